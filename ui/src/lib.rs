//! Compile-time tests of `#[idempotent]` and `#[idempotent_tools]`: the cases are in `pass/` and
//! `fail/`, run by `tests/ui.rs` (`cargo test -p idempotency-ui`). This crate exists so that
//! trybuild, which builds every dependency of the crate that runs it in a target directory of its
//! own, builds only what the cases use (the runtime with rmcp, serde, tokio) and not the stores,
//! database drivers and HTTP stacks of the integration tests.
