//! The [`MemoryStore`](super::MemoryStore)'s background and side work: purging, the
//! reconciler's listing, the outbox and the secret's fingerprint.

use super::super::{
    BoxFuture, Maintenance, OutboxEntry, OutboxStore, Receipt, SecretStore, StoreError, Token,
    Unsettled,
};
use super::MemoryStore;
use crate::clock::Timestamp;
use crate::key::{Key, SecretFingerprint};
use crate::record::RecordState;

impl Maintenance for MemoryStore {
    fn purge(
        &self,
        _now: Timestamp,
        older_than: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<u64, StoreError>> {
        let n = {
            let mut inner = self.lock();
            let doomed: Vec<Key> = inner
                .rows
                .iter()
                .filter(|(_, r)| {
                    matches!(r.state, RecordState::Completed | RecordState::Released)
                        && r.expires_at.is_some_and(|e| e < older_than)
                })
                .take(limit as usize)
                .map(|(k, _)| *k)
                .collect();
            for k in &doomed {
                inner.rows.remove(k);
            }
            doomed.len() as u64
        };
        Box::pin(async move { Ok(n) })
    }

    fn unsettled(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Unsettled>, StoreError>> {
        let out = {
            let inner = self.lock();
            let mut v: Vec<Unsettled> = inner
                .rows
                .iter()
                .filter(|(_, r)| {
                    r.state == RecordState::Unknown
                        || (r.state == RecordState::InFlight && r.lease_expires_at <= now)
                })
                .map(|(k, r)| Unsettled {
                    key: *k,
                    reference: k.reference(r.generation),
                    tenant: r.tenant.clone(),
                    subject: r.subject.clone(),
                    tool: r.tool.clone(),
                    state: r.state,
                    token: Token(r.token),
                    claimed_at: r.claimed_at,
                    window: r.window,
                })
                .collect();
            v.sort_by_key(|u| (u.claimed_at, u.key));
            v.truncate(limit as usize);
            v
        };
        Box::pin(async move { Ok(out) })
    }
}

impl OutboxStore for MemoryStore {
    fn fetch(
        &self,
        now: Timestamp,
        invisible_until: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<OutboxEntry>, StoreError>> {
        let out = {
            let mut inner = self.lock();
            let mut v = Vec::new();
            for m in inner.outbox.iter_mut() {
                if v.len() >= limit as usize {
                    break;
                }
                if m.visible_at <= now {
                    v.push(OutboxEntry {
                        receipt: Receipt::new(m.id.to_string()),
                        reference: m.reference,
                        topic: m.topic.clone(),
                        payload: m.payload.clone(),
                        attempts: m.attempts,
                    });
                    m.attempts += 1;
                    m.visible_at = invisible_until;
                }
            }
            v
        };
        Box::pin(async move { Ok(out) })
    }

    fn ack<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        let out = match receipt.as_str().parse::<i64>() {
            Ok(id) => {
                self.lock().outbox.retain(|m| m.id != id);
                Ok(())
            }
            Err(_) => Err(StoreError::ForeignReceipt {
                receipt: receipt.as_str().to_owned(),
            }),
        };
        Box::pin(async move { out })
    }
}

impl SecretStore for MemoryStore {
    fn swap_secret(
        &self,
        expected: Option<SecretFingerprint>,
        new: SecretFingerprint,
    ) -> BoxFuture<'_, Result<Option<SecretFingerprint>, StoreError>> {
        let stored = {
            let mut inner = self.lock();
            if inner.secret == expected {
                inner.secret = Some(new);
            }
            inner.secret.clone()
        };
        Box::pin(async move { Ok(stored) })
    }
}
