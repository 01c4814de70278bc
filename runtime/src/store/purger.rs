//! A background task that keeps a store from growing without end.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::Store;
use crate::clock::{ticker, Clock};

/// How many records one [`Store::purge`] call deletes; a pass repeats it until a call deletes
/// fewer, yielding in between, so no statement holds locks for long.
const BATCH: u32 = 1_000;

/// Spawns a task that, every `every` (the first pass at once), deletes the completed and released
/// records whose answer stopped being replayed more than `retention` ago (see [`Store::purge`];
/// in-flight and unknown records are never touched). It runs until the handle is aborted or the
/// runtime shuts down; a failed pass is logged and retried at the next tick.
///
/// Records are purged in batches of 1,000. The SQL stores have no index on expiry (it would cost
/// bytes on every row and every completion), so each batch is a scan that stops once it has found
/// its batch: run the purger every few minutes, not per request.
///
/// Must be called inside a Tokio runtime.
///
/// ```no_run
/// # async fn demo() {
/// use std::time::Duration;
/// use idempotency::store::spawn_purger;
/// use idempotency::{Idempotency, MemoryStore, DEFAULT_RETENTION};
/// let engine = Idempotency::new(MemoryStore::new());
/// let purger = spawn_purger(engine.store().clone(), engine.clock().clone(), Duration::from_secs(300), DEFAULT_RETENTION);
/// // ... serve ...
/// purger.abort();
/// # }
/// ```
pub fn spawn_purger(
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    every: Duration,
    retention: Duration,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = ticker(every);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let older_than = clock.now() - retention;
            let mut total = 0u64;
            loop {
                match store.purge(older_than, BATCH).await {
                    Ok(n) => {
                        total += n;
                        if n < u64::from(BATCH) {
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "idempotency purge failed; retrying at the next tick");
                        break;
                    }
                }
            }
            if total > 0 {
                tracing::debug!(purged = total, "idempotency purge");
            }
        }
    })
}
