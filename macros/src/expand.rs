//! Generation: the claim → run → record wrapper around the user's body, and the descriptor that
//! carries `idempotent_hint`.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, Pat};

use crate::ast::{Context, Model};
use crate::attr::{OnError, Options, DEFAULT_WINDOW_MS};
use crate::ctxt::Ctxt;
use crate::hint;

pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let item_fn: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            let e = syn::Error::new(Span::call_site(), "#[idempotent] applies to an `async fn` (a free function or a `&self` method)");
            return with_error(item, e);
        }
    };
    let mut cx = Ctxt::default();
    let opts = Options::parse(&mut cx, args);
    let model = Model::from_item(&mut cx, item_fn, &opts);
    if let Some(model) = model {
        if model.tool_attr.is_some() && !cfg!(feature = "rmcp") {
            cx.error(model.span(), "this is an rmcp tool: enable the `rmcp` feature of idempotency");
        }
        let out = generate(&mut cx, &model, &opts);
        match cx.check() {
            Ok(()) => out,
            Err(e) => with_error(item, e),
        }
    } else {
        match cx.check() {
            Ok(()) => item,
            Err(e) => with_error(item, e),
        }
    }
}

/// tokio-macros' habit: on error, keep the user's item so IDEs and later diagnostics stay sane.
pub fn with_error(item: TokenStream, e: syn::Error) -> TokenStream {
    let err = e.to_compile_error();
    quote!(#item #err)
}

fn const_name(name: &syn::Ident) -> syn::Ident {
    format_ident!("{}_TOOL", name.to_string().trim_start_matches("r#").to_uppercase(), span = name.span())
}

fn generate(cx: &mut Ctxt, m: &Model, opts: &Options) -> TokenStream {
    let krate = opts.krate.clone().unwrap_or_else(|| syn::parse_quote!(::idempotency));
    let p = quote!(#krate::__private);
    let item = &m.item;
    let fn_name = &item.sig.ident;
    let vis = &item.vis;
    let name = &m.name;
    let window = opts.window.as_ref().map_or(DEFAULT_WINDOW_MS, |w| w.millis);
    let timeout = match &opts.timeout {
        Some(t) => {
            let ms = t.millis;
            quote!(#p::Option::Some(#p::Duration::from_millis(#ms)))
        }
        None => quote!(#p::Option::None),
    };
    let spec_value = quote!(#p::ToolSpec::__wrapped(#name, #p::Duration::from_millis(#window), #timeout));
    let (spec_path, descriptor) = if m.is_method {
        let c = const_name(fn_name);
        (
            quote!(Self::#c),
            quote! {
                #[doc(hidden)]
                #[allow(dead_code)]
                #vis const #c: #p::ToolSpec = #spec_value;
            },
        )
    } else {
        (
            quote!(#fn_name::TOOL),
            quote! {
                #[doc(hidden)]
                #[allow(non_snake_case, dead_code)]
                #vis mod #fn_name {
                    /// The wrapped tool's descriptor: its name, window, timeout and `idempotent_hint() == true`.
                    pub const TOOL: #p::ToolSpec = #spec_value;
                }
            },
        )
    };
    let Some((ok_ty, err_ty)) = &m.ok_err else { return TokenStream::new() };
    let policy = match opts.on_error {
        None => quote_spanned!(err_ty.span()=> #p::ErrorPolicy::<#err_ty>::classified()),
        Some(OnError::Definitive) => quote_spanned!(err_ty.span()=> #p::ErrorPolicy::<#err_ty>::definitive()),
        Some(OnError::Retryable) => quote_spanned!(err_ty.span()=> #p::ErrorPolicy::<#err_ty>::retryable()),
        Some(OnError::Unknown) => quote_spanned!(err_ty.span()=> #p::ErrorPolicy::<#err_ty>::unknown()),
    };
    let FnArg::Typed(args_param) = &item.sig.inputs[m.args_index] else { return TokenStream::new() };
    let args_ty = &args_param.ty;
    let rmcp = m.tool_attr.is_some();
    // The value the key is computed from.
    let args_expr = if rmcp {
        quote!(__idem_params.0)
    } else {
        match &*args_param.pat {
            Pat::Ident(pi) => {
                let id = &pi.ident;
                quote!(#id)
            }
            _ => return TokenStream::new(),
        }
    };
    let ret_ty = quote!(#p::Result<#ok_ty, #err_ty>);
    let block = &item.block;
    let body = quote! {
        async move {
            #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::needless_return)]
            if false {
                let __idem_fake: #ret_ty = loop {};
                return __idem_fake;
            }
            #block
        }
    };
    let prepare = match &opts.business_key {
        None => quote_spanned!(args_ty.span()=> #p::Prepared::call(&__idem_caller, #name, &#args_expr)),
        Some(paths) => {
            let fields: Vec<TokenStream> = paths
                .iter()
                .map(|kp| {
                    let segs = kp.segments.iter().map(|s| match s.parse::<usize>() {
                        Ok(n) => {
                            let idx = syn::Index { index: n as u32, span: kp.span };
                            quote!(#idx)
                        }
                        Err(_) => {
                            let id = syn::Ident::new(s, kp.span);
                            quote!(#id)
                        }
                    });
                    quote_spanned!(kp.span=> &#args_expr #(. #segs)*)
                })
                .collect();
            let bk = if fields.len() == 1 { fields[0].clone() } else { quote!(&(#(#fields),*)) };
            quote_spanned!(args_ty.span()=> #p::Prepared::business(&__idem_caller, #name, #bk, &#args_expr))
        }
    };

    let attrs: Vec<syn::Attribute> = item
        .attrs
        .iter()
        .enumerate()
        .map(|(i, a)| if Some(i) == m.tool_attr { hint::merge(cx, a) } else { a.clone() })
        .collect();

    if !rmcp {
        let ctx = match &m.context {
            Context::Receiver => quote!(self),
            Context::Param(id) => quote!(#id),
        };
        let sig = &item.sig;
        return quote! {
            #(#attrs)*
            #vis #sig {
                let __idem_ctx = #ctx;
                let __idem_engine = #p::IdempotencyContext::idempotency(__idem_ctx);
                let __idem_caller = match #p::IdempotencyContext::caller(__idem_ctx) {
                    #p::Result::Ok(c) => c,
                    #p::Result::Err(e) => return #p::Result::Err(::core::convert::From::from(e)),
                };
                let __idem_prepared = match #prepare {
                    #p::Result::Ok(p) => p,
                    #p::Result::Err(e) => return #p::Result::Err(::core::convert::From::from(e)),
                };
                let __idem_body = #body;
                __idem_engine.execute(&#spec_path, &__idem_caller, __idem_prepared, #policy, __idem_body).await.result
            }
            #descriptor
        };
    }

    // rmcp: keep the fn name and #[tool]; take `Parameters<T>` whole (hash `T`, then destructure
    // with the user's pattern); use or add a `RequestContext<RoleServer>` for the caller; answer
    // with a `CallToolResult`.
    let mut sig = item.sig.clone();
    let user_pat = args_param.pat.clone();
    if let FnArg::Typed(t) = &mut sig.inputs[m.args_index] {
        *t.pat = syn::parse_quote!(__idem_params);
    }
    let request = match m.request_index {
        Some(i) => match &mut sig.inputs[i] {
            FnArg::Typed(t) => match &*t.pat {
                Pat::Ident(pi) => {
                    let id = pi.ident.clone();
                    quote!(#id)
                }
                _ => {
                    *t.pat = syn::parse_quote!(__idem_request);
                    quote!(__idem_request)
                }
            },
            FnArg::Receiver(_) => quote!(__idem_request),
        },
        None => {
            sig.inputs.push(syn::parse_quote!(__idem_request: #p::rmcp::service::RequestContext<#p::rmcp::RoleServer>));
            quote!(__idem_request)
        }
    };
    sig.output = syn::parse_quote!(-> #p::Result<#p::rmcp::model::CallToolResult, #p::rmcp::ErrorData>);
    quote! {
        #(#attrs)*
        #vis #sig {
            let __idem_engine = #p::mcp::IdempotentServer::idempotency(self);
            let __idem_caller = match #p::mcp::IdempotentServer::caller(self, &#request) {
                #p::Result::Ok(c) => c,
                #p::Result::Err(e) => return #p::mcp::refuse(e),
            };
            let __idem_prepared = match #prepare {
                #p::Result::Ok(p) => p,
                #p::Result::Err(e) => return #p::mcp::refuse(e),
            };
            let #user_pat = __idem_params;
            let __idem_body = #body;
            #p::mcp::answer(
                __idem_engine.execute_raw(&#spec_path, &__idem_caller, __idem_prepared, #policy, __idem_body).await,
            )
        }
        #descriptor
    }
}
