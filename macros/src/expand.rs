//! The generating layer: the claim → run → record wrapper around the user's body, the
//! descriptor (`ToolSpec`), and the `#[tool]` attribute with the hint merged in. Generated code
//! names the runtime only through `<crate>::__private`; its locals start with `__idem_` and are
//! spanned at `Span::mixed_site()`, so the user's body can neither see nor shadow them.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, Meta, Signature};

use crate::ast::{is_attr, Context, Function, ItemFn, Mode, Request};
use crate::attr::{Answers, ClientKey, Options};
use crate::call::{body, key_step, policy_fn};
use crate::ctxt::Ctxt;
use crate::descriptor::{descriptor, Descriptor};
use crate::emit::with_error;
use crate::tokens::{is_last, local, merge_client_key, merge_hint, relocate, respan, Listed};
use crate::{check, fallback, hint};

/// `#[idempotent]`: parse (options, item) → validate → generate; on error, the item (or rmcp's
/// stand-in) beside every error.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let item_fn: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(e) => return with_error(item, e),
    };
    let mut cx = Ctxt::new();
    let opts = Options::parse(&mut cx, args);
    let function = if check::item(&mut cx, &item_fn) {
        Function::from_item(&mut cx, &item_fn, &opts)
    } else {
        None
    };
    if let Some(f) = &function {
        check::function(&mut cx, f, &opts);
    }
    match (cx.check(), function) {
        (Ok(()), Some(f)) => generate(&f, &opts),
        (Ok(()), None) => item,
        (Err(e), _) => {
            // An rmcp tool gets a stand-in that rmcp's router accepts (unless another
            // #[idempotent] on it is still to expand).
            let again = item_fn.attrs.iter().any(|a| is_attr(a, "idempotent"));
            let stub = if again {
                None
            } else {
                fallback::rmcp_stub(&item_fn, &opts.krate())
            };
            with_error(stub.unwrap_or(item), e)
        }
    }
}

/// `#[idempotent_tools]` on an impl block: the hint checks (`hint::check_impl`), then every
/// `#[idempotent]` method is told where it is (`__in_impl = "inherent" | "trait"`), which an
/// attribute on a function cannot see: an associated fn gets an associated-const descriptor, and
/// a method of a trait impl keeps its descriptor in its body.
pub(crate) fn idempotent_tools(item: TokenStream) -> TokenStream {
    let mut imp: syn::ItemImpl = match syn::parse2(item.clone()) {
        Ok(i) => i,
        // An impl that does not parse (a syntax error in a method's body): emitted unchanged, so
        // the error is reported as the syntax error it is, not as "not an impl".
        Err(_) if hint::is_impl(item.clone()) => return item,
        Err(e) => {
            let e = syn::Error::new(
                e.span(),
                "#[idempotent_tools] applies to an `impl` block (put it above #[tool_router] or on a trait impl holding #[idempotent] methods)",
            );
            return with_error(item, e);
        }
    };
    let mut cx = Ctxt::new();
    let unroutable = hint::check_impl(&mut cx, &imp);
    let marker = if imp.trait_.is_some() {
        "trait"
    } else {
        "inherent"
    };
    for it in &mut imp.items {
        let syn::ImplItem::Fn(f) = it else { continue };
        if unroutable.contains(&f.sig.ident) {
            // Emitted as the plain trait method it would be without rmcp: only our error shows.
            f.attrs
                .retain(|a| !is_attr(a, "tool") && !is_attr(a, "idempotent"));
            continue;
        }
        for a in f.attrs.iter_mut().filter(|a| is_attr(a, "idempotent")) {
            let path = a.path().clone();
            let args = match &a.meta {
                Meta::List(l) if !l.tokens.is_empty() => {
                    let tokens = &l.tokens;
                    quote!(__in_impl = #marker, #tokens)
                }
                _ => quote!(__in_impl = #marker),
            };
            let mut marked: Attribute = syn::parse_quote!(#[#path(#args)]);
            marked.pound_token = a.pound_token;
            marked.bracket_token = a.bracket_token;
            *a = marked;
        }
    }
    if !unroutable.is_empty() {
        imp.attrs.retain(|a| !is_attr(a, "tool_router"));
    }
    match cx.check() {
        Ok(()) => imp.into_token_stream(),
        Err(e) if unroutable.is_empty() => with_error(item, e),
        Err(e) => with_error(imp.into_token_stream(), e),
    }
}

fn generate(f: &Function, opts: &Options) -> TokenStream {
    let krate = opts.krate();
    let p = quote!(#krate::__private);
    let item = &f.item;
    let Descriptor {
        spec_path,
        descriptor,
        local_descriptor,
        registration,
    } = descriptor(f, opts, &p);

    // The signature: the arguments parameter is renamed to a hygienic local, passed whole to the
    // runtime, which keys it and hands it to the body: the user's pattern, with the user's
    // spans, is the body closure's parameter. rmcp also gets the raw arguments and the request.
    let mut sig = item.sig.clone();
    let args = local("__idem_args");
    if let FnArg::Typed(t) = &mut sig.inputs[f.args.index] {
        *t.pat = syn::parse_quote!(#args);
    }
    let key = key_step(f, opts);
    // What `E` must be is checked in an expression of its own, spanned at `E`: a missing bound
    // is reported there, once.
    let (err, pe, ctor) = (
        &f.err,
        respan(&p, f.err.span()),
        policy_fn(opts, f.err.span()),
    );
    let response = matches!(f.mode, Mode::Rmcp { .. }) && is_last(&f.ok, "CallToolResponse");
    let (call, method, policy, body) = match f.mode {
        Mode::Plain => {
            // Only a shared reborrow (`&*ctx`), ended before the body: the body can then move
            // the context, even a `ctx: &mut Ctx`.
            let ctx = match &f.context {
                Context::Receiver => quote!(&*self),
                Context::Param(id) => quote!(&*#id),
            };
            let policy = quote_spanned! {err.span()=>
                #pe::plain::Policy::new(#pe::ErrorPolicy::<#err>::#ctor())
            };
            let call = quote!(#p::plain::Call::new(#ctx, #spec_path));
            (call, "run", policy, body(f, TokenStream::new(), false))
        }
        Mode::Rmcp { .. } => {
            let (call, rebind) = rmcp_call(f, opts, &p, &mut sig, &spec_path);
            let policy = if response {
                quote_spanned!(err.span()=> #pe::mcp::Interim::<#err>::#ctor())
            } else {
                quote_spanned!(err.span()=> #pe::ErrorPolicy::<#err>::#ctor())
            };
            // By the kind of answer: `Json<T>` (`T` stored), a `CallToolResult` (verbatim), a
            // `CallToolResponse` (an input round or a task of its own passed on), or `T`.
            let method = if response {
                "response"
            } else if f.structured.is_some() {
                "json"
            } else if is_last(&f.ok, "CallToolResult") {
                "verbatim"
            } else {
                "answer"
            };
            (call, method, policy, body(f, rebind, opts.task.is_some()))
        }
    };
    // The bounds on `T` (stored and replayed; a `Send` body) are reported at `T`, once: the
    // receiver, the method and its future are all shown there (a receiver shown at the
    // attribute would report them again there).
    let stored = f.structured.as_ref().unwrap_or(&f.ok).span();
    let (call, method) = (relocate(&call, stored), syn::Ident::new(method, stored));
    let run = quote_spanned!(stored=> #call.#method(#args, #key, #policy, #body).await);

    let attrs = item.attrs.iter().enumerate().map(|(i, a)| match f.mode {
        Mode::Rmcp { tool } if tool == i => {
            let listed = Listed {
                args: &f.args.keyed,
                open: (opts.ignore.iter().flat_map(|i| &i.value))
                    .filter(|path| path.value().ends_with(".*"))
                    .collect(),
                output: f.structured.as_ref(),
            };
            let merged = merge_hint(a, &p, &listed);
            match opts.client_key.as_ref().map(|k| k.value) {
                None => merged,
                Some(ClientKey::Accept) => merge_client_key(&merged, &p, "accept"),
                Some(ClientKey::Require) => merge_client_key(&merged, &p, "require"),
            }
        }
        _ => a.clone(),
    });
    let vis = &item.vis;
    quote! {
        #(#attrs)*
        #vis #sig {
            #registration
            #local_descriptor
            #run
        }
        #descriptor
    }
}

/// An rmcp tool's call (`mcp::Call`, with its client-key mode, or a `Task`), its parameters
/// added to `sig` (the arguments as sent; the request, unless the tool takes it), its answer
/// type; and the request's rebinding in the body when the tool's own parameter is renamed.
fn rmcp_call(
    f: &Function,
    opts: &Options,
    p: &TokenStream,
    sig: &mut Signature,
    spec_path: &TokenStream,
) -> (TokenStream, TokenStream) {
    let request_local = local("__idem_request");
    let mut rebind = TokenStream::new();
    let request = match &f.request {
        Some(Request::Named(id)) => quote!(#id),
        Some(Request::Renamed { index, pat }) => {
            if let FnArg::Typed(t) = &mut sig.inputs[*index] {
                *t.pat = syn::parse_quote!(#request_local);
            }
            rebind = quote!(let #pat = #request_local;);
            quote!(#request_local)
        }
        Some(Request::Injected) | None => {
            sig.inputs
                .push(syn::parse_quote!(#request_local: #p::mcp::Request));
            quote!(#request_local)
        }
    };
    // The arguments as sent, copied before `Parameters<T>` takes them: the first parameter
    // after the receiver.
    let raw = local("__idem_raw");
    let at = usize::from(matches!(sig.inputs.first(), Some(FnArg::Receiver(_))));
    sig.inputs
        .insert(at, syn::parse_quote!(#raw: #p::mcp::RawArguments));
    let mut call = quote!(#p::mcp::Call::new(self, &#request, #raw, #spec_path));
    let field = opts.client_key_field.as_ref().map(|k| &k.value);
    match (opts.client_key.as_ref().map(|k| k.value), field) {
        (None, _) => {}
        (Some(ClientKey::Accept), None) => call.extend(quote!(.accept_client_key(&#request))),
        (Some(ClientKey::Require), None) => call.extend(quote!(.require_client_key(&#request))),
        (Some(ClientKey::Accept), Some(f)) => call.extend(quote!(.accept_client_key_at(#f))),
        (Some(ClientKey::Require), Some(f)) => call.extend(quote!(.require_client_key_at(#f))),
    }
    match opts.answers.as_ref().map(|a| a.value) {
        None | Some(Answers::Mcp) => {}
        Some(Answers::Acp) => call.extend(quote!(.acp_answers())),
        Some(Answers::Ucp) => call.extend(quote!(.ucp_answers())),
    }
    if opts.task.is_some() {
        call.extend(quote!(.task(self, &#request)));
    }
    sig.output = if opts.task.is_some() || is_last(&f.ok, "CallToolResponse") {
        syn::parse_quote!(-> #p::mcp::Response)
    } else {
        syn::parse_quote!(-> #p::mcp::Answer)
    };
    (call, rebind)
}

#[cfg(test)]
#[path = "expand_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "runtime_paths_tests.rs"]
mod runtime_paths;
