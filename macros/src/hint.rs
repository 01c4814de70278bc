//! The hint follows the code: `#[idempotent]` merges `idempotent_hint = true` into rmcp's
//! `#[tool(annotations(...))]`, and `#[idempotent_tools]` rejects a hint on an unwrapped tool.

use proc_macro2::TokenStream;
use quote::quote;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprLit, Lit, Meta, Token};

use crate::ast::last_segment_is;
use crate::ctxt::Ctxt;

type Metas = Punctuated<Meta, Token![,]>;

fn tool_args(attr: &Attribute) -> syn::Result<Metas> {
    match &attr.meta {
        Meta::Path(_) => Ok(Metas::new()),
        _ => attr.parse_args_with(Metas::parse_terminated),
    }
}

/// The `idempotent_hint = <bool>` inside `annotations(...)`, with its value and span.
fn find_hint(metas: &Metas) -> Option<(bool, proc_macro2::Span)> {
    for m in metas {
        let Meta::List(list) = m else { continue };
        if !list.path.is_ident("annotations") {
            continue;
        }
        let inner = list.parse_args_with(Metas::parse_terminated).ok()?;
        for a in &inner {
            if let Meta::NameValue(nv) = a {
                if nv.path.is_ident("idempotent_hint") {
                    if let Expr::Lit(ExprLit { lit: Lit::Bool(b), .. }) = &nv.value {
                        return Some((b.value, nv.span()));
                    }
                }
            }
        }
    }
    None
}

/// `#[tool(...)]` with `idempotent_hint = true` merged into its `annotations(...)`.
pub fn merge(cx: &mut Ctxt, attr: &Attribute) -> Attribute {
    let metas = match tool_args(attr) {
        Ok(m) => m,
        Err(e) => {
            cx.push(e);
            return attr.clone();
        }
    };
    if let Some((false, span)) = find_hint(&metas) {
        cx.error(span, "`idempotent_hint = false` contradicts #[idempotent], which makes the tool idempotent; remove it");
        return attr.clone();
    }
    let mut out: Vec<TokenStream> = Vec::new();
    let mut merged = false;
    for m in &metas {
        match m {
            Meta::List(list) if list.path.is_ident("annotations") => {
                merged = true;
                match list.parse_args_with(Metas::parse_terminated) {
                    Ok(inner) => {
                        let has = inner.iter().any(|a| matches!(a, Meta::NameValue(nv) if nv.path.is_ident("idempotent_hint")));
                        let items = inner.iter();
                        if has {
                            out.push(quote!(annotations(#(#items),*)));
                        } else {
                            out.push(quote!(annotations(#(#items,)* idempotent_hint = true)));
                        }
                    }
                    Err(e) => cx.push(e),
                }
            }
            other => out.push(quote!(#other)),
        }
    }
    if !merged {
        out.push(quote!(annotations(idempotent_hint = true)));
    }
    let path = attr.path();
    syn::parse_quote!(#[#path(#(#out),*)])
}

/// `#[idempotent_tools]`: every `idempotent_hint = true` on a method without `#[idempotent]` is
/// an error at the hint.
pub fn check_impl(item: TokenStream) -> TokenStream {
    let imp: syn::ItemImpl = match syn::parse2(item.clone()) {
        Ok(i) => i,
        Err(e) => {
            let err = e.to_compile_error();
            return quote!(#item #err);
        }
    };
    let mut cx = Ctxt::default();
    for it in &imp.items {
        let syn::ImplItem::Fn(f) = it else { continue };
        let wrapped = f.attrs.iter().any(|a| last_segment_is(a.path(), "idempotent"));
        for a in f.attrs.iter().filter(|a| last_segment_is(a.path(), "tool")) {
            if let Ok(metas) = tool_args(a) {
                if let Some((true, span)) = find_hint(&metas) {
                    if !wrapped {
                        cx.error(span, format!(
                            "`idempotent_hint = true` on `{}`, which is not wrapped: add #[idempotent] above #[tool], or remove the hint (the hint follows the code)",
                            f.sig.ident
                        ));
                    }
                }
            }
        }
    }
    match cx.check() {
        Ok(()) => item,
        Err(e) => {
            let err = e.to_compile_error();
            quote!(#item #err)
        }
    }
}
