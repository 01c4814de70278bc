//! Compile-time tests of `#[idempotent]` and `#[idempotent_tools]`. The cases that must compile
//! and run (`pass/`) are modules of one test binary, `tests/pass.rs`, built with the workspace.
//! The rejections (`fail/`: message and span of each) are checked by trybuild (`tests/ui.rs`),
//! which checks every dependency of the crate that runs it again in a target directory of its
//! own: this crate exists so that it checks only what the cases use (the runtime with rmcp, serde,
//! tokio), not the stores' drivers and HTTP stacks of the integration tests.
