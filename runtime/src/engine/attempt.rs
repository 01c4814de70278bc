//! One attempt at a call this caller has claimed: the key, reference, token and tool it holds,
//! the body it runs, and the drop guard that tells the store the truth if the attempt is dropped
//! before its record is settled.

use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::cache::Completed;
use super::call::Call;
use super::core::Core;
use super::guard::{bounded, is_elapsed, Answer, Guard, Held, OnDrop};
use super::lease::Lease;
use crate::clock::Timestamp;
use crate::error::{Error, UnknownReason};
use crate::key::Caller;
use crate::outcome::{ErrorPolicy, Failure, Outcome};
use crate::record::StoredResponse;
use crate::store::{Fenced, OutboxMessage, StoreError};
use crate::tool::ToolSpec;

/// A claimed call. Until its record is settled, dropping it (the caller's future dropped: client
/// gone, a timeout around the call, shutdown) settles the record in the background with what is
/// known at that point: released if the body never started or ended with a retryable error,
/// completed with the answer if the body returned one that was being recorded, otherwise
/// outcome unknown.
pub(super) struct Attempt {
    lease: Duration,
    spec: ToolSpec,
    /// When the claim was made (the engine's clock then). No time this attempt records is
    /// earlier: a clock stepped back while the body ran must not shorten the window.
    claimed_at: Timestamp,
    /// This worker's own view of the claim's lease: past its end the body is not polled again.
    held_until: Lease,
    guard: Guard,
    /// Where its answer is kept once recorded, if anywhere.
    keep: Option<super::cache::Keep>,
    /// Whose call it is, to read the record's truth when someone else settled it.
    caller: Option<Caller>,
}

/// When a claim (or takeover) was made: the engine's clock then, and this process's monotonic
/// instant just before it was sent, from which the worker counts its lease ([`Lease`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Claimed {
    pub(super) at: Timestamp,
    pub(super) sent: tokio::time::Instant,
}

mod hold;
mod running;
mod stopped;

pub(super) use hold::{run, Abandoned, Finished, Hold, Stop, Unrecorded, SETTLE_GRACE};
pub(super) use running::{panic_message, Halted, Running};

impl Attempt {
    pub(super) fn new(core: &Core, spec: ToolSpec, held: Held, claimed: Claimed) -> Self {
        Attempt {
            lease: core.lease,
            spec,
            claimed_at: claimed.at,
            held_until: Lease::new(claimed.sent, core.lease),
            guard: Guard::new(core, held, spec.name),
            keep: None,
            caller: None,
        }
    }

    /// Reads the record as `caller` when it was settled elsewhere, to answer with its truth.
    pub(super) fn for_caller(mut self, caller: Caller) -> Self {
        self.caller = Some(caller);
        self
    }

    /// Keeps the answer, once recorded, in `keep`'s cache.
    pub(super) fn keeping(mut self, keep: Option<super::cache::Keep>) -> Self {
        self.keep = keep;
        self
    }

    /// The engine's clock, never earlier than the claim.
    fn now(&self) -> Timestamp {
        self.guard.core.clock.now().max(self.claimed_at)
    }

    pub(super) fn unknown<E>(
        &self,
        reason: UnknownReason,
        source: Option<StoreError>,
    ) -> Failure<E> {
        Failure::Wrapper(self.unknown_error(reason, source))
    }

    fn unknown_error(&self, reason: UnknownReason, source: Option<StoreError>) -> Error {
        Error::OutcomeUnknown {
            tool: self.spec.name.into(),
            reference: self.guard.reference,
            reason,
            source,
        }
    }

    /// Polls the body until it finishes, panics, runs past `deadline` or is stopped, while
    /// renewing the lease every third of it concurrently (a slow or hung renewal never delays the
    /// body or the deadline). The body is stopped, not polled again, once this worker's lease
    /// passes unrenewed ([`Lease`]) or a renewal finds the record settled by someone else.
    async fn drive_renewing<Fut: Future>(
        &self,
        running: &mut Running<'_, Fut>,
        deadline: Option<tokio::time::Instant>,
    ) -> Finished<Fut::Output> {
        let renewals = self.renew_until_lost();
        tokio::pin!(renewals);
        let timed_out = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(timed_out);
        let lease_ends = tokio::time::sleep_until(self.held_until.ends());
        tokio::pin!(lease_ends);
        loop {
            tokio::select! {
                biased;
                out = &mut *running => break match out {
                    Ok(v) => Finished::Done(v),
                    Err(Halted::Panicked(p)) => Finished::Panicked(panic_message(&*p)),
                    Err(Halted::LeaseEnded) => Finished::Stopped(Stop::LeaseEnded),
                },
                () = &mut timed_out => {
                    break Finished::TimedOut(self.spec.timeout.unwrap_or_default());
                }
                () = &mut lease_ends => {
                    if self.held_until.passed() {
                        break Finished::Stopped(Stop::LeaseEnded);
                    }
                    // Renewed meanwhile: wait for the new end.
                    lease_ends.as_mut().reset(self.held_until.ends());
                }
                e = &mut renewals => break Finished::Stopped(Stop::Settled(e)),
            }
        }
    }

    /// Renews the lease every third of it (a failed renewal is tried again after a tenth);
    /// returns when a renewal finds the record no longer this attempt's (fenced, settled, gone).
    /// Each renewal the store accepts extends this worker's lease from when it was sent.
    async fn renew_until_lost(&self) -> StoreError {
        let every = self.lease / 3;
        let mut pause = every;
        loop {
            tokio::time::sleep(pause).await;
            let now = self.now();
            let sent = tokio::time::Instant::now();
            let renewal =
                self.guard
                    .core
                    .store
                    .renew(self.guard.key, self.guard.token, now, self.lease);
            // A renewal unanswered after a third of the lease is abandoned (it may still land:
            // the store's lease only grows) and tried again; none is waited on past the lease.
            match bounded(Some((sent + every).min(self.held_until.ends())), renewal).await {
                Ok(()) => {
                    self.held_until.renewed(sent);
                    pause = every;
                }
                Err(
                    e @ (StoreError::Fenced { .. }
                    | StoreError::WrongState { .. }
                    | StoreError::NotFound),
                ) => {
                    tracing::warn!(tool = self.tool(), reference = %self.guard.reference, error = %e,
                        "idempotency lease renewal refused: the record was settled elsewhere");
                    return e;
                }
                Err(e) => {
                    tracing::warn!(tool = self.tool(), reference = %self.guard.reference, error = %e,
                        lease_ends_in = ?self.held_until.ends().saturating_duration_since(tokio::time::Instant::now()),
                        "idempotency lease renewal failed; retrying");
                    pause = self.lease / Lease::MARGIN;
                }
            }
        }
    }

    /// Completes the record with `response` and the call's `outbox`. The guard stays armed (to
    /// complete it in the background) until the store has answered. `Err` only when the answer
    /// could not be recorded; [`Recorded::Elsewhere`] when the record was settled by someone
    /// else first (that settlement stands).
    async fn complete(
        &mut self,
        response: StoredResponse,
        outbox: Vec<OutboxMessage>,
        settle_by: Option<tokio::time::Instant>,
    ) -> Result<Recorded, StoreError> {
        let now = self.now();
        self.guard.on_drop = OnDrop::Complete(Box::new(Answer {
            response,
            outbox,
            now,
        }));
        let OnDrop::Complete(answer) = &self.guard.on_drop else {
            unreachable!("set on the line above")
        };
        let completion = answer.completion(self.guard.key, self.guard.token);
        let sent = tokio::time::Instant::now();
        let done = bounded(settle_by, self.guard.core.store.complete(&completion)).await;
        let unsent: Vec<String> = match &done {
            Err(StoreError::Fenced { .. } | StoreError::WrongState { .. }) => {
                answer.outbox.iter().map(|m| m.topic.clone()).collect()
            }
            _ => Vec::new(),
        };
        match done {
            Ok(()) => {
                let recorded = std::mem::replace(&mut self.guard.on_drop, OnDrop::Nothing);
                if let (Some(keep), OnDrop::Complete(answer)) = (&self.keep, recorded) {
                    let (key, reference) = (self.guard.key, self.guard.reference);
                    keep.put(key, reference, answer.response, Completed { at: now, sent });
                }
                tracing::debug!(tool = self.tool(), reference = %self.guard.reference, "idempotency complete");
                Ok(Recorded::Mine)
            }
            Err(e @ (StoreError::Fenced { .. } | StoreError::WrongState { .. })) => {
                // The settlement (the reconciler's, from the processor) stands; this worker's
                // follow-on messages were not written with it. Say so, with their topics, so
                // whoever settled it can send them.
                self.guard.on_drop = OnDrop::Nothing;
                tracing::warn!(tool = self.tool(), reference = %self.guard.reference, error = %e,
                    unsent_outbox = unsent.len(), unsent_topics = ?unsent,
                    "idempotency late completion rejected: the record was settled by someone else");
                Ok(Recorded::Elsewhere(e))
            }
            Err(e) if is_elapsed(&e) => {
                // The store did not answer in time: the guard completes it in the background.
                tracing::error!(tool = self.tool(), reference = %self.guard.reference,
                    "idempotency: the store did not answer the completion in time; outcome unknown to the caller, completion retried in the background");
                Err(e)
            }
            Err(e) => {
                tracing::error!(tool = self.tool(), reference = %self.guard.reference, error = %e,
                    "idempotency completion failed after the side effect: outcome unknown");
                self.guard.on_drop = OnDrop::Undecided;
                self.mark_unknown(settle_by).await;
                Err(e)
            }
        }
    }

    /// Marks the outcome unknown. A failure is logged (the lease will pass and the reconciler
    /// will see it); a store that does not answer by `settle_by` is left to the drop guard.
    pub(super) async fn mark_unknown(&mut self, settle_by: Option<tokio::time::Instant>) {
        match bounded(
            settle_by,
            self.guard
                .core
                .store
                .mark_unknown(self.guard.key, self.guard.token),
        )
        .await
        {
            Ok(()) => self.guard.on_drop = OnDrop::Nothing,
            Err(e) if is_elapsed(&e) => {
                tracing::error!(tool = self.tool(), reference = %self.guard.reference,
                    "idempotency: the store did not answer in time to mark the outcome unknown; it is retried in the background");
            }
            Err(e) => {
                self.guard.on_drop = OnDrop::Nothing;
                tracing::error!(tool = self.tool(), reference = %self.guard.reference, error = %e,
                    "idempotency could not mark the outcome unknown; the claim stays in flight until reconciled");
            }
        }
    }

    /// Gives the claim back: nothing was done. A failed release is tried once more; if that
    /// fails too, the error says so (a repeat would be told "in flight").
    pub(super) async fn release(
        &mut self,
        settle_by: Option<tokio::time::Instant>,
    ) -> Result<(), StoreError> {
        self.guard.on_drop = OnDrop::Release;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let now = self.now();
            let released = self
                .guard
                .core
                .store
                .release(self.guard.key, self.guard.token, now);
            match bounded(settle_by, released).await {
                Ok(()) => {
                    self.guard.on_drop = OnDrop::Nothing;
                    return Ok(());
                }
                Err(
                    e @ (StoreError::Fenced { .. }
                    | StoreError::WrongState { .. }
                    | StoreError::NotFound),
                ) => {
                    // Settled elsewhere (a reconciler): that settlement stands.
                    self.guard.on_drop = OnDrop::Nothing;
                    tracing::warn!(tool = self.tool(), reference = %self.guard.reference, error = %e, "idempotency release refused: the record was settled elsewhere");
                    return Ok(());
                }
                Err(e) => {
                    tracing::error!(tool = self.tool(), reference = %self.guard.reference, error = %e, attempt, "idempotency release failed");
                    // Out of time: the drop guard keeps trying in the background.
                    if is_elapsed(&e) {
                        return Err(e);
                    }
                    if attempt == 2 {
                        self.guard.on_drop = OnDrop::Nothing;
                        return Err(e);
                    }
                }
            }
        }
    }
}

impl Hold for Attempt {
    fn reference(&self) -> crate::key::Reference {
        self.guard.reference
    }

    fn tool(&self) -> &'static str {
        self.spec.name
    }

    fn bound(&self) -> Option<Duration> {
        self.spec.timeout
    }

    fn call(&self) -> Call {
        Call::new(self.guard.reference, self.spec.name)
    }

    fn started(&self) -> &std::sync::atomic::AtomicBool {
        &self.guard.started
    }

    fn lease(&self) -> Option<&Lease> {
        Some(&self.held_until)
    }

    async fn drive<Fut: Future + Send>(
        &self,
        running: &mut Running<'_, Fut>,
        deadline: Option<tokio::time::Instant>,
    ) -> Finished<Fut::Output> {
        self.drive_renewing(running, deadline).await
    }

    async fn record(
        &mut self,
        response: StoredResponse,
        outbox: Vec<OutboxMessage>,
        settle_by: Option<tokio::time::Instant>,
    ) -> Result<(), Unrecorded> {
        match self.complete(response, outbox, settle_by).await {
            Ok(Recorded::Mine) => Ok(()),
            Ok(Recorded::Elsewhere(e)) => Err(Unrecorded::Elsewhere(e)),
            Err(e) => Err(Unrecorded::Failed(
                self.unknown_error(UnknownReason::NotRecorded, Some(e)),
            )),
        }
    }

    async fn give_back(
        &mut self,
        settle_by: Option<tokio::time::Instant>,
    ) -> Result<(), StoreError> {
        self.release(settle_by).await
    }

    async fn abandon(&mut self, why: Abandoned, settle_by: Option<tokio::time::Instant>) -> Error {
        let (tool, reference) = (self.tool(), self.guard.reference);
        why.log(tool, reference, "outcome unknown");
        self.mark_unknown(settle_by).await;
        let reason = match why {
            Abandoned::TimedOut(after) => UnknownReason::TimedOut(after),
            Abandoned::Panicked(message) => UnknownReason::Panicked(message),
            Abandoned::Handler(description) => UnknownReason::Handler(description),
            Abandoned::Unstorable { message, .. } => {
                return Error::Unstorable {
                    tool: tool.into(),
                    reference,
                    message,
                }
            }
        };
        self.unknown_error(reason, None)
    }

    async fn stopped<T: DeserializeOwned, E>(
        mut self,
        stop: Stop,
        policy: &ErrorPolicy<E>,
        settle_by: Option<tokio::time::Instant>,
    ) -> Outcome<T, Failure<E>> {
        match stop {
            Stop::LeaseEnded => self.lease_ended(policy, settle_by).await,
            Stop::Settled(e) => {
                // The record was settled (or taken over) by someone else while the body ran:
                // the body acts no more, and its caller gets the record's truth.
                self.guard.on_drop = OnDrop::Nothing;
                tracing::warn!(tool = self.tool(), reference = %self.guard.reference, error = %e,
                    "idempotency: the claim was settled elsewhere while the body ran; the body was stopped");
                self.settled_elsewhere(e, policy, settle_by).await
            }
            Stop::Outrun(e) => self.settled_elsewhere(e, policy, settle_by).await,
        }
    }
}

/// How a completion ended, when it did not fail.
pub(super) enum Recorded {
    /// This attempt's answer is the record's.
    Mine,
    /// Someone else settled the record first (its error says how): that settlement stands.
    Elsewhere(StoreError),
}
