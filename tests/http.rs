//! The HTTP layer (`idempotency::http`, feature `http`) through an axum 0.8 router, on memory, a
//! SQLite file and PostgreSQL: a repeat with the same `Idempotency-Key` gets the first response
//! (`Idempotent-Replayed: true`, same status and body); the same key with another body is `422`;
//! a repeat while the first runs is `409` with `Retry-After`; a missing key is `400` where
//! required; a `5xx` is not stored; a body past the bound is `413`; other methods and routes
//! pass through; two tenants with one key are two records; 32 duplicates at once over a real
//! loopback server run once; a fresh key for the same request is refused when the route asks.
//!
//! Side effects are counted at the far side (the handler). A request held in the handler is
//! held by a gate the test opens (never a sleep).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use idempotency::http::{IdempotencyLayer, IDEMPOTENT_REPLAYED, PROBLEM_JSON};
use idempotency::tool::ToolSpec;
use idempotency::{Caller, Idempotency};
use idempotency_tests::backends::Backend;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tower::ServiceExt;

const CREATE_ORDER: ToolSpec = ToolSpec::new("create_order", Duration::from_secs(24 * 3600));
/// How long a test waits for something that must happen at once before it fails.
const BOUND: Duration = Duration::from_secs(20);

/// The far side: how many times each handler really ran, and the gate that can hold one.
#[derive(Default)]
struct Far {
    orders: AtomicUsize,
    lists: AtomicUsize,
    others: AtomicUsize,
    gate: Option<Gate>,
}

/// Holds the handler: it says it `entered`, then waits until the test opens it.
#[derive(Default)]
struct Gate {
    entered: Notify,
    open: Notify,
}

/// Creates an order: `201`, a JSON body naming it, a `Location`, and a header not replayed.
async fn create(State(far): State<Arc<Far>>, body: Bytes) -> Response {
    let n = far.orders.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(gate) = &far.gate {
        gate.entered.notify_one();
        gate.open.notified().await;
    }
    let sent: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (
        StatusCode::CREATED,
        [
            ("content-type", "application/json".to_owned()),
            ("location", format!("/orders/{n}")),
            ("x-first", "yes".to_owned()),
        ],
        json!({"order": n, "sent": sent}).to_string(),
    )
        .into_response()
}

/// Fails with a `500` on its first run, then creates.
async fn flaky(State(far): State<Arc<Far>>, body: Bytes) -> Response {
    let n = far.orders.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        return (StatusCode::INTERNAL_SERVER_ERROR, "processor down").into_response();
    }
    let _ = body;
    let json = [("content-type", "application/json")];
    (StatusCode::CREATED, json, json!({"order": n}).to_string()).into_response()
}

/// Takes effect, then fails before answering.
async fn boom(State(far): State<Arc<Far>>) -> Response {
    far.orders.fetch_add(1, Ordering::SeqCst);
    panic!("the processor's answer could not be read");
}

async fn list(State(far): State<Arc<Far>>) -> Response {
    far.lists.fetch_add(1, Ordering::SeqCst);
    ([("content-type", "application/json")], "[]").into_response()
}

async fn other(State(far): State<Arc<Far>>) -> Response {
    far.others.fetch_add(1, Ordering::SeqCst);
    StatusCode::NO_CONTENT.into_response()
}

/// The test's authentication: the caller from `x-tenant` (default `acme`), subject `alice`.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let tenant = request
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("acme")
        .to_owned();
    request
        .extensions_mut()
        .insert(Caller::new(tenant, "alice"));
    next.run(request).await
}

/// An engine on the backend's store.
fn engine(b: &Backend) -> Idempotency {
    Idempotency::builder_shared(b.store.clone()).build()
}

/// `/orders` (GET lists, POST creates behind `layer`), `/flaky` and `/boom` (POST behind `layer`) and
/// `/other` (POST, no layer), inside the authentication.
fn app(far: &Arc<Far>, layer: IdempotencyLayer) -> Router {
    Router::new()
        .route("/orders", get(list).post(create).layer(layer.clone()))
        .route("/flaky", post(flaky).layer(layer.clone()))
        .route("/boom", post(boom).layer(layer))
        .route("/other", post(other))
        .layer(middleware::from_fn(authenticate))
        .with_state(far.clone())
}

/// What came back (also what `doors.rs` reads its REST answers as).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    /// `request` sent to `app`, answered within [`BOUND`].
    pub(crate) async fn of(app: &Router, request: axum::http::Request<Body>) -> Answer {
        let response = tokio::time::timeout(BOUND, app.clone().oneshot(request))
            .await
            .expect("answered in time")
            .expect("infallible");
        let (parts, body) = response.into_parts();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: axum::body::to_bytes(body, usize::MAX)
                .await
                .expect("the body"),
        }
    }

    pub(crate) fn replayed(&self) -> bool {
        self.headers
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v == "true")
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The problem's `code`, checking it is a problem.
    fn problem(&self) -> String {
        assert_eq!(
            self.headers.get("content-type").map(|v| v.as_bytes()),
            Some(PROBLEM_JSON.as_bytes()),
            "{self:?}"
        );
        let p = self.json();
        assert_eq!(p["status"], self.status.as_u16(), "{p}");
        assert_eq!(p["type"], "about:blank", "{p}");
        assert_eq!(
            p["instance"].as_str().map(|s| s.starts_with('/')),
            Some(true)
        );
        assert_eq!(p["detail"], p["message"], "{p}");
        p["code"].as_str().unwrap_or_default().to_owned()
    }
}

/// A request to `app`.
struct Req<'a> {
    method: Method,
    path: &'a str,
    key: Option<&'a str>,
    tenant: &'a str,
    body: Value,
}

impl<'a> Req<'a> {
    fn post(path: &'a str, key: &'a str, body: Value) -> Self {
        Req {
            method: Method::POST,
            path,
            key: Some(key),
            tenant: "acme",
            body,
        }
    }

    fn request(&self) -> Request {
        let mut r = Request::builder()
            .method(self.method.clone())
            .uri(self.path)
            .header("content-type", "application/json")
            .header("x-tenant", self.tenant);
        if let Some(key) = self.key {
            r = r.header("idempotency-key", key);
        }
        r.body(Body::from(self.body.to_string()))
            .expect("a request")
    }

    async fn to(&self, app: &Router) -> Answer {
        Answer::of(app, self.request()).await
    }
}

const K1: &str = "4f6d3c1e-0b7a-4d7e-9a53-000000000001";
const K2: &str = "4f6d3c1e-0b7a-4d7e-9a53-000000000002";
const K3: &str = "4f6d3c1e-0b7a-4d7e-9a53-000000000003";

async fn a_repeat_gets_the_first_response_replayed(b: Backend) {
    let far = Arc::new(Far::default());
    let app = app(&far, IdempotencyLayer::new(engine(&b), CREATE_ORDER));
    let order = Req::post("/orders", K1, json!({"amount": 5, "note": null}));
    let first = order.to(&app).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    assert_eq!(first.headers["x-first"], "yes");
    // The same request, its members in another order: the same request.
    let again = Req::post("/orders", K1, json!({"note": null, "amount": 5}))
        .to(&app)
        .await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers["location"], "/orders/1");
    assert_eq!(again.headers["content-type"], "application/json");
    assert!(
        again.headers.get("x-first").is_none(),
        "not a chosen header"
    );
    assert_eq!(far.orders.load(Ordering::SeqCst), 1);
    b.finish().await;
}

async fn the_same_key_with_another_body_is_422(b: Backend) {
    let far = Arc::new(Far::default());
    let app = app(&far, IdempotencyLayer::new(engine(&b), CREATE_ORDER));
    let first = Req::post("/orders", K1, json!({"amount": 5}))
        .to(&app)
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    // `null` and an absent member differ.
    for body in [json!({"amount": 6}), json!({"amount": 5, "note": null})] {
        let other = Req::post("/orders", K1, body).to(&app).await;
        assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
        assert_eq!(other.problem(), "idempotency_conflict");
        assert!(other.json()["ref"].is_string(), "{other:?}");
    }
    assert_eq!(far.orders.load(Ordering::SeqCst), 1);
    b.finish().await;
}

async fn a_repeat_in_flight_is_409_with_retry_after(b: Backend) {
    let far = Arc::new(Far {
        gate: Some(Gate::default()),
        ..Far::default()
    });
    let app = app(
        &far,
        IdempotencyLayer::new(engine(&b), CREATE_ORDER).retry_after(Duration::from_millis(1500)),
    );
    let gate = || far.gate.as_ref().expect("a gate");
    let first = {
        let app = app.clone();
        tokio::spawn(async move {
            Req::post("/orders", K1, json!({"amount": 5}))
                .to(&app)
                .await
        })
    };
    tokio::time::timeout(BOUND, gate().entered.notified())
        .await
        .expect("the first request runs");
    let repeat = Req::post("/orders", K1, json!({"amount": 5}))
        .to(&app)
        .await;
    assert_eq!(repeat.status, StatusCode::CONFLICT, "{repeat:?}");
    assert_eq!(repeat.problem(), "idempotency_in_flight");
    assert_eq!(repeat.headers["retry-after"], "2");
    assert!(repeat.json()["ref"].is_string());
    gate().open.notify_one();
    let first = first.await.expect("the first request");
    assert_eq!(first.status, StatusCode::CREATED);
    let after = Req::post("/orders", K1, json!({"amount": 5}))
        .to(&app)
        .await;
    assert!(after.replayed());
    assert_eq!(after.body, first.body);
    assert_eq!(far.orders.load(Ordering::SeqCst), 1);
    b.finish().await;
}

/// With the operation's `wait`, a repeat in flight waits for the first answer instead.
async fn a_repeat_with_wait_gets_the_answer(b: Backend) {
    let far = Arc::new(Far {
        gate: Some(Gate::default()),
        ..Far::default()
    });
    let spec = CREATE_ORDER.with_wait(BOUND);
    let app = app(&far, IdempotencyLayer::new(engine(&b), spec));
    let gate = || far.gate.as_ref().expect("a gate");
    let send = |app: &Router| {
        let app = app.clone();
        tokio::spawn(async move {
            Req::post("/orders", K1, json!({"amount": 5}))
                .to(&app)
                .await
        })
    };
    let first = send(&app);
    tokio::time::timeout(BOUND, gate().entered.notified())
        .await
        .expect("the first request runs");
    let repeat = send(&app);
    gate().open.notify_one();
    let first = first.await.expect("the first request");
    let repeat = repeat.await.expect("the repeat");
    assert_eq!(repeat.status, StatusCode::CREATED, "{repeat:?}");
    assert!(repeat.replayed());
    assert_eq!(repeat.body, first.body);
    assert_eq!(far.orders.load(Ordering::SeqCst), 1);
    b.finish().await;
}

async fn a_missing_or_unusable_key_is_400(b: Backend) {
    let far = Arc::new(Far::default());
    let app = app(&far, IdempotencyLayer::new(engine(&b), CREATE_ORDER));
    let missing = Req {
        key: None,
        ..Req::post("/orders", K1, json!({"amount": 5}))
    }
    .to(&app)
    .await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.problem(), "idempotency_key_required");
    assert_eq!(missing.json()["param"], "Idempotency-Key");
    let short = Req::post("/orders", "abc", json!({"amount": 5}))
        .to(&app)
        .await;
    assert_eq!(short.status, StatusCode::BAD_REQUEST);
    assert_eq!(short.problem(), "idempotency_key_invalid");
    assert_eq!(far.orders.load(Ordering::SeqCst), 0);
    b.finish().await;
}

async fn an_optional_key_lets_requests_without_one_through(b: Backend) {
    let far = Arc::new(Far::default());
    let app = app(
        &far,
        IdempotencyLayer::new(engine(&b), CREATE_ORDER).optional_key(),
    );
    let bare = Req {
        key: None,
        ..Req::post("/orders", K1, json!({"amount": 5}))
    };
    for _ in 0..2 {
        let a = bare.to(&app).await;
        assert_eq!(a.status, StatusCode::CREATED);
        assert!(!a.replayed());
    }
    let keyed = Req::post("/orders", K1, json!({"amount": 5}));
    assert!(!keyed.to(&app).await.replayed());
    assert!(keyed.to(&app).await.replayed());
    assert_eq!(far.orders.load(Ordering::SeqCst), 3);
    b.finish().await;
}

async fn a_5xx_is_not_stored(b: Backend) {
    let far = Arc::new(Far::default());
    let app = app(&far, IdempotencyLayer::new(engine(&b), CREATE_ORDER));
    let order = Req::post("/flaky", K1, json!({"amount": 5}));
    let failed = order.to(&app).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.body, "processor down", "the service's own answer");
    let retry = order.to(&app).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed(), "ran again");
    let again = order.to(&app).await;
    assert!(again.replayed());
    assert_eq!(again.body, retry.body);
    assert_eq!(far.orders.load(Ordering::SeqCst), 2);
    b.finish().await;
}

async fn a_body_past_the_bound_is_413(b: Backend) {
    let far = Arc::new(Far::default());
    let app = app(
        &far,
        IdempotencyLayer::new(engine(&b), CREATE_ORDER).max_body(64),
    );
    let big = Req::post("/orders", K1, json!({"note": "x".repeat(100)}))
        .to(&app)
        .await;
    assert_eq!(big.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(big.problem(), "request_too_large");
    let small = Req::post("/orders", K1, json!({"amount": 5}))
        .to(&app)
        .await;
    assert_eq!(
        small.status,
        StatusCode::CREATED,
        "nothing was recorded for the key"
    );
    assert_eq!(far.orders.load(Ordering::SeqCst), 1);
    b.finish().await;
}

async fn other_methods_and_routes_pass_through(b: Backend) {
    let far = Arc::new(Far::default());
    let app = app(&far, IdempotencyLayer::new(engine(&b), CREATE_ORDER));
    for _ in 0..2 {
        let listed = Req {
            method: Method::GET,
            ..Req::post("/orders", K1, json!(null))
        }
        .to(&app)
        .await;
        assert_eq!(listed.status, StatusCode::OK);
        assert!(!listed.replayed());
        let other = Req::post("/other", K1, json!({"amount": 5})).to(&app).await;
        assert_eq!(other.status, StatusCode::NO_CONTENT);
        assert!(!other.replayed());
        // No key on an unprotected route is no refusal either.
        let bare = Req {
            key: None,
            ..Req::post("/other", K1, json!({}))
        };
        assert_eq!(bare.to(&app).await.status, StatusCode::NO_CONTENT);
    }
    assert_eq!(far.lists.load(Ordering::SeqCst), 2);
    assert_eq!(far.others.load(Ordering::SeqCst), 4);
    // PUT and DELETE pass through unless the layer protects them.
    let put = Router::new()
        .route("/orders", axum::routing::put(other).delete(other))
        .layer(IdempotencyLayer::new(engine(&b), CREATE_ORDER))
        .layer(middleware::from_fn(authenticate))
        .with_state(far.clone());
    for method in [Method::PUT, Method::DELETE, Method::PUT] {
        let a = Req {
            method,
            ..Req::post("/orders", K2, json!({}))
        }
        .to(&put)
        .await;
        assert_eq!(a.status, StatusCode::NO_CONTENT);
    }
    assert_eq!(far.others.load(Ordering::SeqCst), 7);
    assert_eq!(far.orders.load(Ordering::SeqCst), 0);
    b.finish().await;
}

async fn two_tenants_with_one_key_are_two_records(b: Backend) {
    let far = Arc::new(Far::default());
    let app = app(&far, IdempotencyLayer::new(engine(&b), CREATE_ORDER));
    let acme = Req::post("/orders", K1, json!({"amount": 5}));
    let globex = Req {
        tenant: "globex",
        ..Req::post("/orders", K1, json!({"amount": 5}))
    };
    let a = acme.to(&app).await;
    let g = globex.to(&app).await;
    assert!(!a.replayed() && !g.replayed());
    assert_ne!(a.body, g.body);
    assert_eq!(acme.to(&app).await.body, a.body);
    assert_eq!(globex.to(&app).await.body, g.body);
    assert_eq!(far.orders.load(Ordering::SeqCst), 2);
    b.finish().await;
}

async fn a_fresh_key_for_the_same_request_is_refused(b: Backend) {
    let far = Arc::new(Far::default());
    let app = app(
        &far,
        IdempotencyLayer::new(engine(&b), CREATE_ORDER).refuse_fresh_keys(Duration::from_secs(600)),
    );
    let first = Req::post("/orders", K1, json!({"amount": 5}))
        .to(&app)
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let fresh = Req::post("/orders", K2, json!({"amount": 5}))
        .to(&app)
        .await;
    assert_eq!(fresh.status, StatusCode::CONFLICT, "{fresh:?}");
    assert_eq!(fresh.problem(), "idempotency_key_mismatch");
    assert!(fresh.json()["ref"].is_string(), "names the first request");
    // The first key still replays; another request under a new key runs.
    assert!(Req::post("/orders", K1, json!({"amount": 5}))
        .to(&app)
        .await
        .replayed());
    let other = Req::post("/orders", K3, json!({"amount": 6}))
        .to(&app)
        .await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert!(!other.replayed());
    assert_eq!(far.orders.load(Ordering::SeqCst), 2);
    b.finish().await;
}

/// A retry after a `5xx` under the same key runs; under a fresh key it is refused.
async fn a_fresh_key_after_a_5xx_is_refused_the_first_key_runs(b: Backend) {
    let far = Arc::new(Far::default());
    let app = app(
        &far,
        IdempotencyLayer::new(engine(&b), CREATE_ORDER).refuse_fresh_keys(Duration::from_secs(600)),
    );
    let failed = Req::post("/flaky", K1, json!({"amount": 5})).to(&app).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    let fresh = Req::post("/flaky", K2, json!({"amount": 5})).to(&app).await;
    assert_eq!(fresh.status, StatusCode::CONFLICT, "{fresh:?}");
    let retry = Req::post("/flaky", K1, json!({"amount": 5})).to(&app).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert_eq!(far.orders.load(Ordering::SeqCst), 2);
    b.finish().await;
}

/// 32 copies of one request at once over a real loopback server: one runs; every other is the
/// replay or "in progress".
async fn duplicates_at_once_over_loopback_run_once(b: Backend) {
    let far = Arc::new(Far::default());
    let app = app(&far, IdempotencyLayer::new(engine(&b), CREATE_ORDER));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let at = listener.local_addr().expect("its address");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let url = format!("http://{at}/orders");
    let sends = (0..32).map(|_| {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            let r = client
                .post(url)
                .header("content-type", "application/json")
                .header("idempotency-key", K1)
                .body(r#"{"amount": 5}"#)
                .send()
                .await
                .expect("an answer");
            let replayed = r.headers().get(IDEMPOTENT_REPLAYED).is_some();
            (
                r.status().as_u16(),
                replayed,
                r.bytes().await.expect("a body"),
            )
        })
    });
    let mut ran = 0;
    for send in sends.collect::<Vec<_>>() {
        let (status, replayed, body) = tokio::time::timeout(BOUND, send)
            .await
            .expect("in time")
            .expect("the request");
        match status {
            201 if !replayed => ran += 1,
            201 | 409 => {}
            other => panic!("{other}: {body:?}"),
        }
    }
    assert_eq!(ran, 1);
    assert_eq!(far.orders.load(Ordering::SeqCst), 1);
    server.abort();
    b.finish().await;
}

/// A request that may have taken effect without an answer is "outcome unknown" (409), for it
/// and every repeat, and never runs again.
async fn a_lost_outcome_is_409_and_never_runs_again(b: Backend) {
    let far = Arc::new(Far::default());
    let app = app(&far, IdempotencyLayer::new(engine(&b), CREATE_ORDER));
    for _ in 0..2 {
        let lost = Req::post("/boom", K1, json!({"amount": 5})).to(&app).await;
        assert_eq!(lost.status, StatusCode::CONFLICT, "{lost:?}");
        assert_eq!(lost.problem(), "idempotency_outcome_unknown");
        assert!(lost.json()["ref"].is_string());
        assert!(lost.headers.get("retry-after").is_none());
    }
    assert_eq!(far.orders.load(Ordering::SeqCst), 1);
    b.finish().await;
}

/// A response past the bound the layer records has taken effect: "outcome unknown" for it and
/// every repeat, never run again.
async fn a_response_past_its_bound_is_an_unknown_outcome(b: Backend) {
    let far = Arc::new(Far::default());
    let layer = IdempotencyLayer::new(engine(&b), CREATE_ORDER).max_response(8);
    let app = app(&far, layer);
    for _ in 0..2 {
        let big = Req::post("/orders", K1, json!({"amount": 5}))
            .to(&app)
            .await;
        assert_eq!(big.status, StatusCode::CONFLICT, "{big:?}");
        assert_eq!(big.problem(), "idempotency_outcome_unknown");
    }
    assert_eq!(far.orders.load(Ordering::SeqCst), 1);
    b.finish().await;
}

/// With `KeyScope::Operation` and the tool's arguments as the fingerprint, a request's record is
/// the one an MCP tool of the operation finds for the same caller and client key (its answer is
/// the stored response's JSON body); the default, path-scoped key is another record.
async fn an_operation_scoped_key_is_the_tools_client_key(b: Backend) {
    use idempotency::http::KeyScope;
    use idempotency::key::ClientKey;
    use idempotency::outcome::ErrorPolicy;
    use idempotency::tool::Prepared;

    let far = Arc::new(Far::default());
    let engine = engine(&b);
    // The MCP side: the tool's call with the client's key and its arguments.
    let tool_call = |key: &'static str| {
        let engine = engine.clone();
        async move {
            let key = ClientKey::new(key).expect("a key");
            let caller = Caller::new("acme", "alice");
            let prepared = Prepared::client(&caller, &CREATE_ORDER, &key, &json!({"amount": 5}))
                .expect("keyed");
            let body = async { Ok::<Value, std::convert::Infallible>(json!("ran")) };
            engine
                .execute_raw(prepared, ErrorPolicy::retryable(), body)
                .await
        }
    };
    let by_path = app(&far, IdempotencyLayer::new(engine.clone(), CREATE_ORDER));
    Req::post("/orders", K1, json!({"amount": 5}))
        .to(&by_path)
        .await;
    assert!(
        !tool_call(K1).await.replayed,
        "a path-scoped key is not the tool's"
    );
    let shared = IdempotencyLayer::new(engine.clone(), CREATE_ORDER)
        .scope(KeyScope::Operation)
        .fingerprint(|req| Ok(req.json().cloned().unwrap_or(Value::Null)));
    let by_operation = app(&far, shared);
    let first = Req::post("/orders", K2, json!({"amount": 5}))
        .to(&by_operation)
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let found = tool_call(K2).await;
    assert!(found.replayed, "one record for the operation and the key");
    let answer = found.result.expect("the stored response's body");
    assert_eq!(answer, first.json(), "not the envelope: the body");
    assert_eq!(far.orders.load(Ordering::SeqCst), 2);
    b.finish().await;
}

/// Behind no authentication there is no caller: the layer refuses rather than guess.
async fn without_a_caller_nothing_runs(b: Backend) {
    let far = Arc::new(Far::default());
    let app = Router::new()
        .route("/orders", post(create))
        .layer(IdempotencyLayer::new(engine(&b), CREATE_ORDER))
        .with_state(far.clone());
    let a = Req::post("/orders", K1, json!({"amount": 5}))
        .to(&app)
        .await;
    assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(a.problem(), "idempotency_caller_missing");
    assert_eq!(far.orders.load(Ordering::SeqCst), 0);
    b.finish().await;
}

idempotency_tests::on_every_store!(
    "http";
    a_repeat_gets_the_first_response_replayed,
    the_same_key_with_another_body_is_422,
    a_repeat_in_flight_is_409_with_retry_after,
    a_repeat_with_wait_gets_the_answer,
    a_missing_or_unusable_key_is_400,
    an_optional_key_lets_requests_without_one_through,
    a_5xx_is_not_stored,
    a_body_past_the_bound_is_413,
    other_methods_and_routes_pass_through,
    two_tenants_with_one_key_are_two_records,
    a_fresh_key_for_the_same_request_is_refused,
    a_fresh_key_after_a_5xx_is_refused_the_first_key_runs,
    duplicates_at_once_over_loopback_run_once,
    without_a_caller_nothing_runs,
    a_lost_outcome_is_409_and_never_runs_again,
    a_response_past_its_bound_is_an_unknown_outcome,
    an_operation_scoped_key_is_the_tools_client_key,
);
