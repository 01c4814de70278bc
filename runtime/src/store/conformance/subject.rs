//! What the cases share beyond the fixtures: the assertions on a store's refusals, and
//! [`Subject`], the store under test with a helper for each operation.
//!
//! A store error where the case expects an answer fails the case: the helpers panic, naming
//! the operation (the runner adds the case's name).

use std::sync::Arc;

use super::fixtures::{answer, at, req, req_window, WINDOW};
use crate::key::{Fingerprint, Key, Reference};
use crate::store::{
    Claim, Completion, Fenced, RecordStatus, Settlement, Store, StoreError, StoredResponse, Token,
    Unsettled,
};

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
