//! The engine: claim → run → record, and the honest answers in between.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::clock::Clock;
use crate::error::Error;
use crate::key::{Caller, Reference, Secret};
use crate::outcome::{ErrorPolicy, Failure, Outcome};
use crate::record::RecordStatus;
use crate::store::{Store, StoreError};
use crate::tool::{Prepared, Recover};

mod acquire;
mod answer;
mod attempt;
mod builder;
mod cache;
mod call;
mod claim;
mod client;
mod core;
mod enqueue;
pub(crate) mod expiry;
mod guard;
mod hooks;
mod keyed;
mod lease;
mod rotation;
mod secret;
#[cfg(test)]
mod tests;
#[cfg(feature = "_sql")]
mod transaction;
mod transactional;
mod wait;

use acquire::{Acquired, Opened};
use answer::{answer_found, replay};
use attempt::Attempt;
use claim::Taken;
use core::Core;
use expiry::Background;
use keyed::Keyed;
use secret::SecretCheck;
use transactional::InTx;
use wait::{Repeat, Waited, Waiters};

pub use builder::IdempotencyBuilder;
pub use call::Call;
pub use enqueue::EnqueueError;
pub(crate) use hooks::Hooks;
#[cfg(feature = "_sql")]
pub use transaction::{Transaction, TransactionError};

/// The store and clock every idempotent tool of a server shares. Cheap to clone.
///
/// ```
/// use idempotency::{store::MemoryStore, Idempotency};
/// let engine = Idempotency::new(MemoryStore::new());
/// # let _ = engine;
/// ```
#[derive(Clone)]
pub struct Idempotency {
    /// The store, the clock and the lease: what the engine's helpers get of it.
    core: Core,
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
    /// Completed answers this engine recorded, replayed with no store round trip; `None`: off.
    cache: Option<Arc<cache::AnswerCache>>,
    /// The clock the store ends windows by (what the cache follows).
    window_clock: crate::store::WindowClock,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("lease", &self.core.lease)
            .finish_non_exhaustive()
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

    /// How many completed answers an engine keeps to replay with no store round trip, unless
    /// [`IdempotencyBuilder::cache`] says otherwise: 4,096. Repeats come soon after their first
    /// call (a client's retry, a model calling again), so recent answers are what is asked
    /// for; 4,096 covers every call of the last 40 s at 100 calls a second. With answers of at
    /// most [`DEFAULT_CACHE_MAX_ANSWER`](Idempotency::DEFAULT_CACHE_MAX_ANSWER) it holds at most
    /// 64 MiB of answers, and a few hundred bytes per answer (about 1–2 MiB) as tools answer.
    pub const DEFAULT_CACHE_ENTRIES: usize = 4_096;

    /// The largest answer (bytes of JSON) the cache keeps unless
    /// [`IdempotencyBuilder::cache_max_answer`] says otherwise: 16 KiB. A larger one is replayed
    /// from the store.
    pub const DEFAULT_CACHE_MAX_ANSWER: usize = 16 * 1024;

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
        IdempotencyBuilder::over(store)
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.core.store
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.core.clock
    }

    /// The claim lease.
    pub fn lease(&self) -> Duration {
        self.core.lease
    }

    /// What the store knows of `reference`, if the caller may see it: its tenant's record, and
    /// for a subject-scoped record, its subject's.
    pub async fn status(
        &self,
        caller: &Caller,
        reference: Reference,
    ) -> Result<Option<RecordStatus>, StoreError> {
        self.core
            .store
            .status(&caller.tenant, &caller.subject, reference)
            .await
    }

    /// Whether a transactional call of `caller`'s tenant is running now under `reference`: its
    /// record appears only at its commit. Another tenant's call is `false`.
    #[cfg(feature = "rmcp")]
    pub(crate) async fn running_in_transaction(
        &self,
        caller: &Caller,
        reference: Reference,
    ) -> Result<bool, StoreError> {
        match self.core.store.transactions() {
            Some(store) => store.running(&caller.tenant, reference).await,
            None => Ok(false),
        }
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
        self.execute_hooked(prepared, policy, body, ()).await
    }

    /// [`Idempotency::execute_raw`] with a kind of call's `hooks` (a task's: [`Hooks`]).
    pub(crate) async fn execute_hooked<T, E, Fut, H>(
        &self,
        prepared: Prepared,
        policy: ErrorPolicy<E>,
        body: Fut,
        hooks: H,
    ) -> Outcome<T, Failure<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>> + Send,
        H: Hooks,
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
        let began = std::time::Instant::now();
        // OpenTelemetry's GenAI/MCP vocabulary (`otel.name` is the span's name for
        // tracing-opentelemetry), and the library's own attributes, filled in as they are known.
        let span = tracing::info_span!(
            "tools/call",
            otel.name = %format_args!("tools/call {}", spec.name),
            otel.kind = "server",
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = spec.name,
            mcp.method.name = "tools/call",
            mcp.session.id = tracing::field::Empty,
            error.type = tracing::field::Empty,
            "idempotency.ref" = tracing::field::Empty,
            idempotency.outcome = tracing::field::Empty,
            idempotency.replayed = tracing::field::Empty,
            idempotency.waited_ms = tracing::field::Empty,
        );
        crate::origin::adopt(&span, &prepared.origin);
        let recorded = span.clone();
        // The key and fingerprint under the current secret, derived once for every stage.
        let keyed = Keyed::new(prepared, &self.secret);
        let call = self.pipeline(keyed, policy, body, hooks);
        let out = tracing::Instrument::instrument(call, span).await;
        let answer = crate::metrics::call(spec.name, &out, began.elapsed());
        recorded.record("idempotency.outcome", answer);
        recorded.record("idempotency.replayed", out.replayed);
        if let Some(r) = &out.reference {
            recorded.record("idempotency.ref", tracing::field::display(r));
        }
        match &out.result {
            Ok(_) => {}
            Err(Failure::Handler(_)) => {
                recorded.record("error.type", "tool_error");
            }
            Err(Failure::Wrapper(_)) => {
                recorded.record("error.type", answer);
            }
        }
        out
    }

    /// What a call of `keyed` that this engine claims keeps of its answer, if anything.
    fn keep(&self, keyed: &Keyed) -> Option<cache::Keep> {
        let cache = self.cache.as_ref()?;
        Some(cache::Keep {
            cache: cache.clone(),
            clock: self.window_clock,
            fingerprint: keyed.fingerprint(),
            tool: keyed.tool(),
            window: keyed.spec().window,
        })
    }

    /// One call, whatever its kind: keyed once, then *acquire* (a cached answer, a claim or a
    /// takeover, an open transaction), *wait* (a repeat that finds the call in flight, if it
    /// may), *run* (under the claim or inside the transaction, the hook first) and *answer*.
    async fn pipeline<T, E, Fut, H>(
        &self,
        keyed: Keyed,
        policy: ErrorPolicy<E>,
        body: Fut,
        hooks: H,
    ) -> Outcome<T, Failure<E>>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>> + Send,
        H: Hooks,
    {
        let spec = *keyed.spec();
        let tool = spec.name;
        let mut repeat = Repeat::new(&spec, self.wait, self.max_waiters);
        let run = loop {
            match self.acquire(&keyed, &mut repeat).await {
                Acquired::Hit {
                    reference,
                    response,
                } => return replay(tool, reference, &response, &policy),
                Acquired::Refused(out) => return out,
                Acquired::Found(found) => {
                    return answer_found(tool, found.claim, found.now, &policy)
                }
                Acquired::InFlight(on) => match repeat.wait(&self.core, &self.waiters, &on).await {
                    Waited::Moved => {}
                    Waited::Over => {
                        return answer_found(tool, on.found.claim, on.found.now, &policy);
                    }
                },
                Acquired::Claimed(taken) => break Run::Claimed(taken),
                Acquired::Opened(opened) => break Run::Opened(opened),
            }
        };
        // Running, it waits no more: its place among the waiters is given back.
        drop(repeat);
        // The run stage: one for both holds, the hook first.
        match run {
            Run::Claimed(taken) => {
                let keep = if taken.rerun { None } else { self.keep(&keyed) };
                let body = hooks.on_claimed(taken.held.reference, body);
                let attempt = Attempt::new(&self.core, spec, taken.held, taken.claimed)
                    .keeping(keep)
                    .for_caller(keyed.prepared.caller);
                attempt::run(attempt, policy, body).await
            }
            Run::Opened(opened) => {
                let body = hooks.on_claimed(opened.tx.reference(), body);
                let keep = self.keep(&keyed);
                attempt::run(InTx::new(opened, keep), policy, body).await
            }
        }
    }
}

/// What a call runs under: its claim, or its open transaction.
enum Run {
    Claimed(Taken),
    Opened(Opened),
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
