//! The example servers through real MCP clients: in-process (duplex), a child process over stdio,
//! and streamable HTTP with two bearer identities.
//!
//! No test waits by the clock: the stub processor says when a charge arrives and, when gated,
//! holds it until the test releases it; [`Finished`] counts the tool calls the server has
//! answered; the HTTP server's address comes from its own "listening on" line.

use std::sync::Arc;
use std::time::Duration;

use idempotency::mcp::{Identity, META_REF, META_REPLAYED, META_STATUS};
use idempotency::{store::MemoryStore, Caller, Idempotency};
use idempotency_examples::carrier::Carrier;
use idempotency_examples::charge::Payments;
use idempotency_examples::processor::Processor;
use idempotency_examples::shipment::Shipping;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult,
    PaginatedRequestParams, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::common::{call, connect, remove_db, soon, temp_db, Client};

/// A server that counts the `tools/call` requests it has finished: the count goes up when the
/// inner handler's future has returned (for a wrapped tool: after the outcome was recorded),
/// whether or not the client still waits for the answer.
struct Finished<S> {
    inner: S,
    done: watch::Sender<usize>,
}

impl<S> Finished<S> {
    fn new(inner: S) -> (Self, watch::Receiver<usize>) {
        let (done, seen) = watch::channel(0);
        (Finished { inner, done }, seen)
    }
}

impl<S: ServerHandler> ServerHandler for Finished<S> {
    fn get_info(&self) -> ServerConfig {
        self.inner.get_info()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let answer = self.inner.call_tool(request, context).await;
        self.done.send_modify(|n| *n += 1);
        answer
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.inner.list_tools(request, context).await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.inner.get_tool(name)
    }
}

fn meta_str(r: &CallToolResult, key: &str) -> Option<String> {
    r.meta.as_ref()?.0.get(key)?.as_str().map(str::to_owned)
}

fn replayed(r: &CallToolResult) -> bool {
    r.meta
        .as_ref()
        .and_then(|m| m.0.get(META_REPLAYED))
        .and_then(Value::as_bool)
        == Some(true)
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn payments(engine: &Idempotency, caller: Caller, processor: &Arc<Processor>) -> Payments {
    Payments::new(engine.clone(), Identity::stdio(caller), processor.clone())
}

fn charge_args() -> Value {
    json!({"amount_cents": 4200, "currency": "EUR", "card_token": "tok_visa"})
}

#[tokio::test]
async fn tools_list_shows_the_hint_exactly_on_wrapped_tools() {
    let engine = Idempotency::new(MemoryStore::new());
    let client = connect(payments(
        &engine,
        Caller::new("acme", "alice"),
        &Arc::new(Processor::default()),
    ))
    .await;
    // The server names itself (not rmcp's own crate name).
    let info = client.peer_info().expect("server info");
    let server = info.server_info.as_ref().expect("serverInfo");
    assert_eq!(server.name, "idempotency-charge-card");
    let tools = client.list_all_tools().await.unwrap();
    let mut seen = Vec::new();
    for t in &tools {
        let hint = t.annotations.as_ref().and_then(|a| a.idempotent_hint);
        seen.push((t.name.to_string(), hint));
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("charge_card".to_string(), Some(true)),
            ("idempotency_status".to_string(), None),
            ("payout".to_string(), Some(true)),
            ("refund".to_string(), None),
        ]
    );
    let status = tools
        .iter()
        .find(|t| t.name == "idempotency_status")
        .unwrap();
    assert_eq!(
        status.annotations.as_ref().and_then(|a| a.read_only_hint),
        Some(true)
    );
    // Client software can tell which tool takes its idempotency key.
    let client_key = |name: &str| {
        let t = tools.iter().find(|t| t.name == name).unwrap();
        t.meta
            .as_ref()
            .and_then(|m| m.get(idempotency::mcp::TOOL_META_CLIENT_KEY))
            .cloned()
    };
    assert_eq!(client_key("charge_card"), Some(json!("accept")));
    assert_eq!(client_key("refund"), None);
}

/// An unwrapped tool returning `Json<Receipt>`: what rmcp lists for it is what the wrapped
/// `charge_card` must list.
#[derive(Clone)]
struct Unwrapped;

#[rmcp::tool_router(server_handler)]
impl Unwrapped {
    #[rmcp::tool]
    async fn charge_card(&self) -> rmcp::Json<idempotency_examples::processor::Receipt> {
        unreachable!("only listed")
    }
}

/// Every `properties` member of an object schema `schema` is matched in `value` by a member of
/// its `type`, every `required` one is present, and nothing else is (the schema's own words).
fn conforms(value: &Value, schema: &Value) {
    assert_eq!(schema["type"], "object", "{schema}");
    let props = schema["properties"].as_object().expect("properties");
    let object = value.as_object().expect("an object");
    for name in schema["required"].as_array().expect("required") {
        assert!(
            object.contains_key(name.as_str().unwrap()),
            "{name} missing from {value}"
        );
    }
    for (name, v) in object {
        let ty = props
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not in the schema"))["type"]
            .clone();
        let ok = match ty.as_str() {
            Some("string") => v.is_string(),
            Some("integer") => v.is_u64() || v.is_i64(),
            other => panic!("a type this check does not know: {other:?}"),
        };
        assert!(ok, "{name} = {v} is not a {ty}");
    }
}

#[tokio::test]
async fn charge_card_lists_the_output_schema_of_its_receipt_and_its_answers_match_it() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::default());
    let client = connect(payments(&engine, Caller::new("acme", "alice"), &processor)).await;
    let tools = client.list_all_tools().await.unwrap();
    let charge = tools.iter().find(|t| t.name == "charge_card").unwrap();
    let listed = Value::Object(
        charge
            .output_schema
            .as_deref()
            .cloned()
            .expect("charge_card lists an outputSchema"),
    );
    let plain = connect(Unwrapped).await;
    let unwrapped = plain.list_all_tools().await.unwrap();
    let expected = Value::Object(unwrapped[0].output_schema.as_deref().cloned().unwrap());
    assert_eq!(listed, expected);
    assert!(listed["properties"].get("charge_id").is_some(), "{listed}");

    let first = call(&client, "charge_card", charge_args()).await;
    let again = call(&client, "charge_card", charge_args()).await;
    assert!(!replayed(&first) && replayed(&again));
    assert_eq!(processor.charges(), 1);
    let content = first.structured_content.clone().expect("structuredContent");
    conforms(&content, &listed);
    assert_eq!(again.structured_content, Some(content.clone()));
    assert_eq!(first.content, again.content);
    // The same JSON as a text block, as rmcp renders `Json<T>`.
    assert_eq!(
        serde_json::from_str::<Value>(&text(&first)).unwrap(),
        content
    );
}

#[tokio::test]
async fn concurrent_repeat_is_in_flight_and_the_processor_charges_once() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::gated());
    let client =
        Arc::new(connect(payments(&engine, Caller::new("acme", "alice"), &processor)).await);
    let c2 = client.clone();
    let first = tokio::spawn(async move { call(&c2, "charge_card", charge_args()).await });
    // The first call has claimed its key and is held inside the processor.
    soon("the first charge", processor.entered(1)).await;
    let second = call(&client, "charge_card", charge_args()).await;
    processor.release(1);
    let first = soon("the first answer", first).await.unwrap();
    assert_eq!(first.is_error, Some(false), "{}", text(&first));
    assert_eq!(second.is_error, Some(true));
    assert_eq!(meta_str(&second, META_STATUS).as_deref(), Some("in_flight"));
    let r = meta_str(&first, META_REF).unwrap();
    assert!(
        text(&second).contains(&r),
        "the in-flight answer names the ref: {}",
        text(&second)
    );
    assert!(text(&second).contains("idempotency_status"));
    assert_eq!(processor.charges(), 1);
}

/// A repeat and the status tool read a record the same way (`Standing`): while the first call
/// runs both say in flight. Once its lease has passed unrenewed (its worker is gone) the status
/// tool says outcome unknown, and `charge_card` (`recover = "rerun"`, its processor deduplicates
/// on the reference) is run again by the next repeat under the same reference: the processor's
/// original receipt, one charge, and from then on both say completed with that receipt.
#[tokio::test]
async fn the_repeat_and_the_status_tool_tell_the_same_story() {
    let clock = idempotency::clock::ManualClock::new(idempotency::clock::Timestamp::from_millis(
        1_796_000_000_000,
    ));
    let engine = Idempotency::builder(MemoryStore::new())
        .clock(clock.clone())
        .without_reconciler()
        .build();
    let processor = Arc::new(Processor::gated());
    let client =
        Arc::new(connect(payments(&engine, Caller::new("acme", "alice"), &processor)).await);
    let c2 = client.clone();
    let first = tokio::spawn(async move { call(&c2, "charge_card", charge_args()).await });
    soon("the first charge", processor.entered(1)).await;
    let status = |r: String| {
        let client = client.clone();
        async move {
            let status = call(&client, "idempotency_status", json!({ "ref": r })).await;
            status.structured_content.expect("structured")
        }
    };
    let repeat = call(&client, "charge_card", charge_args()).await;
    assert_eq!(meta_str(&repeat, META_STATUS).as_deref(), Some("in_flight"));
    let r = meta_str(&repeat, META_REF).expect("the repeat names the ref");
    assert_eq!(status(r.clone()).await["state"], "in_flight");
    // The worker stops renewing (the clock moves past the lease without its renewal timer).
    clock.advance(Idempotency::DEFAULT_LEASE + Duration::from_secs(1));
    assert_eq!(status(r.clone()).await["state"], "outcome_unknown");
    let c3 = client.clone();
    let rerun = tokio::spawn(async move { call(&c3, "charge_card", charge_args()).await });
    soon("the rerun's charge", processor.entered(2)).await;
    // Both requests (the gone worker's, which never reported, and the rerun's) go through; the
    // processor deduplicates them on the reference.
    processor.release(2);
    let rerun = soon("the rerun's answer", rerun).await.unwrap();
    soon("the first answer", first).await.unwrap();
    assert_eq!(rerun.is_error, Some(false), "{}", text(&rerun));
    assert_eq!(meta_str(&rerun, META_REF).as_deref(), Some(r.as_str()));
    let done = status(r).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(Some(done["answer"].clone()), rerun.structured_content);
    assert_eq!(processor.charges(), 1, "the processor charged once");
}

#[tokio::test]
async fn sequential_repeat_has_the_same_content_and_the_status_tool_is_tenant_scoped() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::default());
    let alice = connect(payments(&engine, Caller::new("acme", "alice"), &processor)).await;
    let first = call(&alice, "charge_card", charge_args()).await;
    // Same arguments, other key order and an explicit default: the same call.
    let again = call(&alice, "charge_card", json!({"card_token": "tok_visa", "description": null, "currency": "EUR", "amount_cents": 4200})).await;
    assert_eq!(first.content, again.content);
    assert_eq!(first.structured_content, again.structured_content);
    assert!(!replayed(&first) && replayed(&again));
    assert_eq!(processor.charges(), 1);

    let r = meta_str(&first, META_REF).unwrap();
    let status = call(&alice, "idempotency_status", json!({"ref": r})).await;
    let s = status.structured_content.clone().unwrap();
    assert_eq!(s["state"], "completed", "{s}");
    assert_eq!(s["answer"], first.structured_content.clone().unwrap());

    let bob = connect(payments(&engine, Caller::new("globex", "bob"), &processor)).await;
    let foreign = call(&bob, "idempotency_status", json!({"ref": r})).await;
    assert_eq!(foreign.structured_content.unwrap()["state"], "not_found");
    // The other tenant's identical call is its own operation.
    let theirs = call(&bob, "charge_card", charge_args()).await;
    assert!(!replayed(&theirs));
    assert_eq!(processor.charges(), 2);
}

#[tokio::test]
async fn a_declined_card_is_replayed_not_recharged() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::default());
    let client = connect(payments(&engine, Caller::new("acme", "alice"), &processor)).await;
    let args = json!({"amount_cents": 1, "currency": "EUR", "card_token": "tok_declined"});
    let a = call(&client, "charge_card", args.clone()).await;
    let b = call(&client, "charge_card", args).await;
    assert_eq!(a.is_error, Some(true));
    assert_eq!(a.content, b.content);
    assert!(replayed(&b));
}

#[tokio::test]
async fn create_shipment_same_order_other_address_is_a_mismatch() {
    let engine = Idempotency::new(MemoryStore::new());
    let carrier = Arc::new(Carrier::default());
    let client = connect(Shipping::new(
        engine,
        Identity::stdio(Caller::new("acme", "alice")),
        carrier.clone(),
    ))
    .await;
    let a = call(
        &client,
        "create_shipment",
        json!({"order_id": "o-77", "address": "1 Main St"}),
    )
    .await;
    let b = call(
        &client,
        "create_shipment",
        json!({"order_id": "o-77", "address": "1 Main St", "weight_grams": 1000}),
    )
    .await;
    assert_eq!(a.content, b.content, "defaulted weight is the same call");
    let tracking = a.structured_content.clone().unwrap()["tracking_number"].clone();
    assert_eq!(b.structured_content.unwrap()["tracking_number"], tracking);
    let c = call(
        &client,
        "create_shipment",
        json!({"order_id": "o-77", "address": "9 Elm St"}),
    )
    .await;
    assert_eq!(c.is_error, Some(true));
    assert_eq!(
        meta_str(&c, META_STATUS).as_deref(),
        Some("payload_mismatch")
    );
    assert!(text(&c).contains(&meta_str(&a, META_REF).unwrap()));
    assert_eq!(carrier.labels(), 1);
}

/// Arguments are checked before anything happens, and their refusal releases the claim instead
/// of being stored: the corrected call for the same order runs (it is not a payload mismatch
/// against a stored refusal), the carrier makes exactly one label, and a repeat of the
/// corrected call replays it.
#[tokio::test]
async fn a_bad_address_does_not_hold_the_order_and_the_corrected_call_ships_once() {
    let engine = Idempotency::new(MemoryStore::new());
    let carrier = Arc::new(Carrier::default());
    let client = connect(Shipping::new(
        engine,
        Identity::stdio(Caller::new("acme", "alice")),
        carrier.clone(),
    ))
    .await;
    let bad = json!({"order_id": "o-88", "address": "   "});
    let refused = call(&client, "create_shipment", bad.clone()).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text(&refused).contains("address is empty"),
        "{}",
        text(&refused)
    );
    assert_eq!(
        meta_str(&refused, META_STATUS),
        None,
        "the handler's own refusal"
    );
    assert_eq!(carrier.labels(), 0, "the carrier was never asked");
    // Not stored: the same bad call is checked again, not replayed.
    let refused_again = call(&client, "create_shipment", bad).await;
    assert_eq!(refused_again.is_error, Some(true));
    assert!(!replayed(&refused_again));

    let good = json!({"order_id": "o-88", "address": "1 Main St"});
    let shipped = call(&client, "create_shipment", good.clone()).await;
    assert_eq!(shipped.is_error, Some(false), "{}", text(&shipped));
    assert!(!replayed(&shipped));
    // The released claim kept its reference: the corrected call ships under it.
    assert_eq!(meta_str(&shipped, META_REF), meta_str(&refused, META_REF));
    let repeat = call(&client, "create_shipment", good).await;
    assert!(replayed(&repeat), "{}", text(&repeat));
    assert_eq!(repeat.content, shipped.content);
    assert_eq!(carrier.labels(), 1, "exactly one label at the carrier");
}

/// The same pattern in `charge_card`: a non-positive amount or an unknown currency is refused
/// before the processor is asked, and nothing is stored for it.
#[tokio::test]
async fn invalid_charges_are_refused_before_the_processor_and_not_stored() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::default());
    let client = connect(payments(&engine, Caller::new("acme", "alice"), &processor)).await;
    for (args, says) in [
        (
            json!({"amount_cents": 0, "currency": "EUR", "card_token": "tok_visa"}),
            "amount must be positive",
        ),
        (
            json!({"amount_cents": 4200, "currency": "XYZ", "card_token": "tok_visa"}),
            "unknown currency",
        ),
    ] {
        for _ in 0..2 {
            let r = call(&client, "charge_card", args.clone()).await;
            assert_eq!(r.is_error, Some(true));
            assert!(text(&r).contains(says), "{}", text(&r));
            assert!(!replayed(&r), "a refusal of bad arguments is not stored");
        }
    }
    assert_eq!(processor.charges(), 0);
    let ok = call(&client, "charge_card", charge_args()).await;
    assert_eq!(ok.is_error, Some(false), "{}", text(&ok));
    assert_eq!(processor.charges(), 1);
}

#[tokio::test]
async fn a_child_process_stdio_server_replays_across_a_restart() {
    let db = temp_db("stdio");
    let spawn = || {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_charge_card"));
        cmd.env("IDEMPOTENCY_SQLITE", &db)
            .env_remove("DATABASE_URL");
        rmcp::transport::TokioChildProcess::new(cmd).expect("spawn charge_card")
    };
    let client = ().serve(spawn()).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    let wrapped: Vec<_> = tools
        .iter()
        .filter(|t| t.annotations.as_ref().and_then(|a| a.idempotent_hint) == Some(true))
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(wrapped, vec!["charge_card", "payout"]);
    let first = call(&client, "charge_card", charge_args()).await;
    let second = call(&client, "charge_card", charge_args()).await;
    assert_eq!(first.content, second.content);
    assert!(replayed(&second));
    client.cancel().await.unwrap();

    // A new server process on the same SQLite file still recognises the repeat.
    let client = ().serve(spawn()).await.unwrap();
    let third = call(&client, "charge_card", charge_args()).await;
    assert!(replayed(&third), "the SQLite record survived the restart");
    assert_eq!(first.content, third.content);
    client.cancel().await.unwrap();
    remove_db(&db);
}

/// Tool arguments and answers never reach the log, even at `RUST_LOG=debug`: a stdio server is
/// called with a recognisable card token and its whole stderr searched for it.
#[tokio::test]
async fn no_arguments_in_the_log_at_debug() {
    use tokio::io::AsyncReadExt;
    const CANARY: &str = "tok_canary_5f3a9e";
    let db = temp_db("nolog");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_charge_card"));
    cmd.env("IDEMPOTENCY_SQLITE", &db)
        .env("RUST_LOG", "debug")
        .env_remove("DATABASE_URL");
    let (transport, stderr) = rmcp::transport::TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn charge_card");
    let mut stderr = stderr.expect("piped stderr");
    let log = tokio::spawn(async move {
        let mut all = String::new();
        let _ = stderr.read_to_string(&mut all).await;
        all
    });
    let client = ().serve(transport).await.unwrap();
    let args = json!({"amount_cents": 4200, "currency": "EUR", "card_token": CANARY});
    let first = call(&client, "charge_card", args.clone()).await;
    assert_eq!(first.is_error, Some(false), "{}", text(&first));
    assert!(replayed(&call(&client, "charge_card", args).await));
    client.cancel().await.unwrap();
    let log = log.await.expect("the log");
    assert!(log.contains("DEBUG"), "the server logged at debug: {log}");
    assert!(
        !log.contains(CANARY),
        "the card token is in the log:\n{log}"
    );
    // Where the records go is said at start-up, whole.
    assert!(
        log.contains(&format!("SQLite file {}", db.display())),
        "{log}"
    );
    let charge_id = first.structured_content.expect("a receipt")["charge_id"]
        .as_str()
        .expect("charge_id")
        .to_owned();
    assert!(
        !log.contains(&charge_id),
        "the answer is in the log:\n{log}"
    );
    remove_db(&db);
}

/// A `charge_card --http 127.0.0.1:0 [extra...]` child on its own SQLite file, and its URL read
/// from its own "listening on" line (port 0: the server binds a free port and logs it once it
/// listens). The child is killed when dropped.
async fn spawn_http(
    name: &str,
    extra: &[&str],
) -> (tokio::process::Child, String, std::path::PathBuf) {
    let (child, url, db, _) = spawn_http_with(name, extra, &[]).await;
    (child, url, db)
}

/// [`spawn_http`] with environment variables `env`; also the metrics URL the server logged,
/// if it logged one (`METRICS_ADDR`).
async fn spawn_http_with(
    name: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (
    tokio::process::Child,
    String,
    std::path::PathBuf,
    Option<String>,
) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let db = temp_db(name);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_charge_card"))
        .args(["--http", "127.0.0.1:0"])
        .args(extra)
        .envs(env.iter().copied())
        .env("IDEMPOTENCY_SQLITE", &db)
        .env_remove("DATABASE_URL")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut log = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut metrics = None;
    let url = soon("the server's \"listening on\" line", async {
        while let Some(line) = log.next_line().await.expect("read the server's log") {
            if let Some((_, at)) = line.split_once("metrics on ") {
                metrics = Some(at.trim().to_owned());
            }
            if let Some((_, at)) = line.split_once("listening on ") {
                return at.trim().to_owned();
            }
        }
        panic!("charge_card --http exited before listening");
    })
    .await;
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
        "{url}"
    );
    // Keep draining the log so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = log.next_line().await {} });
    (child, url, db, metrics)
}

/// `METRICS_ADDR` puts /metrics on an address of its own: every metric described, histograms
/// with buckets (not summaries), the purger's among them; nothing beside /mcp.
#[tokio::test]
async fn metrics_on_their_own_address() {
    let (mut child, url, db, metrics) =
        spawn_http_with("metrics", &[], &[("METRICS_ADDR", "127.0.0.1:0")]).await;
    let metrics = metrics.expect("the server logged its metrics address");
    let acme = http_client(&url, "acme-token").await;
    call(&acme, "charge_card", charge_args()).await;
    assert!(replayed(&call(&acme, "charge_card", charge_args()).await));
    let scraped = raw(&metrics, "GET", "", &[], None, None).await;
    assert_eq!(scraped.status, 200);
    for line in [
        "# HELP idempotency_calls_total ",
        "# TYPE idempotency_call_seconds histogram",
        "# TYPE idempotency_store_seconds histogram",
        "idempotency_store_seconds_bucket{operation=\"purge\",le=\"0.0001\"}",
        "idempotency_cache_total{tool=\"charge_card\",result=\"hit\"} 1",
    ] {
        assert!(scraped.body.contains(line), "{line}:\n{}", scraped.body);
    }
    let beside = raw(
        &url.replace("/mcp", "/metrics"),
        "GET",
        "acme-token",
        &[],
        None,
        None,
    )
    .await;
    assert_eq!(beside.status, 404, "not also beside /mcp");
    let _ = child.kill().await;
    remove_db(&db);
}

/// `--http` takes a host name too, and a bad address is refused with the form it needs.
#[tokio::test]
async fn http_takes_a_host_name_and_refuses_a_bad_address() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let db = temp_db("localhost");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_charge_card"))
        .args(["--http", "localhost:0"])
        .env("IDEMPOTENCY_SQLITE", &db)
        .env_remove("DATABASE_URL")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut log = BufReader::new(child.stderr.take().unwrap()).lines();
    soon("the server's \"listening on\" line", async {
        while let Some(line) = log.next_line().await.expect("read the server's log") {
            if line.contains("listening on http://") {
                return;
            }
        }
        panic!("charge_card --http localhost:0 exited before listening");
    })
    .await;
    let _ = child.kill().await;
    remove_db(&db);

    let bad = tokio::process::Command::new(env!("CARGO_BIN_EXE_charge_card"))
        .args(["--http", "8080"])
        .output()
        .await
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("error: --http needs HOST:PORT"), "{err}");
}

/// A store that cannot be opened: the error names it (without the password) and the cause.
#[tokio::test]
async fn a_start_up_failure_names_the_store_and_hides_the_password() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_charge_card"))
        .env("DATABASE_URL", "postgres://app:hunter2@127.0.0.1:1/app")
        .env("IDEMPOTENCY_SECRET", "an example secret of 32 bytes...")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error: cannot open the PostgreSQL store at DATABASE_URL: ")
            && err.contains("postgres://app@127.0.0.1:1/app"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}

/// On a shared store (`DATABASE_URL`) the server refuses the demo secret, before it connects:
/// a replica on it beside others on a real secret would charge every call a second time.
#[tokio::test]
async fn a_shared_store_refuses_the_demo_secret() {
    for demo in [
        None,
        Some("idempotency demo secret: replace me in production"),
    ] {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_charge_card"));
        command.env("DATABASE_URL", "postgres://app:hunter2@127.0.0.1:1/app");
        match demo {
            None => command.env_remove("IDEMPOTENCY_SECRET"),
            Some(s) => command.env("IDEMPOTENCY_SECRET", s),
        };
        let out = command.output().await.unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("error: IDEMPOTENCY_SECRET is not set (or is the published demo secret), and DATABASE_URL")
                && err.contains("only for the local SQLite demo"),
            "{err}"
        );
        assert!(!err.contains("cannot open the PostgreSQL store"), "{err}");
    }
}

async fn http_client(url: &str, token: &str) -> Client {
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    let cfg =
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token.to_owned());
    ().serve(StreamableHttpClientTransport::from_config(cfg))
        .await
        .expect("HTTP client connects")
}

#[tokio::test]
async fn over_http_two_bearer_identities_are_isolated() {
    let (mut child, url, db) = spawn_http("http", &[]).await;
    let acme = http_client(&url, "acme-token").await;
    let globex = http_client(&url, "globex-token").await;
    let a1 = call(&acme, "charge_card", charge_args()).await;
    let a2 = call(&acme, "charge_card", charge_args()).await;
    assert!(replayed(&a2));
    assert_eq!(a1.content, a2.content);
    let r = meta_str(&a1, META_REF).unwrap();
    let mine = call(&acme, "idempotency_status", json!({"ref": r})).await;
    assert_eq!(mine.structured_content.unwrap()["state"], "completed");
    let theirs = call(&globex, "idempotency_status", json!({"ref": r})).await;
    assert_eq!(theirs.structured_content.unwrap()["state"], "not_found");
    let g1 = call(&globex, "charge_card", charge_args()).await;
    assert!(
        !replayed(&g1),
        "another tenant's identical call is its own charge"
    );
    assert_ne!(
        g1.structured_content.unwrap()["charge_id"],
        a1.structured_content.unwrap()["charge_id"]
    );
    // The library's counters, as Prometheus scrapes them from /metrics.
    let scraped = raw(&url.replace("/mcp", "/metrics"), "GET", "", &[], None, None).await;
    assert_eq!(scraped.status, 200);
    let count = |answer: &str| -> Option<f64> {
        scraped
            .body
            .lines()
            .find(|l| {
                l.starts_with("idempotency_calls_total{")
                    && l.contains("tool=\"charge_card\"")
                    && l.contains(&format!("answer=\"{answer}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    assert_eq!(count("fresh"), Some(2.0), "{}", scraped.body);
    assert_eq!(count("replayed"), Some(1.0), "{}", scraped.body);
    // The replay came from the engine's cache of completed answers.
    assert!(
        scraped
            .body
            .lines()
            .any(|l| l.starts_with("idempotency_cache_total{")
                && l.contains("tool=\"charge_card\"")
                && l.contains("result=\"hit\"")
                && l.ends_with(" 1")),
        "{}",
        scraped.body
    );
    assert!(
        scraped
            .body
            .contains("idempotency_store_seconds_bucket{operation=\"claim\""),
        "{}",
        scraped.body
    );
    let _ = child.kill().await;
    remove_db(&db);
}

/// One raw HTTP exchange (the examples crate has no HTTP client of its own to name: rmcp's
/// client hides the session id, and these tests must forge it).
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one HTTP/1.0 request (so the answer, SSE included, is close-delimited, never chunked)
/// and reads the answer until the connection closes, or — for a stream that stays open — until
/// `until` says the body read so far is enough.
async fn raw(
    url: &str,
    method: &str,
    token: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
    until: Option<fn(&str) -> bool>,
) -> Raw {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut stream = tokio::net::TcpStream::connect(authority).await.unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {authority}\r\nAuthorization: Bearer {token}\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    soon(&format!("the answer to {method} {headers:?}"), async {
        let mut buf = [0u8; 8192];
        loop {
            if let Some(enough) = until {
                let text = String::from_utf8_lossy(&got);
                if let Some((_, body)) = text.split_once("\r\n\r\n")
                    && enough(body)
                {
                    return;
                }
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&got).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Raw {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// The JSON-RPC messages of an SSE body (its `data:` lines).
fn sse_messages(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
        .collect()
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw-test", "version": "0"}}})
}

fn initialized() -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
}

fn charge_request(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "charge_card", "arguments": charge_args()}})
}

/// The structured result of the `tools/call` answer in an SSE body.
fn tool_answer(body: &str) -> Option<Value> {
    sse_messages(body)
        .into_iter()
        .find_map(|m| m.get("result")?.get("structuredContent").cloned())
}

/// A session is its opener's: another tenant's bearer token with acme's `Mcp-Session-Id` is
/// refused (403, the same answer as for an id that never existed) on `POST`, on a `GET` that
/// resumes acme's stream with `Last-Event-ID`, and on `DELETE` — which therefore does not end it.
/// Acme's own `POST`, resume, `GET` and `DELETE` work.
#[tokio::test]
async fn over_http_a_session_belongs_to_the_caller_who_opened_it() {
    let (mut child, url, db) = spawn_http("sessions", &[]).await;
    const ACME: &str = "acme-token";
    const GLOBEX: &str = "globex-token";

    // acme opens a session (the legacy handshake: rmcp's default stateful mode).
    let opened = raw(&url, "POST", ACME, &[], Some(initialize()), None).await;
    assert_eq!(opened.status, 200, "{}", opened.body);
    let session = opened
        .header("mcp-session-id")
        .expect("a stateful server opens a session")
        .to_owned();
    let sid = [("Mcp-Session-Id", session.as_str())];
    let ready = raw(&url, "POST", ACME, &sid, Some(initialized()), None).await;
    assert_eq!(ready.status, 202, "{}", ready.body);
    // acme charges in its session; the SSE stream's first event id is where a resume starts.
    let charged = raw(&url, "POST", ACME, &sid, Some(charge_request(2)), None).await;
    assert_eq!(charged.status, 200, "{}", charged.body);
    let receipt = tool_answer(&charged.body).expect("acme's receipt");
    let charge_id = receipt["charge_id"].as_str().unwrap().to_owned();
    let reference = receipt["reference"].as_str().unwrap().to_owned();
    let first_event = charged
        .body
        .lines()
        .find_map(|l| l.strip_prefix("id:"))
        .expect("the stream's events have ids")
        .trim()
        .to_owned();
    let resume = [
        ("Mcp-Session-Id", session.as_str()),
        ("Last-Event-ID", first_event.as_str()),
    ];

    // globex, with acme's session id: refused everywhere, exactly like an unknown id.
    let unknown_id = "00000000-0000-4000-8000-000000000000";
    let unknown = raw(
        &url,
        "POST",
        GLOBEX,
        &[("Mcp-Session-Id", unknown_id)],
        Some(charge_request(3)),
        None,
    )
    .await;
    assert_eq!(unknown.status, 403);
    let forged_post = raw(&url, "POST", GLOBEX, &sid, Some(charge_request(3)), None).await;
    let forged_resume = raw(&url, "GET", GLOBEX, &resume, None, None).await;
    let forged_delete = raw(&url, "DELETE", GLOBEX, &sid, None, None).await;
    for (what, r) in [
        ("POST", &forged_post),
        ("GET resume", &forged_resume),
        ("DELETE", &forged_delete),
    ] {
        assert_eq!(r.status, 403, "{what}: {}", r.body);
        assert_eq!(
            r.body, unknown.body,
            "{what}: the same answer as an unknown id"
        );
        assert!(r.header("mcp-session-id").is_none(), "{what}");
        for secret in [charge_id.as_str(), reference.as_str(), "data:", "result"] {
            assert!(
                !r.body.contains(secret),
                "{what} leaked {secret:?}: {}",
                r.body
            );
        }
    }

    // acme's session survived globex's DELETE: acme may resume its own stream. (rmcp 3.11
    // replays a request's stream only while it is cached; this one has completed and been read
    // in full, and rmcp answers such a resume with 200 and an empty stream or the cached events.
    // Either way it is acme's: 200 where globex got 403.)
    let resumed = raw(&url, "GET", ACME, &resume, None, None).await;
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    assert!(resumed
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream")));
    if let Some(replayed) = tool_answer(&resumed.body) {
        assert_eq!(replayed, receipt);
    }
    // ...calls again in it (a replay: the same receipt)...
    let again = raw(&url, "POST", ACME, &sid, Some(charge_request(4)), None).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(
        tool_answer(&again.body).as_ref(),
        Some(&receipt),
        "{}",
        again.body
    );
    // ...opens its server stream (the headers are enough: the stream stays open)...
    let stream = raw(&url, "GET", ACME, &sid, None, Some(|_| true)).await;
    assert_eq!(stream.status, 200);
    assert!(stream
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream")));
    // ...and ends it. The id is then nobody's: refused like any unknown id.
    let deleted = raw(&url, "DELETE", ACME, &sid, None, None).await;
    assert!((200..300).contains(&deleted.status), "{}", deleted.body);
    let after = raw(&url, "POST", ACME, &sid, Some(charge_request(5)), None).await;
    assert_eq!(after.status, 403);
    // No token at all is still the authentication's 401.
    let anonymous = raw(&url, "POST", "nobody", &sid, Some(charge_request(6)), None).await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.header("www-authenticate"), Some("Bearer"));

    let _ = child.kill().await;
    remove_db(&db);
}

/// `--stateless`: no session is ever opened (nothing to hijack, nothing to resume or delete),
/// and tool calls work, replays included, through rmcp's own client and through a bare POST.
#[tokio::test]
async fn over_http_stateless_mode_serves_tool_calls_without_sessions() {
    let (mut child, url, db) = spawn_http("stateless", &["--stateless"]).await;
    let acme = http_client(&url, "acme-token").await;
    let first = call(&acme, "charge_card", charge_args()).await;
    assert_eq!(first.is_error, Some(false), "{}", text(&first));
    let again = call(&acme, "charge_card", charge_args()).await;
    assert!(replayed(&again));
    assert_eq!(first.content, again.content);

    // The legacy handshake gets an answer but no session.
    let opened = raw(&url, "POST", "acme-token", &[], Some(initialize()), None).await;
    assert_eq!(opened.status, 200, "{}", opened.body);
    assert!(opened.header("mcp-session-id").is_none());
    // A bare tools/call, no session: the same operation, replayed.
    let bare = raw(
        &url,
        "POST",
        "acme-token",
        &[],
        Some(charge_request(7)),
        None,
    )
    .await;
    assert_eq!(bare.status, 200, "{}", bare.body);
    assert_eq!(tool_answer(&bare.body), first.structured_content);
    // No stream to resume or session to end.
    for method in ["GET", "DELETE"] {
        let r = raw(
            &url,
            method,
            "acme-token",
            &[("Last-Event-ID", "0/1")],
            None,
            None,
        )
        .await;
        assert_eq!(r.status, 405, "{method}: {}", r.body);
    }
    let _ = child.kill().await;
    remove_db(&db);
}

/// rmcp 3.11 answers `notifications/cancelled` by cancelling the request's token; it does not
/// drop the handler's future. The wrapped call therefore runs to its end and records the truth:
/// while it runs a repeat is told "in flight", afterwards it gets the stored receipt, and the
/// processor charged once. (A dropped future — disconnect, a runtime shutting down — is covered
/// in `runtime/tests/engine.rs`: it leaves the outcome unknown.)
#[tokio::test]
async fn a_call_cancelled_by_the_client_still_tells_the_truth() {
    use rmcp::model::{CallToolRequest, ClientRequest};
    use rmcp::service::PeerRequestOptions;
    let engine = Idempotency::new(MemoryStore::new());
    // Gated: the charge cannot finish before the client's timeout, however slow the machine.
    let processor = Arc::new(Processor::gated());
    let (server, mut finished) =
        Finished::new(payments(&engine, Caller::new("acme", "alice"), &processor));
    let client = connect(server).await;
    let params = CallToolRequestParams::new("charge_card")
        .with_arguments(charge_args().as_object().cloned().unwrap_or_default());
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    // The host gives up after 200 ms and sends notifications/cancelled.
    let handle = client
        .peer()
        .send_request_with_option(
            request,
            PeerRequestOptions::with_timeout(Duration::from_millis(200)),
        )
        .await
        .expect("sent");
    assert!(
        soon("the client's timeout", handle.await_response())
            .await
            .is_err(),
        "the client timed out and cancelled"
    );
    // The abandoned call claimed its key and is held inside the processor.
    soon("the abandoned charge", processor.entered(1)).await;
    let during = call(&client, "charge_card", charge_args()).await;
    assert_eq!(
        meta_str(&during, META_STATUS).as_deref(),
        Some("in_flight"),
        "{}",
        text(&during)
    );
    // `during` has been answered, so it is finished call 1; let the abandoned call finish too
    // and wait until its handler has returned (its receipt recorded).
    assert_eq!(*finished.borrow(), 1);
    processor.release(1);
    soon(
        "the abandoned call to finish",
        finished.wait_for(|n| *n >= 2),
    )
    .await
    .expect("the server is still running");
    let after = call(&client, "charge_card", charge_args()).await;
    assert!(
        replayed(&after),
        "the abandoned call's receipt was recorded: {}",
        text(&after)
    );
    assert_eq!(processor.charges(), 1);
}

/// The example servers' reconcilers ask their downstream stub by reference: a charge the
/// processor made is settled with its receipt, one it never saw is released; a label the carrier
/// made is settled with it.
#[tokio::test]
async fn the_example_reconcilers_ask_the_stub_by_reference() {
    use idempotency::store::{Settlement, Unsettled};
    use idempotency::tasks::Reconcile;
    let key = |n: u64| {
        idempotency::key::Key::for_call(
            &idempotency::key::Secret::demo(),
            &Caller::new("acme", "alice"),
            "charge_card",
            &n,
        )
        .expect("key")
    };
    let unsettled = |n: u64| Unsettled {
        key: key(n),
        reference: key(n).reference(1),
        tenant: "acme".into(),
        subject: Some("alice".into()),
        tool: "charge_card".into(),
        state: idempotency::store::RecordState::InFlight,
        token: idempotency::store::Token(1),
        claimed_at: idempotency::clock::Timestamp::from_millis(0),
        window: Duration::from_secs(15 * 60),
    };
    let processor = Arc::new(Processor::default());
    let charged = unsettled(1);
    let receipt = processor
        .charge(&charged.reference.to_string(), 4200, "EUR")
        .await;
    let reconcile = idempotency_examples::charge::reconciler(processor.clone());
    match reconcile.reconcile(&charged).await.expect("asked") {
        Settlement::Completed(answer) => {
            assert!(answer.ok);
            let stored: idempotency_examples::processor::Receipt =
                serde_json::from_str(&answer.body).expect("a receipt");
            assert_eq!(stored, receipt);
        }
        other => panic!("expected the receipt, got {other:?}"),
    }
    assert_eq!(
        reconcile.reconcile(&unsettled(2)).await.expect("asked"),
        Settlement::Released
    );
    let carrier = Arc::new(Carrier::default());
    let shipped = unsettled(3);
    let label = carrier.create_label(&shipped.reference.to_string(), "order-3");
    let reconcile = idempotency_examples::shipment::reconciler(carrier.clone());
    match reconcile.reconcile(&shipped).await.expect("asked") {
        Settlement::Completed(answer) => assert!(answer.body.contains(&label.tracking_number)),
        other => panic!("expected the label, got {other:?}"),
    }
    assert_eq!(processor.charges(), 1);
    assert_eq!(carrier.labels(), 1);
}

/// Asked about `X-1` after the same call was made again past its window as `X-2`, the status tool
/// answers what is known: X-1 completed, and the key has moved on to X-2 (not "no such ref").
#[tokio::test]
async fn the_status_of_a_superseded_reference_says_it_completed() {
    let clock = idempotency::clock::ManualClock::new(idempotency::clock::Timestamp::from_millis(
        1_796_000_000_000,
    ));
    let engine = Idempotency::builder(MemoryStore::new())
        .clock(clock.clone())
        .build();
    let processor = Arc::new(Processor::default());
    let alice = connect(payments(&engine, Caller::new("acme", "alice"), &processor)).await;
    let first = call(&alice, "charge_card", charge_args()).await;
    let r1 = meta_str(&first, META_REF).unwrap();
    // charge_card's window (15 min) and a second.
    clock.advance(Duration::from_secs(15 * 60 + 1));
    let later = call(&alice, "charge_card", charge_args()).await;
    let r2 = meta_str(&later, META_REF).unwrap();
    assert_ne!(r1, r2);
    assert_eq!(processor.charges(), 2);
    let status = call(&alice, "idempotency_status", json!({"ref": r1})).await;
    let s = status.structured_content.clone().unwrap();
    assert_eq!(s["state"], "completed", "{s}");
    assert_eq!(s["superseded_by"], r2.as_str(), "{s}");
    assert!(s["message"].as_str().unwrap().contains(&r2), "{s}");
    let bob = connect(payments(&engine, Caller::new("globex", "bob"), &processor)).await;
    let foreign = call(&bob, "idempotency_status", json!({"ref": r1})).await;
    assert_eq!(foreign.structured_content.unwrap()["state"], "not_found");
}

/// The guide's two MCP Inspector commands (docs/guide.md, "To try one with the MCP
/// Inspector"), read from the guide and run as written, twice each, against the example server:
/// Inspector 0.15 starting it over stdio, Inspector 2 over HTTP with the bearer token. Only the
/// paths change: the local installs of the two Inspectors (`examples/build.rs`) for `npx …`, this
/// build's server, a file and an address of the test's own.
#[cfg_attr(
    no_inspector,
    ignore = "needs the two MCP Inspector CLIs (see examples/build.rs)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_inspector_commands_replay() {
    let Some(dir) = option_env!("INSPECTOR_DIR") else {
        panic!("no INSPECTOR_DIR at build time (see examples/build.rs)");
    };
    let guide = include_str!("../../docs/guide.md");
    let command = |prefix: &str| -> Vec<String> {
        let line = guide
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("the guide has no command starting {prefix:?}"));
        // The words of the line, as a shell splits them (double quotes only).
        let (mut words, mut word, mut quoted) = (Vec::new(), String::new(), false);
        for c in line.chars() {
            match c {
                '"' => quoted = !quoted,
                ' ' if !quoted => {
                    if !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                }
                c => word.push(c),
            }
        }
        words.push(word);
        words
    };
    let db = temp_db("inspector-stdio");
    let (_server, url, http_db) = spawn_http("inspector-http", &[]).await;
    let cases = [
        ("npx @modelcontextprotocol/inspector@0.15.0 ", "0.15"),
        ("npx @modelcontextprotocol/inspector@2 ", "2"),
    ];
    for (prefix, version) in cases {
        let words = command(prefix);
        let args: Vec<String> = words[2..]
            .iter()
            .map(|w| match w.as_str() {
                "target/debug/charge_card" => env!("CARGO_BIN_EXE_charge_card").to_owned(),
                "IDEMPOTENCY_SQLITE=/tmp/demo.db" => format!("IDEMPOTENCY_SQLITE={}", db.display()),
                "http://127.0.0.1:8080/mcp" => url.clone(),
                other => other.to_owned(),
            })
            .collect();
        let cli = format!("{dir}/{version}/node_modules/.bin/mcp-inspector");
        let mut answers = Vec::new();
        for _ in 0..2 {
            let out = soon(
                "the Inspector's answer",
                // The servers here run on SQLite (the Inspector passes its environment on).
                tokio::process::Command::new(&cli)
                    .args(&args)
                    .env_remove("DATABASE_URL")
                    .output(),
            )
            .await
            .expect("run the Inspector");
            assert!(
                out.status.success(),
                "Inspector {version}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "Inspector {version} printed no JSON ({e}): {}",
                    String::from_utf8_lossy(&out.stdout)
                )
            });
            answers.push(answer);
        }
        assert_eq!(
            answers[0]["_meta"][META_REPLAYED],
            json!(false),
            "{}",
            answers[0]
        );
        assert_eq!(
            answers[1]["_meta"][META_REPLAYED],
            json!(true),
            "{}",
            answers[1]
        );
        assert_eq!(answers[0]["content"], answers[1]["content"]);
        assert_eq!(answers[0]["_meta"][META_REF], answers[1]["_meta"][META_REF]);
    }
    remove_db(&db);
    remove_db(&http_db);
}

// Client idempotency keys (`client_key`): the key comes from the request's `_meta` or the
// `Idempotency-Key` header, never from the arguments.

/// `tools/call` with `_meta` "idempotency/key" = `key` (any JSON, to send a wrong one too).
async fn call_keyed(
    client: &Client,
    tool: &str,
    args: Value,
    key: Value,
) -> Result<CallToolResult, ErrorData> {
    let mut params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    let mut meta = rmcp::model::RequestMetaObject::default();
    meta.insert(idempotency::mcp::META_KEY.into(), key);
    params.meta = Some(meta);
    match client.call_tool(params).await {
        Ok(r) => Ok(r),
        Err(rmcp::ServiceError::McpError(e)) => Err(e),
        Err(e) => panic!("call_tool: {e}"),
    }
}

/// The JSON-RPC error's `data.type`.
fn error_type(e: &ErrorData) -> Option<&str> {
    e.data.as_ref()?.get("type")?.as_str()
}

const KEY: &str = "6f1c2a7e-7d55-4c1e-9a53-0b5e3c2f9a10";

/// With the client's key: the same key and arguments replay the stored receipt; the same key
/// with other arguments is refused as SEP-3182 proposed (`data.type` "idempotency_key_conflict",
/// naming the first call's ref); another key is another charge, even with the same arguments;
/// without a key (`accept`), the server derives the key as ever. The processor counts charges.
#[tokio::test]
async fn a_client_key_replays_its_call_and_refuses_other_arguments() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::default());
    let client = connect(payments(&engine, Caller::new("acme", "alice"), &processor)).await;
    let first = call_keyed(&client, "charge_card", charge_args(), json!(KEY))
        .await
        .unwrap();
    assert_eq!(first.is_error, Some(false), "{}", text(&first));
    assert!(!replayed(&first));
    let again = call_keyed(&client, "charge_card", charge_args(), json!(KEY))
        .await
        .unwrap();
    assert!(replayed(&again));
    assert_eq!(first.content, again.content);
    assert_eq!(processor.charges(), 1);

    let mut other = charge_args();
    other["amount_cents"] = json!(9900);
    let conflict = call_keyed(&client, "charge_card", other, json!(KEY))
        .await
        .unwrap_err();
    assert_eq!(error_type(&conflict), Some("idempotency_key_conflict"));
    assert_eq!(conflict.code.0, -32602);
    let r = meta_str(&first, META_REF).unwrap();
    assert_eq!(conflict.data.as_ref().unwrap()["ref"], json!(r));
    assert!(
        conflict.message.contains("different arguments") && conflict.message.contains(&r),
        "{}",
        conflict.message
    );
    assert_eq!(processor.charges(), 1, "a conflict charges nothing");

    let second_key = call_keyed(
        &client,
        "charge_card",
        charge_args(),
        json!("a-second-request-0001"),
    )
    .await
    .unwrap();
    assert!(!replayed(&second_key));
    assert_ne!(meta_str(&second_key, META_REF), Some(r.clone()));
    assert_eq!(processor.charges(), 2, "another key is another request");

    // No key: the server's own key (all the arguments), as for any tool.
    let plain = call(&client, "charge_card", charge_args()).await;
    let plain_again = call(&client, "charge_card", charge_args()).await;
    assert!(!replayed(&plain) && replayed(&plain_again));
    assert_eq!(processor.charges(), 3);
}

/// While the key's first request runs, a repeat with the key is told so as SEP-3182 proposed:
/// a JSON-RPC error, `data.type` "idempotency_key_in_progress", with the ref; nothing runs twice.
#[tokio::test]
async fn a_client_key_in_progress_is_a_json_rpc_error() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::gated());
    let client =
        Arc::new(connect(payments(&engine, Caller::new("acme", "alice"), &processor)).await);
    let c2 = client.clone();
    let first =
        tokio::spawn(
            async move { call_keyed(&c2, "charge_card", charge_args(), json!(KEY)).await },
        );
    soon("the first charge", processor.entered(1)).await;
    let busy = call_keyed(&client, "charge_card", charge_args(), json!(KEY))
        .await
        .unwrap_err();
    processor.release(1);
    let first = soon("the first answer", first).await.unwrap().unwrap();
    assert_eq!(error_type(&busy), Some("idempotency_key_in_progress"));
    assert_eq!(busy.code.0, idempotency::mcp::IN_PROGRESS_CODE);
    let r = meta_str(&first, META_REF).unwrap();
    assert_eq!(busy.data.as_ref().unwrap()["ref"], json!(r));
    assert_eq!(busy.data.as_ref().unwrap()[META_STATUS], json!("in_flight"));
    assert_eq!(processor.charges(), 1);
    let after = call_keyed(&client, "charge_card", charge_args(), json!(KEY))
        .await
        .unwrap();
    assert!(replayed(&after));
    assert_eq!(processor.charges(), 1);
}

/// A client key never crosses callers: the same key and arguments from another subject of the
/// tenant, or from another tenant, are their own calls.
#[tokio::test]
async fn two_callers_with_one_client_key_do_not_share_a_record() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::default());
    let mut refs = Vec::new();
    for caller in [
        Caller::new("acme", "alice"),
        Caller::new("acme", "bob"),
        Caller::new("globex", "alice"),
    ] {
        let client = connect(payments(&engine, caller, &processor)).await;
        let r = call_keyed(&client, "charge_card", charge_args(), json!(KEY))
            .await
            .unwrap();
        assert!(!replayed(&r), "{}", text(&r));
        refs.push(meta_str(&r, META_REF).unwrap());
    }
    assert_eq!(processor.charges(), 3);
    refs.sort();
    refs.dedup();
    assert_eq!(refs.len(), 3, "three records");
}

/// A tool that insists on the client's key.
#[derive(Clone)]
struct Strict {
    engine: Idempotency,
    processor: Arc<Processor>,
    tool_router: rmcp::handler::server::router::tool::ToolRouter<Self>,
}

impl idempotency::IdempotencyContext<RequestContext<RoleServer>> for Strict {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, _: &RequestContext<RoleServer>) -> Result<Caller, idempotency::Error> {
        Ok(Caller::new("acme", "alice"))
    }
}

#[idempotency::idempotent_tools]
#[rmcp::tool_router]
impl Strict {
    #[idempotency::idempotent(window = "1h", on_error = "retryable", client_key = "require")]
    #[rmcp::tool(
        description = "Charge a card; the client must send an idempotency key.",
        meta = rmcp::model::MetaObject(
            json!({"team": "payments"}).as_object().cloned().unwrap_or_default()
        )
    )]
    async fn charge_strictly(
        &self,
        rmcp::handler::server::wrapper::Parameters(args): rmcp::handler::server::wrapper::Parameters<
            idempotency_examples::charge::ChargeArgs,
        >,
    ) -> Result<rmcp::Json<idempotency_examples::processor::Receipt>, String> {
        let reference = idempotency::Call::current()
            .ok_or("not wrapped")?
            .reference()
            .to_string();
        Ok(rmcp::Json(
            self.processor
                .charge(&reference, args.amount_cents, &args.currency)
                .await,
        ))
    }
}

#[rmcp::tool_handler(router = self.tool_router)]
impl ServerHandler for Strict {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            rmcp::model::ServerCapabilities::builder()
                .enable_tools()
                .build(),
        )
    }
}

/// `client_key = "require"`: a call without a key, or with one only in its arguments (the
/// model's), is refused with a JSON-RPC error naming where the key goes; an unusable key is
/// refused saying what is wrong. Nothing reaches the processor until a good key comes.
#[tokio::test]
async fn require_refuses_a_call_without_a_usable_client_key() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::default());
    let client = connect(Strict {
        engine,
        processor: processor.clone(),
        tool_router: Strict::tool_router(),
    })
    .await;
    let listed = client.list_all_tools().await.unwrap();
    let meta = listed[0].meta.as_ref().expect("the listing's _meta");
    assert_eq!(meta.get("idempotency/clientKey"), Some(&json!("require")));
    assert_eq!(
        meta.get("team"),
        Some(&json!("payments")),
        "its own _meta kept"
    );
    let params = |args: Value| {
        CallToolRequestParams::new("charge_strictly")
            .with_arguments(args.as_object().cloned().unwrap_or_default())
    };
    let mut in_args = charge_args();
    in_args["idempotency_key"] = json!(KEY);
    for args in [charge_args(), in_args] {
        let Err(rmcp::ServiceError::McpError(missing)) = client.call_tool(params(args)).await
        else {
            panic!("a call without a key must be refused");
        };
        assert_eq!(error_type(&missing), Some("idempotency_key_missing"));
        assert_eq!(
            missing.data.as_ref().unwrap()[META_STATUS],
            json!("invalid")
        );
        assert_eq!(missing.code.0, -32602);
        assert!(
            missing.message.contains("`_meta` as \"idempotency/key\"")
                && missing.message.contains("Idempotency-Key"),
            "{}",
            missing.message
        );
    }
    for (key, says) in [
        (json!("short"), "it must have 8 to 255"),
        (json!("has a space in it"), "character 4"),
        (json!(42), "must be a string, not a number"),
    ] {
        let bad = call_keyed(&client, "charge_strictly", charge_args(), key)
            .await
            .unwrap_err();
        assert_eq!(error_type(&bad), Some("idempotency_key_invalid"));
        assert!(bad.message.contains(says), "{}", bad.message);
    }
    assert_eq!(processor.charges(), 0);
    let ok = call_keyed(&client, "charge_strictly", charge_args(), json!(KEY))
        .await
        .unwrap();
    assert_eq!(ok.is_error, Some(false), "{}", text(&ok));
    assert!(replayed(
        &call_keyed(&client, "charge_strictly", charge_args(), json!(KEY))
            .await
            .unwrap()
    ));
    assert_eq!(processor.charges(), 1);
}

/// Over streamable HTTP the key may come in the `Idempotency-Key` header: replayed with the same
/// arguments, refused as a conflict with others; another key is another charge (the receipt's
/// charge id counts the processor's charges). A header and a `_meta` key that differ are refused.
#[tokio::test]
async fn over_http_the_idempotency_key_header_scopes_the_call() {
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    let (mut child, url, db) = spawn_http("ckeys", &["--stateless"]).await;
    let keyed = |key: &str| {
        let headers = std::collections::HashMap::from([(
            http::HeaderName::from_static("idempotency-key"),
            http::HeaderValue::from_str(key).unwrap(),
        )]);
        StreamableHttpClientTransportConfig::with_uri(url.clone())
            .auth_header("acme-token".to_owned())
            .custom_headers(headers)
    };
    let k1 = ().serve(StreamableHttpClientTransport::from_config(keyed(KEY))).await.unwrap();
    let first = call(&k1, "charge_card", charge_args()).await;
    assert_eq!(first.is_error, Some(false), "{}", text(&first));
    let again = call(&k1, "charge_card", charge_args()).await;
    assert!(replayed(&again));
    assert_eq!(first.content, again.content);
    let receipt = first.structured_content.clone().unwrap();
    assert_eq!(receipt["charge_id"], "ch_000001");
    let mut other = charge_args();
    other["amount_cents"] = json!(9900);
    let args = other.as_object().cloned().unwrap();
    let Err(rmcp::ServiceError::McpError(conflict)) = k1
        .call_tool(CallToolRequestParams::new("charge_card").with_arguments(args))
        .await
    else {
        panic!("the same key with other arguments must be refused");
    };
    assert_eq!(error_type(&conflict), Some("idempotency_key_conflict"));

    let k2 = ()
        .serve(StreamableHttpClientTransport::from_config(keyed(
            "a-second-request-0001",
        )))
        .await
        .unwrap();
    let second = call(&k2, "charge_card", charge_args()).await;
    assert!(!replayed(&second));
    assert_eq!(second.structured_content.unwrap()["charge_id"], "ch_000002");

    // `_meta` and the header disagree: refused, nothing charged.
    let mut request = charge_request(9);
    request["params"]["_meta"] = json!({"idempotency/key": "yet-another-key-0003"});
    let both = raw(
        &url,
        "POST",
        "acme-token",
        &[("Idempotency-Key", KEY)],
        Some(request),
        None,
    )
    .await;
    let error = sse_messages(&both.body)
        .into_iter()
        .find_map(|m| m.get("error").cloned())
        .unwrap_or_else(|| panic!("an error: {}", both.body));
    assert_eq!(error["data"]["type"], "idempotency_key_invalid");
    assert!(
        error["message"].as_str().unwrap().contains("they differ"),
        "{error}"
    );
    let _ = child.kill().await;
    remove_db(&db);
}
