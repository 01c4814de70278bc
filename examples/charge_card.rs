//! The charge_card MCP server. No arguments: stdio (what MCP hosts launch). `--http ADDR`:
//! streamable HTTP at `http://ADDR/mcp`, callers identified by bearer token.
//! Store: SQLite file `idempotency.db` by default, PostgreSQL when `DATABASE_URL` is set.

use std::sync::Arc;
use std::time::Duration;

use idempotency::mcp::Identity;
use idempotency_examples::charge::{self, Payments};
use idempotency_examples::{processor::Processor, Transport};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    idempotency_examples::exit(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    idempotency_examples::init_logging();
    let transport = Transport::from_args()?;
    let delay = std::env::var("PROCESSOR_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let processor = Arc::new(Processor::new(Duration::from_millis(delay)));
    let (engine, store) =
        idempotency_examples::engine_from_env(charge::reconciler(processor.clone())).await?;
    tracing::info!("charge_card server on {store}");
    let identity = Identity::stdio(idempotency_examples::stdio_caller());
    idempotency_examples::serve(
        move || Payments::new(engine.clone(), identity.clone(), processor.clone()),
        transport,
    )
    .await
}
