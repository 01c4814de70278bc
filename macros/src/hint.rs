//! The hint follows the code: `#[idempotent]` merges `idempotent_hint = true` into rmcp's
//! `#[tool(annotations(...))]` (rmcp rejects a second `annotations`), and `#[idempotent_tools]`
//! rejects the hint on a tool that is not wrapped.

use proc_macro2::{Span, TokenStream};
use quote::{quote, ToTokens};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprLit, Lit, Meta, MetaList, Token};

use crate::ast::is_attr;
use crate::ctxt::Ctxt;

type Metas = Punctuated<Meta, Token![,]>;

fn tool_args(attr: &Attribute) -> syn::Result<Metas> {
    match &attr.meta {
        Meta::Path(_) => Ok(Metas::new()),
        Meta::List(list) => list.parse_args_with(Metas::parse_terminated),
        Meta::NameValue(nv) => Err(syn::Error::new(
            nv.eq_token.span,
            "expected #[tool] or #[tool(...)]",
        )),
    }
}

fn annotations(metas: &Metas) -> Option<&MetaList> {
    metas.iter().find_map(|m| match m {
        Meta::List(list) if list.path.is_ident("annotations") => Some(list),
        _ => None,
    })
}

/// The `idempotent_hint = <bool>` inside `annotations(...)`: its value (if a literal) and span.
fn find_hint(metas: &Metas) -> Option<(Option<bool>, Span)> {
    let inner = annotations(metas)?
        .parse_args_with(Metas::parse_terminated)
        .ok()?;
    inner.iter().find_map(|m| match m {
        Meta::NameValue(nv) if nv.path.is_ident("idempotent_hint") => {
            let value = match &nv.value {
                Expr::Lit(ExprLit {
                    lit: Lit::Bool(b), ..
                }) => Some(b.value),
                _ => None,
            };
            Some((value, nv.span()))
        }
        _ => None,
    })
}

/// Errors in the `#[tool]` of a wrapped method: unreadable, or a contradicting hint.
pub fn check_tool(cx: &mut Ctxt, attr: &Attribute) {
    let metas = match tool_args(attr) {
        Ok(m) => m,
        Err(e) => return cx.push(e),
    };
    if let Some(list) = annotations(&metas) {
        if let Err(e) = list.parse_args_with(Metas::parse_terminated) {
            return cx.push(e);
        }
    }
    match find_hint(&metas) {
        Some((Some(true), _)) | None => {}
        Some((Some(false), span)) => cx.error(
            span,
            "`idempotent_hint = false` contradicts #[idempotent], which makes this tool idempotent; remove it (#[idempotent] sets the hint)",
        ),
        Some((None, span)) => cx.error(
            span,
            "#[idempotent] sets `idempotent_hint = true` itself; remove this one",
        ),
    }
}

/// `#[tool(...)]` with `idempotent_hint = true` merged into its `annotations(...)` (added when
/// absent). Everything else keeps its tokens and spans. Call after [`check_tool`] passed.
pub fn merge(attr: &Attribute) -> Attribute {
    let Ok(metas) = tool_args(attr) else {
        return attr.clone();
    };
    let mut items: Vec<TokenStream> = Vec::new();
    let mut merged = false;
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

/// `#[idempotent_tools]`: an `idempotent_hint = true` on a method without `#[idempotent]` is an
/// error at the hint. The impl is emitted unchanged.
pub fn check_impl(item: TokenStream) -> TokenStream {
    let imp: syn::ItemImpl = match syn::parse2(item.clone()) {
        Ok(i) => i,
        Err(e) => {
            let e = syn::Error::new(
                e.span(),
                "#[idempotent_tools] applies to an `impl` block (put it above #[tool_router])",
            );
            return crate::expand::with_error(item, e);
        }
    };
    let mut cx = Ctxt::default();
    for it in &imp.items {
        let syn::ImplItem::Fn(f) = it else { continue };
        // A wrapped tool (even one wrapped below #[tool], which #[idempotent] itself rejects).
        if f.attrs.iter().any(|a| is_attr(a, "idempotent")) {
            continue;
        }
        for a in f.attrs.iter().filter(|a| is_attr(a, "tool")) {
            let Ok(metas) = tool_args(a) else { continue };
            if let Some((Some(true), span)) = find_hint(&metas) {
                cx.error(
                    span,
                    format!(
                        "`idempotent_hint = true` on `{}`, a tool that is not wrapped: add #[idempotent] above #[tool], or remove the hint",
                        f.sig.ident
                    ),
                );
            }
        }
    }
    match cx.check() {
        Ok(()) => item,
        Err(e) => crate::expand::with_error(item, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged(attr: Attribute) -> String {
        merge(&attr).to_token_stream().to_string()
    }

    #[test]
    fn merges_into_annotations() {
        assert_eq!(
            merged(syn::parse_quote!(#[tool])),
            "# [tool (annotations (idempotent_hint = true))]"
        );
        assert_eq!(
            merged(syn::parse_quote!(#[tool(description = "d")])),
            "# [tool (description = \"d\" , annotations (idempotent_hint = true))]"
        );
        assert_eq!(
            merged(syn::parse_quote!(#[rmcp::tool(annotations(title = "T"), name = "n")])),
            "# [rmcp :: tool (annotations (title = \"T\" , idempotent_hint = true) , name = \"n\")]"
        );
        assert_eq!(
            merged(syn::parse_quote!(#[tool(annotations(idempotent_hint = true))])),
            "# [tool (annotations (idempotent_hint = true))]"
        );
    }

    #[test]
    fn rejects_false_hint() {
        let mut cx = Ctxt::default();
        check_tool(
            &mut cx,
            &syn::parse_quote!(#[tool(annotations(idempotent_hint = false))]),
        );
        assert!(cx.check().is_err());
    }
}
