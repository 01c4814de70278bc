//! One attempt at a call this caller has claimed: the key, reference, token and tool it holds,
//! the body it runs, and the drop guard that tells the store the truth if the attempt is dropped
//! before its record is settled.

use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::call::Call;
use crate::clock::Clock;
use crate::error::{Error, UnknownReason};
use crate::key::{Key, Reference};
use crate::outcome::{Disposition, ErrorPolicy, Failure, Outcome};
use crate::record::StoredResponse;
use crate::store::{Completion, Store, StoreError, Token};
use crate::tool::ToolSpec;

/// A claimed call. Until [`Attempt::settled`] is set, dropping it (the caller's future dropped:
/// client gone, a timeout around the call, shutdown) settles the record in the background:
/// released if the body never started, otherwise outcome unknown.
pub(super) struct Attempt {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    lease: Duration,
    spec: ToolSpec,
    key: Key,
    reference: Reference,
    token: Token,
    started: AtomicBool,
    settled: bool,
}

enum Finished<O> {
    Done(O),
    Panicked(Box<dyn std::any::Any + Send>),
    TimedOut(Duration),
}

impl Attempt {
    pub(super) fn new(
        engine: &super::Idempotency,
        spec: ToolSpec,
        key: Key,
        reference: Reference,
        token: Token,
    ) -> Self {
        Attempt {
            store: engine.store.clone(),
            clock: engine.clock.clone(),
            lease: engine.lease,
            spec,
            key,
            reference,
            token,
            started: AtomicBool::new(false),
            settled: false,
        }
    }

    fn tool(&self) -> &'static str {
        self.spec.name
    }

    /// Runs `body` and records what it returned; the answer this attempt gives.
    pub(super) async fn run<T, E, Fut>(
        mut self,
        policy: ErrorPolicy<E>,
        body: Fut,
    ) -> Outcome<T, Failure<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let call = Call::new(self.reference, self.tool());
        let mut running = Running {
            body: Box::pin(call.clone().scope(body)),
            started: &self.started,
        };
        let finished = self.drive(&mut running).await;
        drop(running);
        let result = match finished {
            Finished::TimedOut(after) => {
                tracing::warn!(tool = self.tool(), reference = %self.reference, ?after, "idempotency timeout: outcome unknown");
                self.mark_unknown().await;
                Err(self.unknown(UnknownReason::TimedOut(after), None))
            }
            Finished::Panicked(payload) => {
                tracing::error!(tool = self.tool(), reference = %self.reference, "idempotency handler panicked: outcome unknown");
                self.mark_unknown().await;
                resume_unwind(payload)
            }
            Finished::Done(Ok(value)) => match serde_json::to_string(&value) {
                Ok(body) => {
                    let response = StoredResponse { ok: true, body };
                    match self.record(&response, &call).await {
                        Ok(()) => Ok(value),
                        Err(e) => Err(self.unknown(UnknownReason::NotRecorded, Some(e))),
                    }
                }
                Err(e) => {
                    self.mark_unknown().await;
                    Err(self.unstorable(e.to_string()))
                }
            },
            Finished::Done(Err(err)) => match (policy.classify)(&err) {
                Disposition::Retryable => {
                    tracing::debug!(tool = self.tool(), reference = %self.reference, "idempotency release (retryable error)");
                    self.release().await;
                    Err(Failure::Handler(err))
                }
                Disposition::Definitive => match (policy.encode)(&err) {
                    Ok(body) => {
                        let response = StoredResponse { ok: false, body };
                        match self.record(&response, &call).await {
                            Ok(()) => Err(Failure::Handler(err)),
                            Err(e) => Err(self.unknown(UnknownReason::NotRecorded, Some(e))),
                        }
                    }
                    Err(message) => {
                        self.mark_unknown().await;
                        Err(self.unstorable(message))
                    }
                },
                Disposition::Unknown => {
                    let reason = UnknownReason::Handler((policy.describe)(&err));
                    tracing::warn!(tool = self.tool(), reference = %self.reference, "idempotency outcome unknown (handler)");
                    self.mark_unknown().await;
                    Err(self.unknown(reason, None))
                }
            },
        };
        Outcome {
            result,
            replayed: false,
            reference: Some(self.reference),
        }
    }

    fn unknown<E>(&self, reason: UnknownReason, source: Option<StoreError>) -> Failure<E> {
        Failure::Wrapper(Error::OutcomeUnknown {
            tool: self.tool().into(),
            reference: self.reference,
            reason,
            source,
        })
    }

    fn unstorable<E>(&self, message: String) -> Failure<E> {
        Failure::Wrapper(Error::Unstorable {
            tool: self.tool().into(),
            reference: self.reference,
            message,
        })
    }

    /// Polls the body until it finishes, panics or runs out of time, renewing the lease every
    /// third of it.
    async fn drive<Fut: Future>(&self, running: &mut Running<'_, Fut>) -> Finished<Fut::Output> {
        let start = tokio::time::Instant::now();
        let deadline = self.spec.timeout.map(|t| start + t);
        let renew_every = self.lease / 3;
        let mut next_renew = start + renew_every;
        loop {
            let wake = deadline.map_or(next_renew, |d| d.min(next_renew));
            tokio::select! {
                biased;
                out = &mut *running => return match out {
                    Ok(v) => Finished::Done(v),
                    Err(p) => Finished::Panicked(p),
                },
                _ = tokio::time::sleep_until(wake) => {
                    if let (Some(d), Some(t)) = (deadline, self.spec.timeout) {
                        if tokio::time::Instant::now() >= d {
                            return Finished::TimedOut(t);
                        }
                    }
                    next_renew = tokio::time::Instant::now() + renew_every;
                    let until = self.clock.now() + self.lease;
                    if let Err(e) = self.store.renew(self.key, self.token, until).await {
                        tracing::warn!(tool = self.tool(), reference = %self.reference, error = %e, "idempotency lease renewal failed");
                    }
                }
            }
        }
    }

    /// Completes the record with `response` and the call's outbox. The guard stays armed until
    /// the store has answered. `Err` only when the answer could not be recorded.
    async fn record(&mut self, response: &StoredResponse, call: &Call) -> Result<(), StoreError> {
        let now = self.clock.now();
        let outbox = call.outbox.take();
        let completion = Completion {
            key: self.key,
            token: self.token,
            response,
            now,
            expires_at: now + self.spec.window,
            outbox: &outbox,
        };
        let done = self.store.complete(&completion).await;
        match done {
            Ok(()) => {
                self.settled = true;
                tracing::debug!(tool = self.tool(), reference = %self.reference, "idempotency complete");
                Ok(())
            }
            Err(e @ (StoreError::Fenced { .. } | StoreError::WrongState { .. })) => {
                // The settlement (the reconciler's, from the processor) stands; this worker's
                // follow-on messages were not written with it. Say so, with their topics, so
                // whoever settled it can send them.
                self.settled = true;
                let topics: Vec<&str> = outbox.iter().map(|m| m.topic.as_str()).collect();
                tracing::warn!(tool = self.tool(), reference = %self.reference, error = %e,
                    unsent_outbox = outbox.len(), unsent_topics = ?topics,
                    "idempotency late completion rejected: the record was settled by someone else");
                Ok(())
            }
            Err(e) => {
                tracing::error!(tool = self.tool(), reference = %self.reference, error = %e,
                    "idempotency completion failed after the side effect: outcome unknown");
                self.mark_unknown().await;
                Err(e)
            }
        }
    }

    /// Marks the outcome unknown; a failure is logged (the lease will expire and the reconciler
    /// will see it).
    async fn mark_unknown(&mut self) {
        match self.store.mark_unknown(self.key, self.token).await {
            Ok(()) => {}
            Err(e) => {
                tracing::error!(tool = self.tool(), reference = %self.reference, error = %e,
                    "idempotency could not mark the outcome unknown; the claim stays in flight until reconciled");
            }
        }
        self.settled = true;
    }

    /// Gives the claim back: nothing was done.
    async fn release(&mut self) {
        let now = self.clock.now();
        if let Err(e) = self.store.release(self.key, self.token, now).await {
            tracing::error!(tool = self.tool(), reference = %self.reference, error = %e,
                "idempotency release failed; the claim stays in flight until reconciled");
        }
        self.settled = true;
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let started = self.started.load(Ordering::Relaxed);
        let (store, key, token, reference, tool) = (
            self.store.clone(),
            self.key,
            self.token,
            self.reference,
            self.tool(),
        );
        let now = self.clock.now();
        tracing::warn!(tool, %reference, started, "idempotency call dropped before it was recorded");
        let settle = async move {
            let r = if started {
                store.mark_unknown(key, token).await
            } else {
                store.release(key, token, now).await
            };
            if let Err(e) = r {
                tracing::error!(tool, %reference, error = %e, "idempotency could not settle a dropped call; the reconciler will see its lease expire");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(settle);
            }
            Err(_) => {
                tracing::error!(tool, %reference, "idempotency call dropped outside a Tokio runtime; the reconciler will see its lease expire")
            }
        }
    }
}

/// The body, with panics caught and its first poll noted (a body that never started can be
/// released; one that started cannot).
struct Running<'g, Fut> {
    body: Pin<Box<tokio::task::futures::TaskLocalFuture<Call, Fut>>>,
    started: &'g AtomicBool,
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
