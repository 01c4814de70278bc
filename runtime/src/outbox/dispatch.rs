//! The [`Dispatcher`]: delivers outbox messages at least once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::engine::Idempotency;
use crate::periodic::spawn_periodic;
use crate::store::OutboxEntry;
use crate::store::{BoxError, Store, StoreError};

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
/// let dispatcher = Dispatcher::new(&engine, |m: idempotency::store::OutboxEntry| async move {
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

impl<D> std::fmt::Debug for Dispatcher<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("every", &self.every)
            .field("redeliver_after", &self.redeliver_after)
            .field("max_attempts", &self.max_attempts)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
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
                true
            }
        })
    }
}
