//! The engine: claim → run → record, and the honest answers in between.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, UnknownReason};
use crate::key::Scope;
use crate::key::{Caller, Reference, Secret};
use crate::outcome::{ErrorPolicy, Failure, Outcome};
use crate::record::{RecordState, RecordStatus, Standing};
use crate::store::{Claim, ClaimRequest, Store, StoreError, Token};
use crate::tool::{Prepared, Recover};

mod attempt;
mod call;
mod enqueue;
pub(crate) mod expiry;
mod guard;
mod secret;
mod wait;

use attempt::Attempt;
use expiry::{Background, Reconcile};
use guard::{bounded, Guard, Held};
use secret::SecretCheck;
use wait::{Waited, Waiters, Waking};

pub use call::Call;
pub use enqueue::EnqueueError;

/// The store and clock every idempotent tool of a server shares. Cheap to clone.
///
/// ```
/// use idempotency::{store::MemoryStore, Idempotency};
/// let engine = Idempotency::new(MemoryStore::new());
/// # let _ = engine;
/// ```
#[derive(Clone)]
pub struct Idempotency {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    lease: Duration,
    secret: Secret,
    /// Secrets being rotated out: keys made under them are still recognised.
    previous: Arc<[Secret]>,
    /// Lease-expiry handling, started at the first call; `None` when turned off.
    background: Option<Arc<Background>>,
    /// Whether the store's records are keyed with this engine's secret (checked once).
    secret_check: Arc<SecretCheck>,
    /// How long a repeat waits for a call in progress when its tool does not say.
    wait: Duration,
    /// At most this many repeats wait at once; the next is told "in progress" at once.
    max_waiters: usize,
    /// The repeats waiting now, woken when this engine settles their record.
    waiters: Arc<Waiters>,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// Builds an [`Idempotency`]: the store, and optionally the clock and the lease.
///
/// ```
/// use std::time::Duration;
/// use idempotency::{store::MemoryStore, Idempotency};
/// let engine = Idempotency::builder(MemoryStore::new())
///     .lease(Duration::from_secs(60))
///     .build();
/// assert_eq!(engine.lease(), Duration::from_secs(60));
/// ```
#[must_use = "call .build() to get the engine"]
pub struct IdempotencyBuilder {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    lease: Duration,
    expiry: Expiry,
    secret: Option<Secret>,
    previous: Vec<Secret>,
    wait: Duration,
    max_waiters: usize,
    waiters: Arc<Waiters>,
}

/// What the engine does about claims whose lease passed.
enum Expiry {
    /// Nothing: another process reconciles (or a test drives it by hand).
    Off,
    /// Rounds every `every` (default: the lease), settling through `reconcile` (default: unknown).
    On {
        reconcile: Option<Arc<dyn Reconcile>>,
        every: Option<Duration>,
    },
}

impl std::fmt::Debug for IdempotencyBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyBuilder")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl IdempotencyBuilder {
    /// Uses `clock` instead of the system clock (tests move a `ManualClock`, feature
    /// `test-util`).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The server secret keys, references and fingerprints are derived with (HMAC-SHA256). Every
    /// replica sharing the store must use the same one. Without it the engine uses the published
    /// [`Secret::demo`] and logs a warning: anyone could then confirm a guess about a call's
    /// arguments from its reference.
    pub fn secret(mut self, secret: Secret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// Secrets being rotated out. Changing the secret changes every key; while the previous
    /// secret is listed here, a fresh call (no record under the current secret's key) first
    /// looks for a record under each previous secret's key and, if one is live, answers from it
    /// (replay, in progress, unknown, mismatch) instead of running again. Keep a secret listed
    /// for the longest window plus the retention after the last replica stopped using it; it
    /// costs a fresh call one claim and one release per previous secret.
    pub fn previous_secrets(mut self, secrets: impl IntoIterator<Item = Secret>) -> Self {
        self.previous = secrets.into_iter().collect();
        self
    }

    /// Sets the claim lease (minimum 1 s; default [`Idempotency::DEFAULT_LEASE`], 30 s). A worker that dies
    /// leaves its claim in flight until the lease passes and a reconciler settles it; a live
    /// worker renews it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_secs(1));
        self
    }

    /// How long a repeat that finds its call in progress (claimed, lease live) waits for that
    /// call's answer before it is told "in progress" (default zero: told at once). A tool's own
    /// `wait` wins; a tool's `timeout` bounds it too. A waiting repeat holds no claim and no
    /// store connection: it is woken at once when this engine settles the call, and reads the
    /// record's status every 50 ms to 500 ms (doubling, jittered) to see a settlement by another
    /// replica; the first of this engine's waiters on a call to see it wakes the others.
    /// It then answers as a repeat would: the first call's answer (replayed), or, if the first
    /// call gave its claim back, it claims and runs the body (one waiter wins; the others wait
    /// on). Waiting copies a slow processor's latency into every retry, and under load holds
    /// requests open: the immediate "in progress" stays the default.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// At most `max` repeats wait at once in this engine (default
    /// [`Idempotency::DEFAULT_MAX_WAITERS`], 1,000); beyond that a repeat is told "in
    /// progress" at once.
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.max_waiters = max;
        self
    }

    /// Settles claims whose lease passed (a worker that crashed, was cut off, or could not
    /// record) through `reconcile`, which asks your processor by reference; an answer it settles
    /// is replayed for its tool's window (the one the claim recorded). Without this, such a
    /// claim becomes "outcome unknown" (its worker has not reported), which is true, and stays
    /// so until someone reconciles it.
    pub fn reconcile(mut self, reconcile: impl Reconcile) -> Self {
        let every = match &self.expiry {
            Expiry::On { every, .. } => *every,
            Expiry::Off => None,
        };
        self.expiry = Expiry::On {
            reconcile: Some(Arc::new(reconcile)),
            every,
        };
        self
    }

    /// How often the lease-expiry rounds run (default: every lease). A claim whose worker is gone
    /// is settled within its lease plus this.
    pub fn reconcile_every(mut self, every: Duration) -> Self {
        if let Expiry::On { every: e, .. } = &mut self.expiry {
            *e = Some(every);
        }
        self
    }

    /// No lease-expiry handling in this engine: for a server whose claims another process
    /// reconciles ([`tasks::Reconciler`](crate::tasks::Reconciler)), or a test that drives it by
    /// hand. A crashed call then stays "in progress" until something settles it.
    pub fn without_reconciler(mut self) -> Self {
        self.expiry = Expiry::Off;
        self
    }

    /// The engine, after checking that the store's records are keyed with its secret: what a
    /// server calls at start-up, so that a replica configured with another secret stops there
    /// instead of running every call a second time.
    ///
    /// The store keeps the fingerprint of one secret ([`Secret::fingerprint`], an HMAC of a
    /// fixed label; never the secret). On a store that keeps none yet, this engine's is stored.
    /// An engine whose secret is the stored one starts. One that lists the stored one in
    /// [`previous_secrets`](IdempotencyBuilder::previous_secrets) starts and stores its own
    /// (a rotation): from then on an engine with only the old secret is refused. Any other
    /// engine is refused with [`StoreError::SecretMismatch`], which names both fingerprints.
    ///
    /// Rotating from `old` to `new`: deploy every replica with
    /// `.secret(old).previous_secrets([new])` (nothing changes in the store, and these replicas
    /// already recognise the keys of the next step), then with `.secret(new).previous_secrets([old])`
    /// (the first such replica to start moves the store to `new`); drop `old` from the list after
    /// the longest window plus the retention. A replica already running is not checked again:
    /// the check is made at start.
    ///
    /// An engine from [`build`](IdempotencyBuilder::build) makes the same check at its first
    /// call and refuses calls (nothing runs) while it fails. Errors: the store's, as
    /// [`StoreError`] (unreachable: try again; `SecretMismatch`: fix the configuration).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use idempotency::{key::Secret, store::{MemoryStore, Store, StoreError}, Idempotency};
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let (old, new) = (Secret::new("the secret of 2025, 32 bytes..")?, Secret::new("the secret of 2026, 32 bytes..")?);
    /// Idempotency::builder_shared(store.clone()).secret(old.clone()).start().await?;
    /// // Another secret on the same store is refused...
    /// let other = Idempotency::builder_shared(store.clone()).secret(new.clone()).start().await;
    /// assert!(matches!(other, Err(StoreError::SecretMismatch { .. })));
    /// // ...unless it lists the store's as previous: a rotation, after which `old` alone is refused.
    /// Idempotency::builder_shared(store.clone()).secret(new).previous_secrets([old.clone()]).start().await?;
    /// assert!(Idempotency::builder_shared(store).secret(old).start().await.is_err());
    /// # Ok(()) }
    /// ```
    pub async fn start(self) -> Result<Idempotency, StoreError> {
        let engine = self.build();
        engine.secret_check.ensure(&*engine.store).await?;
        Ok(engine)
    }

    /// The engine, unchecked until its first call (see [`start`](IdempotencyBuilder::start)).
    /// Its lease-expiry rounds start with its first call (inside the runtime that serves it) and
    /// stop when the last clone of the engine is dropped.
    pub fn build(self) -> Idempotency {
        let background = match self.expiry {
            Expiry::Off => None,
            Expiry::On { reconcile, every } => Some(Arc::new(Background::new(
                self.store.clone(),
                self.clock.clone(),
                reconcile,
                every.unwrap_or(self.lease),
            ))),
        };
        let secret = self.secret.unwrap_or_else(|| {
            tracing::warn!(
                "idempotency: no secret configured (IdempotencyBuilder::secret); using the published \
                 demo secret, so anyone who sees a reference can check a guess about its arguments"
            );
            Secret::demo()
        });
        let secret_check = Arc::new(SecretCheck::new(&secret, &self.previous));
        Idempotency {
            store: self.store,
            clock: self.clock,
            lease: self.lease,
            secret,
            previous: self.previous.into(),
            background,
            secret_check,
            wait: self.wait,
            max_waiters: self.max_waiters,
            waiters: self.waiters,
        }
    }
}

impl Idempotency {
    /// How long a claim's lease lasts unless renewed (30 s); a running body renews it every
    /// third of its lease.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

    /// How many repeats may wait at once in one engine unless
    /// [`IdempotencyBuilder::max_waiters`] says otherwise: 1,000. A waiter costs a parked task
    /// and a request held open; at the slowest poll (500 ms) 1,000 of them read the store about
    /// 2,000 times a second, which one PostgreSQL or Redis absorbs. Past that, a processor that
    /// slow is better answered "in progress" than queued behind.
    pub const DEFAULT_MAX_WAITERS: usize = 1_000;

    /// An engine over `store`, on the system clock, with the default lease (30 s) and the default
    /// lease-expiry handling (a claim whose lease passed becomes "outcome unknown").
    pub fn new(store: impl Store) -> Self {
        Self::builder(store).build()
    }

    /// A builder over `store`.
    pub fn builder(store: impl Store) -> IdempotencyBuilder {
        Self::builder_shared(Arc::new(store))
    }

    /// A builder over a store shared with something else (another engine, an admin task).
    pub fn builder_shared(store: Arc<dyn Store>) -> IdempotencyBuilder {
        let waiters = Arc::new(Waiters::default());
        IdempotencyBuilder {
            store: Arc::new(Waking {
                store: Arc::new(crate::metrics::Metered(store)),
                waiters: waiters.clone(),
            }),
            clock: Arc::new(SystemClock),
            lease: Self::DEFAULT_LEASE,
            expiry: Expiry::On {
                reconcile: None,
                every: None,
            },
            secret: None,
            previous: Vec::new(),
            wait: Duration::ZERO,
            max_waiters: Self::DEFAULT_MAX_WAITERS,
            waiters,
        }
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

    /// What the store knows of `reference`, if the caller may see it: its tenant's record, and
    /// for a subject-scoped record, its subject's.
    pub async fn status(
        &self,
        caller: &Caller,
        reference: Reference,
    ) -> Result<Option<RecordStatus>, StoreError> {
        self.store
            .status(&caller.tenant, &caller.subject, reference)
            .await
    }

    /// Runs `body` at most once for `prepared`'s key: claims first, then runs, then records; a
    /// repeat gets the stored answer or the wrapper's honest error, converted into `E`.
    /// What `#[idempotent]` does on plain functions.
    pub async fn execute<T, E, Fut>(
        &self,
        prepared: Prepared,
        policy: ErrorPolicy<E>,
        body: Fut,
    ) -> Outcome<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let o = self.execute_raw(prepared, policy, body).await;
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
        prepared: Prepared,
        policy: ErrorPolicy<E>,
        body: Fut,
    ) -> Outcome<T, Failure<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let spec = prepared.spec;
        if let Some(b) = &self.background {
            b.ensure_started();
            if spec.recover == Recover::Reconcile && b.first_without_reconcile(spec.name) {
                // Said, not silently ignored: nothing here will settle this tool's lost calls.
                tracing::warn!(
                    tool = spec.name,
                    "idempotency: the tool says recover = \"reconcile\", but this engine has no Reconcile \
                     (IdempotencyBuilder::reconcile): its lost calls stay \"outcome unknown\" until settled \
                     by hand (idempotency-admin settle) or by a tasks::Reconciler elsewhere"
                );
            }
        }
        let span = tracing::debug_span!("idempotent_call", tool = spec.name);
        let out =
            tracing::Instrument::instrument(self.claim_and_run(prepared, policy, body), span).await;
        crate::metrics::call(spec.name, &out);
        out
    }

    async fn claim_and_run<T, E, Fut>(
        &self,
        prepared: Prepared,
        policy: ErrorPolicy<E>,
        body: Fut,
    ) -> Outcome<T, Failure<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let (spec, caller) = (&prepared.spec, &prepared.caller);
        let tool = spec.name;
        let started = tokio::time::Instant::now();
        // With a timeout, a store that does not answer the claim within it cannot hold the
        // caller: nothing ran, and the claim it may have made is released.
        let by = spec.timeout.map(|t| started + t);
        let key = prepared.key.key(&self.secret);
        // A repeat that finds the call in progress may wait for it: up to the wait, and the
        // timeout. It claims again only once the record may have moved on.
        let wait = spec.wait.unwrap_or(self.wait);
        let wait = spec.timeout.map_or(wait, |t| wait.min(t));
        let wait_until = (!wait.is_zero()).then(|| started + wait);
        let mut slot: Option<wait::Slot> = None;
        let (claim, now) = loop {
            let now = self.clock.now();
            let claim = match &slot {
                None => self.claim_any(&prepared, key, now, by).await,
                Some(woken) => {
                    woken
                        .read_again(
                            prepared
                                .fingerprint
                                .as_ref()
                                .map(|f| f.fingerprint(&self.secret)),
                            || self.claim_any(&prepared, key, now, by),
                        )
                        .await
                }
            };
            let claim = match claim {
                Ok(c) => c,
                Err(out) => return out,
            };
            let (Some(until), Claim::InFlight { reference, .. }) = (wait_until, &claim) else {
                break (claim, now);
            };
            // Not waited on: a call whose lease passed (its worker is gone), and, while secrets
            // are rotated, a call under a previous secret's key (this key's own claims, made and
            // given back at each look, would wake its waiters for nothing).
            if gone(&claim, now).is_some() || key.reference(reference.generation()) != *reference {
                break (claim, now);
            }
            if slot.is_none() {
                slot = self.waiters.enter(key, self.max_waiters);
            }
            let Some(waiting) = &slot else {
                tracing::info!(tool, %reference, max = self.max_waiters, "idempotency: too many repeats waiting; answering in progress at once");
                break (claim, now);
            };
            tracing::debug!(tool, %reference, "idempotency: waiting for the call in progress");
            let waited = crate::progress::reporting(
                *reference,
                started,
                wait,
                waiting.wait(self, caller, *reference, until),
            )
            .await;
            if let Waited::Over = waited {
                break (claim, now);
            }
        };
        drop(slot);
        // A call whose worker is gone (its lease passed unrenewed, or its outcome was lost) runs
        // again under the same reference when the tool says its side effect deduplicates on it.
        let gone = gone(&claim, now);
        if let (Some(gone), Recover::Rerun) = (gone, spec.recover) {
            return self
                .rerun(&prepared, key, (gone, now, by), (policy, body))
                .await;
        }
        match claim {
            Claim::New { reference, token } => {
                tracing::debug!(tool, %reference, "idempotency claim");
                Attempt::new(
                    self,
                    *spec,
                    Held {
                        key,
                        reference,
                        token,
                    },
                    now,
                )
                .run(policy, body)
                .await
            }
            Claim::Completed {
                reference,
                response,
                ..
            } => {
                tracing::debug!(tool, %reference, ok = response.ok, "idempotency replay");
                let unreadable = |message: String| {
                    Failure::Wrapper(Error::Replay {
                        tool: tool.into(),
                        reference,
                        message,
                    })
                };
                let result = if response.ok {
                    serde_json::from_str::<T>(&response.body).map_err(|e| unreadable(e.to_string()))
                } else {
                    match (policy.decode)(&response.body) {
                        Ok(e) => Err(Failure::Handler(e)),
                        Err(message) => Err(unreadable(message)),
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
                lease_expires_at,
            } => match gone {
                // Nobody has renewed the claim since its lease ended: its worker is gone or
                // could not record its outcome. Not "in progress" as if someone were working.
                Some(_) => {
                    tracing::info!(tool, %reference, %lease_expires_at, "idempotency in flight with its lease passed: outcome unknown");
                    answered(Error::OutcomeUnknown {
                        tool: tool.into(),
                        reference,
                        reason: UnknownReason::Unreported {
                            lease_ended: lease_expires_at,
                        },
                        source: None,
                    })
                }
                None => {
                    tracing::info!(tool, %reference, "idempotency in flight");
                    answered(Error::InFlight {
                        tool: tool.into(),
                        reference,
                        since: claimed_at,
                    })
                }
            },
            Claim::Unknown { reference, .. } => {
                tracing::info!(tool, %reference, "idempotency outcome unknown (repeat)");
                answered(Error::OutcomeUnknown {
                    tool: tool.into(),
                    reference,
                    reason: UnknownReason::Earlier,
                    source: None,
                })
            }
            Claim::Mismatch { reference } => {
                tracing::info!(tool, %reference, "idempotency payload mismatch");
                answered(Error::PayloadMismatch {
                    tool: tool.into(),
                    reference,
                })
            }
        }
    }
}

impl Idempotency {
    /// Claims the call's key under the current secret and, while secrets are rotated, answers
    /// from a live record under a previous one; an error is the caller's answer (nothing ran).
    async fn claim_any<T, E>(
        &self,
        prepared: &Prepared,
        key: crate::key::Key,
        now: crate::clock::Timestamp,
        by: Option<tokio::time::Instant>,
    ) -> Result<Claim, Outcome<T, Failure<E>>> {
        let spec = &prepared.spec;
        let claim = self.claim(prepared, &self.secret, now, by).await?;
        Ok(match claim {
            Claim::New { reference, token } if !self.previous.is_empty() => {
                // Held by a guard while the previous secrets' keys are probed: if this future is
                // dropped, or the probe answers for the call, the claim (nothing ran under it)
                // is given back in the background.
                let held = Guard::claiming(self, key, token, spec.name);
                match self.recognise(prepared, now, by).await {
                    Ok(None) => {
                        held.disarm();
                        Claim::New { reference, token }
                    }
                    // Answered from the record under a previous secret: give this claim back
                    // now (the guard retries in the background if that fails).
                    Ok(Some(earlier)) => {
                        match bounded(by, self.store.release(key, token, now)).await {
                            Ok(()) => held.disarm(),
                            Err(e) => {
                                tracing::warn!(tool = spec.name, %reference, error = %e, "idempotency: could not release a claim answered from a previous secret's record; retrying in the background");
                            }
                        }
                        earlier
                    }
                    Err(out) => return Err(out),
                }
            }
            claim => claim,
        })
    }

    /// Claims the call's key under `secret`; an error is the caller's answer (nothing ran).
    async fn claim<T, E>(
        &self,
        prepared: &Prepared,
        secret: &Secret,
        now: crate::clock::Timestamp,
        by: Option<tokio::time::Instant>,
    ) -> Result<Claim, Outcome<T, Failure<E>>> {
        let (spec, caller) = (&prepared.spec, &prepared.caller);
        let tool = spec.name;
        let key = prepared.key.key(secret);
        let token = attempt_token(now);
        let req = ClaimRequest {
            key,
            tenant: &caller.tenant,
            subject: match prepared.scope {
                Scope::Subject => Some(&caller.subject),
                Scope::Tenant => None,
            },
            tool,
            fingerprint: prepared.fingerprint.map(|f| f.fingerprint(secret)),
            now,
            lease: self.lease,
            window: spec.window,
            token,
        };
        if !self.secret_check.passed() {
            if let Err(source) = bounded(by, self.secret_check.ensure(&*self.store)).await {
                tracing::error!(tool, error = %source, "idempotency: the store's secret check failed; nothing was run");
                return Err(refused(Error::Store {
                    tool: tool.into(),
                    source,
                }));
            }
        }
        let pending = Guard::claiming(self, key, token, tool);
        let claim = bounded(by, self.store.claim(&req)).await;
        if claim.is_ok() {
            pending.disarm();
        } else {
            drop(pending);
        }
        match claim {
            Ok(c) => Ok(c),
            Err(StoreError::ReferenceTaken { reference }) => {
                tracing::error!(tool, %reference, "idempotency claim refused: the reference is held by a different key; nothing was run");
                // This call's own reference: nothing about the holder (not its generation).
                Err(refused(Error::ReferenceTaken {
                    tool: tool.into(),
                    reference: key.reference(1),
                }))
            }
            Err(source @ StoreError::Corrupt { .. }) => {
                // Every repeat finds the same record: not a passing failure. Named by the key's
                // first generation, which finds the record whatever its generation reads as.
                let reference = key.reference(1);
                tracing::error!(tool, %reference, error = %source, "idempotency claim found a record it cannot read; nothing was run");
                Err(answered(Error::Unreadable {
                    tool: tool.into(),
                    reference,
                    source,
                }))
            }
            Err(source) => {
                tracing::warn!(tool, error = %source, "idempotency claim failed; nothing was run");
                Err(refused(Error::Store {
                    tool: tool.into(),
                    source,
                }))
            }
        }
    }

    /// `recover = "rerun"`: takes over the call whose worker is gone (its reference, and when it
    /// started) and runs the body again under its reference (same generation). One runner: a
    /// takeover that loses (another repeat or replica took it over first, or the record settled
    /// meanwhile) answers "in progress". A takeover whose reply is lost (or whose caller goes
    /// away meanwhile) is given back in the background, fenced by its own token, as a lost
    /// claim is: nothing ran under it, and the next repeat runs it at once.
    async fn rerun<T, E, Fut>(
        &self,
        prepared: &Prepared,
        key: crate::key::Key,
        ((reference, since), now, by): (
            Gone,
            crate::clock::Timestamp,
            Option<tokio::time::Instant>,
        ),
        (policy, body): (ErrorPolicy<E>, Fut),
    ) -> Outcome<T, Failure<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let spec = &prepared.spec;
        let tool = spec.name;
        let token = attempt_token(now);
        let pending = Guard::claiming(self, key, token, tool);
        let taken = bounded(by, self.store.take_over(key, token, now, self.lease)).await;
        if taken.is_ok() {
            pending.disarm();
        } else {
            drop(pending);
        }
        match taken {
            Ok(reference) => {
                tracing::warn!(tool, %reference, "idempotency: running a call whose worker is gone again under its reference (recover = \"rerun\")");
                crate::metrics::rerun(tool);
                Attempt::new(
                    self,
                    *spec,
                    Held {
                        key,
                        reference,
                        token,
                    },
                    now,
                )
                .run(policy, body)
                .await
            }
            Err(StoreError::WrongState { .. } | StoreError::NotFound) => {
                tracing::info!(tool, %reference, "idempotency: another repeat took over the call first (or it settled)");
                answered(Error::InFlight {
                    tool: tool.into(),
                    reference,
                    since,
                })
            }
            Err(source) => {
                tracing::warn!(tool, %reference, error = %source, "idempotency: could not take over a call whose worker is gone; nothing was run");
                refused(Error::Store {
                    tool: tool.into(),
                    source,
                })
            }
        }
    }

    /// While secrets are rotated: the live record of this call under a previous secret's key,
    /// if there is one. A probe that finds none made a claim there, which it gives back at once.
    async fn recognise<T, E>(
        &self,
        prepared: &Prepared,
        now: crate::clock::Timestamp,
        by: Option<tokio::time::Instant>,
    ) -> Result<Option<Claim>, Outcome<T, Failure<E>>> {
        let spec = &prepared.spec;
        for secret in self.previous.iter() {
            match self.claim(prepared, secret, now, by).await? {
                Claim::New { token, reference } => {
                    // Given back at once; the guard does it in the background if this future is
                    // dropped meanwhile or the release fails.
                    let key = prepared.key.key(secret);
                    let probe = Guard::claiming(self, key, token, spec.name);
                    if let Err(source) = bounded(by, self.store.release(key, token, now)).await {
                        tracing::warn!(tool = spec.name, %reference, error = %source, "idempotency: could not give back a probe claim under a previous secret");
                        return Err(refused(Error::Store {
                            tool: spec.name.into(),
                            source,
                        }));
                    }
                    probe.disarm();
                }
                earlier => return Ok(Some(earlier)),
            }
        }
        Ok(None)
    }
}

/// A call whose worker is gone: its reference, and when it started.
type Gone = (Reference, crate::clock::Timestamp);

/// The call a claim found whose worker is gone, with when it started: in flight with its lease
/// passed unrenewed ([`Standing::LeasePassed`]), or unknown. `None` for any other answer.
fn gone(claim: &Claim, now: crate::clock::Timestamp) -> Option<Gone> {
    match *claim {
        Claim::InFlight {
            reference,
            claimed_at,
            lease_expires_at,
        } if Standing::of(RecordState::InFlight, None, now >= lease_expires_at, false)
            == Standing::LeasePassed =>
        {
            Some((reference, claimed_at))
        }
        Claim::Unknown { reference, since } => Some((reference, since)),
        _ => None,
    }
}

/// The wrapper's answer about an existing record (it names the record's reference).
fn answered<T, E>(e: Error) -> Outcome<T, Failure<E>> {
    let reference = e.reference();
    Outcome {
        result: Err(Failure::Wrapper(e)),
        replayed: false,
        reference,
    }
}

/// The wrapper's answer when no claim was made.
fn refused<T, E>(e: Error) -> Outcome<T, Failure<E>> {
    Outcome {
        result: Err(Failure::Wrapper(e)),
        replayed: false,
        reference: None,
    }
}

/// A fencing token for one attempt: its claim time in ms × 2^20 plus 20 random bits, so tokens
/// grow with time (a key claimed again after a purge never repeats a token a worker of the purged
/// record could hold) and two attempts at the same millisecond practically never share one.
fn attempt_token(now: crate::clock::Timestamp) -> Token {
    let low = i64::try_from(noise() & 0xF_FFFF).unwrap_or(0);
    Token(now.as_millis().saturating_mul(1 << 20) | low)
}

/// 64 bits that differ from one call to the next and from one process to the next (a randomly
/// keyed hash of a counter): enough for tokens and jitter, not for secrets.
fn noise() -> u64 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    static KEYS: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    KEYS.get_or_init(std::hash::RandomState::new)
        .hash_one(SEQ.fetch_add(1, Ordering::Relaxed))
}
