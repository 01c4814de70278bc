//! rmcp tools: arguments come as `Parameters<T>`, the context is always `self`, and the future
//! must be `Send` (rmcp's `local` tools are refused).
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
    #[idempotent(on_error = "retryable", context = "ctx")]
    #[tool(description = "Charge a card")]
    async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<u64, String> {
        Ok(args.amount)
    }

    #[idempotent(on_error = "retryable")]
    #[tool(description = "Status")]
    async fn status(&self) -> Result<u64, String> {
        Ok(1)
    }

    #[idempotent(on_error = "retryable")]
    #[tool(description = "Refund", local)]
    async fn refund(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<u64, String> {
        Ok(args.amount)
    }
}

fn main() {}
