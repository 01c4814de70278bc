//! The outbox: follow-on work (the receipt email) that a handler queues with
//! [`Call::enqueue`](crate::Call::enqueue), written in the same transaction as the call's completion, and delivered at
//! least once by a [`Dispatcher`], keyed by the operation's reference so the receiving side can
//! deduplicate.

mod dispatch;

pub use dispatch::Dispatcher;
