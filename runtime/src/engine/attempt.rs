//! One attempt at a call this caller has claimed: the key, reference, token and tool it holds,
//! the body it runs, and the drop guard that tells the store the truth if the attempt is dropped
//! before its record is settled.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::call::Call;
use super::guard::{bounded, is_elapsed, Answer, Guard, Held, OnDrop};
use crate::clock::Timestamp;
use crate::error::{Error, UnknownReason};
use crate::outcome::{Disposition, ErrorPolicy, Failure, Outcome};
use crate::record::StoredResponse;
use crate::store::StoreError;
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
    guard: Guard,
    /// Where its answer is kept once recorded, if anywhere.
    keep: Option<super::cache::Keep>,
}

enum Finished<O> {
    Done(O),
    Panicked(String),
    TimedOut(Duration),
}

/// How long the store may take to settle a record after the body, beyond the call's timeout.
const SETTLE_GRACE: Duration = Duration::from_secs(1);

impl Attempt {
    pub(super) fn new(
        engine: &super::Idempotency,
        spec: ToolSpec,
        held: Held,
        claimed_at: Timestamp,
    ) -> Self {
        Attempt {
            lease: engine.lease,
            spec,
            claimed_at,
            guard: Guard::new(engine, held, spec.name),
            keep: None,
        }
    }

    /// Keeps the answer, once recorded, in `keep`'s cache.
    pub(super) fn keeping(mut self, keep: Option<super::cache::Keep>) -> Self {
        self.keep = keep;
        self
    }

    /// The engine's clock, never earlier than the claim.
    fn now(&self) -> Timestamp {
        self.guard.clock.now().max(self.claimed_at)
    }

    fn tool(&self) -> &'static str {
        self.spec.name
    }

    /// Runs `body` and records what it returned; the answer this attempt gives. With a timeout,
    /// the answer comes within the timeout plus [`SETTLE_GRACE`] whatever the store does: a
    /// store call after the body that has not answered by then is abandoned (this attempt's drop
    /// guard settles the record in the background) and the answer is "outcome unknown".
    pub(super) async fn run<T, E, Fut>(
        mut self,
        policy: ErrorPolicy<E>,
        body: Fut,
    ) -> Outcome<T, Failure<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let started = tokio::time::Instant::now();
        let deadline = self.spec.timeout.map(|t| started + t);
        let settle_by = deadline.map(|d| d + SETTLE_GRACE);
        let call = Call::new(self.guard.reference, self.tool());
        let mut running = Running {
            body: Box::pin(call.clone().scope(body)),
            started: &self.guard.started,
        };
        let (finished, lost) = self.drive(&mut running, deadline).await;
        drop(running);
        let result = match finished {
            Finished::TimedOut(after) => {
                tracing::warn!(tool = self.tool(), reference = %self.guard.reference, ?after, "idempotency timeout: outcome unknown");
                self.mark_unknown(settle_by).await;
                Err(self.unknown(UnknownReason::TimedOut(after), None))
            }
            Finished::Panicked(message) => {
                tracing::error!(tool = self.tool(), reference = %self.guard.reference, panic = %message, "idempotency handler panicked: outcome unknown");
                self.mark_unknown(settle_by).await;
                Err(self.unknown(UnknownReason::Panicked(message), None))
            }
            Finished::Done(_) if lost.is_some() => {
                // The record was settled by someone else while the body ran: whatever it
                // returned cannot be recorded, and the settlement stands.
                self.guard.on_drop = OnDrop::Nothing;
                tracing::warn!(tool = self.tool(), reference = %self.guard.reference, error = ?lost,
                    "idempotency: the claim was settled elsewhere while the body ran; its result is not recorded");
                Err(self.unknown(UnknownReason::LeaseLost, lost))
            }
            Finished::Done(Ok(value)) => match serde_json::to_string(&value) {
                Ok(body) => {
                    let response = StoredResponse { ok: true, body };
                    match self.record(response, &call, settle_by).await {
                        Ok(()) => Ok(value),
                        Err(e) => Err(self.unknown(UnknownReason::NotRecorded, Some(e))),
                    }
                }
                Err(e) => {
                    self.mark_unknown(settle_by).await;
                    Err(self.unstorable(e.to_string()))
                }
            },
            Finished::Done(Err(err)) => match (policy.classify)(&err) {
                Disposition::Retryable => {
                    tracing::debug!(tool = self.tool(), reference = %self.guard.reference, "idempotency release (retryable error)");
                    match self.release(settle_by).await {
                        Ok(()) => Err(Failure::Handler(err)),
                        Err(source) => Err(Failure::Wrapper(Error::NotReleased {
                            tool: self.tool().into(),
                            reference: self.guard.reference,
                            handler: (policy.describe)(&err),
                            source,
                        })),
                    }
                }
                Disposition::Definitive => match (policy.encode)(&err) {
                    Ok(body) => {
                        let response = StoredResponse { ok: false, body };
                        match self.record(response, &call, settle_by).await {
                            Ok(()) => Err(Failure::Handler(err)),
                            Err(e) => Err(self.unknown(UnknownReason::NotRecorded, Some(e))),
                        }
                    }
                    Err(message) => {
                        self.mark_unknown(settle_by).await;
                        Err(self.unstorable(message))
                    }
                },
                Disposition::Unknown => {
                    let reason = UnknownReason::Handler((policy.describe)(&err));
                    tracing::warn!(tool = self.tool(), reference = %self.guard.reference, "idempotency outcome unknown (handler)");
                    self.mark_unknown(settle_by).await;
                    Err(self.unknown(reason, None))
                }
            },
        };
        Outcome {
            result,
            replayed: false,
            reference: Some(self.guard.reference),
        }
    }

    fn unknown<E>(&self, reason: UnknownReason, source: Option<StoreError>) -> Failure<E> {
        Failure::Wrapper(Error::OutcomeUnknown {
            tool: self.tool().into(),
            reference: self.guard.reference,
            reason,
            source,
        })
    }

    fn unstorable<E>(&self, message: String) -> Failure<E> {
        Failure::Wrapper(Error::Unstorable {
            tool: self.tool().into(),
            reference: self.guard.reference,
            message,
        })
    }

    /// Polls the body until it finishes, panics or runs past `deadline`, while renewing the
    /// lease every third of it concurrently (a slow or hung renewal never delays the body or the
    /// deadline). A renewal that finds the record settled by someone else stops the renewals:
    /// the second value says so, and the body's result will not be recorded.
    async fn drive<Fut: Future>(
        &self,
        running: &mut Running<'_, Fut>,
        deadline: Option<tokio::time::Instant>,
    ) -> (Finished<Fut::Output>, Option<StoreError>) {
        let mut lost = None;
        let finished = {
            let renewals = self.renew_until_lost();
            tokio::pin!(renewals);
            let timed_out = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(timed_out);
            loop {
                tokio::select! {
                    biased;
                    out = &mut *running => break match out {
                        Ok(v) => Finished::Done(v),
                        Err(p) => Finished::Panicked(panic_message(&*p)),
                    },
                    () = &mut timed_out => {
                        break Finished::TimedOut(self.spec.timeout.unwrap_or_default());
                    }
                    e = &mut renewals, if lost.is_none() => lost = Some(e),
                }
            }
        };
        (finished, lost)
    }

    /// Renews the lease every third of it; returns when a renewal finds the record no longer
    /// this attempt's (fenced, settled, gone). Other failures are logged and retried.
    async fn renew_until_lost(&self) -> StoreError {
        let every = self.lease / 3;
        loop {
            tokio::time::sleep(every).await;
            let now = self.now();
            let by = tokio::time::Instant::now() + every;
            match bounded(
                Some(by),
                self.guard
                    .store
                    .renew(self.guard.key, self.guard.token, now, self.lease),
            )
            .await
            {
                Ok(()) => {}
                Err(
                    e @ (StoreError::Fenced { .. }
                    | StoreError::WrongState { .. }
                    | StoreError::NotFound),
                ) => {
                    tracing::warn!(tool = self.tool(), reference = %self.guard.reference, error = %e,
                        "idempotency lease renewal refused: the record was settled elsewhere; renewals stop");
                    return e;
                }
                Err(e) => {
                    tracing::warn!(tool = self.tool(), reference = %self.guard.reference, error = %e, "idempotency lease renewal failed; retrying")
                }
            }
        }
    }

    /// Completes the record with `response` and the call's outbox. The guard stays armed (to
    /// complete it in the background) until the store has answered. `Err` only when the answer
    /// could not be recorded.
    async fn record(
        &mut self,
        response: StoredResponse,
        call: &Call,
        settle_by: Option<tokio::time::Instant>,
    ) -> Result<(), StoreError> {
        let now = self.now();
        self.guard.on_drop = OnDrop::Complete(Box::new(Answer {
            response,
            outbox: call.outbox.take(),
            now,
        }));
        let OnDrop::Complete(answer) = &self.guard.on_drop else {
            unreachable!("set on the line above")
        };
        let completion = answer.completion(self.guard.key, self.guard.token);
        let sent = tokio::time::Instant::now();
        let done = bounded(settle_by, self.guard.store.complete(&completion)).await;
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
                    let held = (self.guard.key, self.guard.reference);
                    let kept = (self.spec.name, self.spec.window);
                    keep.put(held, answer.response, (now, sent), kept);
                }
                tracing::debug!(tool = self.tool(), reference = %self.guard.reference, "idempotency complete");
                Ok(())
            }
            Err(e @ (StoreError::Fenced { .. } | StoreError::WrongState { .. })) => {
                // The settlement (the reconciler's, from the processor) stands; this worker's
                // follow-on messages were not written with it. Say so, with their topics, so
                // whoever settled it can send them.
                self.guard.on_drop = OnDrop::Nothing;
                tracing::warn!(tool = self.tool(), reference = %self.guard.reference, error = %e,
                    unsent_outbox = unsent.len(), unsent_topics = ?unsent,
                    "idempotency late completion rejected: the record was settled by someone else");
                Ok(())
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
    async fn mark_unknown(&mut self, settle_by: Option<tokio::time::Instant>) {
        match bounded(
            settle_by,
            self.guard
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
    async fn release(&mut self, settle_by: Option<tokio::time::Instant>) -> Result<(), StoreError> {
        self.guard.on_drop = OnDrop::Release;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let now = self.now();
            let released = self
                .guard
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

/// A panic's message, when it has one.
pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// The body, with panics caught and its first poll noted (a body that never started can be
/// released; one that started cannot).
pub(super) struct Running<'g, Fut> {
    pub(super) body: Pin<Box<tokio::task::futures::TaskLocalFuture<Call, Fut>>>,
    pub(super) started: &'g AtomicBool,
}

impl<Fut: Future> Future for Running<'_, Fut> {
    type Output = Result<Fut::Output, Box<dyn std::any::Any + Send>>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.started.store(true, Ordering::Relaxed);
        let body = self.body.as_mut();
        match catch_unwind(AssertUnwindSafe(|| body.poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(p) => Poll::Ready(Err(p)),
        }
    }
}
