//! The call being run, as its handler sees it: [`Call::current`].

use std::sync::Arc;

use serde::Serialize;

use super::enqueue::{EnqueueError, Pending};
use crate::canonical::canonical_json;
use crate::key::Reference;
use crate::store::OutboxMessage;

tokio::task_local! {
    static CURRENT: Call;
}

/// The call being run, seen from inside the handler's body: its reference (pass it downstream
/// as the processor's idempotency key) and its outbox ([`Call::enqueue`]).
#[derive(Clone, Debug)]
pub struct Call {
    pub(crate) reference: Reference,
    pub(crate) tool: &'static str,
    pub(crate) outbox: Arc<Pending>,
    /// A transactional call's connection (`store::sql::SharedConnection` of the store's
    /// database), borrowed through `Call::transaction`.
    pub(crate) transaction: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl Call {
    pub(crate) fn new(reference: Reference, tool: &'static str) -> Self {
        Call {
            reference,
            tool,
            outbox: Arc::new(Pending::open()),
            transaction: None,
        }
    }

    /// The call running in this task, if an idempotent handler is running it.
    ///
    /// ```
    /// assert!(idempotency::Call::current().is_none()); // not inside an #[idempotent] body
    /// ```
    pub fn current() -> Option<Call> {
        CURRENT.try_with(Call::clone).ok()
    }

    /// The operation's reference.
    pub fn reference(&self) -> Reference {
        self.reference
    }

    /// The tool's name.
    pub fn tool(&self) -> &'static str {
        self.tool
    }

    /// Queues follow-on work (the receipt email) to be written in the same transaction as the
    /// completion; a [`Dispatcher`](crate::outbox::Dispatcher) delivers it at least once, keyed
    /// by the reference. Nothing is written if the call does not complete. Refused once the
    /// handler has returned (its messages were already written).
    pub fn enqueue(
        &self,
        topic: impl Into<String>,
        payload: &impl Serialize,
    ) -> Result<(), EnqueueError> {
        let message = OutboxMessage {
            topic: topic.into(),
            payload: canonical_json(payload)?,
        };
        self.outbox.push(message).map_err(|_| EnqueueError::Closed {
            reference: self.reference,
        })
    }

    /// `body`, run with this call as [`Call::current`].
    pub(crate) fn scope<F: std::future::Future>(
        self,
        body: F,
    ) -> tokio::task::futures::TaskLocalFuture<Call, F> {
        CURRENT.scope(self, body)
    }
}
