//! Example servers whose clocks are off, as an operator's misconfigured replica: three
//! `charge_card --http` processes on one PostgreSQL schema, one with the right clock, one run
//! under libfaketime 16 minutes ahead, one 16 minutes behind (their monotonic clocks left
//! alone: `FAKETIME_DONT_FAKE_MONOTONIC=1`). While a call runs on the right one (its processor
//! takes 3 s), every server's repeat says "in flight" and so does its status tool; once it
//! completes, every server replays it and its status tool says "completed", not "expired"
//! (the window is 15 minutes). One charge.

use std::time::Duration;

use crate::common::pg::Schema;
use crate::common::{call, Client};
use idempotency::mcp::{META_REF, META_REPLAYED, META_STATUS};
use rmcp::model::CallToolResult;
use rmcp::ServiceExt;
use serde_json::{json, Value};

/// A charge_card server over HTTP on `url`'s database, its wall clock shifted by `skew`
/// (`+16m`, `-16m`) if any; its address, and its log's lines from then on.
async fn spawn(
    url: &str,
    skew: Option<&str>,
) -> (
    tokio::process::Child,
    String,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_charge_card"));
    command
        .args(["--http", "127.0.0.1:0"])
        .env("DATABASE_URL", url)
        .env("IDEMPOTENCY_SECRET", "a secret shared by the three servers")
        .env("PROCESSOR_DELAY_MS", "3000")
        .env("RUST_LOG", "info,idempotency=debug")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    #[cfg(not(no_faketime))]
    if let Some(skew) = skew {
        command
            .env("LD_PRELOAD", env!("FAKETIME_LIB"))
            .env("FAKETIME", skew)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
    let mut child = command.spawn().expect("spawn charge_card");
    let mut log = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
    let listening = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = log.next_line().await.expect("read the server's log") {
            if let Some((_, at)) = line.split_once("listening on ") {
                return at.trim().to_owned();
            }
        }
        panic!("charge_card --http ({skew:?}) exited before listening");
    })
    .await
    .expect("the server listens within 60 s");
    let (lines, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = log.next_line().await {
            let _ = lines.send(line);
        }
    });
    (child, listening, rx)
}

async fn client(url: &str) -> Client {
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    let cfg = StreamableHttpClientTransportConfig::with_uri(url.to_owned())
        .auth_header("acme-token".to_owned());
    ().serve(StreamableHttpClientTransport::from_config(cfg))
        .await
        .expect("HTTP client connects")
}

fn meta<'a>(r: &'a CallToolResult, key: &str) -> Option<&'a Value> {
    r.meta.as_ref()?.0.get(key)
}

fn args() -> Value {
    json!({"amount_cents": 1600, "currency": "EUR", "card_token": "tok_skew"})
}

/// What the status tool says of `reference` on `client`: its `state`.
async fn status_state(client: &Client, reference: &str) -> String {
    let status = call(client, "idempotency_status", json!({ "ref": reference })).await;
    status
        .structured_content
        .as_ref()
        .and_then(|s| s.get("state"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[cfg_attr(
    all(no_faketime, not(no_database)),
    ignore = "needs libfaketime (Debian package faketime)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_with_skewed_clocks_tell_one_story() {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let schema = Schema::create(&url, "skew").await;
    let db = schema.url();
    // The right one first: it creates the store's tables.
    let (_right_child, right_url, mut right_log) = spawn(&db, None).await;
    let (_ahead_child, ahead_url, _) = spawn(&db, Some("+16m")).await;
    let (_behind_child, behind_url, _) = spawn(&db, Some("-16m")).await;
    let right = client(&right_url).await;
    let skewed = [
        ("+16m", client(&ahead_url).await),
        ("-16m", client(&behind_url).await),
    ];

    let first = {
        let right = client(&right_url).await;
        tokio::spawn(async move { call(&right, "charge_card", args()).await })
    };
    // Claimed once the right server logs its claim (its processor then takes 3 s).
    let reference = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = right_log.recv().await {
            if line.contains("idempotency claim")
                && let Some((_, rest)) = line.split_once("reference=")
            {
                return rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
            }
        }
        panic!("the right server's log ended before its claim");
    })
    .await
    .expect("the claim within 30 s");
    let repeat = call(&right, "charge_card", args()).await;
    assert_eq!(
        meta(&repeat, META_REF).and_then(Value::as_str),
        Some(reference.as_str())
    );
    for (skew, c) in &skewed {
        let repeat = call(c, "charge_card", args()).await;
        assert_eq!(
            meta(&repeat, META_STATUS).and_then(Value::as_str),
            Some("in_flight"),
            "{skew}: the repeat"
        );
        assert_eq!(
            status_state(c, &reference).await,
            "in_flight",
            "{skew}: the status tool agrees with the repeat"
        );
    }

    let done = first.await.expect("the first call");
    assert_ne!(done.is_error, Some(true), "{done:?}");
    for (skew, c) in &skewed {
        let repeat = call(c, "charge_card", args()).await;
        assert_eq!(
            meta(&repeat, META_REPLAYED),
            Some(&Value::Bool(true)),
            "{skew}: replayed"
        );
        assert_eq!(repeat.structured_content, done.structured_content);
        assert_eq!(
            status_state(c, &reference).await,
            "completed",
            "{skew}: the status tool reads it completed, not expired"
        );
    }
    drop(schema);
}
