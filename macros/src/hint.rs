//! The hint follows the code (validating layer): a wrapped tool's `#[tool]` must not contradict
//! the `idempotent_hint = true` that `expand` merges into it, and `#[idempotent_tools]` rejects the
//! hint on a tool that is not wrapped.

use proc_macro2::{Span, TokenStream};
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprLit, Lit, Meta, MetaList};

use crate::ast::{is_attr, tool_args, Metas};
use crate::ctxt::Ctxt;

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
pub(crate) fn check_tool(cx: &mut Ctxt, attr: &Attribute) {
    let metas = match tool_args(attr) {
        Ok(m) => m,
        Err(e) => return cx.push(e),
    };
    if let Some(list) = annotations(&metas)
        && let Err(e) = list.parse_args_with(Metas::parse_terminated)
    {
        return cx.push(e);
    }
    // `local` tools have non-`Send` futures; the engine's claim, renewals and background
    // settlement run on the multi-threaded runtime and need `Send`.
    let local = metas.iter().find(|m| match m {
        Meta::Path(p) => p.is_ident("local"),
        Meta::NameValue(nv) => {
            nv.path.is_ident("local")
                && !matches!(&nv.value, syn::Expr::Lit(l) if matches!(&l.lit, syn::Lit::Bool(b) if !b.value))
        }
        Meta::List(_) => false,
    });
    if let Some(m) = local {
        cx.spanned(
            m,
            "#[idempotent] does not support rmcp's `local` tools: the wrapped call must be a `Send` future (its claim, lease renewals and settlement run on Tokio's multi-threaded runtime); make the handler's future `Send` (hold no `Rc`/`RefCell`/non-`Send` guard across an `.await`) and drop `local`",
        );
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

/// `#[idempotent_tools]`: an `idempotent_hint = true` on a method without `#[idempotent]` is an
/// error at the hint; in an `impl Trait for X`, so is a wrapped rmcp tool (rmcp routes no tools
/// there). The methods of the latter are returned, so the impl can be emitted without them.
pub(crate) fn check_impl(cx: &mut Ctxt, imp: &syn::ItemImpl) -> Vec<syn::Ident> {
    let mut unroutable = Vec::new();
    for it in &imp.items {
        let syn::ImplItem::Fn(f) = it else { continue };
        // A wrapped tool (even one wrapped below #[tool], which #[idempotent] itself rejects).
        if f.attrs.iter().any(|a| is_attr(a, "idempotent")) {
            if let (Some((_, tr, _)), Some(tool)) =
                (&imp.trait_, f.attrs.iter().find(|a| is_attr(a, "tool")))
            {
                let tr = tr
                    .segments
                    .last()
                    .map(|s| s.ident.to_string())
                    .unwrap_or_default();
                cx.spanned(
                    tool,
                    format!(
                        "rmcp does not route tools in a trait impl (`#[tool]` adds a `{}_tool_attr` fn and `#[tool_router]` a `tool_router` fn beside the method, which `impl {tr} for ..` cannot hold): put this tool in an inherent `impl` block with #[tool_router] and #[idempotent], and call the trait's method from its body",
                        f.sig.ident
                    ),
                );
                unroutable.push(f.sig.ident.clone());
            }
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
    unroutable
}

/// `#[attrs] vis unsafe? impl`: the item is an impl block, whatever follows.
pub(crate) fn is_impl(item: TokenStream) -> bool {
    let head = |input: syn::parse::ParseStream| -> syn::Result<bool> {
        input.call(Attribute::parse_outer)?;
        input.parse::<syn::Visibility>()?;
        input.parse::<Option<syn::Token![unsafe]>>()?;
        let is_impl = input.peek(syn::Token![impl]);
        input.parse::<TokenStream>()?;
        Ok(is_impl)
    };
    syn::parse::Parser::parse2(head, item).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_false_hint() {
        let mut cx = Ctxt::new();
        check_tool(
            &mut cx,
            &syn::parse_quote!(#[tool(annotations(idempotent_hint = false))]),
        );
        assert!(cx.check().is_err());
    }
}
