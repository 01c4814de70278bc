//! The fixtures of `tests/sql_conformance.rs` (what only the SQL stores have): fixed times, keys
//! and requests, as the store conformance suite's own (`idempotency::store::conformance`, whose
//! fixtures are private to it) use them.

use std::time::Duration;

use idempotency::{
    clock::Timestamp,
    key::{Fingerprint, Key},
    store::{ClaimRequest, OutboxMessage, StoredResponse, Token},
    Caller,
};

pub use crate::sqlite_file::SqliteFile;

/// The tests' time zero, in ms since the Unix epoch (a date in 2026); times are offsets from it.
pub const T0: i64 = 1_796_000_000_000;
/// One second, in ms.
pub const S: i64 = 1_000;
/// One minute, in ms.
pub const M: i64 = 60 * S;
/// The lease of every claim, in ms.
pub const LEASE: i64 = 30 * S;
/// The tool's window (how long a record answers repeats), in ms.
pub const WINDOW: i64 = 15 * M;
/// The tenant of every call.
pub const TENANT: &str = "acme";
/// The tool of every call.
pub const TOOL: &str = "charge_card";

/// The time `ms` after [`T0`].
pub fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + ms)
}

/// The token a claim at `ms` proposes in these tests (the engine proposes its claim time in ms ×
/// 2^20 plus random bits): a record created or taken over by that claim holds it.
pub fn first_token(ms: i64) -> Token {
    Token(at(ms).as_millis())
}

/// `ms` (non-negative) as a [`Duration`].
pub fn dur(ms: i64) -> Duration {
    Duration::from_millis(ms as u64)
}

/// The key of alice's call of [`TOOL`] at [`TENANT`] named `name` (the demo secret).
pub fn key(name: &str) -> Key {
    Key::for_call(
        &idempotency::key::Secret::demo(),
        &Caller::new(TENANT, "alice"),
        TOOL,
        name,
    )
    .expect("key")
}

/// A successful stored answer with `body`.
pub fn answer(body: &str) -> StoredResponse {
    StoredResponse {
        ok: true,
        body: body.to_owned(),
    }
}

/// The claim of `key` at `now` ms, with [`LEASE`] and [`WINDOW`].
pub fn req(key: Key, fingerprint: Option<Fingerprint>, now: i64) -> ClaimRequest<'static> {
    req_window(key, fingerprint, now, WINDOW)
}

/// [`req`] for a tool whose window is `window` ms.
pub fn req_window(
    key: Key,
    fingerprint: Option<Fingerprint>,
    now: i64,
    window: i64,
) -> ClaimRequest<'static> {
    ClaimRequest {
        key,
        tenant: TENANT,
        subject: None,
        tool: TOOL,
        fingerprint,
        now: at(now),
        lease: dur(LEASE),
        window: dur(window),
        token: first_token(now),
    }
}

/// An outbox message of `topic` carrying `payload`.
pub fn message(topic: &str, payload: &str) -> OutboxMessage {
    OutboxMessage {
        topic: topic.to_owned(),
        payload: payload.to_owned(),
    }
}
