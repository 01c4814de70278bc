//! The example servers' tests, one binary (a module per topic beside this file, their shared
//! client and database helpers in `common/`), so `cargo test` links it once.

mod acp_checkout;
mod common;
mod mcp;
mod place_order;
mod protocols;
mod readme;
mod skew;
mod tasks;
