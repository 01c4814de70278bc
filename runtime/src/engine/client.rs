//! The engine's one client of its store: every store call through the engine (calls, lease
//! expiry, the reconciler, the purger, the dispatcher) is timed into
//! `idempotency_store_seconds` by its operation, and a transition that can end a flight
//! (complete, release, mark unknown, settle) wakes the engine's repeats waiting on its key.

use std::sync::Arc;

use crate::clock::Timestamp;
use crate::key::{Key, Reference, SecretFingerprint};
use crate::metrics::timed;
use crate::record::RecordStatus;
use crate::store::{
    BoxFuture, Claim, ClaimRequest, Maintenance, OutboxEntry, OutboxStore, Receipt, RecordStore,
    SecretStore, Store, StoreError, Token, Transition, Transitioned, Unsettled, Wake,
};

use super::wait::Waiters;

/// The store as the engine calls it: metered, and waking its waiters after settlements.
pub(super) struct Client {
    pub(super) store: Arc<dyn Store>,
    pub(super) waiters: Arc<Waiters>,
}

impl RecordStore for Client {
    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        timed("claim", self.store.claim(req))
    }

    /// Timed under the transition's name ([`Transition::name`]). Wakes the key's waiters after
    /// the transitions that can end a flight, whatever the store answered (a waiter woken for
    /// nothing reads the record and waits on); not after a renewal or a takeover (the record
    /// stays in flight).
    fn transition<'a>(
        &'a self,
        key: Key,
        token: Token,
        op: Transition<'a>,
    ) -> BoxFuture<'a, Result<Transitioned, StoreError>> {
        let fut = timed(op.name(), self.store.transition(key, token, op));
        match op {
            Transition::Renew { .. } | Transition::TakeOver { .. } => fut,
            _ => Box::pin(async move {
                let out = fut.await;
                self.waiters.wake(key);
                out
            }),
        }
    }

    fn status<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>> {
        timed("status", self.store.status(tenant, subject, reference))
    }

    fn watch<'a>(
        &'a self,
        key: Key,
        reference: Reference,
        wake: Wake,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        timed("watch", self.store.watch(key, reference, wake))
    }

    /// The store's own: the engine times a transactional call's `begin`, `commit` and
    /// `rollback` itself.
    fn transactions(&self) -> Option<&dyn crate::store::TransactionalStore> {
        self.store.transactions()
    }

    fn window_clock(&self) -> crate::store::WindowClock {
        self.store.window_clock()
    }
}

impl Maintenance for Client {
    fn purge(
        &self,
        now: Timestamp,
        older_than: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<u64, StoreError>> {
        timed("purge", self.store.purge(now, older_than, limit))
    }

    fn unsettled(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Unsettled>, StoreError>> {
        timed("unsettled", self.store.unsettled(now, limit))
    }
}

impl OutboxStore for Client {
    fn fetch(
        &self,
        now: Timestamp,
        invisible_until: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<OutboxEntry>, StoreError>> {
        timed("fetch", self.store.fetch(now, invisible_until, limit))
    }

    fn ack<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        timed("ack", self.store.ack(receipt))
    }
}

impl SecretStore for Client {
    fn swap_secret(
        &self,
        expected: Option<SecretFingerprint>,
        new: SecretFingerprint,
    ) -> BoxFuture<'_, Result<Option<SecretFingerprint>, StoreError>> {
        timed("swap_secret", self.store.swap_secret(expected, new))
    }
}
