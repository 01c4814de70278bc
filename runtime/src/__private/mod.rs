//! What `#[idempotent]` generates code against. Not a public API: names here change without notice.
//! One file per concern: `tool` (the descriptor), `key` (the key from the typed arguments),
//! `plain` (a plain function's call), `mcp` (an rmcp tool's call and answer).

pub use crate::outcome::ErrorPolicy;
pub use crate::tool::ToolSpec;
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

mod tool;
pub use tool::Tool;
