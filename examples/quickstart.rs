//! The story in one command, on the embedded default (a SQLite file):
//! a model calls `charge_card`; the host retries while the first call is still running; later the
//! model repeats the call. The processor charges once.
//!
//! `cargo run -p idempotency-examples --bin quickstart`

use std::sync::Arc;
use std::time::Duration;

use idempotency::mcp::{Identity, META_REPLAYED};
use idempotency::store::SqliteStore;
use idempotency::{Caller, Idempotency};
use idempotency_examples::charge::{self, Payments};
use idempotency_examples::processor::Processor;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::ServiceExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn replayed(r: &CallToolResult) -> bool {
    r.meta
        .as_ref()
        .and_then(|m| m.0.get(META_REPLAYED))
        .and_then(|v| v.as_bool())
        == Some(true)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    idempotency_examples::exit(run().await)
}

async fn run() -> Result<(), BoxError> {
    let path =
        std::env::temp_dir().join(format!("idempotency-quickstart-{}.db", std::process::id()));
    let store = SqliteStore::open(&path).await?;
    println!("store: SQLite file {}", path.display());
    let processor = Arc::new(Processor::new(Duration::from_millis(1500)));
    let engine = Idempotency::builder(store)
        .reconcile(charge::reconciler(processor.clone()))
        .start()
        .await?;
    let server = Payments::new(
        engine,
        Identity::stdio(Caller::new("acme", "alice")),
        processor.clone(),
    );

    // An MCP client and the server, connected in-process.
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let running = tokio::spawn(async move {
        if let Ok(s) = server.serve(server_io).await {
            let _ = s.waiting().await;
        }
    });
    let client = Arc::new(().serve(client_io).await?);

    let tools = client.list_all_tools().await?;
    for t in &tools {
        let hint = t.annotations.as_ref().and_then(|a| a.idempotent_hint);
        println!(
            "tool {:<20} idempotentHint: {}",
            t.name,
            hint.map_or("-".to_string(), |h| h.to_string())
        );
    }

    let args =
        serde_json::json!({"amount_cents": 4200, "currency": "EUR", "card_token": "tok_visa_4242"});
    let call = || {
        let client = client.clone();
        let args = args.as_object().cloned().unwrap_or_default();
        async move {
            client
                .call_tool(CallToolRequestParams::new("charge_card").with_arguments(args))
                .await
        }
    };

    println!("\n1. the model calls charge_card (the processor takes 1.5 s)");
    let first = tokio::spawn(call());
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("2. the host times out and retries the same call while the first is running");
    let retry = call().await?;
    println!(
        "   -> isError={} {}",
        retry.is_error == Some(true),
        text(&retry)
    );
    let first = first.await??;
    println!("   first call -> {}", text(&first));
    println!("3. a minute later the model repeats the call");
    let later = call().await?;
    println!("   -> replayed={} {}", replayed(&later), text(&later));
    println!(
        "   same content as the first answer: {}",
        later.content == first.content
    );
    let reference = first
        .meta
        .as_ref()
        .and_then(|m| m.0.get(idempotency::mcp::META_REF))
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned();
    println!("4. the model asks the status tool about ref {reference}");
    let mut status_args = serde_json::Map::new();
    status_args.insert("ref".into(), serde_json::Value::String(reference));
    let status = client
        .call_tool(
            CallToolRequestParams::new(idempotency::error::STATUS_TOOL).with_arguments(status_args),
        )
        .await?;
    println!("   -> {}", text(&status));
    println!("\nthe processor counted {} charge(s)", processor.charges());

    drop(client);
    running.abort();
    let _ = std::fs::remove_file(&path);
    for ext in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{ext}", path.display()));
    }
    if processor.charges() != 1 {
        return Err("the processor charged more than once".into());
    }
    Ok(())
}
