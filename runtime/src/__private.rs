//! What `#[idempotent]` generates code against. Not a public API: names here change without notice.

pub use crate::engine::{Failure, Idempotency, IdempotencyContext, Prepared, ToolSpec};
pub use crate::error::Error;
pub use crate::key::Caller;
pub use crate::outcome::{Classify, ErrorPolicy, Outcome};
pub use core::option::Option;
pub use core::result::Result;
pub use core::time::Duration;
pub use serde::de::DeserializeOwned;
pub use serde::Serialize;

#[cfg(feature = "rmcp")]
pub use ::rmcp;

/// The MCP side of generated code.
#[cfg(feature = "rmcp")]
pub mod mcp {
    pub use crate::mcp::{answer, refuse, IdempotentServer};
}
