//! What the cases share: fixed times, keys and requests, the assertions on a store's refusals,
//! and [`Subject`], the store under test with a helper for each operation.
//!
//! A store error where the case expects an answer fails the case: the helpers panic, naming
//! the operation (the runner adds the case's name).

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::key::{Caller, Fingerprint, Key, Reference, Secret};
use crate::store::{
    Claim, ClaimRequest, Completion, Fenced, OutboxMessage, RecordStatus, Settlement, Store,
    StoreError, StoredResponse, Token, Unsettled,
};

/// The cases' time zero, in ms since the Unix epoch (a date in 2026); times are offsets from it.
pub(super) const T0: i64 = 1_796_000_000_000;
/// One second, in ms.
pub(super) const S: i64 = 1_000;
/// One minute, in ms.
pub(super) const M: i64 = 60 * S;
/// The lease of every claim, in ms.
pub(super) const LEASE: i64 = 30 * S;
/// The tool's window (how long a record answers repeats), in ms.
pub(super) const WINDOW: i64 = 15 * M;
/// The tenant of every call.
pub(super) const TENANT: &str = "acme";
/// The tool of every call.
pub(super) const TOOL: &str = "charge_card";

/// The time `ms` after [`T0`].
pub(super) fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + ms)
}

/// The token a claim at `ms` proposes in these cases (the engine proposes its claim time in ms
/// × 2^20 plus random bits): a record created or taken over by that claim holds it.
pub(super) fn first_token(ms: i64) -> Token {
    Token(at(ms).as_millis())
}

/// `ms` (non-negative) as a [`Duration`].
pub(super) fn dur(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// The key of alice's call of [`TOOL`] at [`TENANT`] named `name` (the demo secret).
pub(super) fn key(name: &str) -> Key {
    Key::for_call(&Secret::demo(), &Caller::new(TENANT, "alice"), TOOL, name)
        .unwrap_or_else(|e| panic!("the key of a JSON string argument: {e}"))
}

/// The fingerprint of the arguments `args` (the demo secret).
pub(super) fn fp(args: &str) -> Option<Fingerprint> {
    match Fingerprint::of(&Secret::demo(), args) {
        Ok(f) => Some(f),
        Err(e) => panic!("the fingerprint of {args}: {e}"),
    }
}

/// A successful stored answer with `body`.
pub(super) fn answer(body: &str) -> StoredResponse {
    StoredResponse {
        ok: true,
        body: body.to_owned(),
    }
}

/// The claim of `key` at `now` ms, with [`LEASE`] and [`WINDOW`].
pub(super) fn req(key: Key, fingerprint: Option<Fingerprint>, now: i64) -> ClaimRequest<'static> {
    req_window(key, fingerprint, now, WINDOW)
}

/// [`req`] for a tool whose window is `window` ms.
pub(super) fn req_window(
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
pub(super) fn message(topic: &str, payload: &str) -> OutboxMessage {
    OutboxMessage {
        topic: topic.to_owned(),
        payload: payload.to_owned(),
    }
}

/// Asserts that `r` is the store's `Fenced` refusal of `reference`.
#[track_caller]
pub(super) fn assert_fenced(r: Result<(), StoreError>, reference: Reference) {
    assert!(
        matches!(&r, Err(StoreError::Fenced { reference: got }) if *got == reference),
        "expected Fenced({reference}), got {r:?}"
    );
}

/// Asserts that `r` is the store's `WrongState` refusal of `reference` in `state`.
#[track_caller]
pub(super) fn assert_wrong_state(r: Result<(), StoreError>, reference: Reference, state: &str) {
    assert!(
        matches!(&r, Err(StoreError::WrongState { reference: got, state: s }) if *got == reference && *s == state),
        "expected WrongState({reference}, {state}), got {r:?}"
    );
}

/// Asserts that `r` is the store's `NotFound` refusal.
#[track_caller]
pub(super) fn assert_not_found(r: Result<(), StoreError>) {
    assert!(
        matches!(r, Err(StoreError::NotFound)),
        "expected NotFound, got {r:?}"
    );
}

/// `r`'s value; a store error fails the case, naming what the case was doing.
#[track_caller]
pub(super) fn ok<T>(r: Result<T, StoreError>, doing: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("expected the store to {doing}, got the error {e:?}"),
    }
}

/// The store under test, and how many concurrent callers the contention cases make.
pub(super) struct Subject {
    /// The store, fresh and empty when the case began.
    pub(super) store: Arc<dyn Store>,
    /// How many concurrent claims (or takeovers) of one key the contention cases make.
    pub(super) crowd: usize,
}

impl Subject {
    /// Claims `key` at `now` ms (see [`req`]); a store error fails the case.
    pub(super) async fn claim(
        &self,
        key: Key,
        fingerprint: Option<Fingerprint>,
        now: i64,
    ) -> Claim {
        ok(self.store.claim(&req(key, fingerprint, now)).await, "claim")
    }

    /// Claims `key` at `now` ms, which must be a new claim: its token.
    pub(super) async fn new_claim(
        &self,
        key: Key,
        fingerprint: Option<Fingerprint>,
        now: i64,
    ) -> Token {
        self.new_claim_window(key, fingerprint, now, WINDOW).await
    }

    /// [`Subject::new_claim`] for a tool whose window is `window` ms.
    pub(super) async fn new_claim_window(
        &self,
        key: Key,
        fingerprint: Option<Fingerprint>,
        now: i64,
        window: i64,
    ) -> Token {
        let request = req_window(key, fingerprint, now, window);
        match ok(self.store.claim(&request).await, "claim") {
            Claim::New { token, .. } => token,
            other => panic!("expected a new claim of a fresh key, got {other:?}"),
        }
    }

    /// Completes `key`'s claim `token` at `now` ms with `response` and no outbox.
    pub(super) async fn complete_with(
        &self,
        key: Key,
        token: Token,
        now: i64,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let c = Completion {
            key,
            token,
            response,
            now: at(now),
            outbox: &[],
        };
        self.store.complete(&c).await
    }

    /// Completes `key`'s claim `token` at `now` ms with a successful `body` and no outbox.
    pub(super) async fn complete(
        &self,
        key: Key,
        token: Token,
        now: i64,
        body: &str,
    ) -> Result<(), StoreError> {
        self.complete_with(key, token, now, &answer(body)).await
    }

    /// What alice may see of `reference` at `tenant`; a store error fails the case.
    pub(super) async fn status(&self, tenant: &str, reference: Reference) -> Option<RecordStatus> {
        ok(
            self.store.status(tenant, "alice", reference).await,
            "answer a status lookup",
        )
    }

    /// Up to `limit` records still to settle at `now` ms; a store error fails the case.
    pub(super) async fn unsettled(&self, now: i64, limit: u32) -> Vec<Unsettled> {
        ok(
            self.store.unsettled(at(now), limit).await,
            "list the unsettled records",
        )
    }

    /// Settles `key`'s claim `token` with `s` at `now` ms.
    pub(super) async fn settle(
        &self,
        key: Key,
        token: Token,
        s: &Settlement,
        now: i64,
    ) -> Result<(), StoreError> {
        self.store.settle(key, token, s, at(now)).await
    }
}
