//! ACP's REST routes, each `POST` behind `idempotency::http::IdempotencyLayer`.
//!
//! Each layer is keyed by the operation (`KeyScope::Operation`, the MCP tool's name) and
//! fingerprints the request as the tool's arguments: [`read`] turns the headers into `meta`, the
//! path's id into `id` and the body into `payload` — the very [`AcpArgs`] the MCP tool receives —
//! and the layer leaves out the same members ([`IGNORED`](super::IGNORED)). So one client key
//! sent by one caller names one record through either door, a REST request and an MCP call
//! that ask the same thing have one fingerprint, and whichever comes first answers the other
//! (the body of a `2xx` is the tool's `CheckoutSession`; a tool's answer is replayed here as
//! `201` for create, `200` otherwise). The layer refuses a request [`read`] or
//! [`validate`] refuses (`400`, nothing claimed); the handlers read it again the same way.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idempotency::http::{FingerprintInput, IdempotencyLayer, KeyScope};
use idempotency::{Call, Caller, Idempotency};
use serde_json::{json, Value};

use super::{validate, AcpArgs, AcpError, Merchant, Meta, Operation};

/// The largest body read.
const MAX_BODY: usize = 256 * 1024;

/// The REST routes on `engine`, serving `merchant`; the caller must already be in each request's
/// extensions (the authentication runs first).
pub fn router(engine: &Idempotency, merchant: Arc<Merchant>) -> Router {
    let layer = |op: Operation| {
        let m = merchant.clone();
        // A record the MCP tool wrote is replayed here with the status this route answers.
        let ok = if op == Operation::Create {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        IdempotencyLayer::new(engine.clone(), op.spec())
            .scope(KeyScope::Operation)
            .tool_answers(ok, StatusCode::UNPROCESSABLE_ENTITY)
            .max_body(MAX_BODY)
            .fingerprint(move |req| fingerprint(&m, op, req))
    };
    Router::new()
        .route(
            "/checkout_sessions",
            post(|s, r| handle(Operation::Create, s, r)).layer(layer(Operation::Create)),
        )
        .route(
            "/checkout_sessions/{id}",
            post(|s, r| handle(Operation::Update, s, r))
                .layer(layer(Operation::Update))
                .get(show),
        )
        .route(
            "/checkout_sessions/{id}/complete",
            post(|s, r| handle(Operation::Complete, s, r)).layer(layer(Operation::Complete)),
        )
        .route(
            "/checkout_sessions/{id}/cancel",
            post(|s, r| handle(Operation::Cancel, s, r)).layer(layer(Operation::Cancel)),
        )
        .with_state(merchant)
}

/// `POST /_processor/release`: lets one held charge through (mounted only when the processor is
/// gated, `ACP_PROCESSOR_GATE=1`, for tests).
pub fn gate_router(merchant: Arc<Merchant>) -> Router {
    Router::new()
        .route(
            "/_processor/release",
            post(|State(m): State<Arc<Merchant>>| async move {
                m.processor().release(1);
                StatusCode::NO_CONTENT
            }),
        )
        .with_state(merchant)
}

/// What the layer compares a request's repeats by: the tool's arguments it stands for.
fn fingerprint(
    merchant: &Merchant,
    op: Operation,
    req: &FingerprintInput<'_>,
) -> Result<Value, String> {
    let args = read(op, req.headers(), req.path(), req.body()).map_err(|e| e.message)?;
    validate(merchant.schemas(), op, &args, "$").map_err(|e| e.message)?;
    serde_json::to_value(&args).map_err(|e| e.to_string())
}

/// A REST request as the MCP tool's arguments: the headers ACP's MCP binding maps into `meta`,
/// the path's session id, the body.
pub fn read(
    op: Operation,
    headers: &HeaderMap,
    path: &str,
    body: &[u8],
) -> Result<AcpArgs, AcpError> {
    let text = |name: &str| -> Result<Option<String>, AcpError> {
        match headers.get(name) {
            None => Ok(None),
            Some(v) => v.to_str().map(|s| Some(s.to_owned())).map_err(|_| {
                AcpError::invalid(format!("the {name} header is not text"), Some(name.into()))
            }),
        }
    };
    let api_version = text("api-version")?.ok_or_else(|| {
        AcpError::invalid(
            format!(
                "the API-Version header is required (one of {})",
                super::API_VERSIONS.join(", ")
            ),
            Some("API-Version".into()),
        )
    })?;
    let meta = Meta {
        api_version,
        idempotency_key: text("idempotency-key")?,
        request_id: text("request-id")?,
        user_agent: text("user-agent")?,
        accept_language: text("accept-language")?,
        signature: text("signature")?,
        timestamp: text("timestamp")?,
    };
    // `/checkout_sessions/{id}[/complete|/cancel]`
    let id = (op != Operation::Create)
        .then(|| path.split('/').nth(2).map(str::to_owned))
        .flatten();
    let payload = if body.is_empty() {
        None
    } else {
        let json_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
        if !json_type {
            return Err(AcpError::invalid(
                "the body must be JSON, sent with Content-Type: application/json".into(),
                Some("Content-Type".into()),
            ));
        }
        Some(serde_json::from_slice(body).map_err(|e| {
            AcpError::invalid(format!("the body is not JSON: {e}"), Some("$".into()))
        })?)
    };
    Ok(AcpArgs { meta, id, payload })
}

/// One of the four `POST`s, inside the layer's claim.
async fn handle(
    op: Operation,
    State(merchant): State<Arc<Merchant>>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let Some(caller) = parts.extensions.get::<Caller>().cloned() else {
        return problem(&internal("no authenticated caller"), parts.uri.path());
    };
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return problem(
                &AcpError::invalid(format!("the body could not be read: {e}"), None),
                parts.uri.path(),
            )
        }
    };
    let args = match checked(&merchant, op, &parts.headers, parts.uri.path(), &body) {
        Ok(a) => a,
        Err(e) => return problem(&e, parts.uri.path()),
    };
    let Some(call) = Call::current() else {
        return problem(
            &internal("the route is not behind its idempotency layer"),
            parts.uri.path(),
        );
    };
    match merchant
        .run(op, &caller, args, &call.reference().to_string())
        .await
    {
        Ok(session) => {
            let status = if op == Operation::Create {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            json(status, &session)
        }
        Err(e) => problem(&e, parts.uri.path()),
    }
}

fn checked(
    merchant: &Merchant,
    op: Operation,
    headers: &HeaderMap,
    path: &str,
    body: &Bytes,
) -> Result<AcpArgs, AcpError> {
    let args = read(op, headers, path, body)?;
    validate(merchant.schemas(), op, &args, "$")?;
    Ok(args)
}

/// `GET /checkout_sessions/{id}`: not keyed (a read), the layer lets it through.
async fn show(State(merchant): State<Arc<Merchant>>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let Some(caller) = request.extensions().get::<Caller>() else {
        return problem(&internal("no authenticated caller"), &path);
    };
    let id = path.split('/').nth(2).unwrap_or_default();
    match merchant.get(caller, id) {
        Ok(session) => json(StatusCode::OK, &session),
        Err(e) => problem(&e, &path),
    }
}

fn internal(why: &str) -> AcpError {
    AcpError {
        status: 500,
        kind: "processing_error".into(),
        code: "internal".into(),
        message: format!("the server is misconfigured: {why}"),
        param: None,
    }
}

/// An error as the idempotency layer writes its own: RFC 9457 problem details with ACP's
/// `code`, `message` and `param`.
fn problem(e: &AcpError, instance: &str) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut body = json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": e.status,
        "detail": e.message,
        "instance": instance,
        "code": e.code,
        "message": e.message,
    });
    if let Some(p) = &e.param {
        body["param"] = json!(p);
    }
    let mut response = json(status, &body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/problem+json"),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        headers.insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}

/// `value` as an `application/json` response.
fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the answer could not be written: {e}"),
        )
            .into_response(),
    }
}
