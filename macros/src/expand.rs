//! The generating layer: the claim → run → record wrapper around the user's body, the
//! descriptor (`ToolSpec`), and the `#[tool]` attribute with the hint merged in. Generated code
//! names the runtime only through `<crate>::__private`; its locals start with `__idem_` and are
//! spanned at `Span::mixed_site()`, so the user's body can neither see nor shadow them.

use proc_macro2::{Group, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, Meta};

use crate::ast::{is_attr, Context, Function, ItemFn, Mode, Request};
use crate::attr::{ClientKey, MissingKey, OnError, Options};
use crate::call::{body, key_step, policy_fn};
use crate::ctxt::Ctxt;
use crate::descriptor::{descriptor, Descriptor};
use crate::emit::with_error;
use crate::tokens::{
    is_last, key_access, local, merge_client_key, merge_hint, replace_self, respan,
};
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
    let vis = &item.vis;
    let rmcp = matches!(f.mode, Mode::Rmcp { .. });

    let Descriptor {
        spec_path,
        descriptor,
        local_descriptor,
        registration,
    } = descriptor(f, opts, &p);

    let (ok, err, ret) = (&f.ok, &f.err, &f.ret);
    let pe = respan(&p, err.span());
    // An rmcp tool answering `CallToolResponse` (a completed result, an `input_required` round or
    // a task): the completed result is stored verbatim, the rest is carried out as `Interim`.
    let response = rmcp
        && matches!(ok, syn::Type::Path(t)
            if t.path.segments.last().is_some_and(|s| s.ident == "CallToolResponse"));
    let policy_of = if response {
        quote_spanned!(err.span()=> #pe::mcp::Interim::<#err>)
    } else {
        quote_spanned!(err.span()=> #pe::ErrorPolicy::<#err>)
    };
    let policy = match opts.on_error.as_ref().map(|o| o.value) {
        None => quote_spanned!(err.span()=> #policy_of::classified()),
        Some(OnError::Definitive) => quote_spanned!(err.span()=> #policy_of::definitive()),
        Some(OnError::Retryable) => quote_spanned!(err.span()=> #policy_of::retryable()),
        Some(OnError::Unknown) => quote_spanned!(err.span()=> #policy_of::unknown()),
    };

    let args_local = local(if rmcp { "__idem_params" } else { "__idem_args" });
    let keyed = if rmcp {
        quote!(#args_local.0)
    } else {
        quote!(#args_local)
    };
    let args_ty = &f.args.keyed;
    let caller = local("__idem_caller");
    let pa = respan(&p, args_ty.span());
    // An `Option` business-key field is a compile error unless `missing_key` says what a
    // missing one means: the probe's `key()` is the field itself for anything but an `Option`.
    let mut probes = TokenStream::new();
    let client_key = local("__idem_client_key");
    let prepare = match &opts.business_key {
        None if opts.client_key.is_some() => {
            quote_spanned!(args_ty.span()=> #pa::prepare_client::<#args_ty>(&#caller, &#spec_path, #p::Option::as_ref(&#client_key), &#keyed))
        }
        None => {
            quote_spanned!(args_ty.span()=> #pa::prepare_call::<#args_ty>(&#caller, &#spec_path, &#keyed))
        }
        Some(keys) => {
            let fields: Vec<TokenStream> =
                keys.value.iter().map(|k| key_access(&keyed, k)).collect();
            if opts.missing_key.is_none() {
                for (k, field) in keys.value.iter().zip(&fields) {
                    let pk = respan(&p, k.span);
                    probes.extend(quote_spanned! {k.span=>
                        #pk::business_key_field(#pk::KeyProbe::new(#field).key());
                    });
                }
            }
            let bk = match fields.as_slice() {
                [one] => one.clone(),
                many => quote!(&(#(#many),*)),
            };
            let names = keys
                .value
                .iter()
                .map(|k| k.text.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let prepare_fn = match opts.missing_key.as_ref().map(|m| m.value) {
                Some(MissingKey::CallKey) => quote!(prepare_business_or_call),
                Some(MissingKey::Refuse) | None => quote!(prepare_business),
            };
            quote_spanned!(args_ty.span()=> #pa::#prepare_fn::<#args_ty, _>(&#caller, &#spec_path, #pa::BusinessKey { field: #names, value: #bk }, &#keyed))
        }
    };

    // The signature: the arguments parameter is renamed to a hygienic local; the user's pattern,
    // with the user's spans, is rebound inside the body (after the key is computed), so the body
    // resolves the names it declared. rmcp also gets a request parameter and a tool result.
    let mut sig = item.sig.clone();
    if let FnArg::Typed(t) = &mut sig.inputs[f.args.index] {
        *t.pat = syn::parse_quote!(#args_local);
    }
    let user_args = &f.args.pat;
    let mut rebind = quote!(let #user_args = #args_local;);
    let block = &item.body;
    let fake = local("__idem_fake_return");
    let fake_return = quote! {
        #[allow(unknown_lints, unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop, clippy::needless_return, clippy::unreachable)]
        if false {
            let #fake: #ret = loop {};
            return #fake;
        }
    };

    let attrs: Vec<Attribute> = item
        .attrs
        .iter()
        .enumerate()
        .map(|(i, a)| match f.mode {
            Mode::Rmcp { tool } if tool == i => {
                let merged = merge_hint(a, &p, &f.args.keyed, f.structured.as_ref());
                match opts.client_key.as_ref().map(|k| k.value) {
                    None => merged,
                    Some(ClientKey::Accept) => merge_client_key(&merged, &p, "accept"),
                    Some(ClientKey::Require) => merge_client_key(&merged, &p, "require"),
                }
            }
            _ => a.clone(),
        })
        .collect();

    // `execute_raw` named with the signature's `T` and `E`, and spanned at `T`, so rustc reports
    // a `T` that cannot be stored at `T` (once: the call and its future check the same bounds).
    // Plain mode folds the wrapper's answers into `E` itself, so a missing
    // `From<idempotency::Error>` is reported at `E`, once.
    let (engine, prepared, body_local) = (
        local("__idem_engine"),
        local("__idem_prepared"),
        local("__idem_body"),
    );
    let (c, e, pv, v) = (
        local("__idem_c"),
        local("__idem_e"),
        local("__idem_p"),
        local("__idem_v"),
    );
    // A `Json<T>` answer is stored and replayed as its `T` (rmcp's `Json` is not `Serialize`);
    // the answer is `T`'s structured content either way, as rmcp renders `Json<T>`.
    let call_tool_result: syn::Type = syn::parse_quote!(#p::rmcp::model::CallToolResult);
    let stored = match &f.structured {
        Some(t) => t,
        None if response => &call_tool_result,
        None => ok,
    };
    let stored_err = if response {
        quote!(#p::mcp::Interim<#err>)
    } else {
        quote!(#err)
    };
    let po = respan(&p, stored.span());
    let execute = quote_spanned! {stored.span()=>
        #po::Idempotency::execute_raw::<#stored, #stored_err, _>(&#engine, #prepared, #policy, #body_local).await
    };
    let raw_local = local("__idem_raw");
    let (prologue, finish) = if rmcp {
        let request_local = local("__idem_request");
        let request = match &f.request {
            Some(Request::Named(id)) => quote!(#id),
            Some(Request::Renamed { index, pat }) => {
                if let FnArg::Typed(t) = &mut sig.inputs[*index] {
                    *t.pat = syn::parse_quote!(#request_local);
                }
                rebind.extend(quote!(let #pat = #request_local;));
                quote!(#request_local)
            }
            Some(Request::Injected) | None => {
                sig.inputs
                    .push(syn::parse_quote!(#request_local: #p::mcp::Request));
                quote!(#request_local)
            }
        };
        sig.output = if response || opts.task.is_some() {
            syn::parse_quote!(-> #p::mcp::Response)
        } else {
            syn::parse_quote!(-> #p::mcp::Answer)
        };
        // The arguments as sent, copied before `Parameters<T>` takes them: the first parameter
        // after the receiver.
        let at = usize::from(matches!(sig.inputs.first(), Some(FnArg::Receiver(_))));
        sig.inputs
            .insert(at, syn::parse_quote!(#raw_local: #p::mcp::RawArguments));
        let cx = quote!(#p::IdempotencyContext::<#p::mcp::Request>);
        let as_task = local("__idem_as_task");
        let progress = local("__idem_progress");
        let wants_task = if opts.task.is_some() {
            quote!(let #as_task = #p::mcp::wants_task(self, &#request);)
        } else {
            TokenStream::new()
        };
        // The client's key, from the request's `_meta` or HTTP header (never the arguments).
        let read_client_key = match opts.client_key.as_ref().map(|k| k.value) {
            None => TokenStream::new(),
            Some(mode) => {
                let mode = match mode {
                    ClientKey::Accept => quote!(Accept),
                    ClientKey::Require => quote!(Require),
                };
                quote! {
                    let #client_key = match #p::mcp::client_key(&#request, #p::mcp::ClientKeys::#mode, &#spec_path) {
                        #p::Result::Ok(#c) => #c,
                        #p::Result::Err(#e) => return #p::Result::Err(#e),
                    };
                }
            }
        };
        let prologue = quote! {
            let #engine = #p::Clone::clone(#cx::idempotency(self));
            let #caller = match #cx::caller(self, &#request) {
                #p::Result::Ok(#c) => #c,
                #p::Result::Err(#e) => return #p::mcp::refuse_into(#e),
            };
            #read_client_key
            #probes
            if let #p::Result::Err(#e) = #p::mcp::check_arguments(&#raw_local, &#keyed, &#spec_path) {
                return #p::mcp::refuse_into(#e);
            }
            let #prepared = match #prepare {
                #p::Result::Ok(#pv) => #pv,
                #p::Result::Err(#e) => return #p::mcp::refuse_into(#e),
            };
            // The client's trace context and the session, for the call's span.
            let #prepared = #p::mcp::with_origin(#prepared, &#request);
            #wants_task
            let #progress = #p::mcp::progress_of(&#request);
        };
        // A waiting repeat tells a client that sent a progress token how long it has waited.
        let execute = quote!(#p::mcp::reporting(#progress, async { #execute }).await);
        // A tool that answers with a `CallToolResult` itself gets it back verbatim.
        let verbatim = matches!(ok, syn::Type::Path(t)
            if t.path.segments.last().is_some_and(|s| s.ident == "CallToolResult"));
        let finish = if opts.task.is_some() {
            let task = quote!(#p::mcp::TaskCall { engine: #engine, prepared: #prepared, as_task: #as_task });
            quote!(#task.run(#policy, #body_local).await)
        } else if response {
            quote!(#p::mcp::answer_response(#execute))
        } else if verbatim {
            quote!(#p::mcp::answer_verbatim(#execute))
        } else {
            quote!(#p::mcp::answer(#execute))
        };
        // A request with the client's key is answered "in progress" and "conflict" as
        // SEP-3182 proposed: JSON-RPC errors whose `data.type` says which.
        let finish = if opts.client_key.is_some() {
            quote!(#p::mcp::keyed(&#spec_path, #p::Option::is_some(&#client_key), #finish))
        } else {
            finish
        };
        (prologue, finish)
    } else {
        // Only shared reborrows (`&*ctx`), each ending with its statement, and an owned engine:
        // the body can then move the context, even a `ctx: &mut Ctx`.
        let ctx = match &f.context {
            Context::Receiver => quote!(&*self),
            Context::Param(id) => quote!(&*#id),
        };
        let cx = quote!(#p::IdempotencyContext::<()>);
        let from = quote_spanned!(err.span()=> <#err as #pe::From<#pe::Error>>::from);
        let prologue = quote! {
            let #engine = #p::Clone::clone(#cx::idempotency(#ctx));
            let #caller = match #cx::caller(#ctx, &()) {
                #p::Result::Ok(#c) => #c,
                #p::Result::Err(#e) => return #p::Result::Err(#from(#e)),
            };
            #probes
            let #prepared = match #prepare {
                #p::Result::Ok(#pv) => #pv,
                #p::Result::Err(#e) => return #p::Result::Err(#from(#e)),
            };
        };
        let finish = quote! {
            match #execute.result {
                #p::Result::Ok(#v) => #p::Result::Ok(#v),
                #p::Result::Err(#p::Failure::Handler(#e)) => #p::Result::Err(#e),
                #p::Result::Err(#p::Failure::Wrapper(#e)) => #p::Result::Err(#from(#e)),
            }
        };
        (prologue, finish)
    };
    let body = quote_spanned! {block.span()=>
        async move {
            #fake_return
            #rebind
            #block
        }
    };

    if !rmcp {
        return plain(f, opts, &p);
    }
    let task = rmcp && opts.task.is_some();
    let body = if task {
        // The body outlives the request: it owns a clone of `self`, which it reads as `self`
        // (its `self` tokens name a reference to that clone).
        let this = local("__idem_this");
        let owned = local("__idem_owned");
        let replaced = Group::new(block.delimiter(), replace_self(block.stream(), &this));
        let inner = quote_spanned! {block.span()=>
            async move {
                #fake_return
                #rebind
                #replaced
            }
        };
        let j = local("__idem_json");
        let rendered = if f.structured.is_some() {
            quote!(#p::mcp::task_render(#p::Result::map((#inner).await, |#j: #ok| #j.0), #policy))
        } else if is_last(ok, "CallToolResult") {
            quote!(#p::mcp::task_render_verbatim((#inner).await, #policy))
        } else {
            quote!(#p::mcp::task_render((#inner).await, #policy))
        };
        quote!({
            let #owned = #p::Clone::clone(self);
            async move {
                let #this = &#owned;
                #rendered
            }
        })
    } else if f.structured.is_some() {
        let j = local("__idem_json");
        quote!(async move { #p::Result::map((#body).await, |#j: #ok| #j.0) })
    } else if response {
        quote!(async move { #p::mcp::split_response((#body).await) })
    } else {
        body
    };

    quote! {
        #(#attrs)*
        #vis #sig {
            #registration
            #local_descriptor
            #prologue
            let #body_local = #body;
            #finish
        }
        #descriptor
    }
}

/// A plain function: its body, and one call into the runtime (`plain::Call::run`).
fn plain(f: &Function, opts: &Options, p: &TokenStream) -> TokenStream {
    let item = &f.item;
    let Descriptor {
        spec_path,
        descriptor,
        local_descriptor,
        registration,
    } = descriptor(f, opts, p);
    let mut sig = item.sig.clone();
    let args = local("__idem_args");
    if let FnArg::Typed(t) = &mut sig.inputs[f.args.index] {
        *t.pat = syn::parse_quote!(#args);
    }
    // Only a shared reborrow (`&*ctx`), ended before the body: the body can then move the
    // context, even a `ctx: &mut Ctx`.
    let ctx = match &f.context {
        Context::Receiver => quote!(&*self),
        Context::Param(id) => quote!(&*#id),
    };
    let (err, pe, ctor) = (
        &f.err,
        respan(p, f.err.span()),
        policy_fn(opts, f.err.span()),
    );
    let policy = quote_spanned! {err.span()=>
        #pe::plain::Policy::new(<#err as #pe::From<#pe::Error>>::from, #pe::ErrorPolicy::<#err>::#ctor())
    };
    let key = key_step(f, opts, p);
    let body = body(f, &f.args.pat, TokenStream::new());
    // The bounds on `T` (stored, replayed, a `Send` body) are reported at `T`, once: the call
    // and its future are both spanned there, the runtime's path too.
    let call = quote!(#p::plain::Call::new(#ctx, #spec_path));
    let po = respan(p, f.ok.span());
    let run = quote_spanned!(f.ok.span()=> #po::plain::Call::run(#call, #args, #key, #policy, #body).await);
    let (attrs, vis) = (&item.attrs, &item.vis);
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

#[cfg(test)]
#[path = "expand_tests.rs"]
mod tests;
