//! Settlement notices for repeats that wait (`wait`) on a call another process runs: one
//! subscribing connection per store, opened at the first wait, and a mark on the record.
//!
//! A waiting repeat subscribes to its record's channel (`{ns}:{XX}:w:<ref>`; a shard channel,
//! `SSUBSCRIBE`, on a cluster, so the notice stays on the record's node), then marks the record
//! as watched while it is in flight (`watch.lua`: 1.0 in its unused completion time). A marked
//! record is no longer the string its claim wrote, so its completion or release does not go by
//! compare-and-set (`cas.rs`) but by the fenced script, which settles it and publishes on the
//! channel, and the subscriber wakes the repeats waiting on it here. The order closes every
//! gap: a settlement before the mark is seen by the repeat's next read of the record (the mark
//! finds it settled and is not written); one after it finds the mark and publishes to a
//! connection that is already subscribed. A record nobody waits on costs its settlement
//! nothing: no key to delete, no notice.
//!
//! The subscribing connection is a connection of its own (RESP3), resubscribed by the client
//! after a reconnection; when it drops, everything waiting is woken to read its record again (a
//! notice may have been missed). A channel stays subscribed while repeats wait on it and is
//! given up at a later wait once they are gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::conn::{redis_error, Script, CONNECT_TIMEOUT, RESPONSE_TIMEOUT};
use super::{RedisConnection, ShardKeys};
use crate::store::{StoreError, Wake};

/// Where the subscribing connection goes.
pub(super) enum Source {
    Single(redis::Client),
    Cluster(Vec<String>),
}

/// A store's notices: nothing until the first wait, then a subscribing connection.
pub(super) struct Notices {
    source: Source,
    listening: tokio::sync::OnceCell<Arc<Listening>>,
    /// `watch.lua`: marks a record as watched.
    mark: Script,
}

impl Notices {
    pub(super) fn new(source: Source) -> Self {
        Notices {
            source,
            listening: tokio::sync::OnceCell::new(),
            mark: Script::new(include_str!("scripts/watch.lua")),
        }
    }
}

/// The subscribing side.
struct Listening {
    sub: Sub,
    /// (Un)subscriptions one at a time, so that giving a channel up never overtakes a new
    /// subscription to it.
    ops: tokio::sync::Mutex<()>,
    /// By channel: the repeats waiting on it here, and whether it is subscribed.
    waiting: Mutex<HashMap<String, Vec<Wake>>>,
    task: tokio::task::AbortHandle,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
enum Sub {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Sub {
    async fn subscribe(&self, channel: &str) -> redis::RedisResult<()> {
        match self.clone() {
            Sub::Single(mut c) => c.subscribe(channel).await,
            Sub::Cluster(mut c) => c.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&self, channels: &[String]) -> redis::RedisResult<()> {
        match self.clone() {
            Sub::Single(mut c) => c.unsubscribe(channels).await,
            Sub::Cluster(mut c) => c.sunsubscribe(channels).await,
        }
    }
}

impl Listening {
    /// Wakes the repeats waiting on `channel`.
    fn heard(&self, channel: &[u8]) {
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        for wake in waiting.get(channel).into_iter().flatten() {
            wake.wake();
        }
    }

    /// Wakes everyone: a notice may have been missed.
    fn wake_all(&self) {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        for wake in waiting.values().flatten() {
            wake.wake();
        }
    }

    /// Adds `wake` on `channel`; answers whether the channel is new here, and the channels
    /// whose repeats are all gone (taken out).
    fn add(&self, channel: &str, wake: Wake) -> (bool, Vec<String>) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let mut gone = Vec::new();
        waiting.retain(|c, wakes| {
            wakes.retain(|w| !w.is_gone());
            let keep = !wakes.is_empty() || c == channel;
            if !keep {
                gone.push(c.clone());
            }
            keep
        });
        let wakes = waiting.entry(channel.to_owned()).or_default();
        let fresh = wakes.is_empty();
        wakes.push(wake);
        (fresh, gone)
    }
}

impl Notices {
    /// See [`RecordStore::watch`](crate::store::RecordStore::watch): marks the record of `k`
    /// and waits on its settlement channel.
    pub(super) async fn watch(
        &self,
        conn: &RedisConnection,
        k: &ShardKeys,
        wake: Wake,
    ) -> Result<bool, StoreError> {
        let (record, channel) = (k.record.as_str(), k.watch.as_str());
        let listening = match self.listening.get_or_try_init(|| self.listen()).await {
            Ok(l) => l,
            Err(e) => {
                // The waiting repeat reads its record now and then instead.
                tracing::debug!(error = %e, "idempotency: could not subscribe to settlement notices");
                return Ok(false);
            }
        };
        {
            let _one_at_a_time = listening.ops.lock().await;
            let (fresh, gone) = listening.add(channel, wake);
            if !gone.is_empty()
                && let Err(e) = listening.sub.unsubscribe(&gone).await
            {
                tracing::debug!(error = %e, "idempotency: could not give up settlement channels");
            }
            if fresh && let Err(e) = listening.sub.subscribe(channel).await {
                listening
                    .waiting
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(channel);
                return Err(redis_error(e));
            }
        }
        // Subscribed: now the mark, so a settlement from here on announces.
        let (marked, _) = conn.run(&self.mark, &[record], &[], None).await?;
        // Not in flight (any more): no settlement will announce; the repeat's next read tells.
        Ok(marked == Value::Int(1))
    }

    /// Opens the subscribing connection and starts the task that reads its pushes.
    async fn listen(&self) -> Result<Arc<Listening>, StoreError> {
        let (tx, rx) = unbounded_channel();
        let sub = match &self.source {
            Source::Single(client) => {
                let info = client.get_connection_info().clone();
                let settings = info
                    .redis_settings()
                    .clone()
                    .set_protocol(ProtocolVersion::RESP3);
                let client =
                    redis::Client::open(info.set_redis_settings(settings)).map_err(redis_error)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_push_sender(tx)
                    .set_automatic_resubscription();
                Sub::Single(
                    ConnectionManager::new_with_config(client, config)
                        .await
                        .map_err(redis_error)?,
                )
            }
            Source::Cluster(seeds) => Sub::Cluster(
                ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(RESPONSE_TIMEOUT)
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(tx)
                    .build()
                    .map_err(redis_error)?
                    .get_async_connection()
                    .await
                    .map_err(redis_error)?,
            ),
        };
        Ok(Arc::new_cyclic(|me| {
            let task = tokio::spawn(read(rx, me.clone())).abort_handle();
            Listening {
                sub,
                ops: tokio::sync::Mutex::new(()),
                waiting: Mutex::default(),
                task,
            }
        }))
    }
}

/// Reads the pushes until the store is gone.
async fn read(mut rx: UnboundedReceiver<PushInfo>, listening: std::sync::Weak<Listening>) {
    while let Some(push) = rx.recv().await {
        let Some(l) = listening.upgrade() else { return };
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(Value::BulkString(channel)) = push.data.first() {
                    l.heard(channel);
                }
            }
            // Reconnected (and resubscribed) by the client: a notice may have been missed.
            PushKind::Disconnection => l.wake_all(),
            _ => {}
        }
    }
}

impl std::fmt::Debug for Notices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notices")
            .field("listening", &self.listening.initialized())
            .finish()
    }
}
