//! The suite's fixtures: fixed times, keys and requests, for a store's own cases beside the
//! suite's (a store-specific feature, say), so that they read like the suite's.
//!
//! ```
//! use idempotency::store::conformance::fixtures::{at, key, req, LEASE, T0};
//!
//! let claim = req(key("first"), None, 0);
//! assert_eq!(claim.now, at(0));
//! assert_eq!(at(LEASE).as_millis(), T0 + LEASE);
//! ```

use std::time::Duration;

use crate::clock::Timestamp;
use crate::key::{Caller, Fingerprint, Key, Secret};
use crate::store::{ClaimRequest, OutboxMessage, StoredResponse, Token};

/// The suite's time zero, in ms since the Unix epoch (a date in 2026); times are offsets from it.
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

/// The token a claim at `ms` proposes in the suite (the engine proposes its claim time in ms
/// × 2^20 plus random bits): a record created or taken over by that claim holds it.
pub fn first_token(ms: i64) -> Token {
    Token(at(ms).as_millis())
}

/// `ms` (non-negative) as a [`Duration`].
pub fn dur(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// The key of alice's call of [`TOOL`] at [`TENANT`] named `name` (the demo secret).
///
/// # Panics
///
/// Never for a name (a JSON string can always be keyed); it panics only if that changes.
pub fn key(name: &str) -> Key {
    Key::for_call(&Secret::demo(), &Caller::new(TENANT, "alice"), TOOL, name)
        .unwrap_or_else(|e| panic!("the key of a JSON string argument: {e}"))
}

/// The fingerprint of the arguments `args` (the demo secret).
///
/// # Panics
///
/// Never for a string (a JSON string can always be fingerprinted).
pub fn fp(args: &str) -> Option<Fingerprint> {
    match Fingerprint::of(&Secret::demo(), args) {
        Ok(f) => Some(f),
        Err(e) => panic!("the fingerprint of {args}: {e}"),
    }
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
