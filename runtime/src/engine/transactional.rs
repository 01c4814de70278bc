//! Transactional calls (`#[idempotent(transactional)]`): the claim, the handler's writes and
//! the outcome in one transaction of the store's database, committed together or not at all.
//!
//! At each await, what the next caller is told:
//! - before the transaction opens (the store unreachable, hung past the timeout): nothing was
//!   done; no key is held;
//! - while the body runs: a repeat is told "in flight" (the database holds the key); if the
//!   future is dropped, the worker is killed or the body panics or times out, the database rolls
//!   everything back and the next repeat runs as a fresh call. The body is bounded by the tool's
//!   timeout, or the engine's lease when it has none; the store's transaction carries that bound
//!   (plus [`SETTLE_GRACE`] for the commit), so a worker whose host is gone while its connection
//!   stays half-open holds the key no longer than that either;
//! - at the commit: committed, a repeat replays; refused, nothing stays and a repeat runs once;
//!   the answer lost, the caller is told so and a repeat finds out which it was.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::answer::{answer_found, claim_failed, refused};
use super::attempt::{panic_message, Halted, Running};
use super::cache::{Completed, Keep};
use super::call::Call;
use super::keyed::Keyed;
use super::wait::{Look, Waited};
use super::Idempotency;
use crate::clock::Timestamp;
use crate::error::{Error, UnknownReason};
use crate::outcome::{Disposition, ErrorPolicy, Failure, Outcome};
use crate::record::StoredResponse;
use crate::store::transaction::SETTLE_GRACE;
use crate::store::{Begun, Claim, CommitError, OpenTransaction, StoreError, TxOutcome};
use crate::tool::ToolSpec;

enum Ended<O> {
    Done(O),
    Panicked(String),
    TimedOut(Duration),
}

impl Idempotency {
    /// Runs a transactional tool's call: the same answers as a claimed call, from one
    /// transaction.
    pub(super) async fn run_transactional<T, E, Fut>(
        &self,
        keyed: Keyed,
        policy: ErrorPolicy<E>,
        body: Fut,
    ) -> Outcome<T, Failure<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let spec = *keyed.spec();
        let tool = spec.name;
        let Some(store) = self.core.store.transactions() else {
            return refused(Error::Store {
                tool: tool.into(),
                source: StoreError::Config {
                    problem: format!(
                        "{tool} is transactional, but this store cannot run a call in a transaction of its \
                         database: use SqliteStore or PostgresStore"
                    ),
                    source: None,
                },
            });
        };
        let started = tokio::time::Instant::now();
        let by = spec.timeout.map(|t| started + t);
        // How long the body may run: the tool's timeout, else the engine's lease.
        let bound = spec.timeout.unwrap_or(self.core.lease);
        if let Err(out) = self.check_secret(tool, by).await {
            return out;
        }
        let (wait, wait_until) = self.wait_for(&spec, started);
        // A place among the engine's waiting repeats (at most `max_waiters`), held while this
        // one waits.
        let mut slot = None;
        // Looks that found the call still in progress after a wait: each pauses longer.
        let mut idle_reads = 0;
        loop {
            if slot.is_some() {
                // However the store answers, a waiting repeat begins again at most every few ms.
                super::wait::pace(&mut idle_reads, wait_until).await;
            }
            let now = self.core.clock.now();
            let mut req = self.request(&keyed, keyed.current, now);
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
            let claim = match begun {
                Err(e) => return claim_failed(tool, key, e),
                Ok(Begun::Open(tx)) => {
                    if !self.previous.is_empty() {
                        match self.recognise(&keyed, now, by).await {
                            Ok(None) => {}
                            Ok(Some(earlier)) => {
                                tx.rollback().await;
                                return answer_found(tool, earlier, now, &policy);
                            }
                            Err(out) => {
                                tx.rollback().await;
                                return out;
                            }
                        }
                    }
                    tracing::debug!(tool, reference = %tx.reference(), "idempotency transaction open");
                    let keep = self.keep(&keyed).map(|keep| Kept { keep, key, sent });
                    let run = TxRun {
                        spec,
                        bound,
                        claimed_at: now,
                        keep,
                    };
                    return run_in(tx, run, policy, body).await;
                }
                Ok(Begun::Answered(claim)) => claim,
            };
            // A repeat that may wait for the call in progress waits as any repeat does
            // (`wait.rs`), looking at whether its transaction is still open.
            let (Some(until), Claim::InFlight { reference, .. }) = (wait_until, &claim) else {
                return answer_found(tool, claim, now, &policy);
            };
            slot = self.waiters.keep_or_enter(slot, key, self.max_waiters);
            let Some(waiting) = &slot else {
                tracing::info!(tool, %reference, max = self.max_waiters, "idempotency: too many repeats waiting; answering in progress at once");
                return answer_found(tool, claim, now, &policy);
            };
            tracing::debug!(tool, %reference, "idempotency: waiting for the transactional call in progress");
            crate::metrics::waited(tool);
            let look = Look::Transaction {
                store,
                tenant: &keyed.prepared.caller.tenant,
            };
            let waited = waiting.wait(&self.core, look, *reference, until);
            let waited = crate::progress::reporting(*reference, started, wait, waited).await;
            let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            tracing::Span::current().record("idempotency.waited_ms", waited_ms);
            if let Waited::Over = waited {
                return answer_found(tool, claim, now, &policy);
            }
        }
    }
}

/// Where a transactional call keeps its answer once committed: the cache, the call's key, and
/// the instant before its transaction began.
struct Kept {
    keep: Keep,
    key: crate::key::Key,
    sent: tokio::time::Instant,
}

impl Kept {
    /// Keeps `response`, committed under `reference` with the time `now`.
    fn put(&self, reference: crate::key::Reference, response: StoredResponse, now: Timestamp) {
        let completed = Completed {
            at: now,
            sent: self.sent,
        };
        self.keep.put(self.key, reference, response, completed);
    }
}

/// What a transactional call runs with once its transaction is open.
struct TxRun {
    spec: ToolSpec,
    /// How long the body may run: the tool's timeout, else the engine's lease.
    bound: Duration,
    /// The engine's time when the transaction began (the record's claim time).
    claimed_at: Timestamp,
    /// Where its answer is kept once committed, if anywhere.
    keep: Option<Kept>,
}

/// Runs `body` inside the open transaction `tx`, for at most `run.bound`, and commits its
/// outcome (by `bound` + [`SETTLE_GRACE`]), or rolls back; a committed answer is kept in the
/// cache.
async fn run_in<T, E, Fut>(
    tx: Box<dyn OpenTransaction>,
    run: TxRun,
    policy: ErrorPolicy<E>,
    body: Fut,
) -> Outcome<T, Failure<E>>
where
    T: Serialize,
    Fut: Future<Output = Result<T, E>> + Send,
{
    let TxRun {
        spec,
        bound,
        claimed_at,
        keep,
    } = run;
    let tool = spec.name;
    let reference = tx.reference();
    let begun = tokio::time::Instant::now();
    let deadline = Some(begun + bound);
    let settle_by = deadline.map(|d| d + SETTLE_GRACE);
    let mut call = Call::new(reference, tool);
    call.transaction = Some(tx.connection());
    let outbox = call.outbox.clone();
    let started = AtomicBool::new(false);
    let ended = {
        let mut running = Running {
            body: Box::pin(call.scope(body)),
            started: &started,
            // No lease: the database's transaction holds the call, not a lease.
            lease: None,
        };
        let timed_out = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            out = &mut running => match out {
                Ok(v) => Ended::Done(v),
                Err(Halted::Panicked(p)) => Ended::Panicked(panic_message(&*p)),
                // Never without a lease; said as what it would be, not a panic.
                Err(Halted::LeaseEnded) => Ended::TimedOut(bound),
            },
            () = timed_out => Ended::TimedOut(bound),
        }
    };
    let messages = outbox.take();
    let rolled_back = |reason: String, source: Option<StoreError>| {
        Failure::Wrapper(Error::RolledBack {
            tool: tool.into(),
            reference,
            reason,
            source,
        })
    };
    let result = match ended {
        Ended::TimedOut(after) => {
            tracing::warn!(tool, %reference, ?after, "idempotency timeout: the transaction is rolled back");
            roll_back(tx, settle_by).await;
            Err(rolled_back(
                format!("it ran past its timeout ({after:?})"),
                None,
            ))
        }
        Ended::Panicked(message) => {
            tracing::error!(tool, %reference, panic = %message, "idempotency handler panicked: the transaction is rolled back");
            roll_back(tx, settle_by).await;
            Err(rolled_back(format!("the handler failed ({message})"), None))
        }
        Ended::Done(Ok(value)) => match serde_json::to_string(&value) {
            Ok(body) => {
                let response = StoredResponse { ok: true, body };
                let kept = keep.as_ref().map(|k| (k, response.clone()));
                let outcome = TxOutcome {
                    response,
                    outbox: messages,
                    now: claimed_at,
                };
                match commit(tx, outcome, settle_by).await {
                    Ok(()) => {
                        if let Some((k, response)) = kept {
                            k.put(reference, response, claimed_at);
                        }
                        Ok(value)
                    }
                    Err(e) => Err(committed_failure(tool, reference, e)),
                }
            }
            Err(e) => {
                roll_back(tx, settle_by).await;
                Err(rolled_back(
                    format!("its answer cannot be stored ({e})"),
                    None,
                ))
            }
        },
        Ended::Done(Err(err)) => match (policy.classify)(&err) {
            Disposition::Retryable => {
                tracing::debug!(tool, %reference, "idempotency rollback (retryable error)");
                roll_back(tx, settle_by).await;
                Err(Failure::Handler(err))
            }
            Disposition::Definitive => match (policy.encode)(&err) {
                Ok(body) => {
                    let response = StoredResponse { ok: false, body };
                    let kept = keep.as_ref().map(|k| (k, response.clone()));
                    let outcome = TxOutcome {
                        response,
                        outbox: messages,
                        now: claimed_at,
                    };
                    match commit(tx, outcome, settle_by).await {
                        Ok(()) => {
                            if let Some((k, response)) = kept {
                                k.put(reference, response, claimed_at);
                            }
                            Err(Failure::Handler(err))
                        }
                        Err(e) => Err(committed_failure(tool, reference, e)),
                    }
                }
                Err(message) => {
                    roll_back(tx, settle_by).await;
                    Err(rolled_back(
                        format!("its error cannot be stored ({message})"),
                        None,
                    ))
                }
            },
            Disposition::Unknown => {
                // Its writes here are rolled back; what it did elsewhere, it cannot tell.
                tracing::warn!(tool, %reference, "idempotency outcome unknown (handler): the transaction is rolled back");
                roll_back(tx, settle_by).await;
                Err(Failure::Wrapper(Error::OutcomeUnknown {
                    tool: tool.into(),
                    reference,
                    reason: UnknownReason::Handler((policy.describe)(&err)),
                    source: None,
                }))
            }
        },
    };
    Outcome {
        result,
        replayed: false,
        reference: Some(reference),
    }
}

/// Commits the call's record (and the handler's writes) by `settle_by`. A commit that has not
/// answered by then is abandoned: its connection is closed, and whether it committed is unknown.
async fn commit(
    tx: Box<dyn OpenTransaction>,
    outcome: TxOutcome,
    settle_by: Option<tokio::time::Instant>,
) -> Result<(), CommitError> {
    let committing = crate::metrics::timed("commit", tx.commit(outcome));
    match settle_by {
        None => committing.await,
        Some(by) => tokio::time::timeout_at(by, committing)
            .await
            .unwrap_or_else(|elapsed| {
                Err(CommitError::Unknown(StoreError::Unavailable(Box::new(
                    elapsed,
                ))))
            }),
    }
}

/// Rolls `tx` back, bounded: a rollback that does not answer by `settle_by` is abandoned (its
/// connection closed, which rolls the transaction back).
async fn roll_back(tx: Box<dyn OpenTransaction>, settle_by: Option<tokio::time::Instant>) {
    let rollback = crate::metrics::timed("rollback", tx.rollback());
    match settle_by {
        None => rollback.await,
        Some(by) => {
            let _ = tokio::time::timeout_at(by, rollback).await;
        }
    }
}

fn committed_failure<E>(
    tool: &'static str,
    reference: crate::key::Reference,
    e: CommitError,
) -> Failure<E> {
    match e {
        // A misuse the store found (the handler kept or ended the transaction): its words.
        CommitError::RolledBack(StoreError::Config { problem, .. }) => {
            tracing::error!(tool, %reference, problem = %problem, "idempotency: the call's transaction could not be committed");
            Failure::Wrapper(Error::RolledBack {
                tool: tool.into(),
                reference,
                reason: problem,
                source: None,
            })
        }
        CommitError::RolledBack(source) => {
            tracing::warn!(tool, %reference, error = %source, "idempotency: the database refused the commit; nothing was done");
            Failure::Wrapper(Error::RolledBack {
                tool: tool.into(),
                reference,
                reason: "the database refused its commit".into(),
                source: Some(source),
            })
        }
        CommitError::Unknown(source) => {
            tracing::error!(tool, %reference, error = %source, "idempotency: the commit's answer was lost");
            Failure::Wrapper(Error::OutcomeUnknown {
                tool: tool.into(),
                reference,
                reason: UnknownReason::CommitUnanswered,
                source: Some(source),
            })
        }
    }
}
