//! Settling the claims whose outcome is lost: a worker died between claim and complete (its
//! lease expired), or the outcome is unknown (timeout, a panic, a store failure after the side
//! effect). Nothing is ever re-run because a lease expired: the reconciler asks *you* —
//! typically the processor, by reference — and records what you find.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::spawn_periodic;
use crate::clock::Clock;
use crate::engine::Idempotency;
use crate::store::{BoxError, BoxFuture, Settlement, Store, StoreError, Unsettled};

/// What you tell the reconciler about one unsettled claim.
///
/// ```
/// use idempotency::store::{BoxError, BoxFuture, Settlement, Unsettled};
/// use idempotency::tasks::Reconcile;
/// struct AskProcessor;
/// impl Reconcile for AskProcessor {
///     fn reconcile<'a>(&'a self, claim: &'a Unsettled) -> BoxFuture<'a, Result<Settlement, BoxError>> {
///         Box::pin(async move {
///             // e.g. GET /charges?idempotency_key={claim.reference}
///             Ok(Settlement::Released)
///         })
///     }
/// }
/// ```
pub trait Reconcile: Send + Sync + 'static {
    /// Finds out what happened to `claim` (ask the processor by `claim.reference`). Return
    /// `Completed` with the answer a repeat should get, `Released` if it certainly did not happen,
    /// `Unknown` if you still cannot tell; an `Err` leaves the claim as it is for the next round.
    fn reconcile<'a>(&'a self, claim: &'a Unsettled)
        -> BoxFuture<'a, Result<Settlement, BoxError>>;
}

impl<F, Fut> Reconcile for F
where
    F: Fn(Unsettled) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Settlement, BoxError>> + Send + 'static,
{
    fn reconcile<'a>(
        &'a self,
        claim: &'a Unsettled,
    ) -> BoxFuture<'a, Result<Settlement, BoxError>> {
        Box::pin(self(claim.clone()))
    }
}

/// What one reconciliation round did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Claims looked at.
    pub examined: usize,
    /// Settled as completed.
    pub completed: usize,
    /// Settled as released.
    pub released: usize,
    /// Still unknown (marked so).
    pub unknown: usize,
    /// Skipped: the reconcile function failed, or someone else settled it first (fenced).
    pub skipped: usize,
}

/// Finds unsettled claims and settles them through a [`Reconcile`].
///
/// ```no_run
/// # async fn demo() {
/// use std::time::Duration;
/// use idempotency::store::{MemoryStore, Settlement, Unsettled};
/// use idempotency::{tasks::Reconciler, Idempotency};
/// let engine = Idempotency::new(MemoryStore::new());
/// let reconciler = Reconciler::new(&engine, |claim: Unsettled| async move {
///     // ask the processor about claim.reference
///     Ok(Settlement::Released)
/// })
/// .window(Duration::from_secs(900))
/// .every(Duration::from_secs(30))
/// .spawn();
/// # reconciler.abort();
/// # }
/// ```
pub struct Reconciler {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    reconcile: Arc<dyn Reconcile>,
    every: Duration,
    window: Duration,
    batch: u32,
}

impl Reconciler {
    /// A reconciler over the engine's store and clock: a round every 30 s, at most 100 claims a
    /// round, a settled answer replayed for 15 minutes (set [`Reconciler::window`] to your
    /// tools' window).
    pub fn new(engine: &Idempotency, reconcile: impl Reconcile) -> Self {
        Reconciler {
            store: engine.store().clone(),
            clock: engine.clock().clone(),
            reconcile: Arc::new(reconcile),
            every: Duration::from_secs(30),
            window: Duration::from_secs(900),
            batch: 100,
        }
    }

    /// How often a round runs when spawned.
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    /// How long a settled answer is replayed, from the settlement.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// How many claims one round takes at most (at least 1).
    pub fn batch(mut self, batch: u32) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// One round: every unsettled claim (lease expired, or unknown) is asked about once.
    pub async fn run_once(&self) -> Result<ReconcileReport, StoreError> {
        let now = self.clock.now();
        let claims = self.store.unsettled(now, self.batch).await?;
        let mut report = ReconcileReport {
            examined: claims.len(),
            ..Default::default()
        };
        for claim in &claims {
            let settlement = match self.reconcile.reconcile(claim).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(tool = %claim.tool, reference = %claim.reference, error = %e, "idempotency reconcile failed; will retry");
                    report.skipped += 1;
                    continue;
                }
            };
            let at = self.clock.now();
            match self
                .store
                .settle(claim.key, claim.token, &settlement, at, at + self.window)
                .await
            {
                Ok(()) => {
                    tracing::info!(tool = %claim.tool, reference = %claim.reference, settlement = kind(&settlement), "idempotency reconcile");
                    match settlement {
                        Settlement::Completed(_) => report.completed += 1,
                        Settlement::Released => report.released += 1,
                        Settlement::Unknown => report.unknown += 1,
                    }
                }
                Err(
                    e @ (StoreError::Fenced { .. }
                    | StoreError::WrongState { .. }
                    | StoreError::NotFound),
                ) => {
                    tracing::info!(reference = %claim.reference, error = %e, "idempotency reconcile: already settled elsewhere");
                    report.skipped += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(report)
    }

    /// Runs a round every [`Reconciler::every`] (the first at once) in a background task, until
    /// the handle is aborted; a failed round is logged and retried at the next tick.
    pub fn spawn(self) -> JoinHandle<()> {
        let every = self.every;
        let this = Arc::new(self);
        spawn_periodic(every, move || {
            let this = this.clone();
            async move {
                if let Err(e) = this.run_once().await {
                    tracing::warn!(error = %e, "idempotency reconcile round failed");
                }
            }
        })
    }
}

fn kind(s: &Settlement) -> &'static str {
    match s {
        Settlement::Completed(_) => "completed",
        Settlement::Released => "released",
        Settlement::Unknown => "unknown",
    }
}
