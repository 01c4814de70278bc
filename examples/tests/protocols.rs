//! Keys where the commerce protocols put them, answered in their shape, through a real rmcp
//! client: ACP's MCP binding (`meta.idempotency_key` in the arguments, beside a request id, a
//! timestamp and a signature that change on every retry; errors as JSON-RPC `-32000` with ACP's
//! `Error` in `data`) and UCP's (`meta["idempotency-key"]`). The stub processor counts charges.

use idempotency::mcp::META_REF;
use idempotency::{store::MemoryStore, Caller, Idempotency};
use idempotency_examples::processor::Processor;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolRequestParams, CallToolResult, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{schemars, ErrorData, RoleServer, ServerHandler};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::Arc;

use crate::common::{connect, soon, Client};

/// ACP's `meta` (the binding's header mapping): the key, and what changes on every retry.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct AcpMeta {
    api_version: String,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    timestamp: Option<String>,
    #[serde(default)]
    signature: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct PaymentData {
    token: String,
    provider: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct CompletePayload {
    payment_data: PaymentData,
}

/// `complete_checkout_session`'s arguments: `{meta, id, payload}`.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct AcpComplete {
    meta: AcpMeta,
    id: String,
    payload: CompletePayload,
}

/// UCP's `meta`: the agent's profile and the key.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct UcpMeta {
    #[serde(rename = "ucp-agent")]
    ucp_agent: Value,
    #[serde(rename = "idempotency-key")]
    idempotency_key: String,
}

/// UCP `complete_checkout`'s arguments: `{meta, id, checkout}`.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct UcpComplete {
    meta: UcpMeta,
    id: String,
    checkout: Value,
}

#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Completed {
    id: String,
    status: String,
    order_id: String,
}

#[derive(Clone)]
struct Shop {
    engine: Idempotency,
    caller: Caller,
    processor: Arc<Processor>,
    tool_router: ToolRouter<Self>,
}

impl idempotency::IdempotencyContext<RequestContext<RoleServer>> for Shop {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, _: &RequestContext<RoleServer>) -> Result<Caller, idempotency::Error> {
        Ok(self.caller.clone())
    }
}

impl Shop {
    async fn charge(&self, id: &str) -> Result<rmcp::Json<Completed>, String> {
        let reference = idempotency::Call::current()
            .ok_or("not wrapped")?
            .reference()
            .to_string();
        let receipt = self.processor.charge(&reference, 4300, "usd").await;
        Ok(rmcp::Json(Completed {
            id: id.to_owned(),
            status: "completed".into(),
            order_id: receipt.charge_id,
        }))
    }
}

#[idempotency::idempotent_tools]
#[rmcp::tool_router]
impl Shop {
    #[idempotency::idempotent(
        window = "24h",
        on_error = "retryable",
        client_key = "require",
        client_key_field = "meta.idempotency_key",
        ignore = ["meta.request_id", "meta.timestamp", "meta.signature"],
        answers = "acp"
    )]
    #[rmcp::tool(description = "ACP: complete a checkout session")]
    async fn complete_checkout_session(
        &self,
        Parameters(args): Parameters<AcpComplete>,
    ) -> Result<rmcp::Json<Completed>, String> {
        self.charge(&args.id).await
    }

    /// The same, with the key optional: without one, the server keys the call by its arguments.
    #[idempotency::idempotent(
        window = "24h",
        on_error = "retryable",
        client_key = "accept",
        client_key_field = "meta.idempotency_key",
        ignore = ["meta.request_id", "meta.timestamp", "meta.signature"],
        answers = "acp"
    )]
    #[rmcp::tool(description = "ACP: complete a checkout session (key optional)")]
    async fn complete_checkout_session_optional(
        &self,
        Parameters(args): Parameters<AcpComplete>,
    ) -> Result<rmcp::Json<Completed>, String> {
        self.charge(&args.id).await
    }

    #[idempotency::idempotent(
        window = "24h",
        on_error = "retryable",
        client_key = "require",
        client_key_field = "meta.idempotency-key",
        answers = "ucp"
    )]
    #[rmcp::tool(description = "UCP: place the order")]
    async fn complete_checkout(
        &self,
        Parameters(args): Parameters<UcpComplete>,
    ) -> Result<rmcp::Json<Completed>, String> {
        self.charge(&args.id).await
    }
}

#[rmcp::tool_handler(router = self.tool_router)]
impl ServerHandler for Shop {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

fn shop(engine: &Idempotency, caller: Caller, processor: &Arc<Processor>) -> Shop {
    Shop {
        engine: engine.clone(),
        caller,
        processor: processor.clone(),
        tool_router: Shop::tool_router(),
    }
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

const KEY: &str = "550e8400-e29b-41d4-a716-446655440000";

/// An ACP retry: the same key and payload, with this attempt's request id, time and signature.
fn acp(key: Option<&str>, attempt: u32, token: &str) -> Value {
    let mut meta = json!({
        "api_version": "2026-01-30",
        "request_id": format!("req_{attempt}"),
        "timestamp": format!("2026-12-06T10:00:0{attempt}Z"),
        "signature": format!("sig-{attempt}"),
    });
    if let Some(k) = key {
        meta["idempotency_key"] = json!(k);
    }
    json!({"meta": meta, "id": "cs_123", "payload": {"payment_data": {"token": token, "provider": "stripe"}}})
}

fn structured(r: &CallToolResult) -> Value {
    r.structured_content.clone().expect("structured content")
}

fn reference(r: &CallToolResult) -> Option<String> {
    r.meta
        .as_ref()?
        .0
        .get(META_REF)?
        .as_str()
        .map(str::to_owned)
}

/// The ACP `Error` object a JSON-RPC error carries in `data`, after checking its code.
fn acp_error(e: &ErrorData) -> &Value {
    assert_eq!(
        e.code.0, -32000,
        "ACP errors are JSON-RPC server errors: {e:?}"
    );
    e.data.as_ref().expect("ACP's Error object in data")
}

/// Retries whose request id, timestamp and signature differ replay the first answer; the
/// processor charged once.
#[tokio::test]
async fn acp_retries_with_fresh_request_ids_replay() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::default());
    let client = connect(shop(&engine, Caller::new("acme", "agent"), &processor)).await;
    let first = call(
        &client,
        "complete_checkout_session",
        acp(Some(KEY), 1, "spt_1"),
    )
    .await
    .expect("the first call");
    for attempt in 2..5 {
        let again = call(
            &client,
            "complete_checkout_session",
            acp(Some(KEY), attempt, "spt_1"),
        )
        .await
        .expect("a retry");
        assert_eq!(structured(&again), structured(&first));
        assert_eq!(reference(&again), reference(&first));
    }
    assert_eq!(processor.charges(), 1);
}

/// The same key with another payload is ACP's `idempotency_conflict`, naming the key's field;
/// nothing is charged.
#[tokio::test]
async fn acp_the_same_key_with_another_payload_is_a_conflict() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::default());
    let client = connect(shop(&engine, Caller::new("acme", "agent"), &processor)).await;
    let first = call(
        &client,
        "complete_checkout_session",
        acp(Some(KEY), 1, "spt_1"),
    )
    .await
    .expect("the first call");
    let e = call(
        &client,
        "complete_checkout_session",
        acp(Some(KEY), 2, "spt_OTHER"),
    )
    .await
    .expect_err("a conflict");
    let data = acp_error(&e);
    assert_eq!(data["type"], "invalid_request");
    assert_eq!(data["code"], "idempotency_conflict");
    assert_eq!(data["param"], "$.meta.idempotency_key");
    assert_eq!(data["ref"].as_str(), reference(&first).as_deref());
    assert_eq!(data["message"], json!(e.message));
    assert_eq!(processor.charges(), 1);
}

/// A required key that is missing is ACP's `idempotency_key_required`; an optional one that is
/// missing keys the call by its arguments.
#[tokio::test]
async fn acp_a_missing_key_is_refused_where_required() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::default());
    let client = connect(shop(&engine, Caller::new("acme", "agent"), &processor)).await;
    let e = call(&client, "complete_checkout_session", acp(None, 1, "spt_1"))
        .await
        .expect_err("refused");
    let data = acp_error(&e);
    assert_eq!(data["code"], "idempotency_key_required");
    assert_eq!(data["param"], "$.meta.idempotency_key");
    assert_eq!(processor.charges(), 0);

    let a = call(
        &client,
        "complete_checkout_session_optional",
        acp(None, 1, "spt_1"),
    )
    .await
    .expect("no key, accepted");
    assert_eq!(processor.charges(), 1);
    // Keyed by its arguments: this attempt's request id is part of them.
    let b = call(
        &client,
        "complete_checkout_session_optional",
        acp(None, 1, "spt_1"),
    )
    .await
    .expect("the same arguments");
    assert_eq!(reference(&a), reference(&b));
    assert_eq!(processor.charges(), 1);
}

/// While the key's first request runs, a retry is ACP's `idempotency_in_flight` with the
/// seconds to wait; afterwards the retry replays. One charge.
#[tokio::test]
async fn acp_a_retry_during_the_call_is_in_flight_with_retry_after() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::gated());
    let client = Arc::new(connect(shop(&engine, Caller::new("acme", "agent"), &processor)).await);
    let c = client.clone();
    let first = tokio::spawn(async move {
        call(&c, "complete_checkout_session", acp(Some(KEY), 1, "spt_1")).await
    });
    soon("the first charge", processor.entered(1)).await;
    let e = call(
        &client,
        "complete_checkout_session",
        acp(Some(KEY), 2, "spt_1"),
    )
    .await
    .expect_err("in flight");
    processor.release(1);
    let first = soon("the first answer", first)
        .await
        .expect("task")
        .expect("answer");
    let data = acp_error(&e);
    assert_eq!(data["type"], "invalid_request");
    assert_eq!(data["code"], "idempotency_in_flight");
    assert_eq!(data["retry_after"], 1);
    assert_eq!(data["ref"].as_str(), reference(&first).as_deref());
    let after = call(
        &client,
        "complete_checkout_session",
        acp(Some(KEY), 3, "spt_1"),
    )
    .await
    .expect("replayed");
    assert_eq!(structured(&after), structured(&first));
    assert_eq!(processor.charges(), 1);
}

/// Two tenants with one key are two records, two charges.
#[tokio::test]
async fn acp_one_key_at_two_tenants_is_two_records() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::default());
    let mut refs = Vec::new();
    for tenant in ["acme", "globex"] {
        let client = connect(shop(&engine, Caller::new(tenant, "agent"), &processor)).await;
        let r = call(
            &client,
            "complete_checkout_session",
            acp(Some(KEY), 1, "spt_1"),
        )
        .await
        .expect("a call");
        refs.push(reference(&r));
    }
    assert_ne!(refs[0], refs[1]);
    assert_eq!(processor.charges(), 2);
}

fn ucp(key: &str, checkout: Value) -> Value {
    json!({
        "meta": {"ucp-agent": {"profile": "https://platform.example/profiles/agent.json"}, "idempotency-key": key},
        "id": "checkout_abc123",
        "checkout": checkout,
    })
}

/// UCP: the key in `meta["idempotency-key"]` replays; another payload with it is refused as a
/// UCP protocol error (JSON-RPC `-32000`); one charge.
#[tokio::test]
async fn ucp_a_key_in_meta_replays_and_refuses_another_payload() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::default());
    let client = connect(shop(&engine, Caller::new("acme", "agent"), &processor)).await;
    let payment =
        json!({"payment": {"instruments": [{"id": "pi_1", "handler_id": "h1", "type": "card"}]}});
    let first = call(&client, "complete_checkout", ucp(KEY, payment.clone()))
        .await
        .expect("the first call");
    let again = call(&client, "complete_checkout", ucp(KEY, payment))
        .await
        .expect("a retry");
    assert_eq!(structured(&again), structured(&first));
    let e = call(
        &client,
        "complete_checkout",
        ucp(KEY, json!({"payment": {}})),
    )
    .await
    .expect_err("a conflict");
    assert_eq!(e.code.0, -32000, "{e:?}");
    let data = e.data.as_ref().expect("data");
    assert_eq!(data["code"], "idempotency_conflict", "{data}");
    assert_eq!(processor.charges(), 1);
}
