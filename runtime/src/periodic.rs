//! The one ticker of the background work (lease expiry, reconciler, purger, outbox dispatcher).

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

/// Spawns `round()` every `every` (the first at once), until a round answers `false`, the
/// handle is aborted or the runtime shuts down. A zero period, on which Tokio's interval panics, becomes 1 ms.
pub(crate) fn spawn_periodic<F, Fut>(every: Duration, mut round: F) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !round().await {
                return;
            }
        }
    })
}
