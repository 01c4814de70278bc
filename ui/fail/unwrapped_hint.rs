//! #[idempotent_tools]: `idempotent_hint = true` on a tool that is not wrapped.
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

use idempotency::idempotent_tools;

#[idempotent_tools]
#[tool_router]
impl Payments {
    #[idempotent(on_error = "retryable")]
    #[tool(description = "Charge a card")]
    async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<u64, String> {
        Ok(args.amount)
    }

    #[tool(
        description = "Refund",
        annotations(read_only_hint = false, idempotent_hint = true)
    )]
    async fn refund(&self, Parameters(args): Parameters<ChargeArgs>) -> String {
        args.amount.to_string()
    }
}

fn main() {}
