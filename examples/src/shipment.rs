//! The `create_shipment` server: keyed by `business_key = "order_id"`; the carrier receives the
//! reference as its own; the same order with another address is a payload mismatch.
//!
//! Arguments are checked before anything happens, and a refusal of bad arguments is classified
//! [`Disposition::Retryable`]: the claim is released, nothing is stored, so the corrected call
//! for the same order runs (under the same reference) instead of meeting the refusal as a
//! stored answer — or, with other arguments, as a payload mismatch — for the whole window.

use std::sync::Arc;

use idempotency::mcp::{status_router, Identity};
use idempotency::store::{Settlement, StoredResponse, Unsettled};
use idempotency::tasks::Reconcile;
use idempotency::{
    idempotent, idempotent_tools, Call, Caller, Classify, Disposition, Error, Idempotency,
    IdempotencyContext,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
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

impl ShipmentArgs {
    /// Checks the arguments before the carrier is asked (and before anything is stored).
    pub fn validate(&self) -> Result<(), ShipmentError> {
        if self.order_id.trim().is_empty() {
            return Err(ShipmentError::Invalid("the order id is empty".into()));
        }
        if self.address.trim().is_empty() {
            return Err(ShipmentError::Invalid("the address is empty".into()));
        }
        if self.weight_grams == 0 {
            return Err(ShipmentError::Invalid("the weight is zero".into()));
        }
        Ok(())
    }
}

/// Why a shipment could not be created.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub enum ShipmentError {
    /// The arguments are wrong; nothing was sent to the carrier. Correct them and call again.
    #[error("invalid shipment, nothing was created: {0}. Correct it and call again.")]
    Invalid(String),
}

impl Classify for ShipmentError {
    fn disposition(&self) -> Disposition {
        match self {
            // Nothing happened: release the claim so the corrected call for this order can run.
            // Stored as a final answer, it would hold the order id for the whole window.
            ShipmentError::Invalid(_) => Disposition::Retryable,
        }
    }
}

/// The shipping MCP server.
#[derive(Clone, Debug)]
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

/// Settles a `create_shipment` claim whose worker never reported, from the carrier's record of
/// its reference: a label exists → it is the answer; none → released.
pub fn reconciler(carrier: Arc<Carrier>) -> impl Reconcile {
    move |claim: Unsettled| {
        let carrier = carrier.clone();
        async move {
            match carrier.find(&claim.reference.to_string()) {
                Some(label) => Ok(Settlement::Completed(StoredResponse {
                    ok: true,
                    body: serde_json::to_string(&label)?,
                })),
                None => Ok(Settlement::Released),
            }
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
    #[idempotent(
        business_key = "order_id",
        window = "24h",
        recover = "rerun",
        timeout = "30s"
    )]
    #[tool(
        description = "Create the shipment of an order. One shipment per order id: repeating it returns the same tracking number; the same order with different details is refused."
    )]
    async fn create_shipment(
        &self,
        Parameters(args): Parameters<ShipmentArgs>,
    ) -> Result<Label, ShipmentError> {
        // First, before any side effect: a refusal here releases the claim (see Classify).
        args.validate()?;
        let reference = Call::current()
            .map(|c| c.reference().to_string())
            .unwrap_or_default();
        Ok(self.carrier.create_label(&reference, &args.order_id))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Shipping {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("idempotency-create-shipment", env!("CARGO_PKG_VERSION"))
                .with_title("Shipping (idempotency example)"),
        )
    }
}
