//! [`MemoryStore`]: records in a map behind a mutex. For tests and single-process use; it forgets
//! everything when the process exits (a repeat after a restart would run again — use SQLite for that).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

mod maintenance;

use super::transition::{dispatch, Writes};
use super::{
    BoxFuture, Claim, ClaimRequest, Completion, RecordStore, Settlement, StoreError, Token,
    Transition, Transitioned,
};
use crate::clock::Timestamp;
use crate::key::{Fingerprint, Key, Reference, SecretFingerprint};
use crate::record::{RecordState, RecordStatus, StoredResponse};

#[derive(Clone, Debug)]
struct Row {
    tenant: String,
    subject: Option<String>,
    tool: String,
    generation: u32,
    state: RecordState,
    fingerprint: Option<Fingerprint>,
    token: i64,
    claimed_at: Timestamp,
    lease_expires_at: Timestamp,
    /// The tool's replay window, from the claim: every completion and settlement uses it.
    window: Duration,
    completed_at: Option<Timestamp>,
    expires_at: Option<Timestamp>,
    response: Option<StoredResponse>,
}

#[derive(Debug)]
struct OutboxRow {
    id: i64,
    reference: Reference,
    topic: String,
    payload: String,
    attempts: i32,
    visible_at: Timestamp,
}

#[derive(Debug, Default)]
struct Inner {
    rows: BTreeMap<Key, Row>,
    outbox: VecDeque<OutboxRow>,
    next_outbox_id: i64,
    secret: Option<SecretFingerprint>,
}

/// An in-process [`Store`](super::Store).
///
/// ```
/// # tokio_test_block_on(async {
/// use idempotency::store::{Claim, ClaimRequest, MemoryStore, RecordStore, Token};
/// use idempotency::{clock::Timestamp, key::Key, Caller};
/// let store = MemoryStore::new();
/// let key = Key::for_call(&idempotency::key::Secret::demo(), &Caller::new("acme", "alice"), "charge_card", &100)?;
/// let req = ClaimRequest {
///     key, tenant: "acme", subject: None, tool: "charge_card", fingerprint: None,
///     now: Timestamp::from_millis(0), lease: std::time::Duration::from_secs(30),
///     window: std::time::Duration::from_secs(900), token: Token(1),
/// };
/// assert!(matches!(store.claim(&req).await?, Claim::New { .. }));
/// assert!(matches!(store.claim(&req).await?, Claim::InFlight { .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(()) });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f) }
/// ```
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records it holds (for tests).
    pub fn len(&self) -> usize {
        self.lock().rows.len()
    }

    /// Whether it holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a row half-written (each update is a
        // single assignment), so a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fenced<R>(
        &self,
        key: Key,
        token: Token,
        allowed: &[RecordState],
        f: impl FnOnce(&mut Row, &mut Inner2<'_>) -> R,
    ) -> Result<R, StoreError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let row = inner.rows.get_mut(&key).ok_or(StoreError::NotFound)?;
        let reference = key.reference(row.generation);
        if row.token != token.0 {
            return Err(StoreError::Fenced { reference });
        }
        if !allowed.contains(&row.state) {
            return Err(StoreError::WrongState {
                reference,
                state: row.state.as_str(),
            });
        }
        let mut rest = Inner2 {
            outbox: &mut inner.outbox,
            next_outbox_id: &mut inner.next_outbox_id,
        };
        Ok(f(row, &mut rest))
    }
}

struct Inner2<'a> {
    outbox: &'a mut VecDeque<OutboxRow>,
    next_outbox_id: &'a mut i64,
}

fn mismatch(row: &Row, fp: &Option<Fingerprint>) -> bool {
    matches!((&row.fingerprint, fp), (Some(a), Some(b)) if a != b)
}

impl RecordStore for MemoryStore {
    /// The engine's times: a record completed at `now` answers until `now + window`.
    fn window_clock(&self) -> super::WindowClock {
        super::WindowClock::Engine
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        let out = {
            let mut inner = self.lock();
            let fresh = |generation: u32, token: i64| Row {
                tenant: req.tenant.to_owned(),
                subject: req.subject.map(str::to_owned),
                tool: req.tool.to_owned(),
                generation,
                state: RecordState::InFlight,
                fingerprint: req.fingerprint,
                token,
                claimed_at: req.now,
                lease_expires_at: req.now + req.lease,
                window: req.window,
                completed_at: None,
                expires_at: None,
                response: None,
            };
            match inner.rows.get_mut(&req.key) {
                None => {
                    let (lo, hi) = req.key.reference(1).key_range();
                    let taken = inner
                        .rows
                        .range(Key::from_bytes(lo)..=Key::from_bytes(hi))
                        .next()
                        .map(|(other, row)| other.reference(row.generation));
                    if let Some(reference) = taken {
                        return Box::pin(
                            async move { Err(StoreError::ReferenceTaken { reference }) },
                        );
                    }
                    let token = req.token.0;
                    inner.rows.insert(req.key, fresh(1, token));
                    Claim::New {
                        reference: req.key.reference(1),
                        token: Token(token),
                    }
                }
                Some(row) => {
                    let reference = req.key.reference(row.generation);
                    let expired = row.state == RecordState::Completed
                        && row.expires_at.is_none_or(|e| req.now >= e);
                    if row.state == RecordState::Released || expired {
                        let generation = if expired {
                            row.generation + 1
                        } else {
                            row.generation
                        };
                        // Each claim of a record is later than the one before it, whatever
                        // the clock did: the claim time names the claim (MCP task ids).
                        let after = row.claimed_at.as_millis().saturating_add(1);
                        *row = fresh(generation, req.token.0);
                        row.claimed_at = Timestamp::from_millis(req.now.as_millis().max(after));
                        Claim::New {
                            reference: req.key.reference(generation),
                            token: Token(row.token),
                        }
                    } else if mismatch(row, &req.fingerprint) {
                        Claim::Mismatch { reference }
                    } else {
                        match row.state {
                            RecordState::InFlight => Claim::InFlight {
                                reference,
                                claimed_at: row.claimed_at,
                                lease_expires_at: row.lease_expires_at,
                            },
                            RecordState::Unknown => Claim::Unknown {
                                reference,
                                since: row.claimed_at,
                            },
                            _ => match (&row.response, row.completed_at) {
                                (Some(response), Some(completed_at)) => Claim::Completed {
                                    reference,
                                    response: response.clone(),
                                    completed_at,
                                },
                                _ => {
                                    return Box::pin(async move {
                                        Err(StoreError::corrupt(format!(
                                            "ref {reference} is completed without an answer"
                                        )))
                                    })
                                }
                            },
                        }
                    }
                }
            }
        };
        Box::pin(async move { Ok(out) })
    }

    fn transition<'a>(
        &'a self,
        key: Key,
        token: Token,
        op: Transition<'a>,
    ) -> BoxFuture<'a, Result<Transitioned, StoreError>> {
        dispatch(self, key, token, op)
    }

    fn status<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>> {
        let out = {
            let inner = self.lock();
            let (lo, hi) = reference.key_range();
            inner
                .rows
                .range(Key::from_bytes(lo)..=Key::from_bytes(hi))
                .find(|(_, r)| {
                    r.tenant == tenant
                        && r.subject.as_deref().is_none_or(|s| s == subject)
                        && r.generation >= reference.generation()
                })
                .map(|(_, r)| RecordStatus {
                    reference: reference.with_generation(r.generation),
                    tool: r.tool.clone(),
                    state: r.state,
                    claimed_at: r.claimed_at,
                    lease_expires_at: r.state.lease_shown(r.lease_expires_at, r.completed_at),
                    completed_at: r.completed_at,
                    expires_at: r.expires_at,
                    response: r.response.clone(),
                    read_at: None,
                })
        };
        Box::pin(async move { Ok(out) })
    }
}

impl Writes for MemoryStore {
    fn complete<'a>(&'a self, c: Completion<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        let out = self.fenced(c.key, c.token, super::WORKER_SETTLES, |row, rest| {
            row.state = RecordState::Completed;
            row.response = Some(c.response.clone());
            row.completed_at = Some(c.now);
            row.expires_at = Some(c.now + row.window);
            let reference = c.key.reference(row.generation);
            for m in c.outbox {
                *rest.next_outbox_id += 1;
                rest.outbox.push_back(OutboxRow {
                    id: *rest.next_outbox_id,
                    reference,
                    topic: m.topic.clone(),
                    payload: m.payload.clone(),
                    attempts: 0,
                    visible_at: c.now,
                });
            }
        });
        Box::pin(async move { out })
    }

    fn release(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let out = self.fenced(key, token, super::WORKER_SETTLES, |row, _| {
            row.state = RecordState::Released;
            row.completed_at = Some(now);
            row.expires_at = Some(now);
        });
        Box::pin(async move { out })
    }

    fn mark_unknown(&self, key: Key, token: Token) -> BoxFuture<'_, Result<(), StoreError>> {
        let out = self.fenced(key, token, &[RecordState::InFlight], |row, _| {
            row.state = RecordState::Unknown;
        });
        Box::pin(async move { out })
    }

    fn renew(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let out = self.fenced(key, token, &[RecordState::InFlight], |row, _| {
            row.lease_expires_at = now + lease;
        });
        Box::pin(async move { out })
    }

    fn take_over(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Reference, StoreError>> {
        let out = (|| {
            let mut inner = self.lock();
            let row = inner.rows.get_mut(&key).ok_or(StoreError::NotFound)?;
            let reference = key.reference(row.generation);
            let gone = match row.state {
                RecordState::InFlight => row.lease_expires_at <= now,
                RecordState::Unknown => true,
                _ => false,
            };
            if !gone {
                return Err(StoreError::WrongState {
                    reference,
                    state: row.state.as_str(),
                });
            }
            row.state = RecordState::InFlight;
            row.token = token.0;
            row.lease_expires_at = now + lease;
            Ok(reference)
        })();
        Box::pin(async move { out })
    }

    fn settle<'a>(
        &'a self,
        key: Key,
        token: Token,
        settlement: &'a Settlement,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let out = (|| {
            let mut inner = self.lock();
            let row = inner.rows.get_mut(&key).ok_or(StoreError::NotFound)?;
            let reference = key.reference(row.generation);
            if row.token != token.0 {
                return Err(StoreError::Fenced { reference });
            }
            if !matches!(row.state, RecordState::InFlight | RecordState::Unknown) {
                return Err(StoreError::WrongState {
                    reference,
                    state: row.state.as_str(),
                });
            }
            // An unknown settlement keeps the token: the worker's late answer still lands.
            if !matches!(settlement, Settlement::Unknown) {
                row.token += 1;
            }
            match settlement {
                Settlement::Completed(resp) => {
                    row.state = RecordState::Completed;
                    row.response = Some(resp.clone());
                    row.completed_at = Some(now);
                    row.expires_at = Some(now + row.window);
                }
                Settlement::Released => {
                    row.state = RecordState::Released;
                    row.completed_at = Some(now);
                    row.expires_at = Some(now);
                }
                Settlement::Unknown => row.state = RecordState::Unknown,
            }
            Ok(())
        })();
        Box::pin(async move { out })
    }
}
