//! The MCP side of generated code: a wrapped rmcp tool's call (`Call`, or a `Task`), what
//! its signature names, and what its `#[tool]` attribute lists.

mod call;
mod task;

// `refuse` for the tests that check every refusal's status (`tests/behaviour.rs`).
pub use crate::mcp::answer::refuse;
pub use crate::mcp::arguments::{closed_input_schema, RawArguments};
pub use crate::mcp::client_key::client_key_meta;
pub use crate::mcp::interim::Interim;
pub use call::{Call, Keys};
pub use task::Task;

/// A wrapped tool's return type: its result, or a JSON-RPC error.
pub type Answer = Result<rmcp::model::CallToolResult, rmcp::ErrorData>;

/// A wrapped tool's return type when it may answer with an input round or a task.
pub type Response = Result<rmcp::model::CallToolResponse, rmcp::ErrorData>;

/// What an rmcp tool's caller is read from.
pub type Request = rmcp::service::RequestContext<rmcp::RoleServer>;
