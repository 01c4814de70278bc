//! Shared helpers for the integration tests.

pub mod pg;
pub mod proxy;
pub mod scripted;
