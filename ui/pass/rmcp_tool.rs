//! An rmcp tool: #[idempotent] above #[tool] in a #[tool_router] impl checked by
//! #[idempotent_tools]; the hint is merged into `annotations(...)`.

use idempotency::mcp::Identity;
use idempotency::store::MemoryStore;
use idempotency::{idempotent, idempotent_tools, Caller, Error, Idempotency, IdempotencyContext};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_router, RoleServer};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    amount: u64,
}

#[derive(Serialize, Deserialize)]
struct Receipt {
    amount: u64,
}

struct Payments {
    engine: Idempotency,
    identity: Identity,
}

impl IdempotencyContext<RequestContext<RoleServer>> for Payments {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

#[idempotent_tools]
#[tool_router]
impl Payments {
    /// Charge a card.
    #[idempotent(window = "15m", on_error = "definitive")]
    #[tool(annotations(title = "Charge"))]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Receipt, String> {
        Ok(Receipt {
            amount: args.amount,
        })
    }

    #[idempotent(on_error = "retryable")]
    #[tool(
        name = "refund_v1",
        description = "Refund",
        annotations(idempotent_hint = true)
    )]
    async fn refund(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
        request: RequestContext<RoleServer>,
    ) -> Result<u64, String> {
        let _ = request;
        Ok(args.amount)
    }

    #[idempotent(on_error = "retryable", business_key = "amount")]
    #[tool]
    async fn hold(
        &self,
        _: RequestContext<RoleServer>,
        params: Parameters<ChargeArgs>,
    ) -> Result<u64, String> {
        Ok(params.0.amount)
    }

    /// The client's own key, with the request also read by the body.
    #[idempotent(on_error = "retryable", client_key = "require", scope = "subject")]
    #[tool]
    async fn pay(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
        request: RequestContext<RoleServer>,
    ) -> Result<u64, String> {
        let _ = request.meta;
        Ok(args.amount)
    }

    #[tool(description = "Not wrapped, no hint")]
    async fn list(&self) -> String {
        String::new()
    }
}

pub(crate) fn main() {
    let router: ToolRouter<Payments> = Payments::tool_router();
    let mut hints: Vec<(String, Option<bool>)> = router
        .list_all()
        .into_iter()
        .map(|t| {
            (
                t.name.to_string(),
                t.annotations.and_then(|a| a.idempotent_hint),
            )
        })
        .collect();
    hints.sort();
    assert_eq!(
        hints,
        vec![
            ("charge_card".to_string(), Some(true)),
            ("hold".to_string(), Some(true)),
            ("list".to_string(), None),
            ("pay".to_string(), Some(true)),
            ("refund_v1".to_string(), Some(true)),
        ]
    );
    assert_eq!(Payments::REFUND_TOOL.name(), "refund_v1");
    let _ = Payments {
        engine: Idempotency::new(MemoryStore::new()),
        identity: Identity::http_only(),
    };
}
