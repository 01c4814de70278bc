//! `--ucp`: UCP's `complete_checkout` tool beside ACP's (UCP's `checkout-mcp.md`): `{meta, id,
//! checkout}` arguments, the client key in `meta["idempotency-key"]` (required on complete), the
//! wrapper's refusals as UCP messages (`answers = "ucp"`). It completes a session of this
//! merchant, created through ACP; its own record is apart from ACP's (another tool name).

use rmcp::handler::server::wrapper::Json;
use rmcp::schemars;
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::mcp::AcpServer;
use super::{AcpError, CheckoutSession, Operation};

/// UCP's `meta`: the agent's profile and the key.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UcpMeta {
    /// The platform's UCP agent profile (`{"profile": "https://…"}`).
    #[serde(rename = "ucp-agent")]
    pub ucp_agent: Value,
    /// The client's idempotency key (a UUID), the same on every retry.
    #[serde(
        rename = "idempotency-key",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub idempotency_key: Option<String>,
}

/// `complete_checkout`'s arguments.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UcpComplete {
    /// Protocol metadata.
    pub meta: UcpMeta,
    /// The checkout (this merchant's session id).
    pub id: String,
    /// The checkout's payment, as UCP sends it (`{"payment": {"instruments": [...]}}`).
    pub checkout: Value,
}

/// Completes the session `args.id` (charging once under the call's reference).
pub(super) async fn complete(
    server: &AcpServer,
    args: UcpComplete,
    ctx: &RequestContext<RoleServer>,
) -> Result<Json<CheckoutSession>, AcpError> {
    let instruments = args.checkout["payment"]["instruments"].as_array();
    if instruments.is_none_or(|i| i.is_empty()) {
        return Err(AcpError::invalid(
            "checkout.payment.instruments must list the payment instrument; nothing was charged"
                .into(),
            Some("$.checkout.payment.instruments".into()),
        ));
    }
    let acp = super::AcpArgs {
        meta: super::Meta {
            api_version: super::API_VERSIONS[0].to_owned(),
            ..Default::default()
        },
        id: Some(args.id),
        payload: None,
    };
    let caller = server.caller_of(ctx)?;
    let reference = idempotency::Call::current()
        .map(|c| c.reference().to_string())
        .unwrap_or_default();
    server
        .merchant()
        .run(Operation::Complete, &caller, acp, &reference)
        .await
        .map(Json)
}
