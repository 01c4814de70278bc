//! rmcp routes no tools in a trait impl: a wrapped `#[tool]` there is an error at `#[tool]` that
//! says where to put it instead.
// The rejected method is emitted without `#[idempotent]` and `#[tool]`, so their imports go unused.
#![allow(dead_code, unused_imports)]
use idempotency::mcp::Identity;
use idempotency::{idempotent, idempotent_tools, Caller, Error, Idempotency, IdempotencyContext};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, RoleServer};
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

trait Charging {
    async fn charge_card(&self, args: Parameters<ChargeArgs>) -> Result<u64, String>;
}

#[idempotent_tools]
impl Charging for Payments {
    #[idempotent(on_error = "retryable")]
    #[tool(description = "Charge a card")]
    async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<u64, String> {
        Ok(args.amount)
    }
}

fn main() {}
