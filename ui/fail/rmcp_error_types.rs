//! An rmcp tool's types: `E` must display (the tool's error text), `T` must be stored and
//! replayed (`Serialize + DeserializeOwned`); each is reported at the type, once.
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

#[derive(Debug)]
struct Bare;

struct Receipt;

#[tool_router]
impl Payments {
    #[idempotent(on_error = "retryable")]
    #[tool(description = "An error that cannot be shown")]
    async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<u64, Bare> {
        Ok(args.amount)
    }

    #[idempotent(on_error = "retryable")]
    #[tool(description = "An answer that cannot be stored")]
    async fn refund(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<Receipt, String> {
        let _ = args.amount;
        Ok(Receipt)
    }
}

fn main() {}
