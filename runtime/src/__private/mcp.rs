//! The MCP side of generated code: what a wrapped rmcp tool calls.

pub use crate::mcp::answer::{answer, answer_verbatim, refuse};
pub use crate::mcp::argument_key::argument_key;
pub use crate::mcp::arguments::{check_arguments, closed_input_schema, RawArguments};
pub use crate::mcp::client_key::{client_key, client_key_meta, keyed, ClientKeys, KeyedAnswer};
pub use crate::mcp::commerce::{commerce, Commerce};
pub use crate::mcp::interim::{answer_response, split_response, Interim};
pub use crate::mcp::origin::with_origin;
pub use crate::mcp::progress::{progress_of, reporting};
pub use crate::mcp::task_impl::{
    render as task_render, render_verbatim as task_render_verbatim, TaskCall,
};

/// Whether a `task` tool answers `request` with a task: the server declares the tasks
/// extension (SEP-2663), so `tasks/get` reaches it, and the request's client does too.
pub fn wants_task<S: rmcp::ServerHandler>(server: &S, request: &Request) -> bool {
    server.get_info().capabilities.supports_tasks()
        && request
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks())
}

/// [`refuse`] as the wrapped tool's own answer type (`CallToolResult` or `CallToolResponse`).
pub fn refuse_into<R: From<rmcp::model::CallToolResult>>(
    e: crate::Error,
) -> Result<R, rmcp::ErrorData> {
    refuse(e).map(R::from)
}

/// A wrapped tool's return type: its result, or a JSON-RPC error.
pub type Answer = Result<rmcp::model::CallToolResult, rmcp::ErrorData>;

/// A wrapped tool's return type when it may answer with an input round or a task.
pub type Response = Result<rmcp::model::CallToolResponse, rmcp::ErrorData>;

/// What an rmcp tool's caller is read from.
pub type Request = rmcp::service::RequestContext<rmcp::RoleServer>;
