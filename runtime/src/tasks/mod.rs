//! The background tasks a server runs beside its handlers, all built the same way —
//! `Task::new(&engine, …)`, options, then `.spawn()` (a round every period, the first at once) or
//! `.run_once()`:
//!
//! - [`Purger`]: deletes records whose answer stopped being replayed more than the retention ago;
//! - [`Reconciler`]: settles claims whose outcome is lost (a lease that passed, an unknown
//!   outcome) by asking you, typically the processor by reference;
//! - [`Dispatcher`](crate::outbox::Dispatcher): delivers outbox messages at least once.
//!
//! Each round that fails is logged and retried at the next tick; ticks missed while a round ran
//! long are not made up in a burst ([`MissedTickBehavior::Delay`]).

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

mod purge;
mod reconcile;

pub use purge::Purger;
pub use reconcile::{Reconcile, ReconcileReport, Reconciler};

/// Spawns `round()` every `every` (the first at once), until the handle is aborted or the
/// runtime shuts down. A zero period, on which Tokio's interval panics, becomes 1 ms.
pub(crate) fn spawn_periodic<F, Fut>(every: Duration, mut round: F) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            round().await;
        }
    })
}
