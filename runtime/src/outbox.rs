//! The outbox: follow-on work (the receipt email) that a handler queues with
//! [`Call::enqueue`], written in the same transaction as the call's completion, and delivered at
//! least once by a [`Dispatcher`], keyed by the operation's reference so the receiving side can
//! deduplicate.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::task::JoinHandle;

use crate::call::Call;
use crate::canonical::{canonical_json, CanonicalError};
use crate::clock::Clock;
use crate::engine::Idempotency;
use crate::key::Reference;
use crate::store::{BoxError, Store, StoreError};
use crate::tasks::spawn_periodic;

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

/// Why [`Call::enqueue`] refused a message.
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

impl Call {
    /// Queues follow-on work (the receipt email) to be written in the same transaction as the
    /// completion; a [`Dispatcher`] delivers it at least once, keyed by the reference. Nothing is
    /// written if the call does not complete. Refused once the handler has returned.
    pub fn enqueue(
        &self,
        topic: impl Into<String>,
        payload: &impl Serialize,
    ) -> Result<(), EnqueueError> {
        let payload = canonical_json(payload)?;
        let mut q = self.outbox.0.lock().unwrap_or_else(PoisonError::into_inner);
        match q.as_mut() {
            Some(q) => {
                q.push(OutboxMessage {
                    topic: topic.into(),
                    payload,
                });
                Ok(())
            }
            None => Err(EnqueueError::Closed {
                reference: self.reference,
            }),
        }
    }
}

/// How many times a message is handed out before the dispatcher gives up on it.
const DEFAULT_MAX_ATTEMPTS: i32 = 10;

/// Delivers outbox messages at least once: fetches due messages, hands each to `deliver`, and
/// acknowledges it when `deliver` succeeds. A message whose delivery fails (or whose dispatcher
/// dies mid-way) is handed out again after [`Dispatcher::redeliver_after`]. After
/// [`Dispatcher::max_attempts`] failed deliveries it is given up: logged at error level with its
/// reference, topic and payload (so nothing is lost silently), and acknowledged. The receiving
/// side dedupes by [`OutboxEntry::reference`].
///
/// ```no_run
/// # async fn demo() {
/// use std::time::Duration;
/// use idempotency::{outbox::Dispatcher, store::MemoryStore, Idempotency};
/// let engine = Idempotency::new(MemoryStore::new());
/// let dispatcher = Dispatcher::new(&engine, |m: idempotency::outbox::OutboxEntry| async move {
///     println!("send {} for ref {}", m.topic, m.reference);
///     Ok::<(), idempotency::store::BoxError>(())
/// })
/// .every(Duration::from_secs(1))
/// .spawn();
/// # dispatcher.abort();
/// # }
/// ```
pub struct Dispatcher<D> {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    deliver: D,
    every: Duration,
    redeliver_after: Duration,
    max_attempts: i32,
    batch: u32,
}

impl<D, Fut> Dispatcher<D>
where
    D: Fn(OutboxEntry) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    /// A dispatcher over the engine's store: a round every second, redelivery after 60 s, at
    /// most 10 attempts per message, 100 messages per round.
    pub fn new(engine: &Idempotency, deliver: D) -> Self {
        Dispatcher {
            store: engine.store().clone(),
            clock: engine.clock().clone(),
            deliver,
            every: Duration::from_secs(1),
            redeliver_after: Duration::from_secs(60),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            batch: 100,
        }
    }

    /// How often a round runs when spawned.
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    /// How long a handed-out message waits before it is handed out again.
    pub fn redeliver_after(mut self, d: Duration) -> Self {
        self.redeliver_after = d;
        self
    }

    /// After how many handed-out attempts a message is given up (logged and acknowledged);
    /// at least 1.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = i32::try_from(n.max(1)).unwrap_or(i32::MAX);
        self
    }

    /// One round; returns how many messages were delivered and acknowledged.
    pub async fn run_once(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let due = self
            .store
            .fetch(now, now + self.redeliver_after, self.batch)
            .await?;
        let mut delivered = 0;
        for m in due {
            if m.attempts >= self.max_attempts {
                tracing::error!(reference = %m.reference, topic = %m.topic, payload = %m.payload,
                    attempts = m.attempts,
                    "idempotency outbox: giving up on a message after its last delivery attempt; it is acknowledged and will not be sent");
                self.store.ack(&m.receipt).await?;
                continue;
            }
            let (receipt, reference, topic) = (m.receipt.clone(), m.reference, m.topic.clone());
            match (self.deliver)(m).await {
                Ok(()) => {
                    self.store.ack(&receipt).await?;
                    delivered += 1;
                }
                Err(e) => {
                    tracing::warn!(%reference, topic, error = %e, "idempotency outbox delivery failed; will redeliver")
                }
            }
        }
        Ok(delivered)
    }

    /// Runs a round every [`Dispatcher::every`] (the first at once) in a background task, until
    /// the handle is aborted; a failed round is logged and retried at the next tick.
    pub fn spawn(self) -> JoinHandle<()> {
        let every = self.every;
        let this = Arc::new(self);
        spawn_periodic(every, move || {
            let this = this.clone();
            async move {
                if let Err(e) = this.run_once().await {
                    tracing::warn!(error = %e, "idempotency outbox round failed");
                }
            }
        })
    }
}
