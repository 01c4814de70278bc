//! A `task` tool: its body outlives the request, so it reads `self` through its own clone of the
//! server (`self` as a value, passed on as `&Self`, and a `self::` path all keep working), and
//! the tool answers `CallToolResponse` (a task handle or the result). The server is an rmcp
//! `ServerHandler` (its capabilities say whether it serves tasks).

use idempotency::mcp::Identity;
use idempotency::{idempotent, idempotent_tools, Caller, Error, Idempotency, IdempotencyContext};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_router, RoleServer};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ExportArgs {
    rows: u64,
}

#[derive(Clone)]
struct Reports {
    engine: Idempotency,
    identity: Identity,
    prefix: String,
}

impl IdempotencyContext<RequestContext<RoleServer>> for Reports {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

fn name_of(reports: &Reports, rows: u64) -> String {
    format!("{}-{rows}", reports.prefix)
}

mod files {
    pub(super) const SUFFIX: &str = ".csv";
}

#[idempotent_tools]
#[tool_router]
impl Reports {
    /// Export rows.
    #[idempotent(task, on_error = "retryable")]
    #[tool]
    async fn export(&self, Parameters(args): Parameters<ExportArgs>) -> Result<String, Error> {
        Ok(format!("{}{}", name_of(self, args.rows), self::files::SUFFIX))
    }

    /// Export a chart.
    #[idempotent(task, on_error = "retryable")]
    #[tool]
    async fn chart(&self, Parameters(args): Parameters<ExportArgs>) -> Result<CallToolResult, Error> {
        let _ = self.prefix.len();
        Ok(CallToolResult::success(vec![rmcp::model::ContentBlock::text(args.rows.to_string())]))
    }
}

impl rmcp::ServerHandler for Reports {}

pub(crate) fn main() {
    let _ = Reports::tool_router();
    assert_eq!(Reports::EXPORT_TOOL.name(), "export");
}
