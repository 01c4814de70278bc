//! The outbox's data as the stores keep it: a message a call queued, the entry a store hands out
//! for delivery, and the receipt that acknowledges it. (Queueing is [`Call::enqueue`](crate::Call::enqueue);
//! delivery, [`Dispatcher`](crate::outbox::Dispatcher).)

use crate::key::Reference;

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
