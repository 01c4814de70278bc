//! Shared helpers for the integration tests.

pub mod proxy;
pub mod pg;
