//! The engine: claim → run → record, and the honest answers in between.

use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::canonical::canonical_json;
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, UnknownReason};
use crate::key::{Caller, Fingerprint, Key, Reference};
use crate::outcome::{Disposition, ErrorPolicy, Outcome};
use crate::record::{RecordStatus, StoredResponse};
use crate::store::{Claim, ClaimRequest, Completion, OutboxMessage, Store, StoreError, Token};

/// How long a claim's lease lasts unless renewed; a running body renews it every third of this.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The store and clock every idempotent tool of a server shares. Cheap to clone.
///
/// ```
/// use idempotency::{Idempotency, MemoryStore};
/// let engine = Idempotency::new(MemoryStore::new());
/// # let _ = engine;
/// ```
#[derive(Clone)]
pub struct Idempotency {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    lease: Duration,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Idempotency {
    /// An engine over `store`, on the system clock, with the default lease (30 s).
    pub fn new(store: impl Store) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// An engine over a shared store.
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        Idempotency {
            store,
            clock: Arc::new(SystemClock),
            lease: DEFAULT_LEASE,
        }
    }

    /// Uses `clock` instead of the system clock (tests move a [`ManualClock`](crate::ManualClock)).
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Sets the claim lease (minimum 1 s). A worker that dies leaves its claim in flight until
    /// the lease passes and a reconciler settles it; a live worker renews it.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_secs(1));
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The claim lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// What the store knows of `reference`, if it belongs to the caller's tenant.
    pub async fn status(
        &self,
        caller: &Caller,
        reference: Reference,
    ) -> Result<Option<RecordStatus>, StoreError> {
        self.store.status(&caller.tenant, reference).await
    }

    /// Runs `body` at most once for `prepared`'s key: claims first, then runs, then records; a
    /// repeat gets the stored answer or the wrapper's honest error, converted into `E`.
    /// What `#[idempotent]` calls on plain functions.
    pub async fn execute<T, E, Fut>(
        &self,
        spec: &ToolSpec,
        caller: &Caller,
        prepared: Prepared,
        policy: ErrorPolicy<E>,
        body: Fut,
    ) -> Outcome<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let o = self.execute_raw(spec, caller, prepared, policy, body).await;
        Outcome {
            result: o.result.map_err(Failure::into_error),
            replayed: o.replayed,
            reference: o.reference,
        }
    }

    /// Like [`Idempotency::execute`], keeping the handler's errors and the wrapper's apart
    /// (what the MCP integration renders).
    pub async fn execute_raw<T, E, Fut>(
        &self,
        spec: &ToolSpec,
        caller: &Caller,
        prepared: Prepared,
        policy: ErrorPolicy<E>,
        body: Fut,
    ) -> Outcome<T, Failure<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let span = tracing::debug_span!("idempotent_call", tool = spec.name);
        tracing::Instrument::instrument(
            self.claim_and_run(spec, caller, prepared, policy, body),
            span,
        )
        .await
    }

    async fn claim_and_run<T, E, Fut>(
        &self,
        spec: &ToolSpec,
        caller: &Caller,
        prepared: Prepared,
        policy: ErrorPolicy<E>,
        body: Fut,
    ) -> Outcome<T, Failure<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let tool = spec.name;
        let now = self.clock.now();
        let req = ClaimRequest {
            key: prepared.key,
            tenant: &caller.tenant,
            tool,
            fingerprint: prepared.fingerprint,
            now,
            lease_expires_at: now + self.lease,
        };
        let claim = match self.store.claim(&req).await {
            Ok(c) => c,
            Err(StoreError::ReferenceTaken { reference }) => {
                tracing::error!(tool, %reference, "idempotency claim refused: the reference is held by a different key; nothing was run");
                return fail(
                    Error::ReferenceTaken {
                        tool: tool.into(),
                        reference,
                    },
                    None,
                );
            }
            Err(source) => {
                tracing::warn!(tool, error = %source, "idempotency claim failed; nothing was run");
                return fail(
                    Error::StoreUnavailable {
                        tool: tool.into(),
                        source,
                    },
                    None,
                );
            }
        };
        match claim {
            Claim::New { reference, token } => {
                tracing::debug!(tool, %reference, "idempotency claim");
                self.run(spec, prepared.key, reference, token, policy, body)
                    .await
            }
            Claim::Completed {
                reference,
                response,
                ..
            } => {
                tracing::debug!(tool, %reference, ok = response.ok, "idempotency replay");
                let result = if response.ok {
                    serde_json::from_str::<T>(&response.body)
                        .map_err(|e| e.to_string())
                        .map_err(|message| {
                            Failure::Wrapper(Error::Replay {
                                tool: tool.into(),
                                reference,
                                message,
                            })
                        })
                } else {
                    match (policy.decode)(&response.body) {
                        Ok(e) => Err(Failure::Handler(e)),
                        Err(message) => Err(Failure::Wrapper(Error::Replay {
                            tool: tool.into(),
                            reference,
                            message,
                        })),
                    }
                };
                Outcome {
                    result,
                    replayed: true,
                    reference: Some(reference),
                }
            }
            Claim::InFlight {
                reference,
                claimed_at,
                ..
            } => {
                tracing::info!(tool, %reference, "idempotency in flight");
                fail(
                    Error::InFlight {
                        tool: tool.into(),
                        reference,
                        since: claimed_at,
                    },
                    Some(reference),
                )
            }
            Claim::Unknown { reference, .. } => {
                tracing::info!(tool, %reference, "idempotency outcome unknown (repeat)");
                fail(
                    Error::OutcomeUnknown {
                        tool: tool.into(),
                        reference,
                        reason: UnknownReason::Earlier,
                    },
                    Some(reference),
                )
            }
            Claim::Mismatch { reference } => {
                tracing::info!(tool, %reference, "idempotency payload mismatch");
                fail(
                    Error::PayloadMismatch {
                        tool: tool.into(),
                        reference,
                    },
                    Some(reference),
                )
            }
        }
    }

    async fn run<T, E, Fut>(
        &self,
        spec: &ToolSpec,
        key: Key,
        reference: Reference,
        token: Token,
        policy: ErrorPolicy<E>,
        body: Fut,
    ) -> Outcome<T, Failure<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let tool = spec.name;
        let mut guard = ClaimGuard {
            store: Some(self.store.clone()),
            clock: self.clock.clone(),
            key,
            token,
            reference,
            tool,
            started: AtomicBool::new(false),
        };
        let call = Call {
            reference,
            tool,
            outbox: Arc::new(Mutex::new(Vec::new())),
        };
        let mut running = Running {
            body: Box::pin(CURRENT.scope(call.clone(), body)),
            started: &guard.started,
        };
        let finished = self.drive(spec, key, token, reference, &mut running).await;
        drop(running);
        let unknown = |reason| {
            Failure::Wrapper(Error::OutcomeUnknown {
                tool: tool.into(),
                reference,
                reason,
            })
        };
        let result = match finished {
            Finished::TimedOut(after) => {
                tracing::warn!(tool, %reference, ?after, "idempotency timeout: outcome unknown");
                self.settle_unknown(&mut guard).await;
                Err(unknown(UnknownReason::TimedOut(after)))
            }
            Finished::Panicked(payload) => {
                tracing::error!(tool, %reference, "idempotency handler panicked: outcome unknown");
                self.settle_unknown(&mut guard).await;
                resume_unwind(payload)
            }
            Finished::Done(Ok(value)) => match serde_json::to_string(&value) {
                Ok(body) => {
                    let response = StoredResponse { ok: true, body };
                    match self.record(&mut guard, spec, &response, &call).await {
                        Ok(()) => Ok(value),
                        Err(reason) => Err(unknown(reason)),
                    }
                }
                Err(e) => {
                    self.settle_unknown(&mut guard).await;
                    Err(Failure::Wrapper(Error::Unstorable {
                        tool: tool.into(),
                        reference,
                        message: e.to_string(),
                    }))
                }
            },
            Finished::Done(Err(err)) => match (policy.classify)(&err) {
                Disposition::Retryable => {
                    tracing::debug!(tool, %reference, "idempotency release (retryable error)");
                    let now = self.clock.now();
                    if let Some(store) = guard.store.take() {
                        if let Err(e) = store.release(key, token, now).await {
                            tracing::error!(tool, %reference, error = %e, "idempotency release failed; the claim stays in flight until reconciled");
                        }
                    }
                    Err(Failure::Handler(err))
                }
                Disposition::Definitive => match (policy.encode)(&err) {
                    Ok(body) => {
                        let response = StoredResponse { ok: false, body };
                        match self.record(&mut guard, spec, &response, &call).await {
                            Ok(()) => Err(Failure::Handler(err)),
                            Err(reason) => Err(unknown(reason)),
                        }
                    }
                    Err(message) => {
                        self.settle_unknown(&mut guard).await;
                        Err(Failure::Wrapper(Error::Unstorable {
                            tool: tool.into(),
                            reference,
                            message,
                        }))
                    }
                },
                Disposition::Unknown => {
                    let reason = UnknownReason::Handler((policy.describe)(&err));
                    tracing::warn!(tool, %reference, "idempotency outcome unknown (handler)");
                    self.settle_unknown(&mut guard).await;
                    Err(unknown(reason))
                }
            },
        };
        Outcome {
            result,
            replayed: false,
            reference: Some(reference),
        }
    }

    async fn drive<Fut: Future>(
        &self,
        spec: &ToolSpec,
        key: Key,
        token: Token,
        reference: Reference,
        running: &mut Running<'_, Fut>,
    ) -> Finished<Fut::Output> {
        let start = tokio::time::Instant::now();
        let deadline = spec.timeout.map(|t| start + t);
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
                    if let (Some(d), Some(t)) = (deadline, spec.timeout) {
                        if tokio::time::Instant::now() >= d {
                            return Finished::TimedOut(t);
                        }
                    }
                    next_renew = tokio::time::Instant::now() + renew_every;
                    let until = self.clock.now() + self.lease;
                    if let Err(e) = self.store.renew(key, token, until).await {
                        tracing::warn!(tool = spec.name, %reference, error = %e, "idempotency lease renewal failed");
                    }
                }
            }
        }
    }

    async fn record(
        &self,
        guard: &mut ClaimGuard,
        spec: &ToolSpec,
        response: &StoredResponse,
        call: &Call,
    ) -> Result<(), UnknownReason> {
        let now = self.clock.now();
        let outbox = call.take_outbox();
        let completion = Completion {
            key: guard.key,
            token: guard.token,
            response,
            now,
            expires_at: now + spec.window,
            outbox: &outbox,
        };
        let Some(store) = guard.store.take() else {
            return Ok(());
        };
        match store.complete(&completion).await {
            Ok(()) => {
                tracing::debug!(tool = spec.name, reference = %guard.reference, "idempotency complete");
                Ok(())
            }
            Err(e @ (StoreError::Fenced { .. } | StoreError::WrongState { .. })) => {
                // The settlement (the reconciler's, from the processor) stands; this worker's
                // follow-on messages were not written with it. Say so, with their topics, so
                // whoever settled it can send them.
                let topics: Vec<&str> = outbox.iter().map(|m| m.topic.as_str()).collect();
                tracing::warn!(tool = spec.name, reference = %guard.reference, error = %e,
                    unsent_outbox = outbox.len(), unsent_topics = ?topics,
                    "idempotency late completion rejected: the record was settled by someone else");
                Ok(())
            }
            Err(e) => {
                tracing::error!(tool = spec.name, reference = %guard.reference, error = %e,
                    "idempotency completion failed after the side effect: outcome unknown");
                if let Err(e2) = store.mark_unknown(guard.key, guard.token, now).await {
                    tracing::error!(reference = %guard.reference, error = %e2, "idempotency could not mark the outcome unknown; the lease will expire and the reconciler will see it");
                }
                Err(UnknownReason::NotRecorded(e.to_string()))
            }
        }
    }

    async fn settle_unknown(&self, guard: &mut ClaimGuard) {
        if let Some(store) = guard.store.take() {
            if let Err(e) = store
                .mark_unknown(guard.key, guard.token, self.clock.now())
                .await
            {
                tracing::error!(tool = guard.tool, reference = %guard.reference, error = %e,
                    "idempotency could not mark the outcome unknown; the claim stays in flight until reconciled");
            }
        }
    }
}

fn fail<T, E>(e: Error, reference: Option<Reference>) -> Outcome<T, Failure<E>> {
    Outcome {
        result: Err(Failure::Wrapper(e)),
        replayed: false,
        reference,
    }
}

/// An error from an idempotent call: the handler's own (run now or replayed), or the wrapper's.
#[derive(Debug)]
pub enum Failure<E> {
    /// The handler's error (a definitive one may be a replay).
    Handler(E),
    /// The wrapper's answer: in flight, outcome unknown, mismatch, store failure...
    Wrapper(Error),
}

impl<E: From<Error>> Failure<E> {
    /// Folds the wrapper's answer into the handler's error type.
    pub fn into_error(self) -> E {
        match self {
            Failure::Handler(e) => e,
            Failure::Wrapper(e) => E::from(e),
        }
    }
}

enum Finished<O> {
    Done(O),
    Panicked(Box<dyn std::any::Any + Send>),
    TimedOut(Duration),
}

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

/// Tells the truth if the call is dropped (rmcp cancels a handler by dropping its future) before
/// its record is settled: released if the body never started, otherwise outcome unknown.
struct ClaimGuard {
    store: Option<Arc<dyn Store>>,
    clock: Arc<dyn Clock>,
    key: Key,
    token: Token,
    reference: Reference,
    tool: &'static str,
    started: AtomicBool,
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else {
            return;
        };
        let started = self.started.load(Ordering::Relaxed);
        let (key, token, reference, tool) = (self.key, self.token, self.reference, self.tool);
        let now = self.clock.now();
        tracing::warn!(tool, %reference, started, "idempotency call dropped before it was recorded");
        let settle = async move {
            let r = if started {
                store.mark_unknown(key, token, now).await
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

tokio::task_local! {
    static CURRENT: Call;
}

/// The call being run, seen from inside the handler's body: its reference (pass it downstream
/// as the processor's idempotency key) and its outbox.
#[derive(Clone, Debug)]
pub struct Call {
    reference: Reference,
    tool: &'static str,
    outbox: Arc<Mutex<Vec<OutboxMessage>>>,
}

impl Call {
    /// The call running in this task, if an idempotent handler is running it.
    ///
    /// ```
    /// assert!(idempotency::Call::current().is_none()); // not inside an #[idempotent] body
    /// ```
    pub fn current() -> Option<Call> {
        CURRENT.try_with(Call::clone).ok()
    }

    /// The operation's reference.
    pub fn reference(&self) -> Reference {
        self.reference
    }

    /// The tool's name.
    pub fn tool(&self) -> &'static str {
        self.tool
    }

    /// Queues follow-on work (the receipt email) to be written in the same transaction as the
    /// completion; a dispatcher delivers it at least once, keyed by the reference. Nothing is
    /// written if the call does not complete.
    pub fn enqueue(&self, topic: impl Into<String>, payload: &impl Serialize) -> Result<(), Error> {
        let payload = canonical_json(payload)?;
        let mut q = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
        q.push(OutboxMessage {
            topic: topic.into(),
            payload,
        });
        Ok(())
    }

    fn take_outbox(&self) -> Vec<OutboxMessage> {
        std::mem::take(&mut *self.outbox.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// What the engine needs to know of a tool: its name, window and timeout. Only `#[idempotent]`
/// makes one (its constructor is hidden), so a `ToolSpec` is proof that the tool is wrapped, and
/// the one thing in this crate that reports `idempotent_hint: true`.
///
/// ```
/// # use idempotency::{idempotent, Error, Caller, Idempotency, IdempotencyContext};
/// # struct Ctx(Idempotency);
/// # impl IdempotencyContext for Ctx {
/// #     fn idempotency(&self) -> &Idempotency { &self.0 }
/// #     fn caller(&self) -> Result<Caller, Error> { Ok(Caller::new("t", "s")) }
/// # }
/// #[idempotent(window = "15m", on_error = "retryable")]
/// async fn charge_card(ctx: &Ctx, amount: u64) -> Result<u64, Error> { Ok(amount) }
///
/// assert!(charge_card::TOOL.idempotent_hint());
/// assert_eq!(charge_card::TOOL.name(), "charge_card");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolSpec {
    pub(crate) name: &'static str,
    pub(crate) window: Duration,
    pub(crate) timeout: Option<Duration>,
}

impl ToolSpec {
    #[doc(hidden)]
    pub const fn __wrapped(
        name: &'static str,
        window: Duration,
        timeout: Option<Duration>,
    ) -> Self {
        ToolSpec {
            name,
            window,
            timeout,
        }
    }

    /// The tool's name (part of the key).
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// How long a completed answer is replayed, counted from its completion.
    pub const fn window(&self) -> Duration {
        self.window
    }

    /// After how long a running call is abandoned as "outcome unknown".
    pub const fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Always `true`: the tool is wrapped, so repeating it has no additional effect.
    pub const fn idempotent_hint(&self) -> bool {
        true
    }
}

/// A call's key and (for business keys) the fingerprint of its full arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prepared {
    /// The key.
    pub key: Key,
    /// The full arguments' fingerprint, for business keys.
    pub fingerprint: Option<Fingerprint>,
}

impl Prepared {
    /// The key of a call keyed by all its arguments.
    pub fn call<A: Serialize + ?Sized>(
        caller: &Caller,
        tool: &str,
        args: &A,
    ) -> Result<Self, Error> {
        Key::for_call(caller, tool, args)
            .map(|key| Prepared {
                key,
                fingerprint: None,
            })
            .map_err(|e| e.with_tool(tool))
    }

    /// The key of a call keyed by a business key, with the full arguments' fingerprint.
    pub fn business<A: Serialize + ?Sized, B: Serialize + ?Sized>(
        caller: &Caller,
        tool: &str,
        business_key: &B,
        args: &A,
    ) -> Result<Self, Error> {
        let key =
            Key::for_business_key(caller, tool, business_key).map_err(|e| e.with_tool(tool))?;
        let fingerprint = Fingerprint::of(args).map_err(|e| e.with_tool(tool))?;
        Ok(Prepared {
            key,
            fingerprint: Some(fingerprint),
        })
    }
}

/// Where an idempotent handler finds its engine and its caller. Implement it on the context type
/// your handlers take (or on your server, for `&self` methods).
///
/// ```
/// use idempotency::{Caller, Error, Idempotency, IdempotencyContext, MemoryStore};
/// struct Ctx { engine: Idempotency, tenant: String, user: String }
/// impl IdempotencyContext for Ctx {
///     fn idempotency(&self) -> &Idempotency { &self.engine }
///     fn caller(&self) -> Result<Caller, Error> { Ok(Caller::new(&*self.tenant, &*self.user)) }
/// }
/// ```
pub trait IdempotencyContext {
    /// The engine (store and clock).
    fn idempotency(&self) -> &Idempotency;
    /// Who is calling, from the server's authentication (never from the model's arguments).
    fn caller(&self) -> Result<Caller, Error>;
}

impl<C: IdempotencyContext + ?Sized> IdempotencyContext for &C {
    fn idempotency(&self) -> &Idempotency {
        (**self).idempotency()
    }
    fn caller(&self) -> Result<Caller, Error> {
        (**self).caller()
    }
}

impl<C: IdempotencyContext + ?Sized> IdempotencyContext for Arc<C> {
    fn idempotency(&self) -> &Idempotency {
        (**self).idempotency()
    }
    fn caller(&self) -> Result<Caller, Error> {
        (**self).caller()
    }
}
