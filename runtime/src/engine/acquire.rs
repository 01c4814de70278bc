//! The first stage of every call (plain, transactional, a task's): what it acquires. A completed
//! answer this engine keeps; a claim, new or taken over from a worker that is gone
//! (`recover = "rerun"`); its transaction, open; or instead the record that answers it, in
//! flight (which a repeat may wait for) or settled; or the wrapper's refusal.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::error::Error;
use crate::key::{Key, Reference};
use crate::outcome::{Failure, Outcome};
use crate::record::StoredResponse;
use crate::store::{Begun, Claim, OpenTransaction, StoreError};
use crate::tool::Recover;

use super::answer::{claim_failed, gone, refused, Found};
use super::attempt::Claimed;
use super::cache;
use super::claim::{TakeOver, Taken, Takeover};
use super::guard::Held;
use super::keyed::Keyed;
use super::wait::{InFlight, Look, Repeat};
use super::Idempotency;

/// What a call acquired.
pub(super) enum Acquired<'a, T, E> {
    /// A completed answer this engine keeps, replayed with no store round trip.
    Hit {
        reference: Reference,
        response: Arc<StoredResponse>,
    },
    /// The call's claim, to run under: new, or taken over from a worker that is gone.
    Claimed(Taken),
    /// The call's transaction, open, to run inside (transactional tools).
    Opened(Opened),
    /// A record that answers the call: settled, or in flight and not to be waited for.
    Found(Found),
    /// The call in flight, which this repeat may wait for.
    InFlight(InFlight<'a>),
    /// The wrapper's own answer: nothing ran.
    Refused(Outcome<T, Failure<E>>),
}

/// A transactional call's transaction, open: its tool and key, the engine's time when it began (the
/// record's claim time), the instant before it was asked for, and how long the body may run.
pub(super) struct Opened {
    pub(super) tx: Box<dyn OpenTransaction>,
    pub(super) tool: &'static str,
    pub(super) key: Key,
    pub(super) now: Timestamp,
    pub(super) sent: tokio::time::Instant,
    pub(super) bound: Duration,
}

impl Idempotency {
    /// The acquire stage, one function for every kind of call: the cache first (on a call's
    /// first try), then the claim or the transaction.
    pub(super) async fn acquire<'a, T, E>(
        &'a self,
        keyed: &'a Keyed,
        repeat: &mut Repeat,
    ) -> Acquired<'a, T, E> {
        if repeat.first_try()
            && let Some(hit) = self.cached(keyed)
        {
            return hit;
        }
        if keyed.spec().transactional {
            self.open(keyed, repeat).await
        } else {
            self.claim_or_take_over(keyed, repeat).await
        }
    }

    /// The answer this engine keeps for `keyed`'s call, if it may serve it now.
    fn cached<'a, T, E>(&self, keyed: &Keyed) -> Option<Acquired<'a, T, E>> {
        let cache = self.cache.as_ref()?;
        let tool = keyed.tool();
        match cache.get(&keyed.key(), keyed.fingerprint(), self.core.clock.now()) {
            cache::Found::Hit(reference, response) => {
                crate::metrics::cache(tool, true);
                tracing::debug!(tool, %reference, "idempotency replay from the local cache");
                Some(Acquired::Hit {
                    reference,
                    response,
                })
            }
            cache::Found::Miss => {
                crate::metrics::cache(tool, false);
                None
            }
        }
    }

    /// A plain call's claim (a waiting repeat's read once for the key's waiters), or with
    /// `recover = "rerun"` the takeover of a call whose worker is gone; a takeover that loses
    /// while the repeat may still wait claims again.
    async fn claim_or_take_over<'a, T, E>(
        &'a self,
        keyed: &'a Keyed,
        repeat: &mut Repeat,
    ) -> Acquired<'a, T, E> {
        let spec = keyed.spec();
        let by = repeat.by();
        loop {
            let now = self.core.clock.now();
            repeat.pace().await;
            let sent = tokio::time::Instant::now();
            let claim = match repeat.slot() {
                None => self.claim_any(keyed, now, by).await,
                Some(woken) => {
                    woken
                        .read_again(keyed.fingerprint(), || self.claim_any(keyed, now, by))
                        .await
                }
            };
            let claim = match claim {
                Ok(c) => c,
                Err(out) => return Acquired::Refused(out),
            };
            // A call whose worker is gone runs again under its reference when the tool says
            // its side effect deduplicates on it; a waiting repeat that loses that race waits on.
            if let (Some(gone), Recover::Rerun) = (gone(&claim, now), spec.recover) {
                repeat.leave();
                let takeover = Takeover {
                    gone,
                    now,
                    by,
                    until: repeat.until(),
                };
                match self.take_over(keyed, takeover).await {
                    TakeOver::Taken(taken) => return Acquired::Claimed(taken),
                    TakeOver::Lost => continue,
                    TakeOver::Answered(out) => return Acquired::Refused(out),
                }
            }
            return match claim {
                Claim::New { reference, token } => {
                    tracing::debug!(tool = spec.name, %reference, "idempotency claim");
                    let held = Held {
                        key: keyed.key(),
                        reference,
                        token,
                    };
                    Acquired::Claimed(Taken {
                        held,
                        claimed: Claimed { at: now, sent },
                        rerun: false,
                    })
                }
                claim => {
                    let holder = match &claim {
                        Claim::InFlight { .. } if repeat.may_wait() => {
                            self.waited_key(keyed, &claim, now)
                        }
                        _ => None,
                    };
                    let look = Look::Record(&keyed.prepared.caller);
                    self.found(Found { claim, now }, holder, look)
                }
            };
        }
    }

    /// A transactional call's transaction, opened; or the record its key holds (a call in
    /// flight holds it in a transaction of its own).
    async fn open<'a, T, E>(&'a self, keyed: &'a Keyed, repeat: &mut Repeat) -> Acquired<'a, T, E> {
        let spec = keyed.spec();
        let tool = spec.name;
        let Some(store) = self.core.store.transactions() else {
            return Acquired::Refused(refused(Error::Store {
                tool: tool.into(),
                source: StoreError::Config {
                    problem: format!(
                        "{tool} is transactional, but this store cannot run a call in a transaction of its \
                         database: use SqliteStore or PostgresStore"
                    ),
                    source: None,
                },
            }));
        };
        let by = repeat.by();
        if let Err(out) = self.check_secret(tool, by).await {
            return Acquired::Refused(out);
        }
        // How long the body may run: the tool's timeout, else the engine's lease.
        let bound = spec.timeout.unwrap_or(self.core.lease);
        // However the store answers, a waiting repeat begins again at most every few ms.
        repeat.pace().await;
        let now = self.core.clock.now();
        let mut req = self.request(keyed, keyed.current, now);
        // The transaction holds the key at most this long (its store bounds it so).
        req.lease = bound;
        let key = req.key;
        // Before the transaction begins: no time the database gives the record is earlier.
        let sent = tokio::time::Instant::now();
        let begin = crate::metrics::timed("begin", store.begin(&req));
        let begun = match by {
            None => begin.await,
            Some(by) => tokio::time::timeout_at(by, begin)
                .await
                .unwrap_or_else(|elapsed| Err(StoreError::Unavailable(Box::new(elapsed)))),
        };
        match begun {
            Err(e) => Acquired::Refused(claim_failed(tool, key, e)),
            Ok(Begun::Open(tx)) => {
                if !self.previous.is_empty() {
                    match self.recognise(keyed, now, by).await {
                        Ok(None) => {}
                        Ok(Some(earlier)) => {
                            tx.rollback().await;
                            return Acquired::Found(Found {
                                claim: earlier,
                                now,
                            });
                        }
                        Err(out) => {
                            tx.rollback().await;
                            return Acquired::Refused(out);
                        }
                    }
                }
                tracing::debug!(tool, reference = %tx.reference(), "idempotency transaction open");
                Acquired::Opened(Opened {
                    tx,
                    tool,
                    key,
                    now,
                    sent,
                    bound,
                })
            }
            Ok(Begun::Answered(claim)) => {
                let in_flight = matches!(claim, Claim::InFlight { .. }) && repeat.may_wait();
                // Waited for as any repeat is, looking at whether its transaction is still open.
                let look = Look::Transaction {
                    store,
                    tenant: &keyed.prepared.caller.tenant,
                };
                self.found(Found { claim, now }, in_flight.then_some(key), look)
            }
        }
    }

    /// `found`, as a call in flight to wait for when it has a `holder` key, else as the answer.
    fn found<'a, T, E>(
        &self,
        found: Found,
        holder: Option<Key>,
        look: Look<'a>,
    ) -> Acquired<'a, T, E> {
        match (holder, &found.claim) {
            (Some(holder), Claim::InFlight { reference, .. }) => {
                let reference = *reference;
                Acquired::InFlight(InFlight {
                    found,
                    reference,
                    holder,
                    look,
                })
            }
            _ => Acquired::Found(found),
        }
    }
}
