//! Keys that never run a call twice and never silently replay a different call: what two calls
//! a handler can tell apart always get two keys (or a refusal naming the field), while two
//! encodings of one call get one. Through the attribute, on `MemoryStore`, with a counting stub
//! for the side effect; the rmcp cases through an in-process MCP client.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idempotency::key::{Key, Secret};
use idempotency::store::{MemoryStore, Store};
use idempotency::{idempotent, Caller, Error, Idempotency, IdempotencyContext};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Counts the side effects: how many times a body really ran.
#[derive(Default)]
struct Counter(AtomicUsize);

impl Counter {
    fn hit(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
    fn runs(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

struct Ctx {
    engine: Idempotency,
    caller: Caller,
    runs: Arc<Counter>,
}

impl IdempotencyContext for Ctx {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, _: &()) -> Result<Caller, Error> {
        Ok(self.caller.clone())
    }
}

fn ctx() -> Ctx {
    Ctx {
        engine: Idempotency::new(MemoryStore::new()),
        caller: Caller::new("acme", "alice"),
        runs: Arc::new(Counter::default()),
    }
}

/// The same engine and counter, another subject of the same tenant.
fn as_subject(ctx: &Ctx, subject: &str) -> Ctx {
    Ctx {
        engine: ctx.engine.clone(),
        caller: Caller::new("acme", subject),
        runs: ctx.runs.clone(),
    }
}

// ---------------------------------------------------------------------------------------------
// Numbers a handler can tell apart
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum Quantity {
    Int(i64),
    Float(f64),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Measure {
    quantity: Quantity,
}

#[idempotent(on_error = "retryable")]
async fn measure(ctx: &Ctx, args: Measure) -> Result<String, Error> {
    ctx.runs.hit();
    Ok(format!("{:?}", args.quantity))
}

#[tokio::test]
async fn an_untagged_int_and_float_are_two_calls() {
    let ctx = ctx();
    let int: Measure = serde_json::from_str(r#"{"quantity": 1}"#).unwrap();
    let float: Measure = serde_json::from_str(r#"{"quantity": 1.0}"#).unwrap();
    assert_eq!(measure(&ctx, int.clone()).await.unwrap(), "Int(1)");
    assert_eq!(measure(&ctx, float.clone()).await.unwrap(), "Float(1.0)");
    assert_eq!(
        ctx.runs.runs(),
        2,
        "two calls the handler tells apart ran twice"
    );
    // Each replays its own answer.
    assert_eq!(measure(&ctx, int).await.unwrap(), "Int(1)");
    assert_eq!(measure(&ctx, float).await.unwrap(), "Float(1.0)");
    assert_eq!(ctx.runs.runs(), 2);
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Loose {
    value: serde_json::Value,
}

#[idempotent(on_error = "retryable")]
async fn loose(ctx: &Ctx, args: Loose) -> Result<String, Error> {
    ctx.runs.hit();
    Ok(args.value.to_string())
}

#[tokio::test]
async fn a_value_field_keeps_what_the_handler_sees() {
    let ctx = ctx();
    let mut seen = Vec::new();
    for text in ["0", "-0", "100", "100.0"] {
        let args: Loose = serde_json::from_str(&format!(r#"{{"value": {text}}}"#)).unwrap();
        seen.push(loose(&ctx, args).await.unwrap());
    }
    assert_eq!(seen, ["0", "-0.0", "100", "100.0"]);
    assert_eq!(ctx.runs.runs(), 4, "0/-0 and 100/100.0 are four calls");
    // Member order and whitespace still do not matter.
    let a: Loose = serde_json::from_str(r#"{"value": {"a": 1, "b": [true, null]}}"#).unwrap();
    let b: Loose = serde_json::from_str("{ \"value\" :{\"b\":[ true,null ],\"a\":1} }").unwrap();
    loose(&ctx, a).await.unwrap();
    loose(&ctx, b).await.unwrap();
    assert_eq!(ctx.runs.runs(), 5);
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Price {
    amount: f64,
    currency: String,
}

#[idempotent(on_error = "retryable")]
async fn price(ctx: &Ctx, args: Price) -> Result<f64, Error> {
    ctx.runs.hit();
    Ok(args.amount)
}

/// A typed `f64` is a float whatever the client wrote: its spellings are one call.
#[tokio::test]
async fn a_typed_float_field_has_one_key_for_every_spelling() {
    let ctx = ctx();
    for text in ["100", "100.0", "1e2", "1.00e+2"] {
        let args: Price =
            serde_json::from_str(&format!(r#"{{"currency":"EUR","amount":{text}}}"#)).unwrap();
        assert_eq!(price(&ctx, args).await.unwrap(), 100.0);
    }
    assert_eq!(ctx.runs.runs(), 1);
}

// ---------------------------------------------------------------------------------------------
// Raw JSON
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Serialize, Deserialize)]
struct Forward {
    payload: Box<RawValue>,
}

#[idempotent(on_error = "retryable")]
async fn forward(ctx: &Ctx, args: Forward) -> Result<String, Error> {
    ctx.runs.hit();
    Ok(args.payload.get().to_owned())
}

fn raw(text: &str) -> Forward {
    Forward {
        payload: RawValue::from_string(text.to_owned()).unwrap(),
    }
}

/// A `RawValue` is keyed by its text as the handler reads it: numbers keep every digit, so two
/// decimals one `f64` would merge are two calls; only what no JSON reader sees (whitespace,
/// member order, escapes) is one call; duplicate members, which readers disagree on, are refused.
#[tokio::test]
async fn raw_json_is_keyed_by_the_text_the_handler_reads() {
    let ctx = ctx();
    // Duplicate members: readers disagree on which counts.
    for text in [r#"{"a":1,"a":2}"#, r#"{"a":2,"a":1}"#] {
        match forward(&ctx, raw(text)).await {
            Err(e @ Error::Arguments { .. }) => {
                assert!(e.advice().contains("twice"), "{}", e.advice());
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    assert_eq!(ctx.runs.runs(), 0);
    // One f64, two decimals the handler reads apart: two calls, each replaying its own text.
    for text in [
        "0.1",
        "0.10000000000000000001",
        "0.1",
        "0.10000000000000000001",
    ] {
        assert_eq!(forward(&ctx, raw(text)).await.unwrap(), text);
    }
    assert_eq!(ctx.runs.runs(), 2);
    // Integers beyond 64 bits are accepted and kept apart.
    for text in ["18446744073709551616", "18446744073709551617"] {
        assert_eq!(forward(&ctx, raw(text)).await.unwrap(), text);
    }
    assert_eq!(ctx.runs.runs(), 4);
    // One meaning, two spellings: one call. An integer and a float: two.
    forward(&ctx, raw(r#"{"a": 1, "b": "x"}"#)).await.unwrap();
    forward(&ctx, raw(r#"{"b":"x","a":1}"#)).await.unwrap();
    assert_eq!(ctx.runs.runs(), 5);
    forward(&ctx, raw(r#"{"a": 1.0, "b": "x"}"#)).await.unwrap();
    assert_eq!(ctx.runs.runs(), 6);
}

// ---------------------------------------------------------------------------------------------
// Volatile fields, schema evolution
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stamped {
    order_id: String,
    amount: u64,
    sent_at: u64,
}

#[idempotent(ignore = "sent_at", on_error = "retryable")]
async fn stamped_call(ctx: &Ctx, args: Stamped) -> Result<u64, Error> {
    Ok(ctx.runs.hit() as u64 * 1000 + args.sent_at)
}

#[idempotent(business_key = "order_id", ignore = ["sent_at"], on_error = "retryable")]
async fn stamped_order(ctx: &Ctx, args: Stamped) -> Result<u64, Error> {
    Ok(ctx.runs.hit() as u64 * 1000 + args.sent_at)
}

#[tokio::test]
async fn an_ignored_field_neither_makes_a_new_call_nor_a_mismatch() {
    let ctx = ctx();
    let at = |sent_at, amount| Stamped {
        order_id: "o-1".into(),
        amount,
        sent_at,
    };
    // A retry with a fresh timestamp replays the first answer (sent_at 1).
    assert_eq!(stamped_call(&ctx, at(1, 5)).await.unwrap(), 1001);
    assert_eq!(stamped_call(&ctx, at(2, 5)).await.unwrap(), 1001);
    // Another amount is another call.
    assert_eq!(stamped_call(&ctx, at(3, 6)).await.unwrap(), 2003);
    // Business key: a fresh timestamp is not a payload mismatch; another amount is.
    assert_eq!(stamped_order(&ctx, at(4, 5)).await.unwrap(), 3004);
    assert_eq!(stamped_order(&ctx, at(5, 5)).await.unwrap(), 3004);
    assert!(matches!(
        stamped_order(&ctx, at(6, 7)).await,
        Err(Error::PayloadMismatch { .. })
    ));
    assert_eq!(ctx.runs.runs(), 3);
}

/// ACP's MCP binding: `{meta, id, payload}`, the key in `meta.idempotency_key`, beside a request
/// id, a timestamp and a signature that are fresh on every retry.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct AcpArgs {
    meta: AcpMeta,
    id: String,
    payload: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct AcpMeta {
    idempotency_key: String,
    request_id: String,
    timestamp: String,
    signature: String,
}

#[idempotent(
    business_key = "meta.idempotency_key",
    ignore = ["meta.request_id", "meta.timestamp", "meta.signature"],
    on_error = "retryable"
)]
async fn complete_checkout(ctx: &Ctx, args: AcpArgs) -> Result<String, Error> {
    Ok(format!(
        "{} #{} by {}",
        args.id,
        ctx.runs.hit(),
        args.meta.request_id
    ))
}

#[tokio::test]
async fn nested_volatile_fields_are_left_out_by_path() {
    let ctx = ctx();
    let call = |key: &str, attempt: u32, amount: u64| AcpArgs {
        meta: AcpMeta {
            idempotency_key: key.into(),
            request_id: format!("req-{attempt}"),
            timestamp: format!("2026-12-06T10:00:0{attempt}Z"),
            signature: format!("sig-{attempt}"),
        },
        id: "cs_1".into(),
        payload: serde_json::json!({"payment_data": {"token": "tok", "amount": amount}}),
    };
    // Retries with a fresh request id, timestamp and signature replay the first answer.
    let first = complete_checkout(&ctx, call("k-1", 1, 500)).await.unwrap();
    assert_eq!(first, "cs_1 #1 by req-1");
    for attempt in 2..5 {
        assert_eq!(
            complete_checkout(&ctx, call("k-1", attempt, 500))
                .await
                .unwrap(),
            first
        );
    }
    // The same key with another payload is a conflict, never a replay.
    assert!(matches!(
        complete_checkout(&ctx, call("k-1", 5, 900)).await,
        Err(Error::PayloadMismatch { .. })
    ));
    // Another key is another call.
    assert_eq!(
        complete_checkout(&ctx, call("k-2", 6, 500)).await.unwrap(),
        "cs_1 #2 by req-6"
    );
    assert_eq!(ctx.runs.runs(), 2);
}

/// Version 1 of a tool's arguments, and version 2 with an optional field added the way the
/// guide says (`docs/guide.md`) (`default` + `skip_serializing_if = "Option::is_none"`): during a rolling deploy
/// both run side by side, and a call that omits the new field must keep its key.
mod evolution {
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    pub(super) struct V1 {
        pub(super) amount: u64,
        pub(super) currency: String,
    }

    #[derive(Serialize, Deserialize)]
    pub(super) struct V2 {
        pub(super) amount: u64,
        pub(super) currency: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(super) note: Option<String>,
    }

    /// The same field added without `skip_serializing_if`: it writes `"note": null`.
    #[derive(Serialize, Deserialize)]
    pub(super) struct V2Careless {
        pub(super) amount: u64,
        pub(super) currency: String,
        #[serde(default)]
        pub(super) note: Option<String>,
    }
}

#[test]
fn adding_an_optional_field_keeps_the_key_of_calls_that_omit_it() {
    fn key<A: Serialize>(args: &A) -> Key {
        Key::for_call(
            &Secret::demo(),
            &Caller::new("acme", "alice"),
            "charge",
            args,
        )
        .unwrap()
    }
    let sent = r#"{"amount": 5, "currency": "EUR"}"#;
    let v1: evolution::V1 = serde_json::from_str(sent).unwrap();
    let v2: evolution::V2 = serde_json::from_str(sent).unwrap();
    let careless: evolution::V2Careless = serde_json::from_str(sent).unwrap();
    assert_eq!(key(&v1), key(&v2), "old and new code give one key");
    assert_ne!(
        key(&v1),
        key(&careless),
        "the rule is needed: `null` is written"
    );
    let with_note: evolution::V2 =
        serde_json::from_str(r#"{"amount": 5, "currency": "EUR", "note": "gift"}"#).unwrap();
    assert_ne!(key(&v2), key(&with_note), "a note is a different call");
}

// ---------------------------------------------------------------------------------------------
// Business keys: scope, and a key that may be missing
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Ship {
    order_id: String,
    address: String,
}

#[idempotent(business_key = "order_id", on_error = "retryable")]
async fn ship_tenant(ctx: &Ctx, args: Ship) -> Result<String, Error> {
    Ok(format!("{}#{}", args.order_id, ctx.runs.hit()))
}

#[idempotent(business_key = "order_id", scope = "subject", on_error = "retryable")]
async fn ship_subject(ctx: &Ctx, args: Ship) -> Result<String, Error> {
    Ok(format!("{}#{}", args.order_id, ctx.runs.hit()))
}

fn order(id: &str) -> Ship {
    Ship {
        order_id: id.into(),
        address: "1 Main St".into(),
    }
}

#[tokio::test]
async fn under_subject_scope_bob_never_gets_alices_answer_or_status() {
    let alice = ctx();
    let bob = as_subject(&alice, "bob");
    let first = ship_subject(&alice, order("o-1")).await.unwrap();
    assert_eq!(ship_subject(&alice, order("o-1")).await.unwrap(), first);
    let bobs = ship_subject(&bob, order("o-1")).await.unwrap();
    assert_ne!(bobs, first, "bob's order o-1 is his own");
    assert_eq!(alice.runs.runs(), 2);
    // Alice's reference is invisible to bob.
    let r = reference_of(&alice, "ship_subject", "o-1");
    assert!(alice
        .engine
        .status(&alice.caller, r)
        .await
        .unwrap()
        .is_some());
    assert!(bob.engine.status(&bob.caller, r).await.unwrap().is_none());

    // The default for business keys, tenant scope: one order of the organisation, whoever sends it.
    let first = ship_tenant(&alice, order("o-2")).await.unwrap();
    assert_eq!(ship_tenant(&bob, order("o-2")).await.unwrap(), first);
    let r = reference_of(&alice, "ship_tenant", "o-2");
    assert!(bob.engine.status(&bob.caller, r).await.unwrap().is_some());
    assert_eq!(alice.runs.runs(), 3);
}

fn reference_of(ctx: &Ctx, tool: &'static str, order_id: &str) -> idempotency::Reference {
    let spec = match tool {
        "ship_subject" => ship_subject::TOOL,
        _ => ship_tenant::TOOL,
    };
    idempotency::tool::Prepared::business(
        &ctx.caller,
        &spec,
        idempotency::tool::BusinessKey {
            field: "order_id",
            value: order_id,
        },
        &order(order_id),
    )
    .unwrap()
    .key
    .key(&Secret::demo())
    .reference(1)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct MaybeOrder {
    order_id: Option<String>,
    item: String,
}

#[idempotent(
    business_key = "order_id",
    missing_key = "call_key",
    on_error = "retryable"
)]
async fn order_or_call(ctx: &Ctx, args: MaybeOrder) -> Result<String, Error> {
    Ok(format!("{}#{}", args.item, ctx.runs.hit()))
}

#[tokio::test]
async fn a_missing_business_key_can_fall_back_to_the_call_key() {
    let ctx = ctx();
    let item = |id: Option<&str>, item: &str| MaybeOrder {
        order_id: id.map(str::to_owned),
        item: item.into(),
    };
    let apple = order_or_call(&ctx, item(None, "apple")).await.unwrap();
    assert_eq!(
        order_or_call(&ctx, item(None, "apple")).await.unwrap(),
        apple
    );
    let pear = order_or_call(&ctx, item(None, "pear")).await.unwrap();
    assert_ne!(pear, apple, "two calls without an order id are two calls");
    assert_eq!(ctx.runs.runs(), 2);
    // Another subject's call without a key is not alice's (call keys are subject-scoped).
    let bob = as_subject(&ctx, "bob");
    assert_ne!(
        order_or_call(&bob, item(None, "apple")).await.unwrap(),
        apple
    );
    assert_eq!(ctx.runs.runs(), 3);
}

// ---------------------------------------------------------------------------------------------
// Secrets
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Amount {
    amount: u64,
}

#[idempotent(on_error = "retryable")]
async fn pay(ctx: &Ctx, args: Amount) -> Result<String, Error> {
    Ok(format!("{}#{}", args.amount, ctx.runs.hit()))
}

fn engine_with(store: &Arc<dyn Store>, secret: &str, previous: &[&str]) -> Idempotency {
    Idempotency::builder_shared(store.clone())
        .secret(Secret::new(secret).unwrap())
        .previous_secrets(previous.iter().map(|s| Secret::new(s).unwrap()))
        .build()
}

#[tokio::test]
async fn a_repeat_across_a_secret_rotation_is_recognised() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let runs = Arc::new(Counter::default());
    let with = |engine| Ctx {
        engine,
        caller: Caller::new("acme", "alice"),
        runs: runs.clone(),
    };
    let old = with(engine_with(&store, "the old secret, 2025", &[]));
    let first = pay(&old, Amount { amount: 5 }).await.unwrap();

    // After the rotation, the old secret listed as previous: the repeat replays.
    let rotated = with(engine_with(
        &store,
        "the new secret, 2026",
        &["the old secret, 2025"],
    ));
    assert_eq!(pay(&rotated, Amount { amount: 5 }).await.unwrap(), first);
    assert_eq!(runs.runs(), 1);
    // A fresh call runs once under the new secret, and replays.
    let fresh = pay(&rotated, Amount { amount: 6 }).await.unwrap();
    assert_eq!(pay(&rotated, Amount { amount: 6 }).await.unwrap(), fresh);
    assert_eq!(runs.runs(), 2);

    // Without listing it, the new secret's keys do not find the old record: it would run again.
    let forgetful = with(engine_with(&store, "the new secret, 2026", &[]));
    assert_ne!(pay(&forgetful, Amount { amount: 5 }).await.unwrap(), first);
    assert_eq!(runs.runs(), 3);
}

// ---------------------------------------------------------------------------------------------
// Through an MCP client: fields the key cannot see are refused, and the schema says so
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "rmcp")]
mod mcp {
    use std::sync::Arc;

    use idempotency::mcp::{Identity, META_STATUS};
    use idempotency::{
        idempotent, store::MemoryStore, Caller, Error, Idempotency, IdempotencyContext,
    };
    use rmcp::handler::server::wrapper::Parameters;
    use rmcp::model::{CallToolRequestParams, CallToolResult};
    use rmcp::service::{RequestContext, RunningService};
    use rmcp::{schemars, tool, tool_router, RoleClient, RoleServer, ServiceExt};
    use serde::{Deserialize, Serialize};
    use serde_json::{json, Value};

    use super::Counter;

    #[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
    struct RefundArgs {
        amount: u64,
        /// Rehearse only: the handler reads it, but it is never serialised.
        #[serde(default, skip_serializing)]
        dry_run: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    }

    /// Members a client may send explicitly or under another name, read exactly as the key
    /// sees them.
    #[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
    struct ChargeArgs {
        #[serde(alias = "amt")]
        amount: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        dry_run: bool,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        note: String,
    }

    /// A payload passed on as the text the client sent (as rmcp hands it over).
    #[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
    struct ForwardArgs {
        #[schemars(with = "serde_json::Value")]
        payload: Box<serde_json::value::RawValue>,
    }

    #[derive(Clone)]
    struct Refunds {
        engine: Idempotency,
        identity: Identity,
        runs: Arc<Counter>,
        real: Arc<Counter>,
    }

    impl IdempotencyContext<RequestContext<RoleServer>> for Refunds {
        fn idempotency(&self) -> &Idempotency {
            &self.engine
        }
        fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
            self.identity.resolve(request)
        }
    }

    #[tool_router(server_handler)]
    impl Refunds {
        /// Refund an amount.
        #[idempotent(window = "15m", on_error = "retryable")]
        #[tool]
        async fn refund(&self, Parameters(args): Parameters<RefundArgs>) -> Result<String, Error> {
            self.runs.hit();
            if !args.dry_run {
                self.real.hit();
            }
            Ok(format!(
                "refunded {} (dry run: {})",
                args.amount, args.dry_run
            ))
        }

        /// Charge an amount; each run's answer carries its number.
        #[idempotent(window = "15m", on_error = "retryable")]
        #[tool]
        async fn charge(&self, Parameters(args): Parameters<ChargeArgs>) -> Result<String, Error> {
            let run = self.runs.hit();
            Ok(format!(
                "run {run}: charged {} (dry run: {}, note: {:?})",
                args.amount, args.dry_run, args.note
            ))
        }

        /// Forward a payload; answers with the text the handler read.
        #[idempotent(window = "15m", on_error = "retryable")]
        #[tool]
        async fn forward(
            &self,
            Parameters(args): Parameters<ForwardArgs>,
        ) -> Result<String, Error> {
            self.runs.hit();
            Ok(args.payload.get().to_owned())
        }
    }

    type Client = RunningService<RoleClient, ()>;

    async fn connect(server: Refunds) -> Client {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            if let Ok(s) = server.serve(server_io).await {
                let _ = s.waiting().await;
            }
        });
        ().serve(client_io).await.expect("client connects")
    }

    async fn call(client: &Client, args: Value) -> CallToolResult {
        call_tool(client, "refund", args).await
    }

    async fn call_tool(client: &Client, tool: &'static str, args: Value) -> CallToolResult {
        let args = args.as_object().cloned().unwrap_or_default();
        client
            .call_tool(CallToolRequestParams::new(tool).with_arguments(args))
            .await
            .expect("call_tool")
    }

    /// The answer to a call that must not be refused (the `String` the tool returned).
    async fn answered(client: &Client, tool: &'static str, args: Value) -> String {
        let r = call_tool(client, tool, args.clone()).await;
        assert_eq!(r.is_error, Some(false), "{args}: {}", text(&r));
        serde_json::from_str(&text(&r)).expect("a String answer")
    }

    fn text(r: &CallToolResult) -> String {
        r.content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect()
    }

    fn status(r: &CallToolResult) -> Option<Value> {
        r.meta.as_ref()?.0.get(META_STATUS).cloned()
    }

    fn server() -> Refunds {
        Refunds {
            engine: Idempotency::new(MemoryStore::new()),
            identity: Identity::stdio(Caller::new("acme", "alice")),
            runs: Arc::new(Counter::default()),
            real: Arc::new(Counter::default()),
        }
    }

    /// `dry_run` is read but never serialised: a dry run and the real refund would share a key,
    /// so the real one would get the dry run's answer and never run. The wrapper refuses any
    /// call that sends it, naming the field; the real refund then runs, once.
    #[tokio::test]
    async fn a_field_the_key_cannot_see_is_refused_before_anything_runs() {
        let refunds = server();
        let client = connect(refunds.clone()).await;
        let dry = call(&client, json!({"amount": 5, "dry_run": true})).await;
        assert_eq!(dry.is_error, Some(true));
        assert_eq!(status(&dry), Some(json!("invalid")));
        assert!(text(&dry).contains("`dry_run`"), "{}", text(&dry));
        assert_eq!(refunds.runs.runs(), 0);

        let real = call(&client, json!({"amount": 5})).await;
        assert_eq!(real.is_error, Some(false), "{}", text(&real));
        let again = call(&client, json!({"amount": 5, "note": null})).await;
        assert_eq!(text(&again), text(&real));
        assert_eq!((refunds.runs.runs(), refunds.real.runs()), (1, 1));
        client.cancel().await.ok();
    }

    /// Unknown arguments are refused (not silently ignored and replayed), and the listed input
    /// schema says `additionalProperties: false`.
    #[tokio::test]
    async fn unknown_arguments_are_refused_and_the_schema_is_closed() {
        let refunds = server();
        let client = connect(refunds.clone()).await;
        let tools = client.list_all_tools().await.unwrap();
        let refund = tools.iter().find(|t| t.name == "refund").unwrap();
        assert_eq!(
            refund.input_schema.get("additionalProperties"),
            Some(&json!(false)),
            "{:?}",
            refund.input_schema
        );
        let first = call(&client, json!({"amount": 7})).await;
        assert_eq!(first.is_error, Some(false));
        let extra = call(&client, json!({"amount": 7, "currency": "USD"})).await;
        assert_eq!(extra.is_error, Some(true));
        assert_eq!(status(&extra), Some(json!("invalid")));
        assert!(text(&extra).contains("`currency`"), "{}", text(&extra));
        assert_eq!(refunds.runs.runs(), 1);
        client.cancel().await.ok();
    }

    /// `false` for a flag and `""` for a note are what `skip_serializing_if` drops: the handler
    /// reads the same as when they are omitted, so they are accepted and replay that call.
    /// Values the key sees are other calls; a `skip_serializing` field stays refused even at its
    /// default.
    #[tokio::test]
    async fn explicit_defaults_under_skip_serializing_if_are_the_call_without_them() {
        let refunds = server();
        let client = connect(refunds.clone()).await;
        let first = answered(&client, "charge", json!({"amount": 5})).await;
        assert_eq!(first, r#"run 1: charged 5 (dry run: false, note: "")"#);
        for explicit in [
            json!({"amount": 5, "dry_run": false}),
            json!({"amount": 5, "note": ""}),
            json!({"note": "", "dry_run": false, "amount": 5}),
        ] {
            assert_eq!(answered(&client, "charge", explicit).await, first);
        }
        assert_eq!(refunds.runs.runs(), 1);
        let dry = answered(&client, "charge", json!({"amount": 5, "dry_run": true})).await;
        assert_eq!(dry, r#"run 2: charged 5 (dry run: true, note: "")"#);
        let noted = answered(&client, "charge", json!({"amount": 5, "note": "gift"})).await;
        assert_eq!(noted, r#"run 3: charged 5 (dry run: false, note: "gift")"#);
        assert_eq!(refunds.runs.runs(), 3);

        let never_keyed = call(&client, json!({"amount": 5, "dry_run": false})).await;
        assert_eq!(status(&never_keyed), Some(json!("invalid")));
        assert!(
            text(&never_keyed).contains("`dry_run`"),
            "{}",
            text(&never_keyed)
        );
        assert_eq!(refunds.runs.runs(), 3);
        client.cancel().await.ok();
    }

    /// A serde alias is the field it names: `{"amt": 5}` replays `{"amount": 5}`. A member that
    /// names no field is still refused.
    #[tokio::test]
    async fn an_alias_is_the_call_with_the_field_it_names() {
        let refunds = server();
        let client = connect(refunds.clone()).await;
        let first = answered(&client, "charge", json!({"amount": 5})).await;
        assert_eq!(answered(&client, "charge", json!({"amt": 5})).await, first);
        assert_eq!(refunds.runs.runs(), 1);
        let six = answered(&client, "charge", json!({"amt": 6, "dry_run": false})).await;
        assert_eq!(six, r#"run 2: charged 6 (dry run: false, note: "")"#);
        assert_eq!(answered(&client, "charge", json!({"amount": 6})).await, six);

        let unknown = call_tool(&client, "charge", json!({"amount": 5, "amount_cents": 500})).await;
        assert_eq!(status(&unknown), Some(json!("invalid")));
        assert!(
            text(&unknown).contains("`amount_cents`"),
            "{}",
            text(&unknown)
        );
        assert_eq!(refunds.runs.runs(), 2);
        client.cancel().await.ok();
    }

    /// A `RawValue` is keyed by the text its handler reads: as many runs as distinct texts, and
    /// each repeat replays its own. rmcp hands the handler serde_json's rendering of the parsed
    /// arguments, so whether `0.1` and `0.10000000000000000001` read alike depends on
    /// serde_json's `arbitrary_precision` (off here: one `f64`, one text); `1` and `1.0` read
    /// apart either way, and member order or whitespace never.
    #[tokio::test]
    async fn a_raw_value_is_keyed_by_the_text_its_handler_reads() {
        let refunds = server();
        let client = connect(refunds.clone()).await;
        let payloads = [
            "0.1",
            "0.10000000000000000001",
            "1",
            "1.0",
            r#"{"b": [1, 2.5], "a": "x"}"#,
            r#"{ "a":"x","b":[1,2.5] }"#,
        ];
        let mut read = Vec::new();
        for payload in payloads {
            let payload: Value = serde_json::from_str(payload).unwrap();
            read.push(answered(&client, "forward", json!({"payload": payload})).await);
        }
        let distinct: std::collections::BTreeSet<&String> = read.iter().collect();
        assert_eq!(refunds.runs.runs(), distinct.len(), "{read:?}");
        assert_ne!(read[2], read[3], "1 and 1.0 read apart");
        assert_eq!(read[4], read[5], "member order and whitespace read alike");
        // Repeats replay the text their own first call read.
        for (payload, first) in payloads.iter().zip(&read) {
            let payload: Value = serde_json::from_str(payload).unwrap();
            assert_eq!(
                &answered(&client, "forward", json!({"payload": payload})).await,
                first
            );
        }
        assert_eq!(refunds.runs.runs(), distinct.len());
        client.cancel().await.ok();
    }
}
