//! What the store conformance suites share (`tests/conformance/`, every store, and
//! `tests/sql_conformance.rs`, the SQL stores): fixed times, keys and requests, the assertions on
//! a store's refusals, and [`Backend`], the store under test with helpers for each operation.

use std::sync::Arc;
use std::time::Duration;

use idempotency::{
    clock::Timestamp,
    key::{Fingerprint, Key},
    store::{
        Claim, ClaimRequest, Completion, Fenced, OutboxMessage, RecordStatus, Settlement, Store,
        StoreError, StoredResponse, Token, Unsettled,
    },
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

/// The fingerprint of the arguments `args` (the demo secret).
pub fn fp(args: &str) -> Option<Fingerprint> {
    Some(Fingerprint::of(&idempotency::key::Secret::demo(), args).expect("fingerprint"))
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

/// Asserts that `r` is the store's `Fenced` refusal of `reference`.
#[track_caller]
pub fn assert_fenced(r: Result<(), StoreError>, reference: idempotency::Reference) {
    assert!(
        matches!(&r, Err(StoreError::Fenced { reference: got }) if *got == reference),
        "expected Fenced({reference}), got {r:?}"
    );
}

/// Asserts that `r` is the store's `WrongState` refusal of `reference` in `state`.
#[track_caller]
pub fn assert_wrong_state(
    r: Result<(), StoreError>,
    reference: idempotency::Reference,
    state: &str,
) {
    assert!(
        matches!(&r, Err(StoreError::WrongState { reference: got, state: s }) if *got == reference && *s == state),
        "expected WrongState({reference}, {state}), got {r:?}"
    );
}

/// Asserts that `r` is the store's `NotFound` refusal.
#[track_caller]
pub fn assert_not_found(r: Result<(), StoreError>) {
    assert!(
        matches!(r, Err(StoreError::NotFound)),
        "expected NotFound, got {r:?}"
    );
}

/// Which store a [`Backend`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The in-memory store.
    Memory,
    /// The SQLite store.
    Sqlite,
    /// The PostgreSQL store.
    Postgres,
    /// The Redis store (a single node or a cluster).
    Redis,
}

/// The store under test.
pub struct Backend {
    /// The store.
    pub store: Arc<dyn Store>,
    /// Which store it is.
    pub kind: Kind,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Backend {
    /// How many concurrent claims of one key the contention cases make.
    pub fn crowd(&self) -> usize {
        match self.kind {
            Kind::Sqlite => 200,
            Kind::Memory | Kind::Postgres | Kind::Redis => 1_000,
        }
    }

    /// Claims `key` at `now` ms (see [`req`]); a store error fails the test.
    pub async fn claim(&self, key: Key, fingerprint: Option<Fingerprint>, now: i64) -> Claim {
        self.store
            .claim(&req(key, fingerprint, now))
            .await
            .expect("claim")
    }

    /// Claims `key` at `now` ms, which must be a new claim: its token.
    pub async fn new_claim(&self, key: Key, fingerprint: Option<Fingerprint>, now: i64) -> Token {
        self.new_claim_window(key, fingerprint, now, WINDOW).await
    }

    /// [`Backend::new_claim`] for a tool whose window is `window` ms.
    pub async fn new_claim_window(
        &self,
        key: Key,
        fingerprint: Option<Fingerprint>,
        now: i64,
        window: i64,
    ) -> Token {
        let claim = self
            .store
            .claim(&req_window(key, fingerprint, now, window))
            .await
            .expect("claim");
        match claim {
            Claim::New { token, .. } => token,
            other => panic!("expected a new claim, got {other:?}"),
        }
    }

    /// Completes `key`'s claim `token` at `now` ms with `response` and `outbox`.
    pub async fn complete_with(
        &self,
        key: Key,
        token: Token,
        now: i64,
        response: &StoredResponse,
        outbox: &[OutboxMessage],
    ) -> Result<(), StoreError> {
        let c = Completion {
            key,
            token,
            response,
            now: at(now),
            outbox,
        };
        self.store.complete(&c).await
    }

    /// Completes `key`'s claim `token` at `now` ms with a successful `body` and no outbox.
    pub async fn complete(
        &self,
        key: Key,
        token: Token,
        now: i64,
        body: &str,
    ) -> Result<(), StoreError> {
        self.complete_with(key, token, now, &answer(body), &[])
            .await
    }

    /// What alice may see of `reference` at `tenant`; a store error fails the test.
    pub async fn status(
        &self,
        tenant: &str,
        reference: idempotency::Reference,
    ) -> Option<RecordStatus> {
        self.store
            .status(tenant, "alice", reference)
            .await
            .expect("status")
    }

    /// Up to `limit` records still to settle at `now` ms; a store error fails the test.
    pub async fn unsettled(&self, now: i64, limit: u32) -> Vec<Unsettled> {
        self.store
            .unsettled(at(now), limit)
            .await
            .expect("unsettled")
    }

    /// Settles `key`'s claim `token` with `s` at `now` ms.
    pub async fn settle(
        &self,
        key: Key,
        token: Token,
        s: &Settlement,
        now: i64,
    ) -> Result<(), StoreError> {
        self.store.settle(key, token, s, at(now)).await
    }
}
