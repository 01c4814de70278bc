//! The call being run, as its handler sees it: [`Call::current`].

use std::sync::Arc;

use crate::key::Reference;
use crate::outbox::Pending;

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
}

impl Call {
    pub(crate) fn new(reference: Reference, tool: &'static str) -> Self {
        Call {
            reference,
            tool,
            outbox: Arc::new(Pending::open()),
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

    /// `body`, run with this call as [`Call::current`].
    pub(crate) fn scope<F: std::future::Future>(
        self,
        body: F,
    ) -> tokio::task::futures::TaskLocalFuture<Call, F> {
        CURRENT.scope(self, body)
    }
}
