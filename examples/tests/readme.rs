//! The README's complete server is `examples/server.rs`, byte for byte, and it works: a child
//! process over stdio, driven by rmcp's client, charges once, replays the repeat (also after a
//! restart on the same SQLite file), answers the status tool, and refuses to start without a
//! secret.

use idempotency::error::STATUS_TOOL;
use idempotency::mcp::{META_REF, META_REPLAYED};
use rmcp::model::CallToolResult;
use rmcp::ServiceExt;
use serde_json::{json, Value};

use crate::common::{call, remove_db, temp_db, Client};

const SECRET: &str = "readme-test-secret-0123456789";

/// The Rust block under "## A complete server" in the README.
fn readme_block() -> String {
    let readme = include_str!("../../README.md");
    let section = readme
        .find("## A complete server")
        .expect("the README has a complete-server section");
    let open = "```rust,no_run\n";
    let start = section + readme[section..].find(open).expect("a rust block") + open.len();
    let len = readme[start..].find("```\n").expect("the block ends");
    readme[start..start + len].to_owned()
}

#[test]
fn the_readme_server_is_the_example_byte_for_byte() {
    let example = include_str!("../readme/server.rs");
    let block = readme_block();
    if block != example {
        let line = block
            .lines()
            .zip(example.lines())
            .position(|(a, b)| a != b)
            .map_or_else(|| "the lengths".to_owned(), |i| format!("line {}", i + 1));
        panic!("README block and examples/server.rs differ at {line}: copy one onto the other");
    }
}

fn server(db: &std::path::Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_server"));
    cmd.env("IDEMPOTENCY_SQLITE", db)
        .env("IDEMPOTENCY_SECRET", SECRET)
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG");
    cmd
}

async fn connect(db: &std::path::Path) -> Client {
    let transport = rmcp::transport::TokioChildProcess::new(server(db)).expect("spawn the server");
    ().serve(transport)
        .await
        .expect("the server answers initialize")
}

fn meta<'a>(r: &'a CallToolResult, key: &str) -> Option<&'a Value> {
    r.meta.as_ref()?.0.get(key)
}

fn structured(r: &CallToolResult) -> Value {
    r.structured_content.clone().unwrap_or(Value::Null)
}

fn charge() -> Value {
    json!({"amount_cents": 4200, "currency": "EUR", "card_token": "tok_visa"})
}

#[tokio::test]
async fn the_readme_server_replays_a_repeat_over_stdio_and_after_a_restart() {
    let db = temp_db("readme");
    let client = connect(&db).await;

    let tools = client.list_all_tools().await.expect("tools/list");
    let hint = |name: &str| {
        let tool = tools.iter().find(|t| t.name == name);
        let tool = tool.unwrap_or_else(|| panic!("{name} is listed"));
        tool.annotations.as_ref().and_then(|a| a.idempotent_hint)
    };
    assert_eq!(hint("charge_card"), Some(true), "the wrapped tool says so");
    assert_ne!(hint(STATUS_TOOL), Some(false), "the status tool is listed");

    let first = call(&client, "charge_card", charge()).await;
    assert_eq!(first.is_error, Some(false), "{first:?}");
    let reference = meta(&first, META_REF)
        .and_then(Value::as_str)
        .expect("the answer names its ref")
        .to_owned();
    assert_eq!(structured(&first)["charge_id"], format!("ch_{reference}"));
    assert_ne!(meta(&first, META_REPLAYED), Some(&Value::Bool(true)));

    let repeat = call(&client, "charge_card", charge()).await;
    assert_eq!(meta(&repeat, META_REPLAYED), Some(&Value::Bool(true)));
    assert_eq!(repeat.content, first.content);
    assert_eq!(structured(&repeat), structured(&first));

    let other = call(
        &client,
        "charge_card",
        json!({"amount_cents": 99, "currency": "EUR", "card_token": "tok_visa"}),
    )
    .await;
    assert_ne!(
        meta(&other, META_REF),
        meta(&first, META_REF),
        "other arguments, other call"
    );

    let status = call(&client, STATUS_TOOL, json!({ "ref": reference })).await;
    assert_eq!(status.is_error, Some(false), "{status:?}");
    let status = structured(&status);
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(
        status["answer"],
        structured(&first),
        "the status tool shows the stored answer"
    );
    client.cancel().await.expect("the client closes");

    // A new process on the same file: the record survived, the repeat is still a replay.
    let client = connect(&db).await;
    let later = call(&client, "charge_card", charge()).await;
    assert_eq!(meta(&later, META_REPLAYED), Some(&Value::Bool(true)));
    assert_eq!(later.content, first.content);
    client.cancel().await.expect("the client closes");
    remove_db(&db);
}

#[tokio::test]
async fn the_readme_server_refuses_to_start_without_a_secret() {
    let db = temp_db("readme-nosecret");
    let out = server(&db)
        .env_remove("IDEMPOTENCY_SECRET")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run the server");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("set IDEMPOTENCY_SECRET"), "{stderr}");
    assert!(
        !db.exists(),
        "no store is created before the secret is checked"
    );
}

#[test]
fn the_readme_stays_short() {
    let lines = include_str!("../../README.md").lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; it is for a user: at most 300"
    );
}
