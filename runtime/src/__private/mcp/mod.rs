//! The MCP side of generated code: a wrapped rmcp tool's call (`Call`, or a `Task`), what
//! its signature names, and what its `#[tool]` attribute lists.

mod call;
mod task;

// `refuse` for the tests that check every refusal's status (`tests/behaviour.rs`).
pub use crate::mcp::answer::refuse;
pub use crate::mcp::arguments::RawArguments;
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

/// The input schema listed for a wrapped tool taking `T`: rmcp's, closed
/// (`additionalProperties: false`) as the wrapper refuses fields it cannot key, except for the
/// objects its `ignore` opens (`["meta.*"]`); rmcp's message when `T`'s schema is unusable.
pub fn input_schema<T: rmcp::schemars::JsonSchema + std::any::Any>(
    open: &[&str],
) -> Result<std::sync::Arc<rmcp::model::JsonObject>, String> {
    rmcp::handler::server::common::schema_for_input::<T>()
        .map(|schema| crate::mcp::arguments::closed_input_schema(schema, open))
}

/// The output schema listed for a wrapped tool answering `Json<T>`, as rmcp infers it for an
/// unwrapped tool (whose return type it reads, and which the wrapper rewrites).
pub fn output_schema<T: rmcp::schemars::JsonSchema + std::any::Any>(
) -> std::sync::Arc<rmcp::model::JsonObject> {
    rmcp::handler::server::tool::schema_for_output::<T>()
}
