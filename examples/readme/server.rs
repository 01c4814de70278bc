use idempotency::key::Secret;
use idempotency::mcp::{status_router, Identity};
use idempotency::store::SqliteStore;
use idempotency::{idempotent, idempotent_tools, Call, Caller, Error, Idempotency, IdempotencyContext};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_handler, tool_router, RoleServer, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    amount_cents: u64,
    currency: String,
    card_token: String,
}
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
}

#[derive(Clone)]
struct Payments {
    engine: Idempotency,
    identity: Identity,
    tool_router: ToolRouter<Self>,
}

// The engine, and who is calling: from your authentication or start-up, never from the model.
impl IdempotencyContext<RequestContext<RoleServer>> for Payments {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

#[idempotent_tools]
#[tool_router]
impl Payments {
    #[idempotent(window = "15m", on_error = "retryable")]
    #[tool(description = "Charge a card. A repeat within 15 minutes returns the first receipt.")]
    async fn charge_card(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<Json<Receipt>, String> {
        let reference = Call::current().ok_or("not wrapped")?.reference().to_string();
        // Pass `reference` to the processor as its idempotency key; here, a stand-in receipt.
        Ok(Json(Receipt { charge_id: format!("ch_{reference}"), amount_cents: args.amount_cents }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Payments {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // Logs, the library's warnings among them, on stderr: stdout carries the protocol.
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let path = std::env::var("IDEMPOTENCY_SQLITE").unwrap_or_else(|_| "idempotency.db".into());
    // 16 bytes or more, the same on every replica; `start` checks the store was keyed with it.
    let secret = std::env::var("IDEMPOTENCY_SECRET").map_err(|_| "set IDEMPOTENCY_SECRET")?;
    let store = SqliteStore::open(path).await?; // or PostgresStore::connect(url)
    let engine = Idempotency::builder(store).secret(Secret::new(secret)?).start().await?;
    idempotency::tasks::Purger::new(&engine).spawn(); // deletes records past retention
    let server = Payments {
        engine,
        identity: Identity::stdio(Caller::new("acme", "alice")),
        tool_router: Payments::tool_router() + status_router::<Payments>(),
    };
    server.serve(rmcp::transport::stdio()).await?.waiting().await?;
    Ok(())
}
