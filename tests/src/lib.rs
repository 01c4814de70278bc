//! Shared helpers for the integration tests.

pub mod pg;
pub mod proxy;
#[cfg(feature = "redis")]
pub mod redis_servers;
pub mod scripted;
