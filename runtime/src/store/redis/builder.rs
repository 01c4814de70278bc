//! Connecting the Redis store: `RedisStoreBuilder` (namespace, retention, replica
//! acknowledgement) and the connections to one Redis or a Redis Cluster.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;

use super::acks::{AckMode, Acks, Connector, DEFAULT_ACK_TIMEOUT};
use super::cas::Cas;
use super::clock::{Route, ServerClock};
use super::conn::{Conn, Replicas, CONNECT_TIMEOUT, RESPONSE_TIMEOUT};
use super::{notices, Inner, RedisConnection, RedisStore, Scripts, StoreError, DEFAULT_RETENTION};

/// Configures a [`RedisStore`]; [`connect`](RedisStoreBuilder::connect) or
/// [`connect_cluster`](RedisStoreBuilder::connect_cluster) finishes it.
#[derive(Clone, Debug)]
pub struct RedisStoreBuilder {
    namespace: String,
    retention: Duration,
    acks: AckMode,
    trusted: bool,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        RedisStoreBuilder {
            namespace: "idem".into(),
            retention: DEFAULT_RETENTION,
            acks: AckMode::Auto(DEFAULT_ACK_TIMEOUT),
            trusted: false,
        }
    }
}

impl RedisStoreBuilder {
    /// The prefix of every key the store writes (default `idem`), so several applications can
    /// share one Redis. It must not contain `{` or `}` (they would change the hash tag).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// How long a settled record stays after its window ends before Redis expires it (default
    /// [`DEFAULT_RETENTION`]).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// After a claim that wrote and after a completion, release or settlement, always waits
    /// (`WAIT`) until `replicas` replicas of the record's master acknowledged it, at most
    /// `timeout`; a shortfall fails the call (see [Durability](RedisStore#durability)). Without
    /// this, the store waits for one replica, at most 250 ms, whenever the master has one.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.acks = AckMode::Fixed(Replicas {
            count: replicas,
            timeout,
        });
        self
    }

    /// How long a write waits for the master's replica by default (250 ms unless set): at
    /// most this long, then the claim is refused or the completion reported unknown.
    pub fn replica_ack_timeout(mut self, timeout: Duration) -> Self {
        self.acks = match self.acks {
            AckMode::Fixed(r) => AckMode::Fixed(Replicas { timeout, ..r }),
            _ => AckMode::Auto(timeout),
        };
        self
    }

    /// Never waits for replicas, even when the master has them. A claim or a completion the
    /// master acknowledged but had not yet sent to its replica is lost if the master fails
    /// over: a repeat on the promoted replica then runs the body a second time. For a Redis
    /// that never fails over, or calls whose second run is harmless.
    pub fn without_replica_acks_may_lose_claims_on_failover(mut self) -> Self {
        self.acks = AckMode::Off;
        self
    }

    /// Test only: decide by the times the engine passes instead of the server's clock, so a
    /// test can move time by hand (`ManualClock`) and hit window edges exactly. Never use it
    /// with replicas whose clocks may disagree.
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn trust_engine_clock(mut self) -> Self {
        self.trusted = true;
        self
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.namespace.is_empty() || self.namespace.contains(['{', '}']) {
            return Err(StoreError::Config {
                problem: format!(
                    "the Redis namespace {:?} must be non-empty and contain no braces (they set the hash tag)",
                    self.namespace
                ),
                source: None,
            });
        }
        let timeout = match self.acks {
            AckMode::Fixed(r) => Some(r.timeout),
            AckMode::Auto(t) => Some(t),
            AckMode::Off => None,
        };
        if let Some(timeout) = timeout
            && (timeout.is_zero() || timeout >= RESPONSE_TIMEOUT)
        {
            return Err(StoreError::Config {
                    problem: format!(
                        "the WAIT timeout must be above zero (zero waits forever) and below the {RESPONSE_TIMEOUT:?} response timeout"
                    ),
                    source: None,
                });
        }
        Ok(())
    }

    /// Connects to one Redis at `url` (`redis://host:port/db`, `rediss://` for TLS is not
    /// built in).
    pub async fn connect(self, url: &str) -> Result<RedisStore, StoreError> {
        self.check()?;
        let client = redis::Client::open(url).map_err(|e| StoreError::Config {
            problem: format!(
                "the Redis URL {:?} is not usable",
                super::super::error::redact(url)
            ),
            source: Some(Box::new(e)),
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(2);
        let unreachable = |e| {
            StoreError::Unavailable(Box::new(Unreachable {
                what: format!("Redis at {}", super::super::error::redact(url)),
                source: e,
            }))
        };
        let conn = ConnectionManager::new_with_config(client.clone(), config.clone())
            .await
            .map_err(unreachable)?;
        let conn = RedisConnection(Conn::Single(conn));
        let acks = Acks::start(self.acks, &conn, Connector::Single(client.clone(), config)).await?;
        let cas = Cas::detect(&conn, &self.probe_key()).await;
        let store = self.finish(conn, acks, cas, notices::Source::Single(client));
        // The first reading of the server's clock, so the first claims need no script (on a
        // cluster, each shard's master is read at its first claim). Without it, they use one.
        let route = Route { shard: 0, key: "" };
        let _ = store.inner.clock.read(&store.inner.conn, route).await;
        Ok(store)
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://host:port` each); the
    /// client learns the rest of the cluster from them and follows MOVED and ASK redirections.
    pub async fn connect_cluster(self, seeds: &[&str]) -> Result<RedisStore, StoreError> {
        self.check()?;
        let client = ClusterClientBuilder::new(seeds.iter().copied())
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(RESPONSE_TIMEOUT)
            .build()
            .map_err(|e| StoreError::Config {
                problem: format!("the Redis Cluster seed nodes {seeds:?} are not usable"),
                source: Some(Box::new(e)),
            })?;
        let unreachable = |e| {
            StoreError::Unavailable(Box::new(Unreachable {
                what: format!(
                    "no node of the Redis Cluster seeded by {:?} answered",
                    seeds
                        .iter()
                        .map(|s| super::super::error::redact(s))
                        .collect::<Vec<_>>()
                ),
                source: e,
            }))
        };
        let conn = client.get_async_connection().await.map_err(unreachable)?;
        let conn = RedisConnection(Conn::Cluster(conn));
        let acks = Acks::start(self.acks, &conn, Connector::Cluster(client)).await?;
        let cas = Cas::detect(&conn, &self.probe_key()).await;
        Ok(self.finish(
            conn,
            acks,
            cas,
            notices::Source::Cluster(seeds.iter().map(|s| (*s).to_owned()).collect()),
        ))
    }

    /// A key no record uses, for asking the server what it has.
    fn probe_key(&self) -> String {
        format!("{}:probe", self.namespace)
    }

    fn finish(
        self,
        conn: RedisConnection,
        acks: Acks,
        cas: Cas,
        source: notices::Source,
    ) -> RedisStore {
        let clock = Arc::new(ServerClock::new(matches!(
            source,
            notices::Source::Cluster(_)
        )));
        RedisStore {
            inner: Arc::new(Inner {
                conn,
                acks,
                cas,
                set_nx_get: AtomicBool::new(true),
                clock,
                next_waiting: AtomicUsize::new(0),
                namespace: self.namespace,
                retention_ms: i64::try_from(self.retention.as_millis()).unwrap_or(i64::MAX / 4),
                trusted: if self.trusted { b"1" } else { b"0" },
                scripts: Scripts::new(),
                next_shard: AtomicUsize::new(0),
                notices: notices::Notices::new(source),
            }),
        }
    }
}

impl RedisStore {
    /// A builder: namespace, retention, replica acknowledgement.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// Connects to one Redis at `url` with the defaults (see [`RedisStore::builder`]).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::builder().connect(url).await
    }

    /// Connects to a Redis Cluster through `seeds` with the defaults.
    pub async fn connect_cluster(seeds: &[&str]) -> Result<Self, StoreError> {
        Self::builder().connect_cluster(seeds).await
    }
}

/// The store could not reach Redis when it started.
#[derive(Debug, thiserror::Error)]
#[error("could not connect: {what}")]
struct Unreachable {
    what: String,
    #[source]
    source: redis::RedisError,
}
