//! Generation: the claim → run → record wrapper around the user's body, and the descriptor
//! (`ToolSpec`) that carries `idempotent_hint`. Generated code names the runtime only through
//! `<crate>::__private`, and its locals start with `__idem_`.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn};

use crate::ast::{Context, Function, Mode, Request};
use crate::attr::{KeyPath, OnError, Options, Segment};
use crate::ctxt::Ctxt;
use crate::{check, fallback, hint};

pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let item_fn: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            let e = syn::Error::new(
                Span::call_site(),
                "#[idempotent] applies to an `async fn` (a free function or a `&self` method)",
            );
            return with_error(item, e);
        }
    };
    let mut cx = Ctxt::default();
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
            let again = item_fn
                .attrs
                .iter()
                .any(|a| crate::ast::is_attr(a, "idempotent"));
            let stub = if again {
                None
            } else {
                fallback::rmcp_stub(&item_fn, &opts.krate())
            };
            with_error(stub.unwrap_or(item), e)
        }
    }
}

/// tokio-macros' habit: on error, emit the user's item unchanged beside the errors, so IDEs and
/// later diagnostics see the function as written.
pub fn with_error(item: TokenStream, e: syn::Error) -> TokenStream {
    let err = e.into_compile_error();
    quote!(#item #err)
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

fn local(name: &str) -> Ident {
    Ident::new(name, Span::call_site())
}

/// The method descriptor's name: `charge_card` → `CHARGE_CARD_TOOL`.
pub fn const_name(fn_name: &Ident) -> Ident {
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
    let timeout = opts.timeout.as_ref().map(|t| {
        let ms = t.value;
        quote!(.with_timeout(#p::Duration::from_millis(#ms)))
    });
    let spec = quote!(#p::ToolSpec::new(#name, #p::Duration::from_millis(#window)) #timeout);
    let (spec_path, descriptor) = if f.method {
        let c = const_name(fn_name);
        let descriptor = quote! {
            #[doc(hidden)]
            #[allow(dead_code)]
            pub const #c: #p::ToolSpec = #spec;
        };
        (quote!(Self::#c), descriptor)
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
                /// The wrapped tool's descriptor: name, window, timeout, `idempotent_hint() == true`.
                pub const TOOL: #p::ToolSpec = #spec;
            }
        };
        (quote!(#fn_name::TOOL), descriptor)
    };

    let (ok, err, ret) = (&f.ok, &f.err, &f.ret);
    let pe = respan(&p, err.span());
    let policy = match opts.on_error.as_ref().map(|o| o.value) {
        None => quote_spanned!(err.span()=> #pe::ErrorPolicy::<#err>::classified()),
        Some(OnError::Definitive) => {
            quote_spanned!(err.span()=> #pe::ErrorPolicy::<#err>::definitive())
        }
        Some(OnError::Retryable) => {
            quote_spanned!(err.span()=> #pe::ErrorPolicy::<#err>::retryable())
        }
        Some(OnError::Unknown) => quote_spanned!(err.span()=> #pe::ErrorPolicy::<#err>::unknown()),
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
    let prepare = match &opts.business_key {
        None => {
            quote_spanned!(args_ty.span()=> #pa::prepare_call::<#args_ty>(&#caller, #name, &#keyed))
        }
        Some(keys) => {
            let fields: Vec<TokenStream> =
                keys.value.iter().map(|k| key_access(&keyed, k)).collect();
            let bk = match fields.as_slice() {
                [one] => one.clone(),
                many => quote!(&(#(#many),*)),
            };
            quote_spanned!(args_ty.span()=> #pa::prepare_business::<#args_ty, _>(&#caller, #name, #bk, &#keyed))
        }
    };

    // The signature: the arguments parameter is renamed (the user's pattern is rebound inside the
    // body, after the key is computed); rmcp also gets a request parameter and a tool result.
    let mut sig = item.sig.clone();
    if let FnArg::Typed(t) = &mut sig.inputs[f.args.index] {
        *t.pat = syn::parse_quote!(#args_local);
    }
    let user_args = &f.args.pat;
    let mut rebind = quote!(let #user_args = #args_local;);
    let block = &item.block;
    let fake_return = quote! {
        #[allow(unknown_lints, unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop, clippy::needless_return, clippy::unreachable)]
        if false {
            let __idem_fake_return: #ret = loop {};
            return __idem_fake_return;
        }
    };

    let attrs: Vec<syn::Attribute> = item
        .attrs
        .iter()
        .enumerate()
        .map(|(i, a)| match f.mode {
            Mode::Rmcp { tool } if tool == i => hint::merge(a),
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
    let po = respan(&p, ok.span());
    let execute = quote_spanned! {ok.span()=>
        #po::Idempotency::execute_raw::<#ok, #err, _>(#engine, &#spec_path, &#caller, #prepared, #policy, #body_local).await
    };
    let (prologue, finish) = if rmcp {
        let request = match &f.request {
            Some(Request::Named(id)) => quote!(#id),
            Some(Request::Renamed { index, pat }) => {
                if let FnArg::Typed(t) = &mut sig.inputs[*index] {
                    *t.pat = syn::parse_quote!(__idem_request);
                }
                rebind.extend(quote!(let #pat = __idem_request;));
                quote!(__idem_request)
            }
            Some(Request::Injected) | None => {
                sig.inputs.push(syn::parse_quote!(
                    __idem_request: #p::rmcp::service::RequestContext<#p::rmcp::RoleServer>
                ));
                quote!(__idem_request)
            }
        };
        sig.output =
            syn::parse_quote!(-> #p::Result<#p::rmcp::model::CallToolResult, #p::rmcp::ErrorData>);
        let prologue = quote! {
            let __idem_engine = #p::IdempotencyContext::<#p::mcp::Request>::idempotency(self);
            let #caller = match #p::IdempotencyContext::<#p::mcp::Request>::caller(self, &#request) {
                #p::Result::Ok(__idem_c) => __idem_c,
                #p::Result::Err(__idem_e) => return #p::mcp::refuse(__idem_e),
            };
            let __idem_prepared = match #prepare {
                #p::Result::Ok(__idem_p) => __idem_p,
                #p::Result::Err(__idem_e) => return #p::mcp::refuse(__idem_e),
            };
        };
        let finish = quote!(#p::mcp::answer(#execute));
        (prologue, finish)
    } else {
        let ctx = match &f.context {
            Context::Receiver => quote!(self),
            Context::Param(id) => quote!(#id),
        };
        let from = quote_spanned!(err.span()=> <#err as #pe::From<#pe::Error>>::from);
        let prologue = quote! {
            let __idem_ctx = #ctx;
            let __idem_engine = #p::IdempotencyContext::<()>::idempotency(__idem_ctx);
            let #caller = match #p::IdempotencyContext::<()>::caller(__idem_ctx, &()) {
                #p::Result::Ok(__idem_c) => __idem_c,
                #p::Result::Err(__idem_e) => return #p::Result::Err(#from(__idem_e)),
            };
            let __idem_prepared = match #prepare {
                #p::Result::Ok(__idem_p) => __idem_p,
                #p::Result::Err(__idem_e) => return #p::Result::Err(#from(__idem_e)),
            };
        };
        let finish = quote! {
            match #execute.result {
                #p::Result::Ok(__idem_v) => #p::Result::Ok(__idem_v),
                #p::Result::Err(#p::Failure::Handler(__idem_e)) => #p::Result::Err(__idem_e),
                #p::Result::Err(#p::Failure::Wrapper(__idem_e)) => #p::Result::Err(#from(__idem_e)),
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

    quote! {
        #(#attrs)*
        #vis #sig {
            #prologue
            let __idem_body = #body;
            #finish
        }
        #descriptor
    }
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

    proptest::proptest! {
        #[test]
        fn never_panics(args in "[a-z_=\", \\[\\]0-9.]{0,30}", sig in "[a-z_:&,() <>]{0,30}") {
            if let (Ok(a), Ok(s)) = (args.parse::<TokenStream>(), format!("async fn f({sig}) -> Result<u8, E> {{ Ok(1) }}").parse::<TokenStream>()) {
                let _ = idempotent(a, s);
            }
        }
    }
}
