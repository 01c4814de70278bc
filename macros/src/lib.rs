//! The `#[idempotent]` attribute. Use it through the `idempotency` crate, which re-exports it.
use proc_macro::TokenStream;

/// Placeholder while the macro crate is written: passes the item through unchanged.
#[proc_macro_attribute]
pub fn idempotent(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}
