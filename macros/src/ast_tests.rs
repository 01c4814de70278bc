//! Tests of `ast.rs`.

use super::*;

#[test]
fn boxed_future_is_read_from_the_syntax_tree() {
    let yes: [ReturnType; 4] = [
        syn::parse_quote!(-> ::std::pin::Pin<Box<dyn ::std::future::Future<Output = u8> + Send + '_>>),
        syn::parse_quote!(-> Pin<Box<dyn Future<Output = ()>>>),
        syn::parse_quote!(-> core::pin::Pin<std::boxed::Box<dyn Send + Future<Output = u8>>>),
        syn::parse_quote!(-> Pin<Box<(dyn Future<Output = u8> + Send)>>),
    ];
    for ret in &yes {
        assert!(is_boxed_future(ret), "{}", ret.to_token_stream());
    }
    let no: [ReturnType; 6] = [
        syn::parse_quote!(),
        syn::parse_quote!(-> Result<u8, E>),
        // The text contains "Future", the type is not a boxed future.
        syn::parse_quote!(-> Pin<Box<FutureReceipt>>),
        syn::parse_quote!(-> Pin<Box<dyn NotAFuture<Output = u8>>>),
        syn::parse_quote!(-> Pin<&mut dyn Future<Output = u8>>),
        syn::parse_quote!(-> Box<dyn Future<Output = u8>>),
    ];
    for ret in &no {
        assert!(!is_boxed_future(ret), "{}", ret.to_token_stream());
    }
}

#[test]
fn the_body_is_not_parsed() {
    let item: ItemFn =
        syn::parse_str("#[doc = \"d\"] pub async fn f(x: u8) -> u8 { let = ; }").unwrap();
    assert_eq!(item.body.stream().to_string(), "let = ;");
    assert_eq!(item.attrs.len(), 1);
    assert!(item.sig.asyncness.is_some());
    let e = syn::parse_str::<ItemFn>("struct S;").err().unwrap();
    assert_eq!(e.to_string(), NOT_A_FN);
    assert!(syn::parse_str::<ItemFn>("const X: u8 = 1;").is_err());
    assert!(syn::parse_str::<ItemFn>("const unsafe extern \"C\" fn f() {}").is_ok());
}
