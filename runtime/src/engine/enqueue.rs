//! A running call's outbox: the messages its handler queues with
//! [`Call::enqueue`](crate::Call::enqueue), written with its completion, and why a message is
//! refused.

use std::sync::{Mutex, PoisonError};

use crate::canonical::CanonicalError;
use crate::key::Reference;
use crate::store::OutboxMessage;

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
