//! Whether the store's writes wait for a replica (`WAIT`), and the connections those writes use.
//!
//! By default the store looks at the master when it connects (`INFO replication` on one Redis,
//! `CLUSTER NODES` on a cluster) and, while it has seen no replica, again at most once a
//! second as it writes. Once it has seen one it keeps waiting for one: a master that lost its
//! replica then refuses claims until one is back, rather than acknowledging writes a failover
//! would lose.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;

use super::conn::{bytes, redis_error, Conn, Replicas};
use super::{RedisConnection, StoreError};

/// How long a write waits for its replica by default. A replica on the same network
/// acknowledges in well under a millisecond; 250 ms rides out a replica's pause (a fork for a
/// snapshot, a busy second) without refusing, and bounds what a refused call costs its caller.
pub(super) const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_millis(250);
/// How often a store that has seen no replica looks again.
const RECHECK: Duration = Duration::from_secs(1);
/// Connections for writes followed by `WAIT` (which blocks its connection until the replicas
/// answer, holding up whatever else is pipelined on it), so other calls never queue behind a
/// `WAIT` and concurrent waits do not queue behind each other.
const WAIT_CONNECTIONS: usize = 8;

/// What the builder was told.
#[derive(Clone, Copy, Debug)]
pub(super) enum AckMode {
    /// Wait for one replica when the master has any (the default).
    Auto(Duration),
    /// Always wait for this many.
    Fixed(Replicas),
    /// Never wait.
    Off,
}

/// How to open more connections to the same Redis or cluster.
pub(super) enum Connector {
    Single(redis::Client, ConnectionManagerConfig),
    Cluster(ClusterClient),
}

impl Connector {
    async fn open(&self) -> Result<RedisConnection, StoreError> {
        Ok(RedisConnection(match self {
            Connector::Single(client, config) => Conn::Single(
                ConnectionManager::new_with_config(client.clone(), config.clone())
                    .await
                    .map_err(redis_error)?,
            ),
            Connector::Cluster(client) => {
                Conn::Cluster(client.get_async_connection().await.map_err(redis_error)?)
            }
        }))
    }
}

/// The store's replica acknowledgement: the mode, what was seen, the waiting connections.
pub(super) struct Acks {
    mode: AckMode,
    /// `Auto` only: a replica was seen.
    seen: Arc<AtomicBool>,
    /// `Auto` only: when the master was last looked at (ms since `born`).
    checked: AtomicU64,
    born: Instant,
    connector: Connector,
    waiting: tokio::sync::OnceCell<Vec<RedisConnection>>,
}

impl std::fmt::Debug for Acks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acks")
            .field("mode", &self.mode)
            .field("replica_seen", &self.seen.load(Ordering::Relaxed))
            .finish()
    }
}

impl Acks {
    /// Looks at the master once (`Auto`) and opens the waiting connections if writes wait.
    pub(super) async fn start(
        mode: AckMode,
        conn: &RedisConnection,
        connector: Connector,
    ) -> Result<Acks, StoreError> {
        let seen = match mode {
            AckMode::Auto(_) => has_replicas(conn).await?,
            _ => false,
        };
        let acks = Acks {
            mode,
            seen: Arc::new(AtomicBool::new(seen)),
            checked: AtomicU64::new(0),
            born: Instant::now(),
            connector,
            waiting: tokio::sync::OnceCell::new(),
        };
        if acks.now(conn).is_some() {
            acks.connections().await?;
        }
        Ok(acks)
    }

    /// What a write waits for now. In `Auto` without a replica seen, looks again (in the
    /// background, at most once per [`RECHECK`]) through `conn`.
    pub(super) fn now(&self, conn: &RedisConnection) -> Option<Replicas> {
        match self.mode {
            AckMode::Off => None,
            AckMode::Fixed(r) => Some(r),
            AckMode::Auto(timeout) => {
                if self.seen.load(Ordering::Relaxed) {
                    return Some(Replicas { count: 1, timeout });
                }
                self.recheck(conn);
                None
            }
        }
    }

    fn recheck(&self, conn: &RedisConnection) {
        let at = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.checked.load(Ordering::Relaxed);
        let due = at.saturating_sub(last) >= RECHECK.as_millis() as u64;
        if !due
            || self
                .checked
                .compare_exchange(last, at, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let (conn, seen) = (conn.clone(), self.seen.clone());
        tokio::spawn(async move {
            match has_replicas(&conn).await {
                Ok(true) => {
                    tracing::info!("idempotency: the Redis master has a replica now; claims and completions wait for it from here on");
                    seen.store(true, Ordering::Relaxed);
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "idempotency: could not tell whether the Redis master has replicas");
                }
            }
        });
    }

    /// The connections for writes that wait, opened the first time.
    pub(super) async fn connections(&self) -> Result<&[RedisConnection], StoreError> {
        self.waiting
            .get_or_try_init(|| async {
                let mut all = Vec::with_capacity(WAIT_CONNECTIONS);
                for _ in 0..WAIT_CONNECTIONS {
                    all.push(self.connector.open().await?);
                }
                Ok(all)
            })
            .await
            .map(Vec::as_slice)
    }
}

/// Whether the master (one Redis) or any master (a cluster) has a connected replica.
async fn has_replicas(conn: &RedisConnection) -> Result<bool, StoreError> {
    let unreadable = |e: StoreError| {
        match e {
        StoreError::Config { source, .. } => StoreError::Config {
            problem: "the store cannot tell whether the Redis master has replicas (INFO or CLUSTER NODES was refused); allow those commands, or choose RedisStoreBuilder::wait_for_replicas or without_replica_acks_may_lose_claims_on_failover".into(),
            source,
        },
        other => other,
    }
    };
    match conn.0 {
        Conn::Single(_) => {
            let info = bytes(
                conn.query(redis::cmd("INFO").arg("replication"))
                    .await
                    .map_err(unreadable)?,
            )?;
            Ok(connected_replicas(&String::from_utf8_lossy(&info)) > 0)
        }
        Conn::Cluster(_) => {
            let nodes = bytes(
                conn.query(redis::cmd("CLUSTER").arg("NODES"))
                    .await
                    .map_err(unreadable)?,
            )?;
            Ok(cluster_has_replica(&String::from_utf8_lossy(&nodes)))
        }
    }
}

/// `connected_slaves:N` of `INFO replication` (0 on a replica, which has none of its own).
fn connected_replicas(info: &str) -> u64 {
    info.lines()
        .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Whether `CLUSTER NODES` lists a replica that is connected and not failed.
fn cluster_has_replica(nodes: &str) -> bool {
    nodes.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flags = fields.get(2).copied().unwrap_or("");
        let link = fields.get(7).copied().unwrap_or("");
        flags.split(',').any(|f| f == "slave")
            && !flags.split(',').any(|f| f == "fail" || f == "fail?")
            && link == "connected"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_are_read_from_info_and_cluster_nodes() {
        let master = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\nslave0:ip=127.0.0.1,port=7001,state=online,offset=10,lag=0\r\n";
        assert_eq!(connected_replicas(master), 1);
        assert_eq!(
            connected_replicas("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"),
            0
        );
        assert_eq!(connected_replicas("role:slave\r\n"), 0);
        let nodes = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                     b2 127.0.0.1:7003@17003 slave a1 0 1700000000000 1 connected\n";
        assert!(cluster_has_replica(nodes));
        let failed = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                      b2 127.0.0.1:7003@17003 slave,fail a1 0 1700000000000 1 disconnected\n";
        assert!(!cluster_has_replica(failed));
        assert!(!cluster_has_replica(
            "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-16383\n"
        ));
    }
}
