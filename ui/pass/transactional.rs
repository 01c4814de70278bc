//! `transactional` on a free function and on an rmcp tool method: the attribute expands (the
//! tool registers itself for the start-up check) and the hint is still emitted.
#![allow(dead_code)]
use idempotency::mcp::Identity;
use idempotency::{idempotent, idempotent_tools, Caller, Error, Idempotency, IdempotencyContext};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_router, RoleServer};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Args {
    order_id: String,
}

struct Ctx {
    engine: Idempotency,
}

impl IdempotencyContext for Ctx {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, _: &()) -> Result<Caller, Error> {
        Ok(Caller::new("acme", "alice"))
    }
}

#[idempotent(window = "1h", business_key = "order_id", transactional, on_error = "retryable")]
async fn place_order(_ctx: &Ctx, args: Args) -> Result<String, Error> {
    Ok(args.order_id)
}

#[derive(Clone)]
struct Shop {
    engine: Idempotency,
    identity: Identity,
    tool_router: ToolRouter<Self>,
}

impl IdempotencyContext<RequestContext<RoleServer>> for Shop {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

#[idempotent_tools]
#[tool_router]
impl Shop {
    #[idempotent(window = "1h", transactional, on_error = "retryable")]
    #[tool(description = "Place an order.")]
    async fn order(&self, Parameters(args): Parameters<Args>) -> Result<String, String> {
        Ok(args.order_id)
    }
}

pub(crate) fn main() {
    assert!(place_order::TOOL.is_transactional());
    assert!(Shop::ORDER_TOOL.is_transactional());
    let hint = Shop::tool_router()
        .list_all()
        .into_iter()
        .find(|t| t.name == "order")
        .and_then(|t| t.annotations)
        .and_then(|a| a.idempotent_hint);
    assert_eq!(hint, Some(true));
}
