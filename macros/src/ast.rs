//! The function being wrapped, read into what generation needs: which parameter is the context,
//! which carries the arguments, the `Result<T, E>` it returns, and whether it is an rmcp tool.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, ItemFn, Pat, PathArguments, ReturnType, Type};

use crate::attr::Options;
use crate::ctxt::Ctxt;

pub enum Context {
    /// `&self` (methods; rmcp tools).
    Receiver,
    /// A parameter `name: &Ctx`.
    Param(syn::Ident),
}

pub struct Model {
    pub item: ItemFn,
    /// Index of rmcp's `#[tool]` among the attributes, if this is an rmcp tool.
    pub tool_attr: Option<usize>,
    pub context: Context,
    /// Index (in `sig.inputs`) of the arguments parameter.
    pub args_index: usize,
    /// Index of a `RequestContext<RoleServer>` parameter (rmcp).
    pub request_index: Option<usize>,
    /// `T` and `E` of `Result<T, E>`, when spelled out.
    pub ok_err: Option<(Type, Type)>,
    pub name: String,
    pub is_method: bool,
}

pub fn last_segment_is(path: &syn::Path, name: &str) -> bool {
    path.segments.last().is_some_and(|s| s.ident == name)
}

fn type_last_is(ty: &Type, name: &str) -> bool {
    match ty {
        Type::Path(p) => last_segment_is(&p.path, name),
        _ => false,
    }
}

/// `Result<T, E>` (any path ending in `Result` with two type arguments) → (T, E).
fn result_types(ret: &ReturnType) -> Option<(Type, Type)> {
    let ReturnType::Type(_, ty) = ret else { return None };
    let Type::Path(p) = &**ty else { return None };
    let seg = p.path.segments.last()?;
    if seg.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &seg.arguments else { return None };
    let tys: Vec<&Type> = args
        .args
        .iter()
        .filter_map(|a| match a {
            GenericArgument::Type(t) => Some(t),
            _ => None,
        })
        .collect();
    match tys.as_slice() {
        [t, e] => Some(((*t).clone(), (*e).clone())),
        _ => None,
    }
}

fn returns_boxed_future(ret: &ReturnType) -> bool {
    let ReturnType::Type(_, ty) = ret else { return false };
    let s = quote::quote!(#ty).to_string();
    s.contains("Pin") || s.contains("Future")
}

impl Model {
    pub fn from_item(cx: &mut Ctxt, item: ItemFn, opts: &Options) -> Option<Model> {
        let sig = &item.sig;
        let tool_attr = item.attrs.iter().position(|a| last_segment_is(a.path(), "tool"));
        for a in &item.attrs {
            if last_segment_is(a.path(), "idempotent") {
                cx.error(a.span(), "#[idempotent] is applied twice; keep one");
            }
        }
        if sig.asyncness.is_none() {
            if returns_boxed_future(&sig.output) {
                cx.error(sig.fn_token.span, "#[idempotent] must be placed above #[tool(...)]: below it, rmcp has already turned the async fn into a boxed future");
            } else {
                cx.error(sig.fn_token.span, "#[idempotent] wraps an `async fn`; make this function async");
            }
            return None;
        }
        if let Some(g) = sig.generics.params.iter().find(|p| !matches!(p, syn::GenericParam::Lifetime(_))) {
            cx.error(g.span(), "generic idempotent functions are not supported: the key is computed from concrete argument types");
        }
        let is_method = sig.inputs.iter().any(|a| matches!(a, FnArg::Receiver(_)));
        let ok_err = result_types(&sig.output);
        if ok_err.is_none() {
            let span = match &sig.output {
                ReturnType::Type(_, t) => t.span(),
                ReturnType::Default => sig.ident.span(),
            };
            cx.error(span, "an idempotent function returns `Result<T, E>`: `T` is stored and replayed, `E` carries the wrapper's answers");
        }

        let typed: Vec<(usize, &syn::PatType)> = sig
            .inputs
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a {
                FnArg::Typed(t) => Some((i, t)),
                FnArg::Receiver(_) => None,
            })
            .collect();
        let ident_of = |pt: &syn::PatType| match &*pt.pat {
            Pat::Ident(pi) => Some(pi.ident.clone()),
            _ => None,
        };

        let mut request_index = None;
        let context;
        let args_index;
        if tool_attr.is_some() {
            if !is_method {
                cx.error(sig.ident.span(), "an rmcp tool wrapped with #[idempotent] must be a `&self` method");
                return None;
            }
            context = Context::Receiver;
            request_index = typed.iter().find(|(_, t)| type_last_is(&t.ty, "RequestContext")).map(|(i, _)| *i);
            let params: Vec<usize> = typed.iter().filter(|(_, t)| type_last_is(&t.ty, "Parameters")).map(|(i, _)| *i).collect();
            match params.as_slice() {
                [i] => args_index = *i,
                [] => {
                    cx.error(sig.paren_token.span.join(), "an idempotent rmcp tool takes its arguments as `Parameters<T>`: the key is computed from `T`");
                    return None;
                }
                [_, second, ..] => {
                    cx.error(sig.inputs[*second].span(), "only one `Parameters<T>` argument is supported");
                    return None;
                }
            }
        } else {
            let ctx_pos = match &opts.context {
                Some(name) => {
                    let found = typed.iter().find(|(_, t)| ident_of(t).is_some_and(|i| i == name.value()));
                    match found {
                        Some((i, _)) => Some(*i),
                        None => {
                            cx.error(name.span(), format!("there is no parameter named `{}`", name.value()));
                            return None;
                        }
                    }
                }
                None => typed.iter().find(|(_, t)| matches!(&*t.ty, Type::Reference(_))).map(|(i, _)| *i),
            };
            context = match ctx_pos {
                Some(i) => match &sig.inputs[i] {
                    FnArg::Typed(t) => match ident_of(t) {
                        Some(id) => Context::Param(id),
                        None => {
                            cx.error(t.pat.span(), "the context parameter must be a plain name, like `ctx: &Ctx`");
                            return None;
                        }
                    },
                    FnArg::Receiver(_) => return None,
                },
                None if is_method => Context::Receiver,
                None => {
                    cx.error(
                        sig.paren_token.span.join(),
                        "#[idempotent] needs a context parameter `ctx: &Ctx` (Ctx: idempotency::IdempotencyContext) to find the store and the caller; name it with `context = \"...\"` if it is not the first reference parameter",
                    );
                    return None;
                }
            };
            let rest: Vec<usize> = typed.iter().map(|(i, _)| *i).filter(|i| Some(*i) != ctx_pos).collect();
            match rest.as_slice() {
                [i] => {
                    args_index = *i;
                    if let FnArg::Typed(t) = &sig.inputs[*i] {
                        if ident_of(t).is_none() {
                            cx.error(t.pat.span(), "the arguments parameter must be a plain name, like `args: ChargeArgs`");
                        }
                    }
                }
                [] => {
                    cx.error(sig.paren_token.span.join(), "#[idempotent] needs one arguments parameter (the typed arguments the key is computed from)");
                    return None;
                }
                [_, second, ..] => {
                    cx.error(sig.inputs[*second].span(), "#[idempotent] takes exactly one arguments parameter besides the context: gather the arguments in one struct");
                    return None;
                }
            }
        }
        let name = match (&opts.name, tool_attr) {
            (Some(n), _) => n.value(),
            (None, Some(i)) => tool_name(&item.attrs[i]).unwrap_or_else(|| sig.ident.to_string()),
            (None, None) => sig.ident.to_string(),
        };
        Some(Model { item: item.clone(), tool_attr, context, args_index, request_index, ok_err, name, is_method })
    }

    pub fn span(&self) -> Span {
        self.item.sig.ident.span()
    }
}

/// `name = "..."` inside `#[tool(...)]`.
fn tool_name(attr: &syn::Attribute) -> Option<String> {
    let metas = attr.parse_args_with(syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated).ok()?;
    metas.iter().find_map(|m| match m {
        syn::Meta::NameValue(nv) if nv.path.is_ident("name") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}
