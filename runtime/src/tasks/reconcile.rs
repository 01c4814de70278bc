//! A [`Reconciler`] as a task of its own: the engine's lease-expiry rounds, run apart from the
//! servers (an admin job), on a schedule.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::engine::expiry::{Reconcile, ReconcileReport, Rounds};
use crate::engine::Idempotency;
use crate::periodic::spawn_periodic;
use crate::store::StoreError;

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
/// .every(Duration::from_secs(30))
/// .spawn();
/// # reconciler.abort();
/// # }
/// ```
pub struct Reconciler {
    rounds: Rounds,
    every: Duration,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("every", &self.every)
            .field("batch", &self.rounds.batch)
            .finish_non_exhaustive()
    }
}

impl Reconciler {
    /// A reconciler over the engine's store and clock: a round every 30 s, at most 100 claims a
    /// round. A settled answer is replayed for its tool's window, which the claim recorded.
    pub fn new(engine: &Idempotency, reconcile: impl Reconcile) -> Self {
        Reconciler {
            rounds: Rounds::new(
                engine.store().clone(),
                engine.clock().clone(),
                Arc::new(reconcile),
            ),
            every: Duration::from_secs(30),
        }
    }

    /// How often a round runs when spawned.
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    /// How many claims one round takes at most (at least 1).
    pub fn batch(mut self, batch: u32) -> Self {
        self.rounds.batch = batch.max(1);
        self
    }

    /// One round: every unsettled claim (lease expired, or unknown) is asked about once.
    pub async fn run_once(&self) -> Result<ReconcileReport, StoreError> {
        self.rounds.run_once().await
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
                true
            }
        })
    }
}
