//! What is emitted beside the errors when an rmcp tool cannot be wrapped (thiserror's
//! `fallback.rs`): the user's method, with its body still type-checked, but returning what rmcp's
//! router expects, so the only errors the user sees are ours, not rmcp's "IntoToolRoute is not
//! implemented" about the signature we would have rewritten.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Ident, ReturnType};

use crate::ast::{is_attr, is_boxed_future, tool_args, ItemFn};

/// The stand-in for an rmcp tool, or `None` when the item is not one (plain functions are
/// emitted unchanged).
pub(crate) fn rmcp_stub(item: &ItemFn, krate: &syn::Path) -> Option<TokenStream> {
    if !cfg!(feature = "rmcp") {
        return None;
    }
    let p = quote!(#krate::__private);
    let tool_result = quote!(#p::mcp::Answer);
    let block = &item.body;
    let mut stub = item.clone();
    let body = if item.sig.asyncness.is_none() && is_boxed_future(&item.sig.output) {
        // Placed below #[tool]: rmcp already boxed the body and registered the method.
        let ReturnType::Type(_, boxed) = &item.sig.output else {
            return None;
        };
        quote!({
            let _: #boxed = #block;
            ::core::unreachable!()
        })
    } else if item.sig.asyncness.is_some() && item.attrs.iter().any(|a| is_attr(a, "tool")) {
        let body = match &item.sig.output {
            ReturnType::Type(_, ret) => {
                let fake = Ident::new("__idem_fake_return", Span::mixed_site());
                quote! {
                    async move {
                        #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop, clippy::needless_return)]
                        if false {
                            let #fake: #ret = loop {};
                            return #fake;
                        }
                        #block
                    }
                }
            }
            ReturnType::Default => quote!(async move #block),
        };
        quote!({
            let _ = #body;
            ::core::unreachable!()
        })
    } else {
        return None;
    };
    // Without `local` (refused): rmcp then routes the stand-in like any tool, so no error of its
    // own joins ours.
    for attr in stub.attrs.iter_mut().filter(|a| is_attr(a, "tool")) {
        if let Ok(metas) = tool_args(attr) {
            let kept = metas.iter().filter(|m| !m.path().is_ident("local"));
            let path = attr.path().clone();
            *attr = syn::parse_quote!(#[#path(#(#kept),*)]);
        }
    }
    stub.sig.output = syn::parse_quote!(-> #tool_result);
    stub.body = proc_macro2::Group::new(proc_macro2::Delimiter::Brace, body);
    Some(quote!(#stub))
}
