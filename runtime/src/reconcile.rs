//! Settling the claims whose outcome is lost: a worker died between claim and complete (its
//! lease expired), or the outcome is unknown (timeout, cancellation, panic). Nothing is ever re-run
//! because a lease expired: the reconciler asks *you* — typically the processor, by reference —
//! and records what you find.
//!
//! And the outbox: follow-on work written in the completion's transaction, delivered at least once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{ticker, Clock};
use crate::store::{BoxFuture, OutboxEntry, Settlement, Store, StoreError, Unsettled};

/// What you tell the reconciler about one unsettled claim.
///
/// ```
/// use idempotency::{reconcile::Reconcile, BoxFuture, Settlement, StoredResponse, Unsettled};
/// struct AskProcessor;
/// impl Reconcile for AskProcessor {
///     fn reconcile<'a>(&'a self, claim: &'a Unsettled) -> BoxFuture<'a, Result<Settlement, String>> {
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
    fn reconcile<'a>(&'a self, claim: &'a Unsettled) -> BoxFuture<'a, Result<Settlement, String>>;
}

impl<F, Fut> Reconcile for F
where
    F: Fn(Unsettled) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Settlement, String>> + Send + 'static,
{
    fn reconcile<'a>(&'a self, claim: &'a Unsettled) -> BoxFuture<'a, Result<Settlement, String>> {
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
pub struct Reconciler {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    reconcile: Arc<dyn Reconcile>,
    window: Duration,
    batch: u32,
}

impl Reconciler {
    /// A reconciler over the engine's store and clock. A settled answer is replayed for
    /// `window` from the settlement (use your tools' window).
    pub fn new(engine: &crate::Idempotency, reconcile: impl Reconcile, window: Duration) -> Self {
        Reconciler {
            store: engine.store().clone(),
            clock: engine.clock().clone(),
            reconcile: Arc::new(reconcile),
            window,
            batch: 100,
        }
    }

    /// How many claims one round takes at most (default 100).
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
            let now = self.clock.now();
            match self
                .store
                .settle(claim.key, claim.token, &settlement, now, self.window)
                .await
            {
                Ok(()) => {
                    tracing::info!(tool = %claim.tool, reference = %claim.reference, settlement = ?kind(&settlement), "idempotency reconcile");
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

    /// Runs a round every `every` in a background task, until the task is aborted.
    pub fn spawn(self, every: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = ticker(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = self.run_once().await {
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

/// Delivers outbox messages at least once: fetches due messages, hands each to `deliver`, and
/// acknowledges it when `deliver` succeeds. A message whose delivery fails (or whose dispatcher
/// dies mid-way) is handed out again after `redeliver_after`. The receiving side dedupes by
/// [`OutboxEntry::reference`].
pub struct Dispatcher<D> {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    deliver: D,
    redeliver_after: Duration,
    batch: u32,
}

impl<D, Fut> Dispatcher<D>
where
    D: Fn(OutboxEntry) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    /// A dispatcher over the engine's store.
    pub fn new(engine: &crate::Idempotency, deliver: D) -> Self {
        Dispatcher {
            store: engine.store().clone(),
            clock: engine.clock().clone(),
            deliver,
            redeliver_after: Duration::from_secs(60),
            batch: 100,
        }
    }

    /// How long a handed-out message waits before it is handed out again (default 60 s).
    pub fn redeliver_after(mut self, d: Duration) -> Self {
        self.redeliver_after = d;
        self
    }

    /// One round; returns how many messages were delivered and acknowledged.
    pub async fn run_once(&self) -> Result<usize, StoreError> {
        let due = self
            .store
            .outbox_fetch(self.clock.now(), self.redeliver_after, self.batch)
            .await?;
        let mut delivered = 0;
        for m in due {
            let (id, reference, topic) = (m.id, m.reference, m.topic.clone());
            match (self.deliver)(m).await {
                Ok(()) => {
                    self.store.outbox_ack(id).await?;
                    delivered += 1;
                }
                Err(e) => {
                    tracing::warn!(%reference, topic, error = %e, "idempotency outbox delivery failed; will redeliver")
                }
            }
        }
        Ok(delivered)
    }

    /// Runs a round every `every` in a background task.
    pub fn spawn(self, every: Duration) -> tokio::task::JoinHandle<()>
    where
        Fut: 'static,
    {
        tokio::spawn(async move {
            let mut tick = ticker(every);
            loop {
                tick.tick().await;
                if let Err(e) = self.run_once().await {
                    tracing::warn!(error = %e, "idempotency outbox round failed");
                }
            }
        })
    }
}
