//! MCP integration (feature `rmcp`): identity from the request, honest tool results, the status
//! tool.
//!
//! A server implements [`IdempotencyContext`](crate::IdempotencyContext) with the request type
//! [`RequestContext<RoleServer>`](rmcp::service::RequestContext): the same trait plain handlers
//! implement with `()`, so one server type can serve both.
//!
//! ```ignore
//! #[derive(Clone)]
//! struct Payments { engine: Idempotency, identity: Identity, tool_router: ToolRouter<Self> }
//!
//! impl IdempotencyContext<RequestContext<RoleServer>> for Payments {
//!     fn idempotency(&self) -> &Idempotency { &self.engine }
//!     fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
//!         self.identity.resolve(request)
//!     }
//! }
//!
//! #[idempotent_tools]
//! #[tool_router]
//! impl Payments {
//!     #[idempotent(window = "15m")]
//!     #[tool(description = "Charge a card")]
//!     async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<Receipt, ChargeError> { ... }
//! }
//!
//! // one line adds the status tool:
//! let tool_router = Payments::tool_router() + idempotency::mcp::status_router::<Payments>();
//! ```
//!
//! With `#[idempotent(client_key = "accept" | "require")]`, a key the client software sends in
//! the request's `_meta` ([`META_KEY`]) or the [`HEADER`] HTTP header keys the call; a conflict
//! or a repeat in progress is a JSON-RPC error whose `data.type` is [`KEY_CONFLICT`] or
//! [`KEY_IN_PROGRESS`], as the closed proposal SEP-3182 proposed.
//!
//! See `examples/` for complete servers.

pub(crate) mod answer;
pub(crate) mod argument_key;
pub(crate) mod arguments;
pub(crate) mod client_key;
pub(crate) mod commerce;
mod identity;
pub(crate) mod interim;
pub(crate) mod origin;
pub(crate) mod progress;
mod session;
mod status;
mod task_id;
pub(crate) mod task_impl;

pub(crate) use answer::answer_verbatim;
pub use answer::{META_REF, META_REPLAYED, META_STATUS, STATUSES};
pub use client_key::{
    HEADER, IN_PROGRESS_CODE, KEY_CONFLICT, KEY_INVALID, KEY_IN_PROGRESS, KEY_MISSING, META_KEY,
    TOOL_META_CLIENT_KEY,
};
pub use commerce::{RETRY_AFTER_SECS, SERVER_ERROR};
pub use identity::Identity;

/// Wrapped tools as MCP tasks (the tasks extension, SEP-2663), durable in the idempotency store.
///
/// A tool wrapped with `#[idempotent(task)]` answers a client that declared the tasks extension
/// with a task handle instead of waiting for the body:
///
/// - a task id names one claim of the operation: `{reference}@{claim time in ms}`, the store's
///   claim time (every new claim of a record is later than the one before). The key is claimed
///   (durably, in the store) before the body starts and before the handle is returned, so
///   `tasks/get` finds it on any replica sharing the store, and after a restart;
/// - a repeat of the call (same key) gets the same task id: running → the handle (`working`)
///   instead of an "in flight" error; completed → the handle, whose `tasks/get` gives the stored
///   result; nothing runs twice;
/// - a task never leaves a terminal state. In flight → `working`; completed → `completed` with
///   the stored `CallToolResult` (a definitive error is a completed `isError` result, as for any
///   tool); released (a retryable error: nothing was done) → `failed`, saying it is safe to call
///   again — the call sent again is a new claim and a new task id, and the old id stays
///   `failed`; outcome not known yet (its worker gone, the lease passed, or the outcome lost) →
///   `working`, polled every [`UNSETTLED_POLL_INTERVAL_MS`](crate::mcp::task::UNSETTLED_POLL_INTERVAL_MS),
///   until it is settled, then the outcome that stands. With `recover = "rerun"`, the call sent
///   again continues the same claim under the same id, which then completes;
/// - `tasks/cancel` is acknowledged for a task the caller owns and does not interrupt the work:
///   a side effect stopped halfway is worse than one finished, and cancellation is cooperative
///   (the status may lag); `tasks/get` keeps telling the truth;
/// - a client without the tasks extension (or a server that does not declare it) gets the same
///   tool answered inline, from the same record (a task tool always stores its answer as the
///   `CallToolResult` it renders).
///
/// The server declares the extension (`ServerCapabilities::builder().enable_tasks()`) and routes
/// `tasks/get` and `tasks/cancel` to [`get_task`](crate::mcp::task::get_task) and
/// [`cancel_task`](crate::mcp::task::cancel_task).
pub mod task {
    pub use super::task_impl::{
        cancel_task, get_task, POLL_INTERVAL_MS, UNSETTLED_POLL_INTERVAL_MS,
    };
}
pub use session::CallerBoundSessions;
pub use status::{status_router, status_tool};
