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
//!   (plus [`SETTLE_GRACE`](crate::store::transaction::SETTLE_GRACE) for the commit), so a worker whose host is gone while its connection
//!   stays half-open holds the key no longer than that either;
//! - at the commit: committed, a repeat replays; refused, nothing stays and a repeat runs once;
//!   the answer lost, the caller is told so and a repeat finds out which it was.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::acquire::Opened;
use super::attempt::{panic_message, Abandoned, Finished, Halted, Hold, Running, Stop, Unrecorded};
use super::cache::{Completed, Keep};
use super::call::Call;
use super::lease::Lease;
use crate::clock::Timestamp;
use crate::error::{Error, UnknownReason};
use crate::key::{Key, Reference};
use crate::outcome::{ErrorPolicy, Failure, Outcome};
use crate::record::StoredResponse;
use crate::store::{CommitError, OpenTransaction, OutboxMessage, StoreError, TxOutcome};

/// A transactional call's hold: its open transaction (taken by the commit or the rollback), in
/// which its body runs for at most `bound` and its outcome is committed, or rolled back.
pub(super) struct InTx {
    tx: Option<Box<dyn OpenTransaction>>,
    tool: &'static str,
    reference: Reference,
    /// How long the body may run: the tool's timeout, else the engine's lease.
    bound: Duration,
    /// The engine's time when the transaction began (the record's claim time).
    claimed_at: Timestamp,
    /// Where its answer is kept once committed, if anywhere.
    keep: Option<Kept>,
    started: AtomicBool,
}

impl InTx {
    /// The hold of `opened`, whose committed answer is kept in `keep`'s cache.
    pub(super) fn new(opened: Opened, keep: Option<Keep>) -> Self {
        let Opened {
            tx,
            tool,
            key,
            now,
            sent,
            bound,
        } = opened;
        InTx {
            reference: tx.reference(),
            tx: Some(tx),
            tool,
            bound,
            claimed_at: now,
            keep: keep.map(|keep| Kept { keep, key, sent }),
            started: AtomicBool::new(false),
        }
    }

    fn rolled_back(&self, reason: String) -> Error {
        Error::RolledBack {
            tool: self.tool.into(),
            reference: self.reference,
            reason,
            source: None,
        }
    }

    /// Rolls the transaction back by `settle_by` (if it is still open).
    async fn roll_back(&mut self, settle_by: Option<tokio::time::Instant>) {
        if let Some(tx) = self.tx.take() {
            roll_back(tx, settle_by).await;
        }
    }
}

/// Where a transactional call keeps its answer once committed: the cache, the call's key, and
/// the instant before its transaction began.
struct Kept {
    keep: Keep,
    key: Key,
    sent: tokio::time::Instant,
}

impl Kept {
    /// Keeps `response`, committed under `reference` with the time `now`.
    fn put(&self, reference: Reference, response: StoredResponse, now: Timestamp) {
        let completed = Completed {
            at: now,
            sent: self.sent,
        };
        self.keep.put(self.key, reference, response, completed);
    }
}

impl Hold for InTx {
    fn reference(&self) -> Reference {
        self.reference
    }

    fn tool(&self) -> &'static str {
        self.tool
    }

    fn bound(&self) -> Option<Duration> {
        Some(self.bound)
    }

    fn call(&self) -> Call {
        let mut call = Call::new(self.reference, self.tool);
        call.transaction = self.tx.as_ref().map(|tx| tx.connection());
        call
    }

    fn started(&self) -> &AtomicBool {
        &self.started
    }

    /// No lease: the database's transaction holds the call, not a lease.
    fn lease(&self) -> Option<&Lease> {
        None
    }

    async fn drive<Fut: Future + Send>(
        &self,
        running: &mut Running<'_, Fut>,
        deadline: Option<tokio::time::Instant>,
    ) -> Finished<Fut::Output> {
        let timed_out = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            out = running => match out {
                Ok(v) => Finished::Done(v),
                Err(Halted::Panicked(p)) => Finished::Panicked(panic_message(&*p)),
                // Never without a lease; said as what it would be, not a panic.
                Err(Halted::LeaseEnded) => Finished::TimedOut(self.bound),
            },
            () = timed_out => Finished::TimedOut(self.bound),
        }
    }

    async fn record(
        &mut self,
        response: StoredResponse,
        outbox: Vec<OutboxMessage>,
        settle_by: Option<tokio::time::Instant>,
    ) -> Result<(), Unrecorded> {
        let (tool, reference) = (self.tool, self.reference);
        let Some(tx) = self.tx.take() else {
            return Err(Unrecorded::Failed(
                self.rolled_back("its transaction had ended before its commit".into()),
            ));
        };
        let kept = self.keep.as_ref().map(|k| (k, response.clone()));
        let outcome = TxOutcome {
            response,
            outbox,
            now: self.claimed_at,
        };
        match commit(tx, outcome, settle_by).await {
            Ok(()) => {
                if let Some((k, response)) = kept {
                    k.put(reference, response, self.claimed_at);
                }
                Ok(())
            }
            Err(e) => Err(Unrecorded::Failed(committed_failure(tool, reference, e))),
        }
    }

    async fn give_back(
        &mut self,
        settle_by: Option<tokio::time::Instant>,
    ) -> Result<(), StoreError> {
        self.roll_back(settle_by).await;
        Ok(())
    }

    async fn abandon(&mut self, why: Abandoned, settle_by: Option<tokio::time::Instant>) -> Error {
        let (tool, reference) = (self.tool, self.reference);
        // A handler's unknown outcome: its writes here are rolled back; what it did elsewhere, it
        // cannot tell.
        why.log(tool, reference, "the transaction is rolled back");
        self.roll_back(settle_by).await;
        match why {
            Abandoned::TimedOut(after) => {
                self.rolled_back(format!("it ran past its timeout ({after:?})"))
            }
            Abandoned::Panicked(message) => {
                self.rolled_back(format!("the handler failed ({message})"))
            }
            Abandoned::Unstorable { error, message } => {
                let what = if error { "error" } else { "answer" };
                self.rolled_back(format!("its {what} cannot be stored ({message})"))
            }
            Abandoned::Handler(description) => Error::OutcomeUnknown {
                tool: tool.into(),
                reference,
                reason: UnknownReason::Handler(description),
                source: None,
            },
        }
    }

    /// Never stopped: no lease, no renewal, no record settled elsewhere while the transaction
    /// holds the key. Said, if it were, as a rollback whose outcome is unknown.
    async fn stopped<T: DeserializeOwned, E>(
        mut self,
        _: Stop,
        _: &ErrorPolicy<E>,
        settle_by: Option<tokio::time::Instant>,
    ) -> Outcome<T, Failure<E>> {
        self.roll_back(settle_by).await;
        Outcome {
            result: Err(Failure::Wrapper(Error::OutcomeUnknown {
                tool: self.tool.into(),
                reference: self.reference,
                reason: UnknownReason::LeaseLost,
                source: None,
            })),
            replayed: false,
            reference: Some(self.reference),
        }
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

fn committed_failure(tool: &'static str, reference: Reference, e: CommitError) -> Error {
    match e {
        // A misuse the store found (the handler kept or ended the transaction): its words.
        CommitError::RolledBack(StoreError::Config { problem, .. }) => {
            tracing::error!(tool, %reference, problem = %problem, "idempotency: the call's transaction could not be committed");
            Error::RolledBack {
                tool: tool.into(),
                reference,
                reason: problem,
                source: None,
            }
        }
        CommitError::RolledBack(source) => {
            tracing::warn!(tool, %reference, error = %source, "idempotency: the database refused the commit; nothing was done");
            Error::RolledBack {
                tool: tool.into(),
                reference,
                reason: "the database refused its commit".into(),
                source: Some(source),
            }
        }
        CommitError::Unknown(source) => {
            tracing::error!(tool, %reference, error = %source, "idempotency: the commit's answer was lost");
            Error::OutcomeUnknown {
                tool: tool.into(),
                reference,
                reason: UnknownReason::CommitUnanswered,
                source: Some(source),
            }
        }
    }
}
