//! The run stage, one for every call: the body runs under a [`Hold`], a claim in the store (a
//! plain [`Attempt`](super::Attempt)) or an open transaction (a transactional call's
//! [`InTx`](crate::engine::transactional::InTx)), and its outcome is recorded through it. The
//! decisions (what an answer, a retryable error, a definitive one, a panic or a timeout mean)
//! are made here once; a hold says what recording, giving back and abandoning mean for it.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::running::Running;
use crate::engine::call::Call;
use crate::engine::lease::Lease;
use crate::error::Error;
use crate::key::Reference;
use crate::outcome::{Disposition, ErrorPolicy, Failure, Outcome};
use crate::record::StoredResponse;
use crate::store::{OutboxMessage, StoreError};

/// How long the store may take to settle a record after the body, beyond the body's bound: the
/// grace a transactional call's database gives its commit, for every hold alike.
pub(in crate::engine) const SETTLE_GRACE: Duration = crate::store::transaction::SETTLE_GRACE;

/// How the body ended, as its hold drove it.
pub(in crate::engine) enum Finished<O> {
    Done(O),
    Panicked(String),
    TimedOut(Duration),
    /// The body was stopped: the lease passed unrenewed, or the record was settled elsewhere.
    Stopped(Stop),
}

/// Why a body was stopped before it finished, or its answer not recorded.
pub(in crate::engine) enum Stop {
    /// This worker's lease passed without a renewal the store accepted (the store unreachable,
    /// or the process paused): the store's rounds may now settle the call, so it acts no more.
    LeaseEnded,
    /// A renewal found the record settled or taken over by someone else.
    Settled(StoreError),
    /// The answer was not recorded: someone else settled the record first (that stands).
    Outrun(StoreError),
}

/// Why a call ends without its answer recorded, though its body may have acted.
pub(in crate::engine) enum Abandoned {
    TimedOut(Duration),
    Panicked(String),
    /// What the body gave cannot be stored: its answer (`error` false) or its error.
    Unstorable {
        error: bool,
        message: String,
    },
    /// The handler said its outcome is unknown (its description).
    Handler(String),
}

impl Abandoned {
    /// Logs why the call of `tool` under `reference` was abandoned, and `then` what follows
    /// ("outcome unknown", "the transaction is rolled back").
    pub(in crate::engine) fn log(&self, tool: &str, reference: Reference, then: &str) {
        match self {
            Abandoned::TimedOut(after) => {
                tracing::warn!(tool, %reference, ?after, "idempotency timeout: {then}");
            }
            Abandoned::Panicked(message) => {
                tracing::error!(tool, %reference, panic = %message, "idempotency handler panicked: {then}");
            }
            Abandoned::Handler(_) => {
                tracing::warn!(tool, %reference, "idempotency handler said its outcome is unknown: {then}");
            }
            Abandoned::Unstorable { .. } => {}
        }
    }
}

/// What a call runs under once acquired, and what recording its outcome means there.
pub(in crate::engine) trait Hold: Send + Sized {
    fn reference(&self) -> Reference;
    fn tool(&self) -> &'static str;
    /// How long the body may run, if bounded.
    fn bound(&self) -> Option<Duration>;
    /// The call as its handler sees it (`Call::current`).
    fn call(&self) -> Call;
    /// Set at the body's first poll.
    fn started(&self) -> &AtomicBool;
    /// The worker's lease, if the body runs under one.
    fn lease(&self) -> Option<&Lease>;
    /// Polls the body until it finishes, panics, runs past `deadline` or is stopped, keeping the
    /// hold meanwhile.
    fn drive<Fut: Future + Send>(
        &self,
        running: &mut Running<'_, Fut>,
        deadline: Option<tokio::time::Instant>,
    ) -> impl Future<Output = Finished<Fut::Output>> + Send;
    /// Records `response` with the call's `outbox` by `settle_by`: `Ok` when it stands.
    fn record(
        &mut self,
        response: StoredResponse,
        outbox: Vec<OutboxMessage>,
        settle_by: Option<tokio::time::Instant>,
    ) -> impl Future<Output = Result<(), Unrecorded>> + Send;
    /// Nothing was done (a retryable error): gives the hold back; `Err` when it could not be.
    fn give_back(
        &mut self,
        settle_by: Option<tokio::time::Instant>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Ends the hold without an answer, for `why`: the wrapper's answer.
    fn abandon(
        &mut self,
        why: Abandoned,
        settle_by: Option<tokio::time::Instant>,
    ) -> impl Future<Output = Error> + Send;
    /// The answer when the body was stopped, or its answer outrun (`stop`).
    fn stopped<T: DeserializeOwned, E>(
        self,
        stop: Stop,
        policy: &ErrorPolicy<E>,
        settle_by: Option<tokio::time::Instant>,
    ) -> impl Future<Output = Outcome<T, Failure<E>>> + Send;
}

/// Why an answer was not recorded.
pub(in crate::engine) enum Unrecorded {
    /// Someone else settled the record first: that settlement stands.
    Elsewhere(StoreError),
    /// It could not be: the wrapper's answer.
    Failed(Error),
}

/// Runs `body` under `hold` and records what it returned; the answer the call gives. With a
/// bound, the answer comes within it plus [`SETTLE_GRACE`] whatever the store does: a store
/// call after the body that has not answered by then is abandoned (a claim's drop guard settles
/// the record in the background; a transaction's database ends it).
pub(in crate::engine) async fn run<H, T, E, Fut>(
    mut hold: H,
    policy: ErrorPolicy<E>,
    body: Fut,
) -> Outcome<T, Failure<E>>
where
    H: Hold,
    T: Serialize + DeserializeOwned,
    Fut: Future<Output = Result<T, E>> + Send,
{
    let began = tokio::time::Instant::now();
    let deadline = hold.bound().map(|b| began + b);
    let settle_by = deadline.map(|d| d + SETTLE_GRACE);
    let (tool, reference) = (hold.tool(), hold.reference());
    let call = hold.call();
    let outbox = call.outbox.clone();
    let finished = {
        let mut running = Running {
            body: Box::pin(call.scope(body)),
            started: hold.started(),
            lease: hold.lease(),
        };
        hold.drive(&mut running, deadline).await
    };
    // In the form of the door the call came through (`door.rs`).
    let stored = |ok: bool, body: String| StoredResponse {
        ok,
        body: policy.door.store(body),
    };
    let result = match finished {
        Finished::TimedOut(after) => Err(hold.abandon(Abandoned::TimedOut(after), settle_by).await),
        Finished::Panicked(message) => {
            Err(hold.abandon(Abandoned::Panicked(message), settle_by).await)
        }
        Finished::Stopped(stop) => return hold.stopped(stop, &policy, settle_by).await,
        Finished::Done(Ok(value)) => match serde_json::to_string(&value) {
            Ok(body) => match hold
                .record(stored(true, body), outbox.take(), settle_by)
                .await
            {
                Ok(()) => return recorded(reference, Ok(value)),
                Err(Unrecorded::Elsewhere(e)) => {
                    return hold.stopped(Stop::Outrun(e), &policy, settle_by).await
                }
                Err(Unrecorded::Failed(e)) => Err(e),
            },
            Err(e) => {
                let why = Abandoned::Unstorable {
                    error: false,
                    message: e.to_string(),
                };
                Err(hold.abandon(why, settle_by).await)
            }
        },
        Finished::Done(Err(err)) => match (policy.classify)(&err) {
            Disposition::Retryable => {
                tracing::debug!(tool, %reference, "idempotency: given back (retryable error)");
                match hold.give_back(settle_by).await {
                    Ok(()) => return recorded(reference, Err(Failure::Handler(err))),
                    Err(source) => Err(Error::NotReleased {
                        tool: tool.into(),
                        reference,
                        handler: (policy.describe)(&err),
                        source,
                    }),
                }
            }
            Disposition::Definitive => match (policy.encode)(&err) {
                Ok(body) => match hold
                    .record(stored(false, body), outbox.take(), settle_by)
                    .await
                {
                    Ok(()) => return recorded(reference, Err(Failure::Handler(err))),
                    Err(Unrecorded::Elsewhere(e)) => {
                        return hold.stopped(Stop::Outrun(e), &policy, settle_by).await
                    }
                    Err(Unrecorded::Failed(e)) => Err(e),
                },
                Err(message) => {
                    let why = Abandoned::Unstorable {
                        error: true,
                        message,
                    };
                    Err(hold.abandon(why, settle_by).await)
                }
            },
            Disposition::Unknown => {
                let why = Abandoned::Handler((policy.describe)(&err));
                Err(hold.abandon(why, settle_by).await)
            }
        },
    };
    recorded(reference, result.map_err(Failure::Wrapper))
}

/// The answer of a call that ran under `reference`.
fn recorded<T, E>(reference: Reference, result: Result<T, Failure<E>>) -> Outcome<T, Failure<E>> {
    Outcome {
        result,
        replayed: false,
        reference: Some(reference),
    }
}
