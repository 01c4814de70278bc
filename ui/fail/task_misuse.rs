//! `task` is for rmcp tools whose answer can be a task's result.
#![allow(dead_code)]
use idempotency::mcp::Identity;
use idempotency::{idempotent, Caller, Error, Idempotency, IdempotencyContext};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResponse;
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_router, RoleServer};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Args {
    rows: u64,
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

#[idempotent(task, on_error = "retryable")]
async fn export(_ctx: &Ctx, args: Args) -> Result<u64, Error> {
    Ok(args.rows)
}

#[derive(Clone)]
struct Reports {
    engine: Idempotency,
    identity: Identity,
}

impl IdempotencyContext<RequestContext<RoleServer>> for Reports {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

#[tool_router]
impl Reports {
    #[idempotent(task, on_error = "retryable")]
    #[tool]
    async fn ask(&self, Parameters(args): Parameters<Args>) -> Result<CallToolResponse, Error> {
        let _ = args.rows;
        Ok(rmcp::model::InputRequiredResult::from_request_state("s").into())
    }
}

fn main() {}
