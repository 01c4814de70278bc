//! Lease expiry: settling the claims whose outcome is lost — a worker died between claim and
//! complete (its lease passed), or the outcome is unknown (timeout, a panic, a store failure
//! after the side effect). Nothing is ever re-run because a lease passed: a [`Reconcile`] of
//! yours asks the processor by reference and the answer is recorded; without one, a claim whose
//! lease passed becomes "outcome unknown" (its worker has not reported), which is true, instead
//! of "in progress" forever.
//!
//! The engine runs these rounds in the background unless told not to
//! ([`IdempotencyBuilder::without_reconciler`](super::IdempotencyBuilder::without_reconciler));
//! [`Reconciler`](crate::tasks::Reconciler) runs them as a task of its own.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::clock::Clock;
use crate::periodic::spawn_periodic;
use crate::record::RecordState;
use crate::store::{BoxError, BoxFuture, Fenced, Settlement, Store, StoreError, Unsettled};

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

/// The rounds: which claims, asked whom, settled for how long.
pub(crate) struct Rounds {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// `None`: the default handling (expired in-flight claims become unknown).
    reconcile: Option<Arc<dyn Reconcile>>,
    pub(crate) batch: u32,
}

impl Rounds {
    /// Rounds that settle through `reconcile`: 100 claims a round (a settled answer is replayed
    /// for its record's own window).
    pub(crate) fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        reconcile: Arc<dyn Reconcile>,
    ) -> Self {
        Rounds {
            store,
            clock,
            reconcile: Some(reconcile),
            batch: 100,
        }
    }

    /// One round: every unsettled claim (lease expired, or unknown) is asked about once; with
    /// the default handling (no [`Reconcile`] of yours) only the expired in-flight ones, which
    /// become unknown.
    pub(crate) async fn run_once(&self) -> Result<ReconcileReport, StoreError> {
        let now = self.clock.now();
        let claims = self.store.unsettled(now, self.batch).await?;
        metrics::counter!(crate::metrics::UNSETTLED_SEEN).increment(claims.len() as u64);
        let mut report = ReconcileReport {
            examined: claims.len(),
            ..Default::default()
        };
        // Unknown records this round leaves so: found unknown and not settled, or marked so.
        let mut left_unknown = 0;
        for claim in &claims {
            let was_unknown = usize::from(claim.state == RecordState::Unknown);
            let settlement = match &self.reconcile {
                Some(r) => r.reconcile(claim).await,
                None if claim.state == RecordState::InFlight => Ok(Settlement::Unknown),
                None => {
                    report.skipped += 1;
                    left_unknown += was_unknown;
                    continue;
                }
            };
            let settlement = match settlement {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(tool = %claim.tool, reference = %claim.reference, error = %e, "idempotency reconcile failed; will retry");
                    report.skipped += 1;
                    left_unknown += was_unknown;
                    continue;
                }
            };
            let at = self.clock.now();
            match self
                .store
                .settle(claim.key, claim.token, &settlement, at)
                .await
            {
                Ok(()) => {
                    tracing::info!(tool = %claim.tool, reference = %claim.reference, settlement = kind(&settlement), "idempotency reconcile");
                    match settlement {
                        Settlement::Completed(_) => report.completed += 1,
                        Settlement::Released => report.released += 1,
                        Settlement::Unknown => {
                            report.unknown += 1;
                            left_unknown += 1;
                        }
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
        crate::metrics::round(claims.len(), left_unknown);
        Ok(report)
    }
}

/// The engine's own lease-expiry handling: its rounds, started at the engine's first call
/// (inside the runtime that serves it) and stopped when the last clone of the engine is dropped:
/// at once, a round under way included, so that nothing settles for an engine that is gone.
pub(crate) struct Background {
    rounds: Arc<Rounds>,
    every: Duration,
    /// The rounds' task, once started.
    started: OnceLock<tokio::task::AbortHandle>,
    /// Tools already warned about by [`Background::first_without_reconcile`].
    told: std::sync::Mutex<Vec<&'static str>>,
}

impl Background {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        reconcile: Option<Arc<dyn Reconcile>>,
        every: Duration,
    ) -> Self {
        Background {
            rounds: Arc::new(Rounds {
                store,
                clock,
                reconcile,
                batch: 100,
            }),
            every,
            started: OnceLock::new(),
            told: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Whether `tool` (which says `recover = "reconcile"`) is met for the first time by rounds
    /// that have no [`Reconcile`] of yours to settle its lost calls: said once per tool.
    pub(crate) fn first_without_reconcile(&self, tool: &'static str) -> bool {
        if self.rounds.reconcile.is_some() {
            return false;
        }
        let mut told = self.told.lock().unwrap_or_else(|p| p.into_inner());
        if told.contains(&tool) {
            return false;
        }
        told.push(tool);
        true
    }

    /// Starts the rounds once, on the current runtime.
    pub(crate) fn ensure_started(&self) {
        self.started.get_or_init(|| {
            let rounds = self.rounds.clone();
            spawn_periodic(self.every, move || {
                let rounds = rounds.clone();
                async move {
                    match rounds.run_once().await {
                        Ok(r) if r.examined > r.skipped => tracing::info!(?r, "idempotency lease expiry round"),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "idempotency lease expiry round failed; retrying at the next tick"),
                    }
                    true
                }
            })
            .abort_handle()
        });
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(task) = self.started.get() {
            task.abort();
        }
    }
}

fn kind(s: &Settlement) -> &'static str {
    match s {
        Settlement::Completed(_) => "completed",
        Settlement::Released => "released",
        Settlement::Unknown => "unknown",
    }
}
