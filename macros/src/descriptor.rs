//! The tool's descriptor, as `#[idempotent]` generates it: its `ToolSpec` (name, window and
//! the options the engine reads), where the wrapper finds it (a module beside a free function,
//! an associated const, or the body's own const in a trait impl), and its registration at link
//! time (transactional and task tools).

use proc_macro2::TokenStream;
use quote::quote;

use crate::ast::Function;
use crate::attr::{Options, Recover, Scope};
use crate::tokens::{const_name, local};

/// What the wrapper's expansion places of the descriptor.
pub(crate) struct Descriptor {
    /// The path the wrapper reads the `ToolSpec` at.
    pub(crate) spec_path: TokenStream,
    /// The item beside the function (a module or an associated const), if any.
    pub(crate) descriptor: TokenStream,
    /// The const inside the wrapper's body, if any.
    pub(crate) local_descriptor: TokenStream,
    /// The link-time registration inside the body, if any.
    pub(crate) registration: TokenStream,
}

/// The descriptor of `f` with `opts`; `p` is the path of the runtime's `__private`.
pub(crate) fn descriptor(f: &Function, opts: &Options, p: &TokenStream) -> Descriptor {
    let krate = opts.krate();
    let item = &f.item;
    let (vis, fn_name, name) = (&item.vis, &item.sig.ident, &f.name);
    let window = opts.window_ms();
    let mut spec = quote!(#p::Tool::new(#name, #window));
    if let Some(t) = &opts.timeout {
        let ms = t.value;
        spec.extend(quote!(.timeout_ms(#ms)));
    }
    if let Some(w) = &opts.wait {
        let ms = w.value;
        spec.extend(quote!(.wait_ms(#ms)));
    }
    if let Some(scope) = &opts.scope {
        spec.extend(match scope.value {
            Scope::Tenant => quote!(.tenant_scope()),
            Scope::Subject => quote!(.subject_scope()),
        });
    }
    // The client key's own field is left out of the fingerprint with the ignored ones: a retry
    // carries the same key, and the key is the record's name already.
    let mut fields: Vec<&syn::LitStr> = opts.ignore.iter().flat_map(|i| &i.value).collect();
    fields.extend(opts.client_key_field.as_ref().map(|k| &k.value));
    if !fields.is_empty() {
        spec.extend(quote!(.ignoring(&[#(#fields),*])));
    }
    if let Some(recover) = &opts.recover {
        spec.extend(match recover.value {
            Recover::Unknown => quote!(.recover_unknown()),
            Recover::Rerun => quote!(.recover_rerun()),
            Recover::Reconcile => quote!(.recover_reconcile()),
        });
    }
    if opts.transactional.is_some() {
        spec.extend(quote!(.transactional()));
    }
    // Registered at link time: `start` refuses a store that cannot run a transactional tool,
    // naming it; `tasks/get` says what a task tool's recovery means for a lost worker.
    let registration = if opts.transactional.is_some() || opts.task.is_some() {
        quote!(#p::inventory::submit! { #spec.registered() })
    } else {
        TokenStream::new()
    };
    let spec = quote!(#spec.spec());
    let mut local_descriptor = TokenStream::new();
    let (spec_path, descriptor) = if f.in_trait {
        // A trait impl holds only the trait's items: the descriptor is the body's own.
        let c = local("__IDEM_TOOL");
        local_descriptor = quote!(const #c: #p::ToolSpec = #spec;);
        (quote!(#c), TokenStream::new())
    } else if f.method {
        let c = const_name(fn_name);
        let descriptor = quote! {
            #[doc(hidden)]
            #[allow(dead_code)]
            pub const #c: #p::ToolSpec = #spec;
        };
        // The wrapper reads its own copy: in a trait impl marked by nothing, rustc then reports
        // the associated const it cannot hold, not also a missing `Self::` item.
        let own = local("__IDEM_TOOL");
        local_descriptor = quote!(const #own: #p::ToolSpec = #spec;);
        (quote!(#own), descriptor)
    } else {
        // A relative `crate = "..."` path must also resolve inside the module.
        let absolute = krate.leading_colon.is_some()
            || krate.segments.first().is_some_and(|s| s.ident == "crate");
        let glob = if absolute {
            quote!()
        } else {
            quote!(
                #[allow(unused_imports)]
                use super::*;
            )
        };
        let descriptor = quote! {
            #[doc(hidden)]
            #[allow(non_snake_case, dead_code)]
            #vis mod #fn_name {
                #glob
                /// The wrapped tool's descriptor: name, window, timeout.
                pub const TOOL: #p::ToolSpec = #spec;
            }
        };
        (quote!(#fn_name::TOOL), descriptor)
    };
    Descriptor {
        spec_path,
        descriptor,
        local_descriptor,
        registration,
    }
}
