//! `client_key_field` names a JSON path and needs `client_key`; `answers` is for rmcp tools and
//! takes "mcp", "acp" or "ucp".
#![allow(dead_code)]
use idempotency::mcp::Identity;
use idempotency::{idempotent, idempotent_tools, Caller, Error, Idempotency, IdempotencyContext};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_router, RoleServer};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Meta {
    idempotency_key: Option<String>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Args {
    meta: Meta,
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

#[idempotent(answers = "acp", on_error = "retryable")]
async fn plain(_ctx: &Ctx, args: Args) -> Result<String, Error> {
    Ok(args.order_id)
}

struct Shop {
    engine: Idempotency,
    identity: Identity,
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
    #[idempotent(client_key_field = "meta.idempotency_key", on_error = "retryable")]
    #[tool]
    async fn unsaid(&self, Parameters(args): Parameters<Args>) -> Result<String, String> {
        Ok(args.order_id)
    }

    #[idempotent(client_key = "require", client_key_field = "meta.", on_error = "retryable")]
    #[tool]
    async fn malformed(&self, Parameters(args): Parameters<Args>) -> Result<String, String> {
        Ok(args.order_id)
    }

    #[idempotent(client_key = "require", answers = "stripe", on_error = "retryable")]
    #[tool]
    async fn unknown_shape(&self, Parameters(args): Parameters<Args>) -> Result<String, String> {
        Ok(args.order_id)
    }
}

fn main() {}
