//! One record for an operation reached over REST (the HTTP layer, `KeyScope::Operation`) and over
//! MCP (an rmcp tool with `client_key = "require"`, driven by an in-process rmcp client), on every
//! store: with one client key, whichever door comes first, the other replays its answer and the
//! processor charges once; a `4xx` crosses as the tool's definitive error and back; another
//! payload under the key is a conflict at both doors; two tenants with one key are two records.
//!
//! Each door has an engine of its own, the MCP one on a replica store (its own connections), as
//! two servers sharing one store would: nothing crosses through an engine's memory. Charges are
//! counted at the far side, by the processor stub both doors call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idempotency::http::{IdempotencyLayer, KeyScope};
use idempotency::mcp::{status_router, Identity, META_KEY, META_REF, META_REPLAYED, META_STATUS};
use idempotency::store::Standing;
use idempotency::tool::ToolSpec;
use idempotency::{idempotent, Caller, Error, Idempotency, IdempotencyContext, Reference};
use idempotency_tests::backends::Backend;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, RequestMetaObject, ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::{
    schemars, tool, tool_handler, tool_router, RoleClient, RoleServer, ServerHandler, ServiceExt,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::http::Answer;

/// The operation both doors serve: the layer's spec has the tool's name.
const CREATE_ORDER: ToolSpec = ToolSpec::new("create_order", Duration::from_secs(24 * 3600));
/// How long a test waits for an answer that must come at once before it fails.
const BOUND: Duration = Duration::from_secs(20);
/// An amount the processor declines.
const TOO_MUCH: u64 = 10_000;
/// An amount the REST handler refuses with a `409` whose body is not the tool's error.
const OUT_OF_STOCK: u64 = 7;

/// The far side: every charge it is asked for counts, no deduplication.
#[derive(Default)]
struct Processor {
    charges: AtomicU64,
}

impl Processor {
    /// Charges `args` (declines [`TOO_MUCH`]): the order, or the decline.
    fn charge(&self, args: &OrderArgs) -> Result<Order, Declined> {
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        if args.amount >= TOO_MUCH {
            return Err(Declined {
                error: "card_declined".into(),
                reason: format!("{} is over the card's limit", args.amount),
            });
        }
        Ok(Order {
            order: n,
            item: args.item.clone(),
            amount: args.amount,
        })
    }

    fn charged(&self) -> u64 {
        self.charges.load(Ordering::SeqCst)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct OrderArgs {
    item: String,
    amount: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
struct Order {
    order: u64,
    item: String,
    amount: u64,
}

/// The processor's decline: the REST route's `402` body and the tool's definitive error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("declined ({error}): {reason}")]
struct Declined {
    error: String,
    reason: String,
}

// ---------------------------------------------------------------------------------------------
// The MCP door
// ---------------------------------------------------------------------------------------------

/// The MCP door: `create_order` and the status tool.
#[derive(Clone)]
struct Shop {
    engine: Idempotency,
    identity: Identity,
    processor: Arc<Processor>,
    tool_router: ToolRouter<Self>,
}

impl IdempotencyContext<RequestContext<RoleServer>> for Shop {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

#[tool_router]
impl Shop {
    /// Create an order and charge for it.
    #[idempotent(window = "24h", on_error = "definitive", client_key = "require")]
    #[tool]
    async fn create_order(
        &self,
        Parameters(args): Parameters<OrderArgs>,
    ) -> Result<Json<Order>, Declined> {
        self.processor.charge(&args).map(Json)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Shop {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

type Client = RunningService<RoleClient, ()>;

/// An rmcp client of the shop, in process, calling as `caller`.
async fn mcp(engine: Idempotency, processor: &Arc<Processor>, caller: Caller) -> Client {
    let shop = Shop {
        engine,
        identity: Identity::stdio(caller),
        processor: processor.clone(),
        tool_router: Shop::tool_router() + status_router::<Shop>(),
    };
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(s) = shop.serve(server_io).await {
            let _ = s.waiting().await;
        }
    });
    ().serve(client_io).await.expect("the client connects")
}

/// `create_order` with the client's `key`: the result, or the JSON-RPC error's `data`.
async fn call(client: &Client, key: &str, args: Value) -> Result<CallToolResult, Value> {
    let mut params = CallToolRequestParams::new("create_order")
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    let mut meta = RequestMetaObject::default();
    meta.insert(META_KEY.into(), json!(key));
    params.meta = Some(meta);
    match tokio::time::timeout(BOUND, client.call_tool(params))
        .await
        .expect("answered in time")
    {
        Ok(r) => Ok(r),
        Err(rmcp::ServiceError::McpError(e)) => Err(e.data.unwrap_or_default()),
        Err(e) => panic!("tools/call: {e}"),
    }
}

fn meta(r: &CallToolResult, key: &str) -> Value {
    r.meta
        .as_ref()
        .and_then(|m| m.0.get(key).cloned())
        .unwrap_or_default()
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The REST door
// ---------------------------------------------------------------------------------------------

/// `POST /orders`: `201` and the order, `402` and the decline, `409` (not the tool's error) when
/// out of stock.
async fn create(State(processor): State<Arc<Processor>>, body: Bytes) -> Response {
    let json = [("content-type", "application/json")];
    let Ok(args) = serde_json::from_slice::<OrderArgs>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    if args.amount == OUT_OF_STOCK {
        let body = json!({"message": format!("{} is out of stock", args.item)});
        return (StatusCode::CONFLICT, json, body.to_string()).into_response();
    }
    match processor.charge(&args) {
        Ok(order) => (StatusCode::CREATED, json, to_json(&order)).into_response(),
        Err(declined) => (StatusCode::PAYMENT_REQUIRED, json, to_json(&declined)).into_response(),
    }
}

fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// The caller from `x-tenant`, subject `alice`, as the MCP door's identity names them.
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

/// The REST door: the key scoped by the operation, requests fingerprinted as the tool's
/// arguments, a tool's answers replayed as `201` (its errors as the default `422`).
fn rest(engine: Idempotency, processor: &Arc<Processor>) -> Router {
    let layer = IdempotencyLayer::new(engine, CREATE_ORDER)
        .scope(KeyScope::Operation)
        .tool_answers(StatusCode::CREATED, StatusCode::UNPROCESSABLE_ENTITY)
        .fingerprint(|req| req.json().cloned().ok_or_else(|| "not JSON".to_owned()));
    Router::new()
        .route("/orders", post(create).layer(layer))
        .layer(middleware::from_fn(authenticate))
        .with_state(processor.clone())
}

async fn post_order(app: &Router, tenant: &str, key: &str, args: &Value) -> Answer {
    let request = axum::http::Request::post("/orders")
        .header("content-type", "application/json")
        .header("x-tenant", tenant)
        .header("idempotency-key", key)
        .body(Body::from(args.to_string()))
        .expect("a request");
    Answer::of(app, request).await
}

// ---------------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------------

const K1: &str = "2b1f9c4e-6d0a-4c57-8e21-0000000000d1";
const K2: &str = "2b1f9c4e-6d0a-4c57-8e21-0000000000d2";

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

/// Both doors, each with an engine of its own over the backend's records.
struct Doors {
    processor: Arc<Processor>,
    rest: Router,
    mcp: Client,
    /// The MCP door's engine, for status lookups.
    engine: Idempotency,
}

async fn doors(b: &Backend) -> Doors {
    let processor = Arc::new(Processor::default());
    let rest = rest(
        Idempotency::builder_shared(b.store.clone()).build(),
        &processor,
    );
    let engine = Idempotency::builder_shared(b.replica().await).build();
    let mcp = mcp(engine.clone(), &processor, alice()).await;
    Doors {
        processor,
        rest,
        mcp,
        engine,
    }
}

/// What the status tool says of `reference`.
async fn status_tool(client: &Client, reference: &Value) -> Value {
    let args = json!({ "ref": reference });
    let params = CallToolRequestParams::new("idempotency_status")
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    let r = tokio::time::timeout(BOUND, client.call_tool(params))
        .await
        .expect("answered in time")
        .expect("the status tool answers");
    r.structured_content.unwrap_or_default()
}

/// The record's standing and stored answer, as the status lookup reads it.
async fn status_of(engine: &Idempotency, reference: &Value) -> (Standing, String) {
    let reference: Reference = reference
        .as_str()
        .and_then(|r| r.parse().ok())
        .expect("a reference");
    let status = engine
        .status(&alice(), reference)
        .await
        .expect("the store answers")
        .expect("the record");
    let now = engine.clock().now();
    let body = status.response.clone().map(|r| r.body).unwrap_or_default();
    (status.standing(reference, now), body)
}

/// REST first: the tool's caller gets the response's body as the tool's answer, replayed, and
/// the processor is not asked again; the status lookup reads the recorded response.
async fn rest_then_mcp_is_one_charge(b: Backend) {
    let d = doors(&b).await;
    let args = json!({"item": "book", "amount": 5});
    let first = post_order(&d.rest, "acme", K1, &args).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    let again = call(&d.mcp, K1, args.clone()).await.expect("a result");
    assert_eq!(again.is_error, Some(false), "{}", text(&again));
    assert_eq!(meta(&again, META_REPLAYED), json!(true));
    assert_eq!(again.structured_content, Some(first.json()));
    assert_eq!(d.processor.charged(), 1, "one charge at the processor");
    let reference = meta(&again, META_REF);
    let (standing, stored) = status_of(&d.engine, &reference).await;
    assert_eq!(standing, Standing::Completed);
    assert!(stored.starts_with("http {\"status\":201"), "{stored}");
    let status = status_tool(&d.mcp, &reference).await;
    assert_eq!(status["state"], "completed", "{status}");
    let response = &status["answer"]["http_response"];
    assert_eq!(response["status"], 201, "{status}");
    assert_eq!(response["body"]["json"], first.json(), "{status}");
    b.finish().await;
}

/// MCP first: the REST request gets the tool's answer as a JSON `201` (the route's choice),
/// replayed, and the processor is not asked again.
async fn mcp_then_rest_is_one_charge(b: Backend) {
    let d = doors(&b).await;
    let args = json!({"item": "pen", "amount": 3});
    let first = call(&d.mcp, K1, args.clone()).await.expect("a result");
    assert_eq!(first.is_error, Some(false), "{}", text(&first));
    assert_eq!(meta(&first, META_REPLAYED), json!(false));
    let again = post_order(&d.rest, "acme", K1, &args).await;
    assert_eq!(again.status, StatusCode::CREATED, "{again:?}");
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.headers["content-type"], "application/json");
    assert_eq!(Some(again.json()), first.structured_content);
    assert_eq!(d.processor.charged(), 1, "one charge at the processor");
    b.finish().await;
}

/// A `4xx` crosses as a definitive error: REST's `402` decline is the tool's `Declined`,
/// replayed; the tool's decline is REST's `422` with the decline's JSON. A `409` whose body is
/// not the tool's error reaches the tool as an error naming the status and the ref.
async fn a_stored_4xx_crosses_as_a_definitive_error(b: Backend) {
    let d = doors(&b).await;
    let over = json!({"item": "car", "amount": TOO_MUCH});
    let declined = post_order(&d.rest, "acme", K1, &over).await;
    assert_eq!(
        declined.status,
        StatusCode::PAYMENT_REQUIRED,
        "{declined:?}"
    );
    let decline: Declined = serde_json::from_slice(&declined.body).expect("the decline");
    let again = call(&d.mcp, K1, over.clone()).await.expect("a result");
    assert_eq!(again.is_error, Some(true));
    assert_eq!(meta(&again, META_REPLAYED), json!(true));
    assert_eq!(
        meta(&again, META_STATUS),
        Value::Null,
        "the tool's own error"
    );
    assert_eq!(text(&again), decline.to_string());
    let reference = meta(&again, META_REF);
    let (standing, _) = status_of(&d.engine, &reference).await;
    assert_eq!(standing, Standing::Failed);
    let status = status_tool(&d.mcp, &reference).await;
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(status["answer"]["http_response"]["status"], 402, "{status}");

    let first = call(&d.mcp, K2, over.clone()).await.expect("a result");
    assert_eq!(first.is_error, Some(true), "{}", text(&first));
    let replayed = post_order(&d.rest, "acme", K2, &over).await;
    assert_eq!(
        replayed.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{replayed:?}"
    );
    assert!(replayed.replayed());
    let decline: Declined = serde_json::from_slice(&replayed.body).expect("the decline");
    assert_eq!(text(&first), decline.to_string());
    assert_eq!(d.processor.charged(), 2, "one charge per key");

    let key = "2b1f9c4e-6d0a-4c57-8e21-0000000000d3";
    let stock = json!({"item": "lamp", "amount": OUT_OF_STOCK});
    let refused = post_order(&d.rest, "acme", key, &stock).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
    let unreadable = call(&d.mcp, key, stock).await.expect("a result");
    assert_eq!(unreadable.is_error, Some(true));
    assert_eq!(meta(&unreadable, META_STATUS), json!("replay_failed"));
    let says = text(&unreadable);
    let reference = meta(&unreadable, META_REF);
    assert!(
        says.contains("status 409")
            && says.contains("out of stock")
            && says.contains(reference.as_str().unwrap_or("no ref")),
        "{says}"
    );
    assert_eq!(d.processor.charged(), 2, "nothing ran again");
    b.finish().await;
}

/// The key with another payload, across the doors either way: a conflict, nothing charged.
async fn another_payload_across_doors_is_a_conflict(b: Backend) {
    let d = doors(&b).await;
    let five = json!({"item": "book", "amount": 5});
    let six = json!({"item": "book", "amount": 6});
    assert_eq!(
        post_order(&d.rest, "acme", K1, &five).await.status,
        StatusCode::CREATED
    );
    let conflict = call(&d.mcp, K1, six.clone()).await.expect_err("a conflict");
    assert_eq!(
        conflict["type"],
        json!("idempotency_key_conflict"),
        "{conflict}"
    );

    let first = call(&d.mcp, K2, five).await.expect("a result");
    assert_eq!(first.is_error, Some(false), "{}", text(&first));
    let refused = post_order(&d.rest, "acme", K2, &six).await;
    assert_eq!(
        refused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{refused:?}"
    );
    assert_eq!(
        refused.json()["code"],
        "idempotency_conflict",
        "{refused:?}"
    );
    assert_eq!(d.processor.charged(), 2);
    b.finish().await;
}

/// Two tenants with one key are two records: each door's caller gets its own charge.
async fn two_tenants_with_one_key_are_two_records(b: Backend) {
    let d = doors(&b).await;
    let args = json!({"item": "book", "amount": 5});
    let acme = post_order(&d.rest, "acme", K1, &args).await;
    assert_eq!(acme.status, StatusCode::CREATED);
    let globex = mcp(
        d.engine.clone(),
        &d.processor,
        Caller::new("globex", "alice"),
    )
    .await;
    let other = call(&globex, K1, args.clone()).await.expect("a result");
    assert_eq!(other.is_error, Some(false), "{}", text(&other));
    assert_eq!(
        meta(&other, META_REPLAYED),
        json!(false),
        "not acme's record"
    );
    assert_ne!(other.structured_content, Some(acme.json()));
    let globex_rest = post_order(&d.rest, "globex", K1, &args).await;
    assert!(
        globex_rest.replayed(),
        "globex's own record, from its tool call"
    );
    assert_eq!(Some(globex_rest.json()), other.structured_content);
    assert_eq!(d.processor.charged(), 2);
    b.finish().await;
}

idempotency_tests::on_every_store!(
    "doors", redis;
    rest_then_mcp_is_one_charge,
    mcp_then_rest_is_one_charge,
    a_stored_4xx_crosses_as_a_definitive_error,
    another_payload_across_doors_is_a_conflict,
    two_tenants_with_one_key_are_two_records,
);
