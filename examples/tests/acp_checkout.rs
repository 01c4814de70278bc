//! The acp_checkout merchant (`examples/acp_checkout.rs`) as a child process, driven through a
//! real HTTP client (reqwest) on its REST routes and through rmcp's client on its MCP endpoint,
//! on a SQLite file (and PostgreSQL with `DATABASE_URL`, Redis with `REDIS_URL`). Charges are
//! counted at the far side: the stub processor's `charged <order> ref=<ref>` lines on the
//! server's stderr, read up to a sentinel charge made last (so no earlier line is still in the
//! pipe). "In flight" holds the processor on a gate the test opens; "5xx" makes it fail once.

use std::collections::HashMap;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::{ErrorData, ServiceExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::pg::Schema;
use crate::common::{remove_db, soon, temp_db, Client};

const SECRET: &str = "acp-checkout-test-secret-0123456789";

/// Where the merchant keeps its records.
enum Store {
    Sqlite(std::path::PathBuf),
    Postgres {
        url: String,
        _schema: Schema,
    },
    Redis {
        url: String,
        namespace: String,
        _server: Option<tokio::process::Child>,
    },
}

impl Store {
    fn sqlite(name: &str) -> Store {
        Store::Sqlite(temp_db(&format!("acp-{name}")))
    }

    async fn postgres(name: &str) -> Store {
        let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
        let schema = Schema::create(&url, name).await;
        Store::Postgres {
            url: schema.url(),
            _schema: schema,
        }
    }

    /// `REDIS_URL`, or a `redis-server` of this test on a free port (stopped with the value).
    async fn redis(name: &str) -> Store {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let namespace = format!("acp-test-{name}-{}-{nanos:x}", std::process::id());
        if let Ok(url) = std::env::var("REDIS_URL") {
            return Store::Redis {
                url,
                namespace,
                _server: None,
            };
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = tokio::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start redis-server");
        let mut out = BufReader::new(server.stdout.take().expect("piped stdout")).lines();
        soon("redis-server ready", async {
            while let Some(line) = out.next_line().await.expect("its log") {
                if line.contains("Ready to accept connections") {
                    return;
                }
            }
            panic!("redis-server exited before it was ready");
        })
        .await;
        tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
        Store::Redis {
            url: format!("redis://127.0.0.1:{port}"),
            namespace,
            _server: Some(server),
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Store::Sqlite(path) = self {
            remove_db(path);
        }
    }
}

/// A running merchant: its base URL and its stderr, line by line.
struct Merchant {
    _child: tokio::process::Child,
    base: String,
    log: tokio::sync::mpsc::UnboundedReceiver<String>,
    http: reqwest::Client,
    sentinels: u32,
}

impl Merchant {
    async fn spawn(store: &Store, env: &[(&str, &str)], args: &[&str]) -> Merchant {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_acp_checkout"));
        cmd.args(["--http", "127.0.0.1:0"])
            .args(args)
            .env("IDEMPOTENCY_SECRET", SECRET)
            .env("RUST_LOG", "info")
            .env_remove("DATABASE_URL")
            .env_remove("REDIS_URL")
            .env_remove("IDEMPOTENCY_WAIT")
            .env_remove("ACP_PROCESSOR_GATE")
            .env_remove("ACP_PROCESSOR_FAILURES")
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        match store {
            Store::Sqlite(path) => cmd.env("IDEMPOTENCY_SQLITE", path),
            Store::Postgres { url, .. } => cmd.env("DATABASE_URL", url),
            Store::Redis { url, namespace, .. } => cmd
                .env("REDIS_URL", url)
                .env("IDEMPOTENCY_REDIS_NAMESPACE", namespace),
        };
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn acp_checkout");
        let mut lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
        let mcp = soon("the merchant listening", async {
            while let Some(line) = lines.next_line().await.expect("read its stderr") {
                if let Some((_, at)) = line.split_once("listening on ") {
                    return at.trim().to_owned();
                }
            }
            panic!("acp_checkout exited before listening");
        })
        .await;
        let (tx, log) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = tx.send(line);
            }
        });
        Merchant {
            _child: child,
            base: mcp.trim_end_matches("/mcp").to_owned(),
            log,
            http: reqwest::Client::new(),
            sentinels: 0,
        }
    }

    /// The next stderr line containing `what`.
    async fn line(&mut self, what: &str) -> String {
        soon(what, async {
            while let Some(line) = self.log.recv().await {
                if line.contains(what) {
                    return line;
                }
            }
            panic!("the merchant's stderr ended before {what:?}");
        })
        .await
    }

    /// A REST request as `token`'s caller; its status, headers and JSON body.
    async fn rest(&self, token: &str, path: &str, req: Rest<'_>) -> Answer {
        let url = format!("{}{path}", self.base);
        let mut b = if req.get {
            self.http.get(url)
        } else {
            self.http.post(url)
        };
        b = b
            .header("authorization", format!("Bearer {token}"))
            .header("api-version", "2026-01-30")
            .header("request-id", format!("req_{}", req.attempt))
            .header(
                "timestamp",
                format!("2026-12-06T10:00:0{}Z", req.attempt % 10),
            )
            .header("signature", format!("sig-{}", req.attempt))
            .header("user-agent", format!("agent/{}", req.attempt));
        if let Some(k) = req.key {
            b = b.header("idempotency-key", k);
        }
        if let Some(body) = req.body {
            b = b
                .header("content-type", "application/json")
                .body(serde_json::to_vec(body).expect("a body"));
        }
        let response = b.send().await.expect("the merchant answers");
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        let bytes = response.bytes().await.expect("the body");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Answer {
            status,
            headers,
            body,
        }
    }

    /// An rmcp client of `/mcp` as `token`'s caller.
    async fn mcp(&self, token: &str) -> Client {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        use rmcp::transport::StreamableHttpClientTransport;
        let cfg = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", self.base))
            .auth_header(token.to_owned());
        ().serve(StreamableHttpClientTransport::from_config(cfg))
            .await
            .expect("the MCP client connects")
    }

    /// A new session of `token`'s caller, over REST: its id.
    async fn session(&self, token: &str, key: &str) -> String {
        let a = self
            .rest(token, "/checkout_sessions", Rest::post(key, 1, &create()))
            .await;
        assert_eq!(a.status, 201, "{:?}", a.body);
        a.body["id"].as_str().expect("an id").to_owned()
    }

    /// Every charge the processor made so far, read up to a sentinel charge made now (a new
    /// session completed under a new key), which is left out: order id → references.
    async fn charges(&mut self) -> HashMap<String, Vec<String>> {
        self.sentinels += 1;
        let key = format!("sentinel-key-{}", self.sentinels);
        let id = self.session("acme-token", &key).await;
        let done = self
            .rest(
                "acme-token",
                &format!("/checkout_sessions/{id}/complete"),
                Rest::post(&key, 1, &pay("spt_sentinel")),
            )
            .await;
        assert_eq!(done.status, 200, "the sentinel charge: {:?}", done.body);
        let sentinel = done.body["order"]["id"]
            .as_str()
            .expect("an order")
            .to_owned();
        let mut charges: HashMap<String, Vec<String>> = HashMap::new();
        loop {
            let line = self.line("charged ").await;
            let rest = line
                .split_once("charged ")
                .map(|(_, r)| r)
                .unwrap_or_default();
            let (order, reference) = rest.split_once(" ref=").expect("charged <order> ref=<ref>");
            if order == sentinel {
                return charges;
            }
            charges
                .entry(order.to_owned())
                .or_default()
                .push(reference.to_owned());
        }
    }
}

/// One REST request's shape: its key, its attempt number (the request id, timestamp, signature
/// and user agent change with it), its body.
#[derive(Clone, Copy)]
struct Rest<'a> {
    key: Option<&'a str>,
    attempt: u32,
    body: Option<&'a Value>,
    get: bool,
}

impl<'a> Rest<'a> {
    fn post(key: &'a str, attempt: u32, body: &'a Value) -> Self {
        Rest {
            key: Some(key),
            attempt,
            body: Some(body),
            get: false,
        }
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HashMap<String, String>,
    body: Value,
}

impl Answer {
    fn replayed(&self) -> bool {
        self.headers.get("idempotent-replayed").map(String::as_str) == Some("true")
    }
}

fn create() -> Value {
    json!({"line_items": [{"id": "sku_1", "name": "Mug", "unit_amount": 1500}], "currency": "usd", "capabilities": {}})
}

fn pay(token: &str) -> Value {
    json!({"payment_data": {"handler_id": "card", "instrument": {"type": "card", "credential": {"type": "spt", "token": token}}}})
}

/// ACP tool arguments for `attempt` of a request with `key`.
fn acp(key: Option<&str>, attempt: u32, id: Option<&str>, payload: Option<Value>) -> Value {
    let mut meta = json!({
        "api_version": "2026-01-30",
        "request_id": format!("req_mcp_{attempt}"),
        "timestamp": format!("2026-12-06T11:00:0{}Z", attempt % 10),
        "signature": format!("sig-mcp-{attempt}"),
    });
    if let Some(k) = key {
        meta["idempotency_key"] = json!(k);
    }
    let mut args = json!({"meta": meta});
    if let Some(id) = id {
        args["id"] = json!(id);
    }
    if let Some(p) = payload {
        args["payload"] = p;
    }
    args
}

async fn call(client: &Client, tool: &str, args: Value) -> Result<CallToolResult, ErrorData> {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    match client.call_tool(params).await {
        Ok(r) => Ok(r),
        Err(rmcp::ServiceError::McpError(e)) => Err(e),
        Err(e) => panic!("call_tool: {e}"),
    }
}

fn structured(r: &CallToolResult) -> Value {
    assert_ne!(r.is_error, Some(true), "{r:?}");
    r.structured_content.clone().expect("structured content")
}

/// ACP's `Error` in a JSON-RPC `-32000` error.
fn acp_error(e: &ErrorData) -> &Value {
    assert_eq!(e.code.0, -32000, "{e:?}");
    e.data.as_ref().expect("ACP's Error in data")
}

/// Over REST: retries whose request id, timestamp, signature and user agent differ replay;
/// the same key with another body is a conflict; a missing key and an invalid body are refused
/// before anything is claimed (the corrected request then runs under the same key); reads and
/// other routes pass the layer untouched; one charge.
async fn rest_door(store: Store) {
    let mut m = Merchant::spawn(&store, &[], &[]).await;
    let t = "acme-token";
    let body = create();
    let first = m
        .rest(
            t,
            "/checkout_sessions",
            Rest::post("create-key-1", 1, &body),
        )
        .await;
    assert_eq!(
        (first.status, first.replayed()),
        (201, false),
        "{:?}",
        first.body
    );
    let again = m
        .rest(
            t,
            "/checkout_sessions",
            Rest::post("create-key-1", 2, &body),
        )
        .await;
    assert_eq!((again.status, again.replayed()), (201, true));
    assert_eq!(again.body, first.body);
    let other = json!({"line_items": [{"id": "sku_2"}], "currency": "usd", "capabilities": {}});
    let conflict = m
        .rest(
            t,
            "/checkout_sessions",
            Rest::post("create-key-1", 3, &other),
        )
        .await;
    assert_eq!(
        (conflict.status, conflict.body["code"].as_str()),
        (422, Some("idempotency_conflict"))
    );

    let id = first.body["id"].as_str().expect("an id");
    let complete = format!("/checkout_sessions/{id}/complete");
    let no_key = m
        .rest(
            t,
            &complete,
            Rest {
                key: None,
                ..Rest::post("", 1, &pay("spt_1"))
            },
        )
        .await;
    assert_eq!(
        (no_key.status, no_key.body["code"].as_str()),
        (400, Some("idempotency_key_required"))
    );
    let invalid = json!({"payment_data": {"handler_id": "card"}});
    let refused = m
        .rest(t, &complete, Rest::post("complete-key-1", 1, &invalid))
        .await;
    assert_eq!(
        (refused.status, refused.body["code"].as_str()),
        (400, Some("invalid_request"))
    );
    assert!(
        refused.body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("$.payment_data")),
        "{:?}",
        refused.body
    );
    let paid = m
        .rest(t, &complete, Rest::post("complete-key-1", 2, &pay("spt_1")))
        .await;
    assert_eq!(
        (paid.status, paid.replayed()),
        (200, false),
        "{:?}",
        paid.body
    );
    assert_eq!(paid.body["status"], "completed");
    for attempt in 3..6 {
        let retry = m
            .rest(
                t,
                &complete,
                Rest::post("complete-key-1", attempt, &pay("spt_1")),
            )
            .await;
        assert_eq!((retry.status, retry.replayed()), (200, true));
        assert_eq!(retry.body, paid.body);
    }
    // Another key for a completed session: refused by the merchant, nothing charged.
    let twice = m
        .rest(t, &complete, Rest::post("complete-key-2", 1, &pay("spt_1")))
        .await;
    assert_eq!(
        (twice.status, twice.body["code"].as_str()),
        (409, Some("invalid_state"))
    );

    // Update and cancel another session: each replays under its key; a cancelled session
    // cannot be paid for.
    let other_id = m.session(t, "create-key-2").await;
    let session = format!("/checkout_sessions/{other_id}");
    let items = json!({"line_items": [{"id": "sku_3", "unit_amount": 700}]});
    let updated = m
        .rest(t, &session, Rest::post("update-key-1", 1, &items))
        .await;
    assert_eq!(
        (updated.status, updated.replayed()),
        (200, false),
        "{:?}",
        updated.body
    );
    assert_eq!(updated.body["totals"][1]["amount"], 700);
    let again = m
        .rest(t, &session, Rest::post("update-key-1", 2, &items))
        .await;
    assert_eq!(
        (again.status, again.replayed(), &again.body),
        (200, true, &updated.body)
    );
    let cancel = format!("{session}/cancel");
    let no_body = Rest {
        body: None,
        ..Rest::post("cancel-key-1", 1, &items)
    };
    let cancelled = m.rest(t, &cancel, no_body).await;
    assert_eq!(
        (cancelled.status, cancelled.body["status"].as_str()),
        (200, Some("canceled"))
    );
    let again = m
        .rest(
            t,
            &cancel,
            Rest {
                attempt: 2,
                ..no_body
            },
        )
        .await;
    assert_eq!((again.status, again.replayed()), (200, true));
    let refused = m
        .rest(
            t,
            &format!("{session}/complete"),
            Rest::post("complete-key-3", 1, &pay("spt_1")),
        )
        .await;
    assert_eq!(
        (refused.status, refused.body["code"].as_str()),
        (409, Some("invalid_state"))
    );

    // A read, even with a key, is not the layer's: answered by the handler each time.
    for attempt in 1..3 {
        let read = Rest {
            get: true,
            body: None,
            ..Rest::post("get-key-0001", attempt, &body)
        };
        let shown = m.rest(t, &format!("/checkout_sessions/{id}"), read).await;
        assert_eq!((shown.status, shown.replayed()), (200, false));
        assert_eq!(shown.body, paid.body);
    }
    let metrics = m
        .http
        .get(format!("{}/metrics", m.base))
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status().as_u16(), 200);

    let order = paid.body["order"]["id"]
        .as_str()
        .expect("an order")
        .to_owned();
    let charges = m.charges().await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges[&order].len(), 1);
}

#[tokio::test]
async fn sqlite_rest_door() {
    rest_door(Store::sqlite("rest")).await;
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn postgres_rest_door() {
    rest_door(Store::postgres("acprest").await).await;
}

/// Over MCP: the same through rmcp's client; errors are ACP's, in JSON-RPC `-32000`.
#[tokio::test]
async fn sqlite_mcp_door() {
    let store = Store::sqlite("mcp");
    let mut m = Merchant::spawn(&store, &[], &[]).await;
    let client = m.mcp("acme-token").await;
    let created = call(
        &client,
        "create_checkout_session",
        acp(Some("mcp-create-1"), 1, None, Some(create())),
    )
    .await
    .expect("created");
    let again = call(
        &client,
        "create_checkout_session",
        acp(Some("mcp-create-1"), 2, None, Some(create())),
    )
    .await
    .expect("replayed");
    assert_eq!(structured(&again), structured(&created));
    let id = structured(&created)["id"]
        .as_str()
        .expect("an id")
        .to_owned();

    let other = json!({"line_items": [{"id": "sku_2"}], "currency": "usd", "capabilities": {}});
    let e = call(
        &client,
        "create_checkout_session",
        acp(Some("mcp-create-1"), 3, None, Some(other)),
    )
    .await
    .expect_err("a conflict");
    assert_eq!(acp_error(&e)["code"], "idempotency_conflict");
    let e = call(
        &client,
        "complete_checkout_session",
        acp(None, 1, Some(&id), Some(pay("spt_2"))),
    )
    .await
    .expect_err("no key");
    assert_eq!(acp_error(&e)["code"], "idempotency_key_required");
    let e = call(
        &client,
        "complete_checkout_session",
        acp(Some("mcp-complete-1"), 1, Some(&id), Some(json!({}))),
    )
    .await
    .expect_err("invalid");
    let data = acp_error(&e);
    assert_eq!(
        (data["type"].as_str(), data["code"].as_str()),
        (Some("invalid_request"), Some("invalid"))
    );
    assert_eq!(data["param"], "$.payload");
    let e = call(
        &client,
        "complete_checkout_session",
        acp(
            Some("mcp-complete-1"),
            1,
            Some("cs_nowhere"),
            Some(pay("spt_2")),
        ),
    )
    .await
    .expect_err("no such session");
    assert_eq!(acp_error(&e)["code"], "session_not_found");

    let paid = call(
        &client,
        "complete_checkout_session",
        acp(Some("mcp-complete-1"), 2, Some(&id), Some(pay("spt_2"))),
    )
    .await
    .expect("paid");
    for attempt in 3..6 {
        let retry = call(
            &client,
            "complete_checkout_session",
            acp(
                Some("mcp-complete-1"),
                attempt,
                Some(&id),
                Some(pay("spt_2")),
            ),
        )
        .await
        .expect("a retry");
        assert_eq!(structured(&retry), structured(&paid));
    }
    let shown = call(
        &client,
        "get_checkout_session",
        acp(None, 1, Some(&id), None),
    )
    .await
    .expect("shown");
    assert_eq!(structured(&shown)["status"], "completed");
    // Another tenant does not see it.
    let globex = m.mcp("globex-token").await;
    let e = call(
        &client,
        "get_checkout_session",
        acp(None, 1, Some(&id), Some(json!({}))),
    )
    .await
    .expect_err("get takes no payload");
    assert_eq!(acp_error(&e)["param"], "$.payload");
    let e = call(
        &globex,
        "get_checkout_session",
        acp(None, 1, Some(&id), None),
    )
    .await
    .expect_err("not theirs");
    assert_eq!(acp_error(&e)["code"], "session_not_found");

    let order = structured(&paid)["order"]["id"]
        .as_str()
        .expect("an order")
        .to_owned();
    let charges = m.charges().await;
    assert_eq!(charges.keys().collect::<Vec<_>>(), [&order]);
    assert_eq!(charges[&order].len(), 1);
}

/// While a key's first request is inside the processor, a retry is told so with the time to
/// wait (REST: `409` + `Retry-After`; MCP: `idempotency_in_flight` with `retry_after`); once it
/// is let through, the retries replay it. One charge each.
#[tokio::test]
async fn sqlite_in_flight_with_retry_after() {
    let store = Store::sqlite("inflight");
    let mut m = Merchant::spawn(&store, &[("ACP_PROCESSOR_GATE", "1")], &[]).await;
    let t = "acme-token";
    let rest_id = m.session(t, "held-create-1").await;
    let mcp_id = m.session(t, "held-create-2").await;
    let complete = format!("/checkout_sessions/{rest_id}/complete");
    let first_rest = {
        let (http, url) = (m.http.clone(), format!("{}{complete}", m.base));
        tokio::spawn(async move {
            http.post(url)
                .header("authorization", "Bearer acme-token")
                .header("api-version", "2026-01-30")
                .header("idempotency-key", "held-key-1")
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&pay("spt_h")).expect("a body"))
                .send()
                .await
                .expect("an answer")
                .status()
                .as_u16()
        })
    };
    m.line("processor holding ref=").await;
    let retry = m
        .rest(t, &complete, Rest::post("held-key-1", 2, &pay("spt_h")))
        .await;
    assert_eq!(
        (retry.status, retry.body["code"].as_str()),
        (409, Some("idempotency_in_flight"))
    );
    assert_eq!(
        retry.headers.get("retry-after").map(String::as_str),
        Some("1")
    );

    let client = std::sync::Arc::new(m.mcp(t).await);
    let first_mcp = {
        let (c, id) = (client.clone(), mcp_id.clone());
        tokio::spawn(async move {
            call(
                &c,
                "complete_checkout_session",
                acp(Some("held-key-2"), 1, Some(&id), Some(pay("spt_m"))),
            )
            .await
        })
    };
    m.line("processor holding ref=").await;
    let e = call(
        &client,
        "complete_checkout_session",
        acp(Some("held-key-2"), 2, Some(&mcp_id), Some(pay("spt_m"))),
    )
    .await
    .expect_err("in flight");
    let data = acp_error(&e);
    assert_eq!(data["code"], "idempotency_in_flight");
    assert_eq!(data["retry_after"], 1);

    for _ in 0..2 {
        let released = m
            .http
            .post(format!("{}/_processor/release", m.base))
            .header("authorization", "Bearer acme-token")
            .send()
            .await
            .expect("released");
        assert_eq!(released.status().as_u16(), 204);
    }
    assert_eq!(
        soon("the REST request", first_rest).await.expect("task"),
        200
    );
    let first_mcp = soon("the MCP call", first_mcp)
        .await
        .expect("task")
        .expect("paid");
    let after = m
        .rest(t, &complete, Rest::post("held-key-1", 3, &pay("spt_h")))
        .await;
    assert_eq!((after.status, after.replayed()), (200, true));
    let after = call(
        &client,
        "complete_checkout_session",
        acp(Some("held-key-2"), 3, Some(&mcp_id), Some(pay("spt_m"))),
    )
    .await
    .expect("replayed");
    assert_eq!(structured(&after), structured(&first_mcp));

    // The sentinel charge passes the gate too.
    let released = m
        .http
        .post(format!("{}/_processor/release", m.base))
        .header("authorization", "Bearer acme-token")
        .send()
        .await
        .expect("released");
    assert_eq!(released.status().as_u16(), 204);
    let charges = m.charges().await;
    assert_eq!(charges.len(), 2, "{charges:?}");
    assert!(charges.values().all(|refs| refs.len() == 1), "{charges:?}");
}

/// A processor failure is a `503` over REST (an error result over MCP), never stored: the
/// retry with the same key runs again and charges once.
#[tokio::test]
async fn sqlite_a_5xx_is_not_stored() {
    let store = Store::sqlite("fail");
    let mut m = Merchant::spawn(&store, &[("ACP_PROCESSOR_FAILURES", "2")], &[]).await;
    let t = "acme-token";
    let id = m.session(t, "fail-create-1").await;
    let complete = format!("/checkout_sessions/{id}/complete");
    let failed = m
        .rest(t, &complete, Rest::post("fail-key-1", 1, &pay("spt_f")))
        .await;
    assert_eq!(
        (failed.status, failed.body["code"].as_str()),
        (503, Some("processor_unavailable"))
    );
    m.line("processor unavailable ref=").await;

    let mcp_id = m.session(t, "fail-create-2").await;
    let client = m.mcp(t).await;
    let args = |attempt| {
        acp(
            Some("fail-key-2"),
            attempt,
            Some(&mcp_id),
            Some(pay("spt_g")),
        )
    };
    let failed = call(&client, "complete_checkout_session", args(1))
        .await
        .expect("an error result");
    assert_eq!(failed.is_error, Some(true), "{failed:?}");
    m.line("processor unavailable ref=").await;

    // The processor is back: both retries run again (nothing was stored) and charge.
    let retried = m
        .rest(t, &complete, Rest::post("fail-key-1", 2, &pay("spt_f")))
        .await;
    assert_eq!(
        (retried.status, retried.replayed()),
        (200, false),
        "{:?}",
        retried.body
    );
    let retried = call(&client, "complete_checkout_session", args(2))
        .await
        .expect("paid");
    assert_eq!(structured(&retried)["status"], "completed");

    let charges = m.charges().await;
    assert_eq!(charges.len(), 2, "{charges:?}");
    assert!(charges.values().all(|refs| refs.len() == 1), "{charges:?}");
}

/// Two tenants sending one key make two records: two sessions, two charges.
#[tokio::test]
async fn sqlite_two_tenants_with_one_key_are_two_records() {
    let store = Store::sqlite("tenants");
    let mut m = Merchant::spawn(&store, &[], &[]).await;
    let mut refs = Vec::new();
    let mut ids = Vec::new();
    for t in ["acme-token", "globex-token"] {
        let a = m
            .rest(
                t,
                "/checkout_sessions",
                Rest::post("shared-key-1", 1, &create()),
            )
            .await;
        assert_eq!((a.status, a.replayed()), (201, false));
        let id = a.body["id"].as_str().expect("an id").to_owned();
        let paid = m
            .rest(
                t,
                &format!("/checkout_sessions/{id}/complete"),
                Rest::post("shared-key-2", 1, &pay("spt_t")),
            )
            .await;
        assert_eq!((paid.status, paid.replayed()), (200, false));
        refs.push(
            paid.body["order"]["id"]
                .as_str()
                .expect("an order")
                .to_owned(),
        );
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1]);
    let charges = m.charges().await;
    assert_eq!(charges.len(), 2, "{charges:?}");
    let references: Vec<&String> = refs.iter().map(|o| &charges[o][0]).collect();
    assert_ne!(references[0], references[1]);
}

/// 32 identical REST requests at once: one runs, the others are told it is in flight or get
/// its answer; one charge.
async fn concurrent_duplicates(store: Store) {
    let mut m = Merchant::spawn(&store, &[], &[]).await;
    let id = m.session("acme-token", "burst-create-1").await;
    let url = format!("{}/checkout_sessions/{id}/complete", m.base);
    let body = serde_json::to_vec(&pay("spt_burst")).expect("a body");
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (http, url, body, barrier) =
                (m.http.clone(), url.clone(), body.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let r = http
                    .post(url)
                    .header("authorization", "Bearer acme-token")
                    .header("api-version", "2026-01-30")
                    .header("idempotency-key", "burst-key-1")
                    .header("request-id", format!("req_{i}"))
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .expect("an answer");
                let status = r.status().as_u16();
                let body: Value = serde_json::from_slice(&r.bytes().await.expect("a body"))
                    .unwrap_or(Value::Null);
                (status, body)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(soon("a request of the burst", t).await.expect("task"));
    }
    let paid: Vec<&Value> = answers
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, b)| b)
        .collect();
    assert!(!paid.is_empty(), "{answers:?}");
    assert!(
        paid.iter().all(|b| *b == paid[0]),
        "every 200 is the one answer"
    );
    assert!(
        answers
            .iter()
            .all(|(s, b)| *s == 200 || (*s == 409 && b["code"] == "idempotency_in_flight")),
        "{answers:?}"
    );
    let charges = m.charges().await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges.values().next().map(Vec::len), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_concurrent_duplicates_charge_once() {
    concurrent_duplicates(Store::sqlite("burst")).await;
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_concurrent_duplicates_charge_once() {
    concurrent_duplicates(Store::postgres("acpburst").await).await;
}

#[cfg_attr(no_redis, ignore = "needs REDIS_URL or redis-server on the PATH")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_concurrent_duplicates_charge_once() {
    concurrent_duplicates(Store::redis("burst").await).await;
}

/// `--ucp`: UCP's `complete_checkout` with `meta["idempotency-key"]` replays, and refuses a
/// call without a key in UCP's shape; one charge.
#[tokio::test]
async fn sqlite_ucp_complete_checkout() {
    let store = Store::sqlite("ucp");
    let mut m = Merchant::spawn(&store, &[], &["--ucp"]).await;
    let id = m.session("acme-token", "ucp-create-1").await;
    let client = m.mcp("acme-token").await;
    let args = |key: Option<&str>| {
        let mut meta =
            json!({"ucp-agent": {"profile": "https://platform.example/profiles/agent.json"}});
        if let Some(k) = key {
            meta["idempotency-key"] = json!(k);
        }
        json!({"meta": meta, "id": id, "checkout": {"payment": {"instruments": [{"id": "pi_1", "handler_id": "card", "type": "card"}]}}})
    };
    let e = call(&client, "complete_checkout", args(None))
        .await
        .expect_err("no key");
    assert_eq!(e.code.0, -32000, "{e:?}");
    let data = e.data.as_ref().expect("data");
    assert_eq!(
        (data["type"].as_str(), data["code"].as_str()),
        (Some("error"), Some("idempotency_key_required")),
        "{data}"
    );
    let key = "0b7c0d3e-5a4f-4c3b-9a2e-1f0e9d8c7b6a";
    let first = call(&client, "complete_checkout", args(Some(key)))
        .await
        .expect("completed");
    let again = call(&client, "complete_checkout", args(Some(key)))
        .await
        .expect("replayed");
    assert_eq!(structured(&again), structured(&first));
    let charges = m.charges().await;
    assert_eq!(charges.len(), 1, "{charges:?}");

    // Without --ucp the tool is not served.
    let plain = Merchant::spawn(&store, &[], &[]).await;
    let tools = plain
        .mcp("acme-token")
        .await
        .list_all_tools()
        .await
        .expect("tools");
    // Listed as ACP's binding asks: the payload's request schema, bundled, and what is required.
    let complete = tools
        .iter()
        .find(|t| t.name == "complete_checkout_session")
        .expect("listed");
    let schema = Value::Object((*complete.input_schema).clone());
    assert_eq!(
        schema["properties"]["payload"]["$ref"],
        "#/$defs/CheckoutSessionCompleteRequest"
    );
    assert_eq!(schema["required"], json!(["meta", "id", "payload"]));
    // `meta` is listed open (`ignore = [.., "meta.*"]`): ACP asks servers to accept members a
    // later version adds.
    let meta = &schema["properties"]["meta"];
    let meta = match meta["$ref"].as_str() {
        Some(r) => &schema["$defs"][r.trim_start_matches("#/$defs/")],
        None => meta,
    };
    assert_eq!(meta["properties"]["api_version"]["type"], "string");
    assert_eq!(meta.get("additionalProperties"), None, "{meta}");
    assert_eq!(schema["additionalProperties"], false);
    for tool in &tools {
        let schema = Value::Object((*tool.input_schema).clone());
        assert_refs_resolve(&schema, &schema);
    }
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "cancel_checkout_session",
            "complete_checkout_session",
            "create_checkout_session",
            "get_checkout_session",
            "update_checkout_session"
        ]
    );
}

/// Every `$ref` in `at` names a definition under `root`'s `$defs`.
fn assert_refs_resolve(root: &Value, at: &Value) {
    match at {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                let name = r
                    .strip_prefix("#/$defs/")
                    .unwrap_or_else(|| panic!("{r} is not bundled"));
                assert!(root["$defs"].get(name).is_some(), "{r} resolves to nothing");
            }
            m.values().for_each(|v| assert_refs_resolve(root, v));
        }
        Value::Array(items) => items.iter().for_each(|v| assert_refs_resolve(root, v)),
        _ => {}
    }
}

/// One client key names one record through either door: REST first, the MCP retry replays the
/// response's body as the tool's answer; MCP first, the REST retry replays the tool's answer
/// (`201` for create, `200` for complete). One charge.
#[tokio::test]
async fn sqlite_one_record_across_doors() {
    let store = Store::sqlite("doors");
    let mut m = Merchant::spawn(&store, &[], &[]).await;
    let t = "acme-token";
    let client = m.mcp(t).await;
    let replayed = |r: &CallToolResult| {
        r.meta
            .as_ref()
            .and_then(|m| m.0.get("idempotency/replayed"))
            == Some(&Value::Bool(true))
    };

    let by_rest = m
        .rest(
            t,
            "/checkout_sessions",
            Rest::post("door-create-1", 1, &create()),
        )
        .await;
    assert_eq!((by_rest.status, by_rest.replayed()), (201, false));
    let by_mcp = call(
        &client,
        "create_checkout_session",
        acp(Some("door-create-1"), 2, None, Some(create())),
    )
    .await
    .expect("replayed over MCP");
    assert!(replayed(&by_mcp), "{by_mcp:?}");
    assert_eq!(structured(&by_mcp), by_rest.body);

    let created = call(
        &client,
        "create_checkout_session",
        acp(Some("door-create-2"), 1, None, Some(create())),
    )
    .await
    .expect("created over MCP");
    let again = m
        .rest(
            t,
            "/checkout_sessions",
            Rest::post("door-create-2", 2, &create()),
        )
        .await;
    assert_eq!((again.status, again.replayed()), (201, true));
    assert_eq!(again.body, structured(&created));

    let id = structured(&created)["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let paid = call(
        &client,
        "complete_checkout_session",
        acp(Some("door-pay-1"), 1, Some(&id), Some(pay("spt_d"))),
    )
    .await
    .expect("paid over MCP");
    let again = m
        .rest(
            t,
            &format!("/checkout_sessions/{id}/complete"),
            Rest::post("door-pay-1", 2, &pay("spt_d")),
        )
        .await;
    assert_eq!((again.status, again.replayed()), (200, true));
    assert_eq!(again.body, structured(&paid));
    // Another payload under the key is a conflict at the other door too.
    let other = m
        .rest(
            t,
            &format!("/checkout_sessions/{id}/complete"),
            Rest::post("door-pay-1", 3, &pay("spt_other")),
        )
        .await;
    assert_eq!(
        (other.status, other.body["code"].as_str()),
        (422, Some("idempotency_conflict"))
    );

    let charges = m.charges().await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges.values().next().map(Vec::len), Some(1));
}

/// A `meta` member this merchant's `Meta` does not declare (one a later ACP version may add) is
/// accepted over MCP and keyed by nothing: the MCP retry of a REST payment replays it, whatever
/// the member's value, and a member `Meta` declares (`api_version`) is still compared. One
/// charge.
#[tokio::test]
async fn sqlite_an_unknown_meta_member_replays_across_doors() {
    let store = Store::sqlite("meta-glob");
    let mut m = Merchant::spawn(&store, &[], &[]).await;
    let t = "acme-token";
    let client = m.mcp(t).await;
    let created = m
        .rest(
            t,
            "/checkout_sessions",
            Rest::post("glob-create", 1, &create()),
        )
        .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let id = created.body["id"].as_str().expect("an id").to_owned();
    let paid = m
        .rest(
            t,
            &format!("/checkout_sessions/{id}/complete"),
            Rest::post("glob-pay", 1, &pay("spt_g")),
        )
        .await;
    assert_eq!((paid.status, paid.replayed()), (200, false));

    for (attempt, risk) in [(2, 7), (3, 8)] {
        let mut args = acp(Some("glob-pay"), attempt, Some(&id), Some(pay("spt_g")));
        args["meta"]["risk_signals"] = json!({"score": risk});
        let again = call(&client, "complete_checkout_session", args)
            .await
            .expect("replayed over MCP");
        let replayed = again
            .meta
            .as_ref()
            .and_then(|m| m.0.get("idempotency/replayed"));
        assert_eq!(replayed, Some(&Value::Bool(true)), "{again:?}");
        assert_eq!(structured(&again), paid.body);
    }
    // A member the type declares stays compared: another locale is another request.
    let mut args = acp(Some("glob-pay"), 4, Some(&id), Some(pay("spt_g")));
    args["meta"]["accept_language"] = json!("fr-FR");
    args["meta"]["risk_signals"] = json!({"score": 9});
    let other = call(&client, "complete_checkout_session", args)
        .await
        .expect_err("a conflict");
    assert_eq!(
        acp_error(&other)["code"],
        "idempotency_conflict",
        "{other:?}"
    );

    let charges = m.charges().await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges.values().next().map(Vec::len), Some(1));
}
