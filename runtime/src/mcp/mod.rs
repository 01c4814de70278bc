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
//! See `examples/` for complete servers.

mod answer;
pub(crate) mod arguments;
mod identity;
mod interim;
pub(crate) mod progress;
mod session;
mod status;
pub mod task;

pub use answer::{answer, answer_verbatim, refuse, META_REF, META_REPLAYED, META_STATUS, STATUSES};
pub use identity::Identity;
pub use interim::{answer_response, split_response, Interim};
pub use session::CallerBoundSessions;
pub use status::{status_router, status_tool};
