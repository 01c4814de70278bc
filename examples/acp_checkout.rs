//! The acp_checkout example merchant: ACP's checkout over REST and over MCP from one process.
//!
//! `acp_checkout --http ADDR [--stateless] [--ucp]` serves `POST /checkout_sessions`,
//! `POST /checkout_sessions/{id}`, `…/{id}/complete`, `…/{id}/cancel` and
//! `GET /checkout_sessions/{id}`, and the five ACP tools at `http://ADDR/mcp` (with `--ucp`, also
//! UCP's `complete_checkout`), callers identified by bearer token (`acme-token`, `globex-token`).
//! Store: SQLite file `idempotency.db` by default, PostgreSQL with `DATABASE_URL`, Redis with
//! `REDIS_URL`. The stub processor prints `charged <order id> ref=<reference>` on stderr per charge
//! (`ACP_PROCESSOR_GATE`, `ACP_PROCESSOR_FAILURES`: see `idempotency_examples::acp::processor`).
//! docs/acp-checkout.md has curl lines.

use std::sync::Arc;

use idempotency::mcp::Identity;
use idempotency_examples::acp::{self, mcp::AcpServer, processor::Processor, Merchant};
use idempotency_examples::Transport;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    idempotency_examples::exit(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    idempotency_examples::init_logging();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ucp = args.iter().any(|a| a == "--ucp");
    let rest: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "--ucp")
        .collect();
    let transport = match Transport::parse(&rest)? {
        Transport::Stdio => {
            return Err("usage: acp_checkout --http ADDR [--stateless] [--ucp]: ACP's REST routes and its MCP binding are served over HTTP".into())
        }
        http => http,
    };
    let processor = Arc::new(Processor::from_env()?);
    let merchant = Arc::new(Merchant::new(processor.clone())?);
    let (engine, store) = acp::engine_from_env().await?;
    tracing::info!("acp_checkout merchant on {store}");
    let mut routes = acp::rest::router(&engine, merchant.clone());
    if processor.gated() {
        tracing::warn!("ACP_PROCESSOR_GATE=1: every charge waits for POST /_processor/release");
        routes = routes.merge(acp::rest::gate_router(merchant.clone()));
    }
    if ucp {
        tracing::info!("--ucp: UCP's complete_checkout tool is served too");
    }
    let identity = Identity::http_only();
    idempotency_examples::serve_with(
        move || AcpServer::new(engine.clone(), identity.clone(), merchant.clone(), ucp),
        transport,
        Some(routes),
    )
    .await
}
