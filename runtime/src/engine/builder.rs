//! The engine's builder: `IdempotencyBuilder`, what it sets (clock, secrets, lease, waiting,
//! lease-expiry handling), and `start`/`build`, which make the [`Idempotency`].

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::key::Secret;
use crate::store::{Store, StoreError};

use super::client::Client;
use super::expiry::{Background, Reconcile};
use super::secret::SecretCheck;
use super::wait::Waiters;
use super::Idempotency;

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
    /// `start` does not check that the store can run the transactional tools linked in.
    no_transactional_tools: bool,
    /// The cache of completed answers: entries, and the largest answer kept.
    cache: (usize, usize),
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
    /// A builder over `store` with every default: what [`Idempotency::builder_shared`] returns.
    pub(super) fn over(store: Arc<dyn Store>) -> Self {
        let waiters = Arc::new(Waiters::default());
        Self {
            store: Arc::new(Client {
                store,
                waiters: waiters.clone(),
            }),
            clock: Arc::new(SystemClock),
            lease: Idempotency::DEFAULT_LEASE,
            expiry: Expiry::On {
                reconcile: None,
                every: None,
            },
            secret: None,
            previous: Vec::new(),
            wait: Duration::ZERO,
            max_waiters: Idempotency::DEFAULT_MAX_WAITERS,
            waiters,
            no_transactional_tools: false,
            cache: (
                Idempotency::DEFAULT_CACHE_ENTRIES,
                Idempotency::DEFAULT_CACHE_MAX_ANSWER,
            ),
        }
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
    /// secret is listed here, a call claims its key under every secret listed and the current
    /// one, in one order every replica shares (ascending key bytes), and a live record under any
    /// of them answers for it (replay, in progress, unknown, mismatch) instead of a second run;
    /// the same call at replicas of both rotation steps at once runs once, and the other
    /// replicas wait for it. Keep a secret listed for the longest window plus the retention
    /// after the last replica stopped using it; it costs a fresh call one claim and one release
    /// per previous secret (and a repeat up to that many, by its key's place in the order).
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

    /// Keeps up to `entries` completed answers this engine recorded (default
    /// [`Idempotency::DEFAULT_CACHE_ENTRIES`], 4,096; `0` turns the cache off) and replays
    /// them with no store round trip. A completed answer does not change until its window
    /// ends, so this is safe: an answer is never served after its record's window ended (on
    /// the clock the store ends windows by, see [`WindowClock`](crate::store::WindowClock);
    /// a store that does not say keeps nothing), to another caller (the key separates them),
    /// to a business-key call whose arguments differ (the store then answers "mismatch"), or
    /// for a call still in flight. Answers larger than
    /// [`cache_max_answer`](IdempotencyBuilder::cache_max_answer) are not kept. Every clone of
    /// the engine shares it; another process (replica) has its own, and asks the store.
    pub fn cache(mut self, entries: usize) -> Self {
        self.cache.0 = entries;
        self
    }

    /// The largest answer (bytes of JSON) the cache keeps (default
    /// [`Idempotency::DEFAULT_CACHE_MAX_ANSWER`], 16 KiB); a larger one is replayed from the
    /// store.
    pub fn cache_max_answer(mut self, bytes: usize) -> Self {
        self.cache.1 = bytes;
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
    ///
    /// It also refuses a store that cannot run a call in a transaction of its database (memory,
    /// Redis) while a `#[idempotent(transactional)]` tool is linked into the program, naming the
    /// tool, unless [`without_transactional_tools`](IdempotencyBuilder::without_transactional_tools)
    /// says this engine serves none of them.
    pub async fn start(self) -> Result<Idempotency, StoreError> {
        let unserved = if self.no_transactional_tools || self.store.transactions().is_some() {
            Vec::new()
        } else {
            crate::tool::transactional_tools()
        };
        if !unserved.is_empty() {
            return Err(StoreError::Config {
                problem: format!(
                    "{} {} transactional (#[idempotent(transactional)]), but this store cannot run a call in a \
                     transaction of its database: serve {} with SqliteStore or PostgresStore (or, if another engine \
                     serves {}, say so with IdempotencyBuilder::without_transactional_tools() on this one)",
                    unserved.join(", "),
                    if unserved.len() == 1 { "is" } else { "are" },
                    if unserved.len() == 1 { "it" } else { "them" },
                    if unserved.len() == 1 { "it" } else { "them" },
                ),
                source: None,
            });
        }
        let engine = self.build();
        engine.secret_check.ensure(&*engine.core.store).await?;
        Ok(engine)
    }

    /// This engine serves none of the program's `#[idempotent(transactional)]` tools (another
    /// engine, on a SQL store, does): [`start`](IdempotencyBuilder::start) does not refuse its
    /// store for them. A transactional call that reaches it anyway is refused (nothing runs).
    pub fn without_transactional_tools(mut self) -> Self {
        self.no_transactional_tools = true;
        self
    }

    /// The engine, unchecked until its first call (see [`start`](IdempotencyBuilder::start)).
    /// Its lease-expiry rounds start with its first call (inside the runtime that serves it) and
    /// stop when the last clone of the engine is dropped, a round under way included (its
    /// [`Reconcile`](crate::tasks::Reconcile) future is dropped; what it settled stays settled).
    pub fn build(self) -> Idempotency {
        crate::metrics::describe();
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
        let window_clock = self.store.window_clock();
        Idempotency {
            core: super::core::Core {
                store: self.store,
                clock: self.clock,
                lease: self.lease,
            },
            secret,
            previous: self.previous.into(),
            background,
            secret_check,
            wait: self.wait,
            max_waiters: self.max_waiters,
            waiters: self.waiters,
            cache: super::cache::AnswerCache::new(self.cache.0, self.cache.1).map(Arc::new),
            window_clock,
        }
    }
}
