//! What is emitted beside the errors when an rmcp tool cannot be wrapped (thiserror's
//! `fallback.rs`): the user's method, with its body still type-checked, but returning what rmcp's
//! router expects, so the only errors the user sees are ours, not rmcp's "IntoToolRoute is not
//! implemented" about the signature we would have rewritten.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{ItemFn, ReturnType, Type};

use crate::ast::is_attr;

/// `Pin<Box<dyn Future<Output = ..> ..>>`: the shape rmcp's `#[tool]` gives an `async fn`.
pub fn is_boxed_future(ret: &ReturnType) -> bool {
    let ReturnType::Type(_, ty) = ret else {
        return false;
    };
    let Type::Path(p) = &**ty else { return false };
    let Some(pin) = p.path.segments.last().filter(|s| s.ident == "Pin") else {
        return false;
    };
    quote::ToTokens::to_token_stream(&pin.arguments)
        .to_string()
        .contains("Future")
}

/// The stand-in for an rmcp tool, or `None` when the item is not one (plain functions are
/// emitted unchanged).
pub fn rmcp_stub(item: &ItemFn, krate: &syn::Path) -> Option<TokenStream> {
    if !cfg!(feature = "rmcp") {
        return None;
    }
    let p = quote!(#krate::__private);
    let tool_result = quote!(#p::Result<#p::rmcp::model::CallToolResult, #p::rmcp::ErrorData>);
    let block = &item.block;
    let mut stub = item.clone();
    if item.sig.asyncness.is_none() && is_boxed_future(&item.sig.output) {
        // Placed below #[tool]: rmcp already boxed the body and registered the method.
        let ReturnType::Type(_, boxed) = &item.sig.output else {
            return None;
        };
        stub.sig.output = syn::parse_quote!(-> #tool_result);
        stub.block = syn::parse_quote!({
            let _: #boxed = #block;
            ::core::unreachable!()
        });
    } else if item.sig.asyncness.is_some() && item.attrs.iter().any(|a| is_attr(a, "tool")) {
        let body = match &item.sig.output {
            ReturnType::Type(_, ret) => quote! {
                async move {
                    #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop, clippy::needless_return)]
                    if false {
                        let __idem_fake_return: #ret = loop {};
                        return __idem_fake_return;
                    }
                    #block
                }
            },
            ReturnType::Default => quote!(async move #block),
        };
        stub.sig.output = syn::parse_quote!(-> #tool_result);
        stub.block = syn::parse_quote!({
            let _ = #body;
            ::core::unreachable!()
        });
    } else {
        return None;
    }
    Some(quote!(#stub))
}
