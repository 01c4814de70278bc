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
//! long are not made up in a burst (Tokio's `MissedTickBehavior::Delay`).
//!
//! The engine runs lease-expiry handling of its own unless told not to
//! ([`IdempotencyBuilder::reconcile`](crate::IdempotencyBuilder::reconcile)); a [`Reconciler`]
//! is for a process that settles claims apart from the servers (an admin job).

mod purge;
mod reconcile;

pub use crate::engine::expiry::{Reconcile, ReconcileReport};
pub use purge::Purger;
pub use reconcile::Reconciler;
