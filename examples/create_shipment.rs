//! The create_shipment MCP server. No arguments: stdio. `--http ADDR`: streamable HTTP.
//! Store: SQLite file `idempotency.db` by default, PostgreSQL when `DATABASE_URL` is set.

use std::sync::Arc;

use idempotency::mcp::Identity;
use idempotency_examples::shipment::{self, Shipping};
use idempotency_examples::{carrier::Carrier, Transport};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    idempotency_examples::exit(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    idempotency_examples::init_logging();
    let transport = Transport::from_args()?;
    let carrier = Arc::new(Carrier::default());
    let (engine, store) =
        idempotency_examples::engine_from_env(shipment::reconciler(carrier.clone())).await?;
    tracing::info!("create_shipment server on {store}");
    let identity = Identity::stdio(idempotency_examples::stdio_caller());
    idempotency_examples::serve(
        move || Shipping::new(engine.clone(), identity.clone(), carrier.clone()),
        transport,
    )
    .await
}
