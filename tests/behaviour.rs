//! What `#[idempotent]` does at run time, on `MemoryStore`, through the attribute itself: a free
//! function, a `&self` method and rmcp tools, each backed by a counting stub processor that takes
//! 2 s (on Tokio's paused clock, so the suite is fast).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency::{
    error::UnknownReason, idempotent, store::MemoryStore, Call, Caller, Classify, Disposition,
    Error, Idempotency, IdempotencyContext, Reference,
};
use serde::{Deserialize, Serialize};

/// The downstream processor: counts its side effects and remembers the reference it was given.
#[derive(Default)]
struct Processor {
    calls: AtomicUsize,
    references: Mutex<Vec<String>>,
}

impl Processor {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn references(&self) -> Vec<String> {
        self.references.lock().unwrap().clone()
    }

    async fn charge(&self, reference: &str, args: &ChargeArgs) -> Result<Receipt, ChargeError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.references.lock().unwrap().push(reference.to_owned());
        tokio::time::sleep(Duration::from_secs(2)).await;
        match args.currency.as_str() {
            "DECLINE" => Err(ChargeError::Declined(format!("{} refused", args.amount))),
            "DOWN" => Err(ChargeError::Unavailable),
            _ => Ok(Receipt {
                amount: args.amount,
                reference: reference.to_owned(),
            }),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChargeArgs {
    amount: u64,
    currency: String,
    #[serde(default)]
    note: Option<String>,
}

fn charge(amount: u64, currency: &str) -> ChargeArgs {
    ChargeArgs {
        amount,
        currency: currency.into(),
        note: None,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    amount: u64,
    reference: String,
}

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
enum ChargeError {
    #[error("declined: {0}")]
    Declined(String),
    #[error("the processor is unavailable")]
    Unavailable,
    #[error(transparent)]
    #[serde(skip)]
    Idempotency(#[from] Error),
}

impl Classify for ChargeError {
    fn disposition(&self) -> Disposition {
        match self {
            ChargeError::Declined(_) => Disposition::Definitive,
            ChargeError::Unavailable | ChargeError::Idempotency(_) => Disposition::Retryable,
        }
    }
}

struct Ctx {
    engine: Idempotency,
    processor: Arc<Processor>,
}

impl IdempotencyContext for Ctx {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, _: &()) -> Result<Caller, Error> {
        Ok(Caller::new("acme", "alice"))
    }
}

fn ctx() -> Ctx {
    Ctx {
        engine: Idempotency::new(MemoryStore::new()),
        processor: Arc::new(Processor::default()),
    }
}

fn current_reference() -> Result<String, ChargeError> {
    Call::current()
        .map(|c| c.reference().to_string())
        .ok_or(ChargeError::Unavailable)
}

#[idempotent(window = "15m")]
async fn charge_card(ctx: &Ctx, args: ChargeArgs) -> Result<Receipt, ChargeError> {
    let reference = current_reference()?;
    ctx.processor.charge(&reference, &args).await
}

#[idempotent(window = "15m", timeout = "1s")]
async fn charge_with_timeout(ctx: &Ctx, args: ChargeArgs) -> Result<Receipt, ChargeError> {
    let reference = current_reference()?;
    ctx.processor.charge(&reference, &args).await
}

fn in_flight_reference(r: &Result<Receipt, ChargeError>) -> Option<Reference> {
    match r {
        Err(ChargeError::Idempotency(Error::InFlight { reference, .. })) => Some(*reference),
        _ => None,
    }
}

#[test]
fn descriptor() {
    assert_eq!(charge_card::TOOL.name(), "charge_card");
    assert_eq!(charge_card::TOOL.window(), Duration::from_secs(15 * 60));
    assert_eq!(charge_card::TOOL.timeout(), None);
    assert_eq!(
        charge_with_timeout::TOOL.timeout(),
        Some(Duration::from_secs(1))
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_repeat_runs_once_and_the_second_is_in_flight() {
    let ctx = ctx();
    let (first, second) = tokio::join!(
        charge_card(&ctx, charge(4200, "EUR")),
        charge_card(&ctx, charge(4200, "EUR"))
    );
    assert_eq!(ctx.processor.calls(), 1);
    let receipt = first.expect("the first call charges");
    let in_flight = in_flight_reference(&second)
        .expect("the second call is told it is in flight, not given a receipt");
    // The body read its reference with Call::current() and passed it downstream: the same one.
    assert_eq!(ctx.processor.references(), vec![in_flight.to_string()]);
    assert_eq!(receipt.reference, in_flight.to_string());
}

#[tokio::test(start_paused = true)]
async fn sequential_repeat_returns_the_stored_answer() {
    let ctx = ctx();
    let first = charge_card(&ctx, charge(4200, "EUR")).await.unwrap();
    let again = charge_card(&ctx, charge(4200, "EUR")).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(ctx.processor.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn key_order_whitespace_and_defaulted_fields_do_not_change_the_key() {
    let ctx = ctx();
    let a: ChargeArgs = serde_json::from_str(r#"{"amount":4200,"currency":"EUR"}"#).unwrap();
    let b: ChargeArgs =
        serde_json::from_str("{ \"currency\" : \"EUR\",\n  \"note\": null, \"amount\" : 4200 }")
            .unwrap();
    let first = charge_card(&ctx, a).await.unwrap();
    let second = charge_card(&ctx, b).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(ctx.processor.calls(), 1);
}

/// Numbers are keyed by the typed value the handler reads: for an `f64` field `1e2`, `100` and
/// `100.0` are one key; an integer field refuses `1e2` when the arguments are read, before any
/// key exists. String escapes do not matter either.
#[test]
fn number_spelling_and_escapes_follow_the_typed_value() {
    #[derive(Serialize, Deserialize)]
    struct Weight {
        kg: f64,
        label: String,
    }
    let caller = idempotency::Caller::new("acme", "alice");
    let key = |json: &str| {
        let w: Weight = serde_json::from_str(json).unwrap();
        idempotency::key::Key::for_call(&idempotency::key::Secret::demo(), &caller, "ship", &w)
            .unwrap()
    };
    let a = key(r#"{"kg":1e2,"label":"A"}"#);
    assert_eq!(a, key(r#"{"kg":100,"label":"\u0041"}"#));
    assert_eq!(a, key(r#"{"label":"A","kg":100.0}"#));
    assert_ne!(a, key(r#"{"kg":100.5,"label":"A"}"#));
    let refused = serde_json::from_str::<ChargeArgs>(r#"{"amount":1e2,"currency":"EUR"}"#);
    assert!(refused.is_err(), "a u64 field refuses 1e2 before keying");
}

#[tokio::test(start_paused = true)]
async fn different_amounts_are_different_calls() {
    let ctx = ctx();
    let a = charge_card(&ctx, charge(4200, "EUR")).await.unwrap();
    let b = charge_card(&ctx, charge(4300, "EUR")).await.unwrap();
    assert_ne!(a.reference, b.reference);
    assert_eq!(ctx.processor.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_retryable_error_lets_the_repeat_run_again() {
    let ctx = ctx();
    let first = charge_card(&ctx, charge(4200, "DOWN")).await;
    assert!(matches!(first, Err(ChargeError::Unavailable)), "{first:?}");
    let second = charge_card(&ctx, charge(4200, "DOWN")).await;
    assert!(
        matches!(second, Err(ChargeError::Unavailable)),
        "{second:?}"
    );
    assert_eq!(ctx.processor.calls(), 2);
    // A released claim keeps its reference: the processor deduplicates on it.
    let refs = ctx.processor.references();
    assert_eq!(refs[0], refs[1]);
}

#[tokio::test(start_paused = true)]
async fn a_definitive_error_is_replayed() {
    let ctx = ctx();
    let first = charge_card(&ctx, charge(4200, "DECLINE")).await;
    let second = charge_card(&ctx, charge(4200, "DECLINE")).await;
    match (&first, &second) {
        (Err(ChargeError::Declined(a)), Err(ChargeError::Declined(b))) => assert_eq!(a, b),
        other => panic!("expected the same decline twice, got {other:?}"),
    }
    assert_eq!(ctx.processor.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_is_outcome_unknown_and_the_repeat_does_not_run_again() {
    let ctx = ctx();
    let first = charge_with_timeout(&ctx, charge(4200, "EUR")).await;
    let r1 = match &first {
        Err(ChargeError::Idempotency(Error::OutcomeUnknown {
            reference,
            reason: UnknownReason::TimedOut(d),
            ..
        })) => {
            assert_eq!(*d, Duration::from_secs(1));
            *reference
        }
        other => panic!("expected outcome unknown (timed out), got {other:?}"),
    };
    let second = charge_with_timeout(&ctx, charge(4200, "EUR")).await;
    match &second {
        Err(ChargeError::Idempotency(Error::OutcomeUnknown {
            reference,
            reason: UnknownReason::Earlier,
            ..
        })) => {
            assert_eq!(*reference, r1)
        }
        other => panic!("expected outcome unknown (earlier), got {other:?}"),
    }
    assert_eq!(ctx.processor.calls(), 1);
}

// A `&self` method: the receiver is the context; the descriptor is `Server::CHARGE_TOOL`.

struct Server {
    engine: Idempotency,
    processor: Processor,
}

impl IdempotencyContext for Server {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, _: &()) -> Result<Caller, Error> {
        Ok(Caller::new("acme", "bob"))
    }
}

impl Server {
    #[idempotent(window = "1h")]
    async fn charge(&self, args: ChargeArgs) -> Result<Receipt, ChargeError> {
        let reference = current_reference()?;
        self.processor.charge(&reference, &args).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_self_method_works() {
    assert_eq!(Server::CHARGE_TOOL.name(), "charge");
    assert_eq!(Server::CHARGE_TOOL.window(), Duration::from_secs(3600));
    let s = Server {
        engine: Idempotency::new(MemoryStore::new()),
        processor: Processor::default(),
    };
    let (a, b) = tokio::join!(s.charge(charge(1, "EUR")), s.charge(charge(1, "EUR")));
    assert!(a.is_ok());
    assert!(in_flight_reference(&b).is_some(), "{b:?}");
    let c = s.charge(charge(1, "EUR")).await.unwrap();
    assert_eq!(a.unwrap(), c);
    assert_eq!(s.processor.calls(), 1);
}

// Business keys: one field, and a nested one.

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Parcel {
    id: String,
    weight_grams: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ShipArgs {
    order_id: String,
    address: String,
    parcel: Parcel,
}

fn ship(order_id: &str, address: &str, parcel_id: &str) -> ShipArgs {
    ShipArgs {
        order_id: order_id.into(),
        address: address.into(),
        parcel: Parcel {
            id: parcel_id.into(),
            weight_grams: 1000,
        },
    }
}

async fn label(ctx: &Ctx) -> Result<String, Error> {
    ctx.processor.calls.fetch_add(1, Ordering::SeqCst);
    let reference = Call::current()
        .map(|c| c.reference().to_string())
        .unwrap_or_default();
    Ok(format!("label-{reference}"))
}

#[idempotent(business_key = "order_id", on_error = "retryable")]
async fn create_shipment(ctx: &Ctx, args: ShipArgs) -> Result<String, Error> {
    let _ = args.address;
    label(ctx).await
}

#[idempotent(business_key = "parcel.id", on_error = "retryable")]
async fn ship_parcel(ctx: &Ctx, args: ShipArgs) -> Result<String, Error> {
    let _ = args.parcel.weight_grams;
    label(ctx).await
}

#[idempotent(business_key = ["order_id", "parcel.id"], on_error = "retryable")]
async fn ship_line(ctx: &Ctx, args: ShipArgs) -> Result<String, Error> {
    let _ = args;
    label(ctx).await
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct OptionalOrder {
    order_id: Option<String>,
    item: String,
}

#[idempotent(
    business_key = "order_id",
    missing_key = "refuse",
    on_error = "retryable"
)]
async fn order_item(ctx: &Ctx, args: OptionalOrder) -> Result<String, Error> {
    let _ = args.item;
    label(ctx).await
}

/// A missing business key (`None`, `""`) never shares a record: the call is refused before any
/// store I/O with an error that names the field, whatever the other arguments.
#[tokio::test(start_paused = true)]
async fn a_missing_business_key_is_refused_naming_the_field() {
    let ctx = ctx();
    for (order_id, item) in [
        (None, "apple"),
        (None, "pear"),
        (Some(String::new()), "fig"),
    ] {
        let out = order_item(
            &ctx,
            OptionalOrder {
                order_id,
                item: item.into(),
            },
        )
        .await;
        match out {
            Err(e @ Error::Arguments { .. }) => {
                assert!(e.nothing_done());
                assert!(e.advice().contains("`order_id`"), "{}", e.advice());
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    assert_eq!(ctx.processor.calls(), 0, "nothing ran");
    // With the key present it runs, once.
    let given = || OptionalOrder {
        order_id: Some("o-7".into()),
        item: "apple".into(),
    };
    let first = order_item(&ctx, given()).await.unwrap();
    assert_eq!(order_item(&ctx, given()).await.unwrap(), first);
    assert_eq!(ctx.processor.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_business_key_with_other_arguments_is_a_mismatch() {
    let ctx = ctx();
    let first = create_shipment(&ctx, ship("o-1", "1 Main St", "p-1"))
        .await
        .unwrap();
    let same = create_shipment(&ctx, ship("o-1", "1 Main St", "p-1"))
        .await
        .unwrap();
    assert_eq!(first, same);
    let other = create_shipment(&ctx, ship("o-1", "9 Elm St", "p-1")).await;
    match other {
        Err(Error::PayloadMismatch { reference, .. }) => {
            assert_eq!(first, format!("label-{reference}"))
        }
        other => panic!("expected a payload mismatch, got {other:?}"),
    }
    assert_eq!(ctx.processor.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_nested_business_key_works() {
    let ctx = ctx();
    let first = ship_parcel(&ctx, ship("o-1", "1 Main St", "p-1"))
        .await
        .unwrap();
    // Same parcel under another order: the key is the parcel id, so it is a mismatch.
    assert!(matches!(
        ship_parcel(&ctx, ship("o-2", "1 Main St", "p-1")).await,
        Err(Error::PayloadMismatch { .. })
    ));
    // Another parcel: another key.
    let second = ship_parcel(&ctx, ship("o-1", "1 Main St", "p-2"))
        .await
        .unwrap();
    assert_ne!(first, second);
    assert_eq!(ctx.processor.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn several_business_key_fields_make_one_key() {
    let ctx = ctx();
    let a = ship_line(&ctx, ship("o-1", "1 Main St", "p-1"))
        .await
        .unwrap();
    let b = ship_line(&ctx, ship("o-1", "1 Main St", "p-2"))
        .await
        .unwrap();
    assert_ne!(a, b);
    assert!(matches!(
        ship_line(&ctx, ship("o-1", "2 Main St", "p-2")).await,
        Err(Error::PayloadMismatch { .. })
    ));
    assert_eq!(ctx.processor.calls(), 2);
}

/// rmcp tools through an in-process MCP client: the hint is on wrapped tools only, and the
/// wrapper answers with tool results.
#[cfg(feature = "rmcp")]
mod mcp {
    use std::sync::Arc;

    use idempotency::mcp::{Identity, META_REF, META_REPLAYED, META_STATUS};
    use idempotency::{
        idempotent, idempotent_tools, store::MemoryStore, Call, Caller, Error, Idempotency,
        IdempotencyContext,
    };
    use rmcp::handler::server::tool::RequestState;
    use rmcp::handler::server::wrapper::Parameters;
    use rmcp::model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, InputRequiredResult,
    };
    use rmcp::service::{RequestContext, RunningService};
    use rmcp::{schemars, tool, tool_router, RoleClient, RoleServer, ServiceExt};
    use serde::{Deserialize, Serialize};
    use serde_json::{json, Value};

    use super::{ChargeError, Processor, Receipt};

    #[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
    struct McpChargeArgs {
        amount: u64,
        currency: String,
    }

    #[derive(Clone)]
    struct Payments {
        engine: Idempotency,
        identity: Identity,
        processor: Arc<Processor>,
    }

    impl IdempotencyContext<RequestContext<RoleServer>> for Payments {
        fn idempotency(&self) -> &Idempotency {
            &self.engine
        }
        fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
            self.identity.resolve(request)
        }
    }

    #[idempotent_tools]
    #[tool_router(server_handler)]
    impl Payments {
        /// Charge a card.
        #[idempotent(window = "15m")]
        #[tool(annotations(title = "Charge"))]
        async fn charge_card(
            &self,
            Parameters(args): Parameters<McpChargeArgs>,
        ) -> Result<Receipt, ChargeError> {
            let reference = Call::current()
                .map(|c| c.reference().to_string())
                .ok_or(ChargeError::Unavailable)?;
            if args.amount == 13 {
                panic!("the processor client tripped over an amount of 13");
            }
            let args = super::charge(args.amount, &args.currency);
            self.processor.charge(&reference, &args).await
        }

        /// Look at the weather (not wrapped: no hint).
        #[tool(annotations(read_only_hint = true))]
        async fn weather(&self) -> String {
            "sunny".into()
        }
    }

    type Client = RunningService<RoleClient, ()>;

    async fn connect(server: Payments) -> Client {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            if let Ok(s) = server.serve(server_io).await {
                let _ = s.waiting().await;
            }
        });
        ().serve(client_io).await.expect("client connects")
    }

    fn payments(processor: &Arc<Processor>) -> Payments {
        Payments {
            engine: Idempotency::new(MemoryStore::new()),
            identity: Identity::stdio(Caller::new("acme", "alice")),
            processor: processor.clone(),
        }
    }

    async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
        let args = args.as_object().cloned().unwrap_or_default();
        client
            .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
            .await
            .expect("call_tool")
    }

    fn meta(r: &CallToolResult, key: &str) -> Option<Value> {
        r.meta.as_ref()?.0.get(key).cloned()
    }

    #[test]
    fn an_unwrapped_tool_never_reports_idempotent_hint() {
        let mut hints: Vec<(String, Option<bool>)> = Payments::tool_router()
            .list_all()
            .into_iter()
            .map(|t| {
                (
                    t.name.to_string(),
                    t.annotations.and_then(|a| a.idempotent_hint),
                )
            })
            .collect();
        hints.sort();
        assert_eq!(
            hints,
            vec![("charge_card".into(), Some(true)), ("weather".into(), None)]
        );
        assert_eq!(Payments::CHARGE_CARD_TOOL.name(), "charge_card");
    }

    #[tokio::test]
    async fn tools_list_over_mcp_shows_the_hint_and_keeps_the_other_annotations() {
        let client = connect(payments(&Arc::new(Processor::default()))).await;
        let tools = client.list_all_tools().await.unwrap();
        let charge = tools.iter().find(|t| t.name == "charge_card").unwrap();
        let a = charge.annotations.as_ref().unwrap();
        assert_eq!(
            (a.idempotent_hint, a.title.as_deref()),
            (Some(true), Some("Charge"))
        );
        assert_eq!(charge.description.as_deref(), Some("Charge a card."));
        let weather = tools.iter().find(|t| t.name == "weather").unwrap();
        assert_eq!(
            weather.annotations.as_ref().and_then(|a| a.idempotent_hint),
            None
        );
        client.cancel().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_wrapped_tool_replays_and_reports_in_flight() {
        let processor = Arc::new(Processor::default());
        let client = Arc::new(connect(payments(&processor)).await);
        let args = json!({"amount": 4200, "currency": "EUR"});
        let c2 = client.clone();
        let a2 = args.clone();
        let first = tokio::spawn(async move { call(&c2, "charge_card", a2).await });
        // Let the first call claim and reach the processor's 2 s sleep.
        while processor.calls() == 0 {
            tokio::task::yield_now().await;
        }
        let second = call(
            &client,
            "charge_card",
            json!({"currency": "EUR", "amount": 4200}),
        )
        .await;
        let first = first.await.unwrap();
        assert_eq!(first.is_error, Some(false));
        assert_eq!(second.is_error, Some(true));
        assert_eq!(meta(&second, META_STATUS), Some(json!("in_flight")));
        let reference = meta(&first, META_REF)
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap();
        assert_eq!(processor.references(), vec![reference.clone()]);
        assert_eq!(
            first.structured_content.as_ref().unwrap()["reference"],
            json!(reference)
        );

        let third = call(&client, "charge_card", args).await;
        assert_eq!(third.content, first.content);
        assert_eq!(meta(&third, META_REPLAYED), Some(json!(true)));
        assert_eq!(processor.calls(), 1);

        let declined = json!({"amount": 1, "currency": "DECLINE"});
        let d1 = call(&client, "charge_card", declined.clone()).await;
        let d2 = call(&client, "charge_card", declined).await;
        assert_eq!(d1.is_error, Some(true));
        assert_eq!(d1.content, d2.content);
        assert_eq!(meta(&d2, META_REPLAYED), Some(json!(true)));
        assert_eq!(processor.calls(), 2);
    }

    /// Every wrapper answer carries one of `STATUSES`, every status is used, and the README's
    /// status table lists exactly them.
    #[test]
    fn every_status_is_emitted_and_the_readme_lists_exactly_them() {
        use idempotency::error::UnknownReason;
        use idempotency::key::KeyError;
        use idempotency::store::StoreError;
        let r: idempotency::Reference = "3f9a0c1b2d4e5f60-1".parse().unwrap();
        let tool = || "charge_card".to_string();
        let every = vec![
            Error::InFlight {
                tool: tool(),
                reference: r,
                since: idempotency::clock::Timestamp::from_millis(0),
            },
            Error::OutcomeUnknown {
                tool: tool(),
                reference: r,
                reason: UnknownReason::Earlier,
                source: None,
            },
            Error::PayloadMismatch {
                tool: tool(),
                reference: r,
            },
            Error::Store {
                tool: tool(),
                source: StoreError::NotFound,
            },
            Error::ReferenceTaken {
                tool: tool(),
                reference: r,
            },
            Error::Arguments {
                tool: tool(),
                source: KeyError::EmptyTenant,
            },
            Error::InvalidCaller {
                reason: "no token".into(),
            },
            Error::Replay {
                tool: tool(),
                reference: r,
                message: "x".into(),
            },
            Error::Unstorable {
                tool: tool(),
                reference: r,
                message: "x".into(),
            },
        ];
        let mut emitted: Vec<String> = every
            .into_iter()
            .map(|e| {
                let text = e.advice();
                let result = idempotency::__private::mcp::refuse(e).unwrap();
                assert_eq!(result.is_error, Some(true));
                assert!(format!("{:?}", result.content).contains(&text[..20]));
                meta(&result, META_STATUS)
                    .and_then(|v| v.as_str().map(String::from))
                    .expect("a status")
            })
            .collect();
        emitted.sort();
        emitted.dedup();
        let mut known: Vec<String> = idempotency::mcp::STATUSES
            .iter()
            .map(|s| s.to_string())
            .collect();
        known.sort();
        assert_eq!(emitted, known, "every status is emitted, and only those");
        let readme = include_str!("../README.md");
        let start = readme.find("<!-- statuses").expect("README status table");
        let end = readme
            .find("<!-- /statuses -->")
            .expect("README status table end");
        let mut listed: Vec<String> = readme[start..end]
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next().map(String::from))
            .collect();
        listed.sort();
        assert_eq!(
            listed, known,
            "the README lists exactly the statuses the code emits"
        );
    }

    /// A panicking wrapped tool is answered over MCP (the client does not time out): isError,
    /// "outcome unknown (the handler failed …), ref X, call idempotency_status"; the record is
    /// unknown, a repeat is told so and does not run, and the server keeps serving.
    #[tokio::test(start_paused = true)]
    async fn a_panicking_tool_is_answered_and_the_server_keeps_serving() {
        let processor = Arc::new(Processor::default());
        let client = connect(payments(&processor)).await;
        let args = json!({"amount": 13, "currency": "EUR"});
        let first = call(&client, "charge_card", args.clone()).await;
        assert_eq!(first.is_error, Some(true));
        assert_eq!(meta(&first, META_STATUS), Some(json!("outcome_unknown")));
        let text = format!("{:?}", first.content);
        assert!(
            text.contains("the handler failed while it was running"),
            "{text}"
        );
        assert!(text.contains("tripped over an amount of 13"), "{text}");
        assert!(text.contains("idempotency_status"), "{text}");
        let reference = meta(&first, META_REF).expect("the ref");
        let again = call(&client, "charge_card", args).await;
        assert_eq!(meta(&again, META_STATUS), Some(json!("outcome_unknown")));
        assert_eq!(meta(&again, META_REF), Some(reference));
        let other = call(
            &client,
            "charge_card",
            json!({"amount": 100, "currency": "EUR"}),
        )
        .await;
        assert_ne!(other.is_error, Some(true), "{other:?}");
        assert_eq!(
            processor.calls(),
            1,
            "only the healthy call reached the processor"
        );
    }

    /// A tool that answers with a whole `CallToolResult` (an image and a text block, structured
    /// content, its own `_meta`): stored and replayed verbatim, the replay marker merged in.
    #[derive(Clone)]
    struct Gallery {
        engine: Idempotency,
        identity: Identity,
        renders: Arc<Processor>,
    }

    impl IdempotencyContext<RequestContext<RoleServer>> for Gallery {
        fn idempotency(&self) -> &Idempotency {
            &self.engine
        }
        fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
            self.identity.resolve(request)
        }
    }

    #[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
    struct RenderArgs {
        title: String,
    }

    #[tool_router(server_handler)]
    impl Gallery {
        /// Render a chart.
        #[idempotent(on_error = "retryable")]
        #[tool]
        async fn render(
            &self,
            Parameters(args): Parameters<RenderArgs>,
        ) -> Result<rmcp::model::CallToolResult, Error> {
            let n = self
                .renders
                .calls
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut meta = serde_json::Map::new();
            meta.insert("chart/renderer".into(), json!("v2"));
            Ok(rmcp::model::CallToolResult::success(vec![
                rmcp::model::ContentBlock::image("iVBORw0KGgo=", "image/png"),
                rmcp::model::ContentBlock::text(format!("{} (render {n})", args.title)),
            ])
            .with_meta(Some(rmcp::model::MetaObject(meta))))
        }
    }

    #[tokio::test]
    async fn a_call_tool_result_is_stored_and_replayed_verbatim() {
        let renders = Arc::new(Processor::default());
        let gallery = Gallery {
            engine: Idempotency::new(MemoryStore::new()),
            identity: Identity::stdio(Caller::new("acme", "alice")),
            renders: renders.clone(),
        };
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            if let Ok(s) = gallery.serve(server_io).await {
                let _ = s.waiting().await;
            }
        });
        let client: Client = ().serve(client_io).await.expect("client connects");
        let first = call(&client, "render", json!({"title": "sales"})).await;
        let again = call(&client, "render", json!({"title": "sales"})).await;
        assert_eq!(renders.calls(), 1);
        let blocks = serde_json::to_value(&first.content).unwrap();
        assert_eq!(blocks[0]["type"], json!("image"), "{blocks}");
        assert_eq!(blocks[0]["data"], json!("iVBORw0KGgo="));
        assert_eq!(blocks[1]["text"], json!("sales (render 0)"));
        assert_eq!(serde_json::to_value(&again.content).unwrap(), blocks);
        assert_eq!(again.is_error, first.is_error);
        assert_eq!(meta(&first, META_REPLAYED), Some(json!(false)));
        assert_eq!(meta(&again, META_REPLAYED), Some(json!(true)));
        assert_eq!(meta(&again, "chart/renderer"), Some(json!("v2")));
        assert_eq!(meta(&again, META_REF), meta(&first, META_REF));
    }

    /// A transfer that asks the client to confirm before it acts (a multi-round-trip request:
    /// `input_required` with a request state, then the same call with the state echoed).
    #[derive(Clone)]
    struct Bank {
        engine: Idempotency,
        identity: Identity,
        processor: Arc<Processor>,
    }

    impl IdempotencyContext<RequestContext<RoleServer>> for Bank {
        fn idempotency(&self) -> &Idempotency {
            &self.engine
        }
        fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
            self.identity.resolve(request)
        }
    }

    const CONFIRMED: &str = "confirmed";

    #[tool_router(server_handler)]
    impl Bank {
        /// Transfer money once the client confirms.
        #[idempotent(on_error = "retryable")]
        #[tool]
        async fn transfer(
            &self,
            Parameters(args): Parameters<McpChargeArgs>,
            RequestState(state): RequestState,
        ) -> Result<CallToolResponse, ChargeError> {
            if state.as_deref() != Some(CONFIRMED) {
                // Ask first, act after: nothing has been done yet.
                return Ok(InputRequiredResult::from_request_state(CONFIRMED).into());
            }
            let reference = Call::current()
                .map(|c| c.reference().to_string())
                .ok_or(ChargeError::Unavailable)?;
            let receipt = self
                .processor
                .charge(&reference, &super::charge(args.amount, &args.currency))
                .await?;
            let value = serde_json::to_value(receipt).map_err(|_| ChargeError::Unavailable)?;
            Ok(CallToolResult::structured(value).into())
        }
    }

    async fn transfer(client: &Client, state: Option<&str>) -> CallToolResponse {
        let args = json!({"amount": 700, "currency": "EUR"});
        let mut params = CallToolRequestParams::new("transfer")
            .with_arguments(args.as_object().cloned().unwrap_or_default());
        if let Some(s) = state {
            params = params.with_request_state(s);
        }
        client.call_tool_once(params).await.expect("tools/call")
    }

    fn complete(r: CallToolResponse) -> CallToolResult {
        match r {
            CallToolResponse::Complete(r) => r,
            other => panic!("expected a completed result, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_input_required_round_is_not_stored_and_its_continuation_completes_once() {
        let processor = Arc::new(Processor::default());
        let bank = Bank {
            engine: Idempotency::new(MemoryStore::new()),
            identity: Identity::stdio(Caller::new("acme", "alice")),
            processor: processor.clone(),
        };
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            if let Ok(s) = bank.serve(server_io).await {
                let _ = s.waiting().await;
            }
        });
        // `input_required` reaches only peers of protocol 2026-07-28 or newer (no `initialize`).
        let lifecycle = rmcp::ClientLifecycleMode::Discover {
            preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
        };
        let client: Client = rmcp::ClientServiceExt::serve_with_lifecycle((), client_io, lifecycle)
            .await
            .expect("client connects");

        // The first round asks; asked again, it asks again: the question was not stored as the
        // answer, and the key is not held in flight.
        for _ in 0..2 {
            match transfer(&client, None).await {
                CallToolResponse::InputRequired(ir) => {
                    assert_eq!(ir.request_state.as_deref(), Some(CONFIRMED))
                }
                other => panic!("expected input_required, got {other:?}"),
            }
        }
        assert_eq!(processor.calls(), 0);

        // The continuation runs the body under the same key and completes.
        let done = complete(transfer(&client, Some(CONFIRMED)).await);
        assert_eq!(done.is_error, Some(false), "{done:?}");
        assert_eq!(meta(&done, META_REPLAYED), Some(json!(false)));
        assert_eq!(processor.calls(), 1);
        let reference = meta(&done, META_REF).unwrap();
        assert_eq!(
            done.structured_content.as_ref().unwrap()["reference"],
            reference
        );

        // A repeat of the original call, and of the continuation, get the completed answer.
        for state in [None, Some(CONFIRMED)] {
            let again = complete(transfer(&client, state).await);
            assert_eq!(meta(&again, META_REPLAYED), Some(json!(true)));
            assert_eq!(again.structured_content, done.structured_content);
            assert_eq!(again.content, done.content);
        }
        assert_eq!(processor.calls(), 1);
    }
}
