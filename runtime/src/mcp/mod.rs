//! MCP integration (feature `rmcp`): identity from the request, honest tool results, the status
//! tool.
//!
//! ```ignore
//! #[derive(Clone)]
//! struct Payments { engine: Idempotency, identity: Identity, tool_router: ToolRouter<Self> }
//!
//! impl IdempotentServer for Payments {
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
mod identity;
mod status;

pub use answer::{answer, refuse, META_REF, META_REPLAYED, META_STATUS};
pub use identity::Identity;
pub use status::{status_router, status_tool};

use rmcp::service::RequestContext;
use rmcp::RoleServer;

use crate::{Caller, Error, Idempotency};

/// An rmcp server whose tools are wrapped with `#[idempotent]`: where the engine is, and who is
/// calling (from the request — the HTTP auth middleware's identity or the server's configured
/// stdio identity — never from the model's arguments).
pub trait IdempotentServer: Send + Sync + 'static {
    /// The engine (store and clock).
    fn idempotency(&self) -> &Idempotency;
    /// The caller of this request. [`Identity::resolve`] does the usual thing.
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error>;
}
