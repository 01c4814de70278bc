//! #[idempotent] placed below #[tool]: rmcp has already rewritten the method.
#![allow(dead_code)]
use idempotency::mcp::Identity;
use idempotency::{idempotent, Caller, Error, Idempotency, IdempotencyContext};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_router, RoleServer};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
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

#[tool_router]
impl Payments {
    #[tool(description = "Charge a card")]
    #[idempotent(on_error = "retryable")]
    async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<u64, String> {
        Ok(args.amount)
    }
}

fn main() {}
