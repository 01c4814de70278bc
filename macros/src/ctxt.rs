//! Collects errors so every problem is reported at once (serde_derive's `Ctxt`). A `Ctxt` must be
//! consumed by [`Ctxt::check`]: dropping it unchecked is a bug in this crate (errors would be lost),
//! so it panics.

use proc_macro2::Span;

pub(crate) struct Ctxt {
    /// `None` once checked.
    errors: Option<Vec<syn::Error>>,
}

impl Ctxt {
    pub(crate) fn new() -> Ctxt {
        Ctxt {
            errors: Some(Vec::new()),
        }
    }

    pub(crate) fn error(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(syn::Error::new(span, msg));
    }

    /// An error covering all of `tokens` (first to last), like `syn::Error::new_spanned`.
    pub(crate) fn spanned(&mut self, tokens: impl quote::ToTokens, msg: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }

    pub(crate) fn push(&mut self, e: syn::Error) {
        self.errors.as_mut().expect("Ctxt used after check").push(e);
    }

    /// All errors so far, combined into one; consumes the context.
    pub(crate) fn check(mut self) -> Result<(), syn::Error> {
        let mut errors = self.errors.take().into_iter().flatten();
        let Some(mut all) = errors.next() else {
            return Ok(());
        };
        for e in errors {
            all.combine(e);
        }
        Err(all)
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !std::thread::panicking() && self.errors.is_some() {
            panic!("forgot to check for errors");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_combines_in_order() {
        let mut cx = Ctxt::new();
        assert!(Ctxt::new().check().is_ok());
        cx.error(Span::call_site(), "first");
        cx.error(Span::call_site(), "second");
        let all: Vec<String> = cx
            .check()
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(all, ["first", "second"]);
    }

    #[test]
    #[should_panic(expected = "forgot to check for errors")]
    fn unchecked_panics() {
        let mut cx = Ctxt::new();
        cx.error(Span::call_site(), "lost");
    }

    #[test]
    #[should_panic(expected = "forgot to check for errors")]
    fn unchecked_without_errors_panics_too() {
        let _cx = Ctxt::new();
    }
}
