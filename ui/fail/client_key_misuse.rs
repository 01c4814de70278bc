//! `client_key` is for rmcp tools, takes "accept" or "require", and is the call's only key.
#![allow(dead_code)]
use idempotency::mcp::Identity;
use idempotency::{idempotent, idempotent_tools, Caller, Error, Idempotency, IdempotencyContext};
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

#[idempotent(client_key = "accept", on_error = "retryable")]
async fn plain(_ctx: &Ctx, args: Args) -> Result<String, Error> {
    Ok(args.order_id)
}

struct Orders {
    engine: Idempotency,
    identity: Identity,
}

impl IdempotencyContext<RequestContext<RoleServer>> for Orders {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

#[idempotent_tools]
#[tool_router]
impl Orders {
    #[idempotent(client_key = "requir", on_error = "retryable")]
    #[tool]
    async fn misspelt(&self, Parameters(args): Parameters<Args>) -> Result<String, String> {
        Ok(args.order_id)
    }

    #[idempotent(client_key = "accept", business_key = "order_id", on_error = "retryable")]
    #[tool]
    async fn two_keys(&self, Parameters(args): Parameters<Args>) -> Result<String, String> {
        Ok(args.order_id)
    }

    #[idempotent(client_key = "require", scope = "tenant", on_error = "retryable")]
    #[tool]
    async fn shared(&self, Parameters(args): Parameters<Args>) -> Result<String, String> {
        Ok(args.order_id)
    }
}

fn main() {}
