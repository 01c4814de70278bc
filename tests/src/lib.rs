//! Shared helpers for the integration tests.

#[cfg(all(feature = "sqlite", feature = "redis"))]
pub mod backends;
pub mod charge;
pub mod conformance;
pub mod far;
pub mod pg;
pub mod processes;
pub mod proxy;
pub mod raw;
#[cfg(feature = "redis")]
pub mod redis_servers;
pub mod scripted;
pub mod sqlite_file;

/// The example tool most tests key their calls for: only its name (and default scope) matters to
/// the key.
pub const CHARGE_CARD: idempotency::tool::ToolSpec =
    idempotency::tool::ToolSpec::new("charge_card", std::time::Duration::from_secs(900));
