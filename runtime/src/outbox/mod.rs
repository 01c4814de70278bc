//! The outbox: follow-on work (the receipt email) that a handler queues with
//! [`Call::enqueue`](crate::Call::enqueue), written in the same transaction as the call's completion, and delivered at
//! least once by a [`Dispatcher`], keyed by the operation's reference so the receiving side can
//! deduplicate.

use std::sync::{Mutex, PoisonError};

use crate::canonical::CanonicalError;
use crate::key::Reference;

mod dispatch;

pub use dispatch::Dispatcher;

/// A follow-on message (say, the receipt email) written in the same transaction as the
/// completion, keyed by the operation's reference, delivered at least once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxMessage {
    /// What kind of work it is (`"receipt_email"`), for the dispatcher to route.
    pub topic: String,
    /// The message's JSON text.
    pub payload: String,
}

/// How a store names one handed-out outbox message, to acknowledge it: the backend chooses the
/// text (a row id, a stream id, a queue's receipt handle).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Receipt(String);

impl Receipt {
    /// A receipt with the backend's text.
    pub fn new(text: impl Into<String>) -> Self {
        Receipt(text.into())
    }

    /// The backend's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Receipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A message handed out by [`OutboxStore::fetch`](crate::store::OutboxStore::fetch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxEntry {
    /// What acknowledges it ([`OutboxStore::ack`](crate::store::OutboxStore::ack)).
    pub receipt: Receipt,
    /// The reference of the operation that wrote it: the receiving side dedupes by it.
    pub reference: Reference,
    /// The message's topic.
    pub topic: String,
    /// The message's JSON text.
    pub payload: String,
    /// How many times it was handed out before.
    pub attempts: i32,
}

/// Why [`Call::enqueue`](crate::Call::enqueue) refused a message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueError {
    /// The payload cannot be written as canonical JSON.
    #[error("the outbox message cannot be written as JSON")]
    Payload(#[from] CanonicalError),
    /// The call's messages were already taken to be written with its completion (the handler
    /// returned, or `enqueue` ran from a task that outlived it): this message would be lost.
    #[error("the call of ref {reference} has already finished; its outbox was written with its completion, so this message was not queued")]
    Closed {
        /// The call's reference.
        reference: Reference,
    },
}

/// The messages a running call has queued; sealed (`None`) once taken for the completion.
#[derive(Debug, Default)]
pub(crate) struct Pending(Mutex<Option<Vec<OutboxMessage>>>);

impl Pending {
    pub(crate) fn open() -> Self {
        Pending(Mutex::new(Some(Vec::new())))
    }

    /// The queued messages; later `enqueue`s are refused.
    pub(crate) fn take(&self) -> Vec<OutboxMessage> {
        let mut q = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        q.take().unwrap_or_default()
    }
}

impl Pending {
    /// Queues a message, unless the messages were already taken.
    pub(crate) fn push(&self, message: OutboxMessage) -> Result<(), OutboxMessage> {
        let mut q = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match q.as_mut() {
            Some(q) => {
                q.push(message);
                Ok(())
            }
            None => Err(message),
        }
    }
}
