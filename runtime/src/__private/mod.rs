//! What `#[idempotent]` generates code against. Not a public API: names here change without notice.
//! One file per concern: `key` (the key from the typed arguments), `plain` (a plain function's
//! call), `mcp` (an rmcp tool's call and answer).

pub use crate::error::Error;
pub use crate::key::Scope;
pub use crate::outcome::ErrorPolicy;
pub use crate::tool::{Recover, TaskTool, ToolSpec, TransactionalTool};
pub use core::convert::From;
pub use core::option::Option;
pub use core::result::Result;
pub use core::time::Duration;
pub use inventory;

#[cfg(feature = "rmcp")]
pub use ::rmcp;

/// The MCP side of generated code.
#[cfg(feature = "rmcp")]
pub mod mcp;

/// A wrapped plain function's call.
pub mod plain;

mod key;
pub use key::*;
