//! What the example tests share: an rmcp client, a tool call, a SQLite file or a PostgreSQL
//! schema of their own. Each test binary uses a part of it.
#![allow(dead_code, reason = "each test binary uses a part of it")]

pub(crate) mod pg;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::RoleClient;
use serde_json::Value;

/// An rmcp client with no handler of its own.
pub(crate) type Client = RunningService<RoleClient, ()>;

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
