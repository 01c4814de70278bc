//! `idempotency-admin`'s tests, one binary (a module per topic beside this file), so `cargo test`
//! links it once.

mod cli;
mod no_store;
mod sqlite_first_start;
mod tls;
