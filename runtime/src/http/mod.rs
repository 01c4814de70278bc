//! An HTTP layer on the same engine and stores (feature `http`): a [`tower_layer::Layer`] that
//! makes a `POST` (or `PATCH`) route safe to send twice with an `Idempotency-Key` header, as the
//! IETF draft `draft-ietf-httpapi-idempotency-key-header-07` and the Agentic Commerce Protocol
//! (ACP SEP #120) describe it.
//!
//! For each request it protects, the layer reads the `Idempotency-Key` header (required or
//! optional), takes the authenticated [`Caller`](crate::Caller) that an authentication layer put
//! in the request's extensions, fingerprints the request (method, path and body: canonical JSON
//! for a JSON body, a digest of the bytes otherwise; or a value the route computes), claims the
//! key before the inner service runs, and records its response. A repeat with the same key gets
//! the stored status, chosen headers and body with `Idempotent-Replayed: true`; the same key with
//! another request gets `422`; a repeat while the first runs gets `409` with `Retry-After`. A
//! `5xx` response is never stored: the claim is given back and a retry runs again. The wrapper's
//! own answers are `application/problem+json` (RFC 9457).
//!
//! ```
//! use std::time::Duration;
//! use idempotency::{http::IdempotencyLayer, store::MemoryStore, tool::ToolSpec, Idempotency};
//!
//! // The operation: the name (part of the key) and window an MCP tool of it would use too.
//! const CREATE_ORDER: ToolSpec = ToolSpec::new("create_order", Duration::from_secs(24 * 3600));
//! let engine = Idempotency::new(MemoryStore::new());
//! let layer = IdempotencyLayer::new(engine, CREATE_ORDER).max_body(64 * 1024);
//! // axum: Router::new().route("/orders", post(create_order).layer(layer)), inside the
//! // authentication layer that inserts the `idempotency::Caller`.
//! # let _ = layer;
//! ```
//!
//! The user guide is `docs/http.md`.

mod body;
mod config;
mod envelope;
mod fingerprint;
mod fresh;
mod header;
mod layer;
mod problem;
mod service;

pub use config::KeyScope;
pub use fingerprint::FingerprintInput;
pub use header::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub use layer::IdempotencyLayer;
pub use problem::PROBLEM_JSON;
pub use service::IdempotencyService;
