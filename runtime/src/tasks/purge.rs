//! A background task that keeps a store from growing without end.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::engine::Idempotency;
use crate::periodic::spawn_periodic;
use crate::store::{Store, StoreError, DEFAULT_RETENTION};

/// How many records one [`Maintenance::purge`](crate::store::Maintenance::purge) call deletes; a
/// round repeats it until a call deletes fewer, yielding in between, so no statement holds locks
/// for long.
const BATCH: u32 = 1_000;

/// Deletes the completed and released records whose answer stopped being replayed more than
/// the retention ago (default [`DEFAULT_RETENTION`], 48 h). In-flight and unknown records are
/// never touched. Records go in batches of 1,000; run it every few minutes, not per request.
///
/// ```no_run
/// # async fn demo() {
/// use std::time::Duration;
/// use idempotency::{store::MemoryStore, tasks::Purger, Idempotency};
/// let engine = Idempotency::new(MemoryStore::new());
/// let purger = Purger::new(&engine).every(Duration::from_secs(300)).spawn();
/// // ... serve ...
/// purger.abort();
/// # }
/// ```
pub struct Purger {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    every: Duration,
    retention: Duration,
}

impl std::fmt::Debug for Purger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Purger")
            .field("every", &self.every)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl Purger {
    /// A purger over the engine's store: every 5 minutes, 48 h retention.
    pub fn new(engine: &Idempotency) -> Self {
        Purger {
            store: engine.store().clone(),
            clock: engine.clock().clone(),
            every: Duration::from_secs(300),
            retention: DEFAULT_RETENTION,
        }
    }

    /// How often a round runs when spawned.
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    /// How long a record is kept after its answer stopped being replayed.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// One round: batches until one comes back short; returns how many records went.
    pub async fn run_once(&self) -> Result<u64, StoreError> {
        let now = self.clock.now();
        let older_than = now - self.retention;
        let mut total = 0u64;
        loop {
            let n = self.store.purge(now, older_than, BATCH).await?;
            total += n;
            metrics::counter!(crate::metrics::PURGED).increment(n);
            if n < u64::from(BATCH) {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }

    /// Runs a round every [`Purger::every`] (the first at once) in a background task, until the
    /// handle is aborted; a failed round is logged and retried at the next tick.
    pub fn spawn(self) -> JoinHandle<()> {
        let every = self.every;
        let this = Arc::new(self);
        spawn_periodic(every, move || {
            let this = this.clone();
            async move {
                match this.run_once().await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(purged = n, "idempotency purge"),
                    Err(e) => {
                        tracing::warn!(error = %e, "idempotency purge failed; retrying at the next tick")
                    }
                }
                true
            }
        })
    }
}
