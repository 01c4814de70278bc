//! The pieces of a wrapper's one call into the runtime: the key step (the arguments' type and
//! business-key fields spanned where the user wrote them), the error policy's constructor, and
//! the body as a closure of the arguments.

use proc_macro2::{Group, Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;

use crate::ast::Function;
use crate::attr::{MissingKey, OnError, Options};
use crate::tokens::{key_access, local, replace_self};

/// The constructor of the error policy `on_error` names (`classified` by default), at `span`.
pub(crate) fn policy_fn(opts: &Options, span: Span) -> syn::Ident {
    let name = match opts.on_error.as_ref().map(|o| o.value) {
        None => "classified",
        Some(OnError::Definitive) => "definitive",
        Some(OnError::Retryable) => "retryable",
        Some(OnError::Unknown) => "unknown",
    };
    syn::Ident::new(name, span)
}

/// The key step, `|k, a| k.call::<Args>(a)`: the arguments' type spelled out and spanned at
/// that type, so that one that cannot be keyed is reported there; each business-key field read
/// and probed at the key's string, so that a missing or `Option` field is reported there.
pub(crate) fn key_step(f: &Function, opts: &Options) -> TokenStream {
    let (k, a) = (local("__idem_k"), local("__idem_a"));
    let args_ty = &f.args.keyed;
    let Some(keys) = &opts.business_key else {
        return quote_spanned!(args_ty.span()=> |#k, #a| #k.call::<#args_ty>(#a));
    };
    // Through `*a`, so that a missing field is reported on the arguments' type itself.
    let root = quote!((*#a));
    let fields: Vec<TokenStream> = keys.value.iter().map(|k| key_access(&root, k)).collect();
    let mut probes = TokenStream::new();
    if opts.missing_key.is_none() {
        // An `Option` field is a compile error unless `missing_key` says what a missing one
        // means: the probe's `key()` is the field itself for anything but an `Option`.
        for (key, field) in keys.value.iter().zip(&fields) {
            // `(k)`, not `k`: an expression that starts with the hygienic `k` is reported at
            // the whole attribute; the parentheses are the key's string.
            probes.extend(quote_spanned! {key.span=>
                (#k).business_key_field((#k).probe(#field).key());
            });
        }
    }
    let value = match fields.as_slice() {
        [one] => one.clone(),
        many => quote!(&(#(#many),*)),
    };
    let names = keys
        .value
        .iter()
        .map(|k| k.text.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let method = match opts.missing_key.as_ref().map(|m| m.value) {
        Some(MissingKey::CallKey) => quote!(business_or_call),
        Some(MissingKey::Refuse) | None => quote!(business),
    };
    let call = quote_spanned!(args_ty.span()=> #k.#method::<#args_ty, _>(#names, #value, #a));
    quote!(|#k, #a| { #probes #call })
}

/// The body as a closure of the arguments (the user's pattern, with the user's spans), whose
/// future the runtime runs once the key is claimed; `rebind` comes first in it. A never-taken
/// `return` of the function's own type lets `?` in the body infer its error type. A task's body
/// outlives the request: it owns a clone of the server (its first parameter), which it reads as
/// `self` (its `self` tokens name a reference to that clone).
pub(crate) fn body(f: &Function, rebind: TokenStream, task: bool) -> TokenStream {
    let (pat, ret, block) = (&f.args.pat, &f.ret, &f.item.body);
    let fake = local("__idem_fake_return");
    let (owned, inner) = if task {
        let (this, owned) = (local("__idem_this"), local("__idem_owned"));
        let replaced = Group::new(block.delimiter(), replace_self(block.stream(), &this));
        (quote!(#owned,), quote!(let #this = &#owned; #replaced))
    } else {
        (TokenStream::new(), block.to_token_stream())
    };
    quote_spanned! {block.span()=>
        move |#owned #pat| async move {
            #[allow(unknown_lints, unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop, clippy::needless_return, clippy::unreachable)]
            if false {
                let #fake: #ret = loop {};
                return #fake;
            }
            #rebind
            #inner
        }
    }
}
