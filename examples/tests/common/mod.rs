//! What the example tests share: an rmcp client, a tool call, a SQLite file or a PostgreSQL
//! schema of their own. Each test binary uses a part of it.
#![allow(dead_code, reason = "each test binary uses a part of it")]

pub(crate) mod pg;

use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServerHandler, ServiceExt};
use serde_json::Value;

/// An rmcp client with no handler of its own.
pub(crate) type Client = RunningService<RoleClient, ()>;

/// A client of `server`, in process (a duplex pipe).
pub(crate) async fn connect<S: ServerHandler + Send + Sync + 'static>(server: S) -> Client {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(s) = server.serve(server_io).await {
            let _ = s.waiting().await;
        }
    });
    ().serve(client_io).await.expect("client connects")
}

/// Fails the test instead of hanging it when an awaited event never comes (a guard, not a wait:
/// every event here arrives in milliseconds).
pub(crate) async fn soon<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// `tools/call` with JSON arguments; a transport or protocol failure fails the test.
pub(crate) async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let args = args.as_object().cloned().unwrap_or_default();
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .expect("call_tool")
}

/// A SQLite file path of this test process, removed first.
pub(crate) fn temp_db(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("idem-ex-{name}-{}.db", std::process::id()));
    remove_db(&p);
    p
}

/// Removes a SQLite file and its WAL companions.
pub(crate) fn remove_db(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
