//! What every entry point emits on error (tokio-macros' habit): the item beside the errors, so
//! IDEs and later diagnostics see the item as written. The lowest layer: it depends on nothing
//! else in the crate.

use proc_macro2::TokenStream;
use quote::quote;

pub(crate) fn with_error(item: TokenStream, e: syn::Error) -> TokenStream {
    let err = e.into_compile_error();
    quote!(#item #err)
}
