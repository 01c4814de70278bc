//! The `acp_checkout` example merchant: ACP's five checkout operations over REST
//! ([`rest`]) and over MCP ([`mcp`]) from one process, one record per client key whichever door
//! a request comes through (see [`Operation`]), inputs checked against ACP's published request
//! schemas ([`schema`]), charges made by a stub [`processor`].
//!
//! The sessions live in the process's memory (a demo: a restart forgets them, while the
//! idempotency records live in the store).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency::tool::ToolSpec;
use idempotency::{Caller, Classify, Disposition};
use rmcp::schemars;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

mod listing;
pub mod mcp;
pub mod processor;
pub mod rest;
pub mod schema;
mod store;
pub mod ucp;

pub use store::engine_from_env;

use processor::Processor;
use schema::Schemas;

/// The ACP API versions this merchant speaks (`API-Version`, `meta.api_version`).
pub const API_VERSIONS: &[&str] = &["2026-01-30"];

/// How long a client key is remembered: ACP asks for at least 24 hours.
const WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The argument members left out of the fingerprint: what changes on every retry (the request
/// id, the signing time and the signature), who sent it (`user_agent`, which a REST client and an
/// MCP client of one platform may spell differently), the `meta` members [`Meta`] does not
/// declare (`meta.*`: ACP's MCP binding asks servers to ignore those a later version adds; the
/// tools accept them unread, and REST's `meta`, built from headers, never has them), and the key
/// itself. The MCP tools name the first five in `ignore = [...]` and the key in
/// `client_key_field`; the macro lists them in this order, so the tools' `ToolSpec`s equal these
/// (a test checks it).
pub const IGNORED: &[&str] = &[
    "meta.request_id",
    "meta.timestamp",
    "meta.signature",
    "meta.user_agent",
    "meta.*",
    "meta.idempotency_key",
];

/// One of the four operations that change a session (`get` changes nothing and is not keyed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `POST /checkout_sessions`, `create_checkout_session`.
    Create,
    /// `POST /checkout_sessions/{id}`, `update_checkout_session`.
    Update,
    /// `POST /checkout_sessions/{id}/complete`, `complete_checkout_session`.
    Complete,
    /// `POST /checkout_sessions/{id}/cancel`, `cancel_checkout_session`.
    Cancel,
}

impl Operation {
    /// The operation as the idempotency engine knows it: the MCP tool's name (so that the REST
    /// route, keyed with `KeyScope::Operation`, derives the tool's key), ACP's window, and the
    /// members left out of the fingerprint.
    pub const fn spec(self) -> ToolSpec {
        let name = match self {
            Operation::Create => "create_checkout_session",
            Operation::Update => "update_checkout_session",
            Operation::Complete => "complete_checkout_session",
            Operation::Cancel => "cancel_checkout_session",
        };
        ToolSpec::new(name, WINDOW).ignoring(IGNORED)
    }

    /// The request schema of its payload.
    fn schema(self) -> &'static str {
        match self {
            Operation::Create => "CheckoutSessionCreateRequest",
            Operation::Update => "CheckoutSessionUpdateRequest",
            Operation::Complete => "CheckoutSessionCompleteRequest",
            Operation::Cancel => "CancelSessionRequest",
        }
    }
}

/// ACP's `meta` (the MCP binding's mapping of the REST headers).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Meta {
    /// `API-Version`: the ACP version the request is written in (`2026-01-30`).
    pub api_version: String,
    /// `Idempotency-Key`: one per request, the same on each of its retries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// `Request-Id`: a correlation id, new on each attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// `User-Agent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    /// `Accept-Language`: the locale of the answer's messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept_language: Option<String>,
    /// `Signature`: the request's signature, new on each attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// `Timestamp`: when the request was signed (RFC 3339), new on each attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
}

/// An ACP tool's arguments, `{meta, id, payload}`; also what a REST request is read into (its
/// headers as `meta`, its path's id as `id`, its body as `payload`), so both doors fingerprint
/// one value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AcpArgs {
    /// Protocol metadata.
    pub meta: Meta,
    /// The checkout session (all operations but create).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The request body (create, update, complete; optional for cancel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
}

/// An ACP error: its HTTP status over REST, ACP's `Error` (`type`, `code`, `message`, `param`)
/// in `data` of a JSON-RPC `-32000` error over MCP.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct AcpError {
    /// The HTTP status.
    pub status: u16,
    /// ACP's `type`: `invalid_request`, `processing_error`, `service_unavailable`.
    pub kind: String,
    /// ACP's `code`.
    pub code: String,
    /// What went wrong and what to do.
    pub message: String,
    /// The JSONPath (or header) at fault.
    pub param: Option<String>,
}

impl AcpError {
    fn invalid(message: String, param: Option<String>) -> AcpError {
        AcpError {
            status: 400,
            kind: "invalid_request".into(),
            code: "invalid".into(),
            message,
            param,
        }
    }

    fn not_found(id: &str) -> AcpError {
        AcpError {
            status: 404,
            kind: "invalid_request".into(),
            code: "session_not_found".into(),
            message: format!("no checkout session {id} for this account; nothing was done"),
            param: Some("id".into()),
        }
    }

    fn state(id: &str, status: &str, op: &str) -> AcpError {
        AcpError {
            status: 409,
            kind: "invalid_request".into(),
            code: "invalid_state".into(),
            message: format!(
                "checkout session {id} is {status}: it cannot be {op}; nothing was done"
            ),
            param: Some("id".into()),
        }
    }

    /// ACP's `Error` object.
    pub fn body(&self) -> Value {
        let mut e = json!({"type": self.kind, "code": self.code, "message": self.message});
        if let Some(p) = &self.param {
            e["param"] = json!(p);
        }
        e
    }
}

impl Classify for AcpError {
    fn disposition(&self) -> Disposition {
        // Every refusal is made before anything is charged or changed: released, not stored,
        // so a corrected request with the same key runs.
        Disposition::Retryable
    }
}

/// Checks a request before anything is claimed: a supported API version, the `id` and
/// `payload` the operation takes, the payload against ACP's schema. `root` is where the payload
/// is (`$` for a REST body, `$.payload` for an MCP tool's).
pub fn validate(
    schemas: &Schemas,
    op: Operation,
    args: &AcpArgs,
    root: &str,
) -> Result<(), AcpError> {
    let version = args.meta.api_version.as_str();
    if !API_VERSIONS.contains(&version) {
        return Err(AcpError::invalid(
            format!(
                "API version {version:?} is not one this merchant speaks ({})",
                API_VERSIONS.join(", ")
            ),
            Some("meta.api_version".into()),
        ));
    }
    match (op, &args.id) {
        (Operation::Create, Some(_)) => {
            return Err(AcpError::invalid(
                "create takes no id".into(),
                Some("id".into()),
            ))
        }
        (Operation::Create, None) => {}
        (_, None) => {
            return Err(AcpError::invalid(
                "the checkout session id is required".into(),
                Some("id".into()),
            ))
        }
        (_, Some(id)) if id.trim().is_empty() => {
            return Err(AcpError::invalid(
                "the checkout session id is empty".into(),
                Some("id".into()),
            ))
        }
        _ => {}
    }
    let payload = match (&args.payload, op) {
        (Some(p), _) => p,
        (None, Operation::Cancel) => return Ok(()),
        (None, _) => {
            return Err(AcpError::invalid(
                "a request body (`payload`) is required".into(),
                Some(root.into()),
            ))
        }
    };
    schemas
        .validate(op.schema(), payload, root)
        .map_err(|e| AcpError::invalid(e.to_string(), Some(e.path)))
}

/// A checkout session, as ACP answers it (the members this merchant fills).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CheckoutSession {
    /// `cs_…`.
    pub id: String,
    /// `ready_for_payment`, `complete_in_progress`, `completed`, `canceled`.
    pub status: String,
    /// ISO 4217, as the request gave it.
    pub currency: String,
    /// One per item asked for.
    pub line_items: Vec<Value>,
    /// `subtotal` and `total`, in minor units.
    pub totals: Vec<Value>,
    /// None offered: the demo sells digital goods.
    pub fulfillment_options: Vec<Value>,
    /// None.
    pub messages: Vec<Value>,
    /// None.
    pub links: Vec<Value>,
    /// The agent's capabilities as the request gave them.
    pub capabilities: Value,
    /// The buyer, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buyer: Option<Value>,
    /// Where to deliver, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fulfillment_details: Option<Value>,
    /// The order, once completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Value>,
}

/// The merchant: sessions by account, and the processor.
#[derive(Debug)]
pub struct Merchant {
    sessions: Mutex<HashMap<(String, String), CheckoutSession>>,
    next: AtomicU64,
    processor: Arc<Processor>,
    schemas: Schemas,
}

impl Merchant {
    /// A merchant charging through `processor`.
    pub fn new(processor: Arc<Processor>) -> Result<Merchant, schema::SchemaError> {
        Ok(Merchant {
            sessions: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            processor,
            schemas: Schemas::load(schema::CHECKOUT_REQUESTS)?,
        })
    }

    /// The request schemas.
    pub fn schemas(&self) -> &Schemas {
        &self.schemas
    }

    /// The processor.
    pub fn processor(&self) -> &Processor {
        &self.processor
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), CheckoutSession>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The caller's session `id`.
    pub fn get(&self, caller: &Caller, id: &str) -> Result<CheckoutSession, AcpError> {
        self.sessions()
            .get(&(caller.tenant.to_string(), id.to_owned()))
            .cloned()
            .ok_or_else(|| AcpError::not_found(id))
    }

    /// Runs a checked request (see [`validate`]) for `caller`; `reference` is the operation's
    /// idempotency reference (the processor's own key for a charge).
    pub async fn run(
        &self,
        op: Operation,
        caller: &Caller,
        args: AcpArgs,
        reference: &str,
    ) -> Result<CheckoutSession, AcpError> {
        let payload = args.payload.unwrap_or(Value::Null);
        let tenant = caller.tenant.to_string();
        match (op, args.id) {
            (Operation::Create, None) => Ok(self.create(tenant, &payload)),
            (Operation::Create, Some(_)) => Err(AcpError::invalid(
                "create takes no id".into(),
                Some("id".into()),
            )),
            (_, None) => Err(AcpError::invalid(
                "the checkout session id is required".into(),
                Some("id".into()),
            )),
            (Operation::Update, Some(id)) => {
                self.change(&tenant, &id, "updated", |s| update(s, &payload))
            }
            (Operation::Cancel, Some(id)) => {
                self.change(&tenant, &id, "canceled", |s| s.status = "canceled".into())
            }
            (Operation::Complete, Some(id)) => self.complete(&tenant, &id, reference).await,
        }
    }

    fn create(&self, tenant: String, payload: &Value) -> CheckoutSession {
        let n = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let mut session = CheckoutSession {
            id: format!("cs_{:x}_{n}", std::process::id()),
            status: "ready_for_payment".into(),
            currency: payload["currency"].as_str().unwrap_or_default().to_owned(),
            line_items: Vec::new(),
            totals: Vec::new(),
            fulfillment_options: Vec::new(),
            messages: Vec::new(),
            links: Vec::new(),
            capabilities: payload.get("capabilities").cloned().unwrap_or(json!({})),
            buyer: None,
            fulfillment_details: None,
            order: None,
        };
        update(&mut session, payload);
        self.sessions()
            .insert((tenant, session.id.clone()), session.clone());
        session
    }

    /// Changes an open session under the lock.
    fn change(
        &self,
        tenant: &str,
        id: &str,
        what: &str,
        f: impl FnOnce(&mut CheckoutSession),
    ) -> Result<CheckoutSession, AcpError> {
        let mut sessions = self.sessions();
        let session = sessions
            .get_mut(&(tenant.to_owned(), id.to_owned()))
            .ok_or_else(|| AcpError::not_found(id))?;
        if session.status != "ready_for_payment" {
            return Err(AcpError::state(id, &session.status, what));
        }
        f(session);
        Ok(session.clone())
    }

    /// Charges the session's total once, then records the order. The session is marked
    /// `complete_in_progress` first, so a second completion under another key is refused rather
    /// than charged.
    async fn complete(
        &self,
        tenant: &str,
        id: &str,
        reference: &str,
    ) -> Result<CheckoutSession, AcpError> {
        let total = self
            .change(tenant, id, "completed", |s| {
                s.status = "complete_in_progress".into()
            })
            .map(|s| total(&s))?;
        let key = (tenant.to_owned(), id.to_owned());
        let charge = match self.processor.charge(reference, total).await {
            Ok(charge) => charge,
            Err(e) => {
                if let Some(s) = self.sessions().get_mut(&key) {
                    s.status = "ready_for_payment".into();
                }
                return Err(AcpError {
                    status: 503,
                    kind: "service_unavailable".into(),
                    code: "processor_unavailable".into(),
                    message: format!("{e}: send the request again with the same idempotency key"),
                    param: None,
                });
            }
        };
        let mut sessions = self.sessions();
        let session = sessions
            .get_mut(&key)
            .ok_or_else(|| AcpError::not_found(id))?;
        session.status = "completed".into();
        session.order = Some(json!({
            "id": charge.order_id,
            "checkout_session_id": id,
            "permalink_url": format!("https://merchant.example/orders/{}", charge.order_id),
        }));
        Ok(session.clone())
    }
}

/// Applies an update's members (and a create's) to a session.
fn update(session: &mut CheckoutSession, payload: &Value) {
    if let Some(items) = payload.get("line_items").and_then(Value::as_array) {
        session.line_items = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let amount = item["unit_amount"].as_i64().unwrap_or(1000);
                json!({
                    "id": format!("li_{}", i + 1),
                    "item": item,
                    "quantity": 1,
                    "unit_amount": amount,
                    "totals": [{"type": "total", "display_text": "Total", "amount": amount}],
                })
            })
            .collect();
        let sum: i64 = session
            .line_items
            .iter()
            .filter_map(|l| l["unit_amount"].as_i64())
            .sum();
        session.totals = vec![
            json!({"type": "subtotal", "display_text": "Subtotal", "amount": sum}),
            json!({"type": "total", "display_text": "Total", "amount": sum}),
        ];
    }
    if let Some(buyer) = payload.get("buyer") {
        session.buyer = Some(buyer.clone());
    }
    if let Some(details) = payload.get("fulfillment_details") {
        session.fulfillment_details = Some(details.clone());
    }
}

fn total(session: &CheckoutSession) -> i64 {
    session
        .totals
        .iter()
        .find(|t| t["type"] == "total")
        .and_then(|t| t["amount"].as_i64())
        .unwrap_or(0)
}
