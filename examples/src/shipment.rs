//! The `create_shipment` server: keyed by `business_key = "order_id"`; the carrier receives the
//! reference as its own; the same order with another address is a payload mismatch.

use std::sync::Arc;

use idempotency::mcp::{status_router, Identity};
use idempotency::{
    idempotent, idempotent_tools, Call, Caller, Error, Idempotency, IdempotencyContext,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_handler, tool_router, RoleServer, ServerHandler};
use serde::{Deserialize, Serialize};

use crate::carrier::{Carrier, Label};

/// The arguments of `create_shipment`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShipmentArgs {
    /// The order to ship: unique in the tenant, so it is the business key.
    pub order_id: String,
    /// Where to.
    pub address: String,
    /// Parcel weight in grams.
    #[serde(default = "default_weight")]
    pub weight_grams: u32,
}

fn default_weight() -> u32 {
    1000
}

/// Why a shipment could not be created.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub enum ShipmentError {
    /// The address was refused by the carrier.
    #[error("the carrier refused the address: {0}")]
    BadAddress(String),
}

/// The shipping MCP server.
#[derive(Clone)]
pub struct Shipping {
    engine: Idempotency,
    identity: Identity,
    /// The stub carrier (shared, so tests can count labels).
    pub carrier: Arc<Carrier>,
    tool_router: ToolRouter<Self>,
}

impl Shipping {
    /// A server on `engine`, shipping through `carrier`.
    pub fn new(engine: Idempotency, identity: Identity, carrier: Arc<Carrier>) -> Self {
        Shipping {
            engine,
            identity,
            carrier,
            tool_router: Self::tool_router() + status_router::<Self>(),
        }
    }
}

impl IdempotencyContext<RequestContext<RoleServer>> for Shipping {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

#[idempotent_tools]
#[tool_router]
impl Shipping {
    /// Create a shipment for an order, once per order.
    #[idempotent(business_key = "order_id", window = "24h", on_error = "definitive")]
    #[tool(
        description = "Create the shipment of an order. One shipment per order id: repeating it returns the same tracking number; the same order with different details is refused."
    )]
    async fn create_shipment(
        &self,
        Parameters(args): Parameters<ShipmentArgs>,
    ) -> Result<Label, ShipmentError> {
        if args.address.trim().is_empty() {
            return Err(ShipmentError::BadAddress("empty address".into()));
        }
        let reference = Call::current()
            .map(|c| c.reference().to_string())
            .unwrap_or_default();
        Ok(self.carrier.create_label(&reference, &args.order_id))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Shipping {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}
