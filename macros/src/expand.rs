//! The generating layer: the claim → run → record wrapper around the user's body, the
//! descriptor (`ToolSpec`), and the `#[tool]` attribute with the hint merged in. Generated code
//! names the runtime only through `<crate>::__private`; its locals start with `__idem_` and are
//! spanned at `Span::mixed_site()`, so the user's body can neither see nor shadow them.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, Ident, Meta, MetaList};

use crate::ast::{is_attr, tool_args, Context, Function, ItemFn, Metas, Mode, Request};
use crate::attr::{KeyPath, MissingKey, OnError, Options, Recover, Scope, Segment};
use crate::ctxt::Ctxt;
use crate::emit::with_error;
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

/// `tokens` with every span set to `span`: the runtime's path inside a `quote_spanned!`, so that
/// rustc's trait errors point at the user's type rather than at the attribute.
fn respan(tokens: &TokenStream, span: Span) -> TokenStream {
    tokens
        .clone()
        .into_iter()
        .map(|t| match t {
            TokenTree::Group(g) => {
                let mut group = Group::new(g.delimiter(), respan(&g.stream(), span));
                group.set_span(span);
                TokenTree::Group(group)
            }
            mut other => {
                other.set_span(span);
                other
            }
        })
        .collect()
}

/// A generated local: hygienic (`mixed_site`), so the user's body cannot name it, nor shadow it.
fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

/// The method descriptor's name: `charge_card` → `CHARGE_CARD_TOOL`.
pub(crate) fn const_name(fn_name: &Ident) -> Ident {
    format_ident!(
        "{}_TOOL",
        fn_name.unraw().to_string().to_uppercase(),
        span = fn_name.span()
    )
}

/// `&__idem_args.order.id` (or `&__idem_params.0.order.id`), spanned at the key's string, so a
/// missing field is reported there.
fn key_access(root: &TokenStream, k: &KeyPath) -> TokenStream {
    let segs = k.segments.iter().map(|s| match s {
        Segment::Field(id) => id.to_token_stream(),
        Segment::Index(i) => syn::Index {
            index: *i,
            span: k.span,
        }
        .to_token_stream(),
    });
    quote_spanned!(k.span=> &#root #(.#segs)*)
}

fn generate(f: &Function, opts: &Options) -> TokenStream {
    let krate = opts.krate();
    let p = quote!(#krate::__private);
    let item = &f.item;
    let vis = &item.vis;
    let fn_name = &item.sig.ident;
    let name = &f.name;
    let rmcp = matches!(f.mode, Mode::Rmcp { .. });

    let window = opts.window_ms();
    let mut spec = quote!(#p::ToolSpec::new(#name, #p::Duration::from_millis(#window)));
    if let Some(t) = &opts.timeout {
        let ms = t.value;
        spec.extend(quote!(.with_timeout(#p::Duration::from_millis(#ms))));
    }
    if let Some(w) = &opts.wait {
        let ms = w.value;
        spec.extend(quote!(.with_wait(#p::Duration::from_millis(#ms))));
    }
    if let Some(scope) = &opts.scope {
        let variant = match scope.value {
            Scope::Tenant => quote!(Tenant),
            Scope::Subject => quote!(Subject),
        };
        spec.extend(quote!(.with_scope(#p::Scope::#variant)));
    }
    if let Some(ignore) = &opts.ignore {
        let fields = &ignore.value;
        spec.extend(quote!(.ignoring(&[#(#fields),*])));
    }
    if let Some(recover) = &opts.recover {
        let variant = match recover.value {
            Recover::Unknown => quote!(Unknown),
            Recover::Rerun => quote!(Rerun),
            Recover::Reconcile => quote!(Reconcile),
        };
        spec.extend(quote!(.with_recover(#p::Recover::#variant)));
    }
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
    let prepare = match &opts.business_key {
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
                        {
                            #[allow(unused_imports)]
                            use #pk::KeyProbeAny as _;
                            #pk::business_key_field(#pk::KeyProbe(#field).key());
                        }
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
                merge_hint(a, &p, &f.args.keyed, f.structured.as_ref())
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
            syn::parse_quote!(-> #p::Result<#p::rmcp::model::CallToolResponse, #p::rmcp::ErrorData>)
        } else {
            syn::parse_quote!(-> #p::Result<#p::rmcp::model::CallToolResult, #p::rmcp::ErrorData>)
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
        let prologue = quote! {
            let #engine = #p::Clone::clone(#cx::idempotency(self));
            let #caller = match #cx::caller(self, &#request) {
                #p::Result::Ok(#c) => #c,
                #p::Result::Err(#e) => return #p::mcp::refuse_into(#e),
            };
            #probes
            if let #p::Result::Err(#e) = #p::mcp::check_arguments(&#raw_local, &#keyed, &#spec_path) {
                return #p::mcp::refuse_into(#e);
            }
            let #prepared = match #prepare {
                #p::Result::Ok(#pv) => #pv,
                #p::Result::Err(#e) => return #p::mcp::refuse_into(#e),
            };
            #wants_task
            let #progress = #p::mcp::progress_of(&#request);
        };
        // A repeat that waits for the call in progress tells a client that sent a progress
        // token how long it has waited.
        let execute = quote!(#p::mcp::reporting(#progress, async { #execute }).await);
        // A tool that answers with a `CallToolResult` itself gets it back verbatim.
        let verbatim = matches!(ok, syn::Type::Path(t)
            if t.path.segments.last().is_some_and(|s| s.ident == "CallToolResult"));
        let finish = if opts.task.is_some() {
            quote!(#p::mcp::task_call(#engine, #prepared, #as_task, (#policy, #body_local)).await)
        } else if response {
            quote!(#p::mcp::answer_response(#execute))
        } else if verbatim {
            quote!(#p::mcp::answer_verbatim(#execute))
        } else {
            quote!(#p::mcp::answer(#execute))
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
            #local_descriptor
            #prologue
            let #body_local = #body;
            #finish
        }
        #descriptor
    }
}

/// `ty`'s last path segment is `name`.
fn is_last(ty: &syn::Type, name: &str) -> bool {
    matches!(ty, syn::Type::Path(t) if t.path.segments.last().is_some_and(|s| s.ident == name))
}

/// `tokens` with every `self` (not `self::`) naming `with` instead, at the user's span.
fn replace_self(tokens: TokenStream, with: &Ident) -> TokenStream {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let path_follows = |i: usize| matches!(trees.get(i + 1), Some(TokenTree::Punct(p)) if p.as_char() == ':' && p.spacing() == proc_macro2::Spacing::Joint);
    trees
        .iter()
        .enumerate()
        .map(|(i, t)| match t {
            TokenTree::Ident(id) if id == "self" && !path_follows(i) => TokenTree::Ident(
                Ident::new(&with.to_string(), with.span().located_at(id.span())),
            ),
            TokenTree::Group(g) => {
                let mut group = Group::new(g.delimiter(), replace_self(g.stream(), with));
                group.set_span(g.span());
                TokenTree::Group(group)
            }
            other => other.clone(),
        })
        .collect()
}

/// `#[tool(...)]` with `idempotent_hint = true` merged into its `annotations(...)` (added when
/// absent). Everything else keeps its tokens and spans. Call after
/// `hint::check_tool` passed.
///
/// Unless the tool gives its own `input_schema`, the one rmcp would infer from the arguments type
/// is listed closed (`additionalProperties: false`), as the wrapper refuses fields it cannot key.
/// A `Json<T>` answer lists `T`'s output schema, as rmcp infers it for an unwrapped tool (whose
/// return type it reads, and which the wrapper rewrites), unless the tool gives its own.
fn merge_hint(
    attr: &Attribute,
    p: &TokenStream,
    args_ty: &syn::Type,
    output: Option<&syn::Type>,
) -> Attribute {
    let Ok(metas) = tool_args(attr) else {
        return attr.clone();
    };
    let mut items: Vec<TokenStream> = Vec::new();
    let mut merged = false;
    let own_schema = metas
        .iter()
        .any(|m| matches!(m, Meta::NameValue(nv) if nv.path.is_ident("input_schema")));
    let own_output = metas
        .iter()
        .any(|m| matches!(m, Meta::NameValue(nv) if nv.path.is_ident("output_schema")));
    if let (Some(t), false) = (output, own_output) {
        items.push(quote! {
            output_schema = #p::rmcp::handler::server::tool::schema_for_output::<#t>()
        });
    }
    if !own_schema {
        items.push(quote! {
            input_schema = #p::mcp::closed_input_schema(
                #p::rmcp::handler::server::common::schema_for_input::<#args_ty>()
                    .unwrap_or_else(|e| panic!("Invalid input schema for `{}`: {}", ::core::any::type_name::<#args_ty>(), e))
            )
        });
    }
    for m in &metas {
        match m {
            Meta::List(list) if list.path.is_ident("annotations") => {
                merged = true;
                let inner = list
                    .parse_args_with(Metas::parse_terminated)
                    .unwrap_or_default();
                let has = inner.iter().any(
                    |a| matches!(a, Meta::NameValue(nv) if nv.path.is_ident("idempotent_hint")),
                );
                let mut tokens = list.tokens.clone();
                if !has {
                    if !inner.is_empty() && !inner.trailing_punct() {
                        tokens.extend(quote!(,));
                    }
                    tokens.extend(quote!(idempotent_hint = true));
                }
                let list = MetaList {
                    tokens,
                    ..list.clone()
                };
                items.push(list.into_token_stream());
            }
            other => items.push(other.into_token_stream()),
        }
    }
    if !merged {
        items.push(quote!(annotations(idempotent_hint = true)));
    }
    let path = attr.path();
    let pound = attr.pound_token;
    let mut out: Attribute = syn::parse_quote!(#pound[#path(#(#items),*)]);
    out.bracket_token = attr.bracket_token;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(args: TokenStream, item: TokenStream) -> String {
        idempotent(args, item).to_string()
    }

    #[test]
    fn plain_fn_gets_a_module_descriptor() {
        let out = expand(
            quote!(window = "2h"),
            quote!(
                async fn charge(ctx: &Ctx, args: A) -> Result<R, E> {
                    Ok(R)
                }
            ),
        );
        assert!(out.contains("mod charge"), "{out}");
        assert!(
            out.contains(":: idempotency :: __private :: prepare_call :: < A >"),
            "{out}"
        );
        assert!(out.contains("7200000u64"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn method_gets_an_associated_const() {
        let out = expand(
            quote!(business_key = "order.id"),
            quote!(
                async fn ship(&self, args: A) -> Result<R, E> {
                    Ok(R)
                }
            ),
        );
        assert!(out.contains("pub const SHIP_TOOL"), "{out}");
        assert!(out.contains("& __idem_args . order . id"), "{out}");
    }

    #[test]
    fn errors_keep_the_item() {
        let out = expand(
            quote!(colour = "red"),
            quote!(
                async fn charge(ctx: &Ctx, args: A) -> Result<R, E> {
                    Ok(R)
                }
            ),
        );
        assert!(out.contains("compile_error"), "{out}");
        assert!(out.starts_with("async fn charge"), "{out}");
        let out = expand(
            quote!(),
            quote!(
                fn charge(ctx: &Ctx, args: A) -> Result<R, E> {
                    Ok(R)
                }
            ),
        );
        assert!(out.contains("make this function async"), "{out}");
        let out = expand(
            quote!(),
            quote!(
                struct S;
            ),
        );
        assert!(out.contains("compile_error"), "{out}");
    }

    #[test]
    fn crate_path_is_used() {
        let out = expand(
            quote!(crate = "my_idem"),
            quote!(
                async fn charge(ctx: &Ctx, args: A) -> Result<R, E> {
                    Ok(R)
                }
            ),
        );
        assert!(out.contains("my_idem :: __private"), "{out}");
        assert!(!out.contains(":: idempotency ::"), "{out}");
        assert!(out.contains("use super :: * ;"), "{out}");
    }

    fn merged(attr: Attribute) -> String {
        merge_hint(&attr, &quote!(P), &syn::parse_quote!(A), None)
            .to_token_stream()
            .to_string()
    }

    const SCHEMA: &str = "input_schema = P :: mcp :: closed_input_schema (P :: rmcp :: handler :: server :: common :: schema_for_input :: < A > () . unwrap_or_else (| e | panic ! (\"Invalid input schema for `{}`: {}\" , :: core :: any :: type_name :: < A > () , e)))";

    #[test]
    fn merges_into_annotations() {
        assert_eq!(
            merged(syn::parse_quote!(#[tool])),
            format!("# [tool ({SCHEMA} , annotations (idempotent_hint = true))]")
        );
        assert_eq!(
            merged(syn::parse_quote!(#[tool(description = "d")])),
            format!(
                "# [tool ({SCHEMA} , description = \"d\" , annotations (idempotent_hint = true))]"
            )
        );
        assert_eq!(
            merged(syn::parse_quote!(#[rmcp::tool(annotations(title = "T"), name = "n")])),
            format!("# [rmcp :: tool ({SCHEMA} , annotations (title = \"T\" , idempotent_hint = true) , name = \"n\")]")
        );
        assert_eq!(
            merged(syn::parse_quote!(#[tool(annotations(idempotent_hint = true))])),
            format!("# [tool ({SCHEMA} , annotations (idempotent_hint = true))]")
        );
        // A tool's own input schema is kept as it is.
        assert_eq!(
            merged(syn::parse_quote!(#[tool(input_schema = s())])),
            "# [tool (input_schema = s () , annotations (idempotent_hint = true))]"
        );
    }

    #[test]
    fn a_json_answer_lists_its_output_schema() {
        let attr: Attribute = syn::parse_quote!(#[tool]);
        let out = merge_hint(
            &attr,
            &quote!(P),
            &syn::parse_quote!(A),
            Some(&syn::parse_quote!(R)),
        )
        .to_token_stream()
        .to_string();
        assert_eq!(
            out,
            format!("# [tool (output_schema = P :: rmcp :: handler :: server :: tool :: schema_for_output :: < R > () , {SCHEMA} , annotations (idempotent_hint = true))]")
        );
        // The tool's own output schema is kept.
        let attr: Attribute = syn::parse_quote!(#[tool(output_schema = s())]);
        let out = merge_hint(
            &attr,
            &quote!(P),
            &syn::parse_quote!(A),
            Some(&syn::parse_quote!(R)),
        )
        .to_token_stream()
        .to_string();
        assert!(!out.contains("schema_for_output"), "{out}");
        if cfg!(feature = "rmcp") {
            let out = expand(
                quote!(),
                quote!(
                    #[tool]
                    async fn charge(&self, Parameters(a): Parameters<A>) -> Result<Json<R>, E> {
                        Ok(Json(R))
                    }
                ),
            );
            assert!(out.contains("execute_raw :: < R , E , _ >"), "{out}");
            assert!(out.contains("schema_for_output :: < R >"), "{out}");
        }
    }

    #[test]
    fn an_impl_tells_its_functions_where_they_are() {
        let out = idempotent_tools(quote!(
            impl Charger for S {
                #[idempotent]
                async fn charge(&self, a: A) -> Result<R, E> { Ok(R) }
                #[idempotent(window = "1h")]
                async fn refund(&self, a: A) -> Result<R, E> { Ok(R) }
            }
        ))
        .to_string();
        assert!(
            out.contains("# [idempotent (__in_impl = \"trait\")]"),
            "{out}"
        );
        assert!(
            out.contains("# [idempotent (__in_impl = \"trait\" , window = \"1h\")]"),
            "{out}"
        );
        let out = expand(
            quote!(__in_impl = "trait"),
            quote!(
                async fn charge(&self, a: A) -> Result<R, E> {
                    Ok(R)
                }
            ),
        );
        assert!(!out.contains("CHARGE_TOOL"), "{out}");
        assert!(out.contains("const __IDEM_TOOL"), "{out}");
        let out = expand(
            quote!(__in_impl = "inherent"),
            quote!(
                async fn refund(ctx: &Ctx, a: A) -> Result<R, E> {
                    Ok(R)
                }
            ),
        );
        assert!(out.contains("pub const REFUND_TOOL"), "{out}");
        assert!(!out.contains("mod refund"), "{out}");
        // Not an impl: the error says where it goes, beside the item.
        let out = idempotent_tools(quote!(
            struct S;
        ))
        .to_string();
        assert!(out.contains("applies to an `impl` block"), "{out}");
        // A broken body is rustc's to report.
        let item: TokenStream = "impl S { fn f(&self) { let = ; } }".parse().unwrap();
        assert_eq!(idempotent_tools(item.clone()).to_string(), item.to_string());
    }

    #[test]
    fn spec_uses_the_const_builder() {
        let out = expand(
            quote!(window = "2h"),
            quote!(
                async fn charge(ctx: &Ctx, args: A) -> Result<R, E> {
                    Ok(R)
                }
            ),
        );
        assert!(
            out.contains(":: idempotency :: __private :: ToolSpec :: new (\"charge\" , :: idempotency :: __private :: Duration :: from_millis (7200000u64))"),
            "{out}"
        );
        assert!(!out.contains("with_timeout"), "{out}");
        assert!(!out.contains("with_wait"), "{out}");
        assert!(!out.contains("__wrapped"), "{out}");
        let out = expand(
            quote!(timeout = "30s", wait = "3s"),
            quote!(
                async fn ship(&self, args: A) -> Result<R, E> {
                    Ok(R)
                }
            ),
        );
        assert!(
            out.contains(". with_timeout (:: idempotency :: __private :: Duration :: from_millis (30000u64))"),
            "{out}"
        );
        assert!(
            out.contains(
                ". with_wait (:: idempotency :: __private :: Duration :: from_millis (3000u64))"
            ),
            "{out}"
        );
    }

    #[test]
    fn context_is_read_through_a_shared_reborrow() {
        let out = expand(
            quote!(),
            quote!(
                async fn charge(ctx: &mut Ctx, args: A) -> Result<R, E> {
                    ctx.count += 1;
                    Ok(R)
                }
            ),
        );
        assert!(!out.contains("compile_error"), "{out}");
        let cx = ":: idempotency :: __private :: IdempotencyContext :: < () >";
        assert!(
            out.contains(&format!(
                "__idem_engine = :: idempotency :: __private :: Clone :: clone ({cx} :: idempotency (& * ctx))"
            )),
            "{out}"
        );
        assert!(
            out.contains(&format!("{cx} :: caller (& * ctx , & ())")),
            "{out}"
        );
        // The context itself is never moved before the body, which moves it.
        assert!(!out.contains("= ctx ;"), "{out}");
        assert!(
            out.contains("execute_raw :: < R , E , _ > (& __idem_engine"),
            "{out}"
        );
        let out = expand(
            quote!(),
            quote!(
                async fn ship(&self, args: A) -> Result<R, E> {
                    Ok(R)
                }
            ),
        );
        assert!(
            out.contains(&format!("{cx} :: idempotency (& * self)")),
            "{out}"
        );
    }

    #[test]
    fn rmcp_tool_uses_the_context_trait_for_the_request() {
        let out = expand(
            quote!(),
            quote!(
                #[tool]
                async fn charge(&self, Parameters(args): Parameters<A>) -> Result<R, E> {
                    Ok(R)
                }
            ),
        );
        if cfg!(feature = "rmcp") {
            let cx = ":: idempotency :: __private :: IdempotencyContext :: < :: idempotency :: __private :: mcp :: Request >";
            assert!(
                out.contains(&format!("{cx} :: idempotency (self)")),
                "{out}"
            );
            assert!(
                out.contains(&format!("{cx} :: caller (self , & __idem_request)")),
                "{out}"
            );
            assert!(
                out.contains("__idem_request : :: idempotency :: __private :: mcp :: Request"),
                "{out}"
            );
            assert!(
                out.contains("annotations (idempotent_hint = true)"),
                "{out}"
            );
        }
        assert!(!out.contains("IdempotentServer"), "{out}");
    }

    #[test]
    fn body_is_kept_as_tokens() {
        // A syntax error in the body is not ours to report: the body is emitted as written.
        let item: TokenStream =
            "async fn charge(ctx: &Ctx, args: A) -> Result<R, E> { let x = ; Ok(R) }"
                .parse()
                .unwrap();
        let out = expand(quote!(), item);
        assert!(!out.contains("compile_error"), "{out}");
        assert!(
            out.contains("let args = __idem_args ; { let x = ; Ok (R) }"),
            "{out}"
        );
    }

    #[test]
    fn what_is_not_a_function_keeps_a_precise_error() {
        let out = expand(
            quote!(),
            quote!(
                struct S;
            ),
        );
        assert!(out.contains("applies to an `async fn`"), "{out}");
        assert!(out.starts_with("struct S ;"), "{out}");
        // A broken signature: syn's own error, not "applies to an async fn".
        let out = expand(
            quote!(),
            quote!(async fn charge(ctx: &Ctx, args:) -> R { 1 }),
        );
        assert!(out.contains("compile_error"), "{out}");
        assert!(!out.contains("applies to an `async fn`"), "{out}");
        let out = expand(
            quote!(),
            quote!(
                async fn charge(ctx: &Ctx, args: A) -> Result<R, E>;
            ),
        );
        assert!(out.contains("expected the function's body"), "{out}");
        let out = expand(
            quote!(),
            quote!(
                async fn charge(ctx: &Ctx, args: A) -> Result<R, E> {}
                struct S;
            ),
        );
        assert!(
            out.contains("unexpected tokens after the function's body"),
            "{out}"
        );
    }

    proptest::proptest! {
        #[test]
        fn never_panics(args in "[a-z_=\", \\[\\]0-9.]{0,30}", sig in "[a-z_:&,() <>]{0,30}") {
            if let (Ok(a), Ok(s)) = (args.parse::<TokenStream>(), format!("async fn f({sig}) -> Result<u8, E> {{ Ok(1) }}").parse::<TokenStream>()) {
                let _ = idempotent(a, s);
            }
        }
    }
}
