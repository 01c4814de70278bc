//! [`RedisStore`]: the records on one Redis (or Valkey) or a Redis Cluster. Every call is one
//! round trip, whatever its answer: a claim is one transaction (`SET … NX GET` and `ZADD … NX`,
//! see `claim.rs`; a Lua script for the claims that take a record over), a completion or a
//! release a compare-and-set against the string the claim wrote (`cas.rs`: a transaction where
//! the server has `SET … IFEQ`, else a small script), every other call one Lua script. Every
//! time is on the server's clock.
//!
//! ## Keys
//!
//! A record is addressed by its reference: the key's first 8 bytes, in hex, under a hash tag
//! naming one of 256 shards (the reference's first byte). A shard's keys share a slot, so each
//! script touches one slot, and the cluster spreads the shards over its masters:
//!
//! | key | type | what |
//! |---|---|---|
//! | `{ns}:{XX}:r:<ref>` | string | the record (see `Record`): state, generation, claim time, lease or window end, completion time, key rest, token, fingerprint, tenant, subject, tool, answer |
//! | `{ns}:{XX}:i` | sorted set | the shard's records by time, in two bands: unsettled ones by lease end (unknown ones at 0), what [`unsettled`](crate::store::Maintenance::unsettled) reads; settled ones by window end - 2^50, what [`purge`](crate::store::Maintenance::purge) reads |
//! | `{ns}:{XX}:o` | stream | the shard's outbox messages (consumer group `g`) |
//! | `{ns}:{XX}:ov` | sorted set | when each handed-out message becomes visible again |
//! | `{ns}:{XX}:w:<ref>` | a channel | a settlement of a record a repeat on another process waits for (it marks the record) announces itself on it (`SPUBLISH` on a cluster), see `notices.rs` |
//! | `{ns}:secret` | string | the fingerprint of the secret the keys are made with (see [`SecretStore`](crate::store::SecretStore)) |
//!
//! One index with two bands rather than two indexes: a completion moves its record's entry with
//! one `ZADD` instead of a `ZREM` from one and a `ZADD` to the other.
//!
//! A settled record expires by itself (`SET … PXAT`) at its window end plus the retention; an
//! in-flight or unknown one never expires.
//!
//! ## Time
//!
//! Replicas' clocks disagree, so every script reads the server's `TIME` and shifts each time of
//! the call by `TIME - now` (see [Time](crate::store#time)); a claim without a script writes the
//! server's time as a reading of it taken less than two seconds before bounds it (`clock.rs`).
//! The times a claim or the reconciler reads come back shifted into the caller's frame,
//! [`status`](crate::store::RecordStore::status) reports the server's.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::{Claim, ClaimRequest, Completion, Settlement, StoreError, Token, DEFAULT_RETENTION};
use crate::clock::Timestamp;

mod acks;
mod admin;
mod background;
mod builder;
mod cas;
mod claim;
mod clock;
mod conn;
mod fenced;
mod notices;
mod record;
mod record_store;
mod secret;

pub use builder::RedisStoreBuilder;
pub use conn::RedisConnection;
use conn::{Replicas, ReplicationShortfall, Script};

/// How many shards the records are spread over (one hash tag each).
const SHARDS: usize = 256;

struct Scripts {
    claim: Script,
    count: Script,
    fenced: Script,
    unsettled: Script,
    purge: Script,
    fetch: Script,
    ack: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            claim: Script::new(include_str!("scripts/claim.lua")),
            count: Script::new(include_str!("scripts/purgeable.lua")),
            fenced: Script::new(include_str!("scripts/fenced.lua")),
            unsettled: Script::new(include_str!("scripts/unsettled.lua")),
            purge: Script::new(include_str!("scripts/purge.lua")),
            fetch: Script::new(include_str!("scripts/fetch.lua")),
            ack: Script::new(include_str!("scripts/ack.lua")),
        }
    }
}

/// A [`Store`](super::Store) on Redis or Valkey: one server, or a Redis Cluster.
///
/// ```no_run
/// # async fn demo() -> Result<(), idempotency::store::StoreError> {
/// use std::time::Duration;
/// use idempotency::{store::RedisStore, Idempotency};
/// // One Redis:
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// // A cluster, from seed nodes; a claim and a completion wait for one replica (the default
/// // whenever the masters have replicas), here at most 100 ms:
/// let store = RedisStore::builder()
///     .replica_ack_timeout(Duration::from_millis(100))
///     .connect_cluster(&["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
///     .await?;
/// let engine = Idempotency::new(store);
/// # let _ = engine; Ok(()) }
/// ```
///
/// ## Durability
///
/// Redis replicates asynchronously: a master that fails over may lose a write it acknowledged,
/// and a claim lost that way lets a repeat run the body again. So, by default, when the master
/// has a replica (checked at connect, and once a second while none was seen), a claim that
/// created or took over a record and a completion, release or settlement are followed by
/// `WAIT 1 250` on the same connection: no replica's acknowledgement within 250 ms fails the
/// claim ("nothing was done"; the claim is released) and the completion (the engine reports
/// the outcome unknown; a repeat finds it completed or in progress, never runs it again). Once
/// a replica was seen the store keeps waiting for one, refusing claims while the master has
/// none. [`wait_for_replicas`](RedisStoreBuilder::wait_for_replicas) asks for more replicas;
/// [`without_replica_acks_may_lose_claims_on_failover`](RedisStoreBuilder::without_replica_acks_may_lose_claims_on_failover)
/// turns the wait off. On a cluster the store waits as soon as any master has a replica, so a
/// master without one refuses its claims.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: RedisConnection,
    /// Whether writes wait for replicas, and the connections they use (in turn).
    acks: acks::Acks,
    /// The claim strings for completions and releases by compare-and-set.
    cas: cas::Cas,
    /// Whether claims go by `SET … NX GET` (see `claim.rs`), until the server refuses it.
    set_nx_get: AtomicBool,
    /// The server's clock, followed for those claims.
    clock: Arc<clock::ServerClock>,
    next_waiting: AtomicUsize,
    namespace: String,
    retention_ms: i64,
    trusted: &'static [u8],
    scripts: Scripts,
    next_shard: AtomicUsize,
    /// Settlement notices for waiting repeats.
    notices: notices::Notices,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("connection", &self.inner.conn)
            .field("namespace", &self.inner.namespace)
            .field("retention_ms", &self.inner.retention_ms)
            .field("acks", &self.inner.acks)
            .field("cas", &self.inner.cas)
            .finish()
    }
}

/// A record's shard: the reference's first byte.
fn shard_of(prefix: &[u8; 8]) -> usize {
    usize::from(prefix[0])
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    push_hex(&mut s, bytes);
    s
}

fn push_hex(s: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
}

fn unhex(s: &[u8]) -> Option<Vec<u8>> {
    let val = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks(2)
        .map(|p| Some((val(p[0])? << 4) | val(p[1])?))
        .collect()
}

/// The keys of one record's shard.
struct ShardKeys {
    /// The shard (see [`shard_of`]).
    shard: usize,
    record: String,
    index: String,
    /// The channel that announces the record's settlement to a repeat waiting on another
    /// process (see `notices.rs`).
    watch: String,
}

impl ShardKeys {
    /// The shard's outbox stream (only the fenced script writes it, so it is made there).
    fn outbox(&self) -> String {
        let mut s = String::with_capacity(self.index.len());
        s.push_str(self.index.strip_suffix('i').unwrap_or(&self.index));
        s.push('o');
        s
    }

    /// The record's index member: its key's last 16 bytes (the scripts take it so too).
    fn member(&self) -> &str {
        &self.record[self.record.len().saturating_sub(16)..]
    }

    /// The shard, routed by its index key (for reading its master's clock).
    fn route(&self) -> clock::Route<'_> {
        clock::Route {
            shard: self.shard,
            key: &self.index,
        }
    }
}

impl Inner {
    fn shard_base(&self, shard: usize) -> String {
        format!("{}:{{{shard:02x}}}", self.namespace)
    }

    /// The prefix of a shard's record keys (a record is this + its index member).
    fn record_prefix(&self, shard: usize) -> String {
        format!("{}:r:", self.shard_base(shard))
    }

    /// A record's keys; the scripts take the index member from the record key's last 16 bytes.
    fn keys(&self, prefix: &[u8; 8]) -> ShardKeys {
        // Each call makes these twice (claim, completion): one exact allocation per key, no
        // formatting machinery (`format!` here was about 6% of a fresh call's client CPU).
        let key = |kind: &str, reference: &[u8]| {
            let mut s = String::with_capacity(
                self.namespace.len() + ":{xx}".len() + kind.len() + 2 * reference.len(),
            );
            s.push_str(&self.namespace);
            s.push_str(":{");
            push_hex(&mut s, &prefix[..1]);
            s.push('}');
            s.push_str(kind);
            push_hex(&mut s, reference);
            s
        };
        ShardKeys {
            shard: shard_of(prefix),
            record: key(":r:", prefix),
            index: key(":i", &[]),
            watch: key(":w:", prefix),
        }
    }

    /// What a write waits for now.
    fn wait(&self) -> Option<Replicas> {
        self.acks.now(&self.conn)
    }

    /// The connection for a script: one of the waiting ones when it is followed by `WAIT`.
    async fn conn_for(&self, wait: Option<Replicas>) -> Result<&RedisConnection, StoreError> {
        if wait.is_none() {
            return Ok(&self.conn);
        }
        let waiting = self.acks.connections().await?;
        Ok(
            match waiting
                .get(self.next_waiting.fetch_add(1, Ordering::Relaxed) % waiting.len().max(1))
            {
                Some(c) => c,
                None => &self.conn,
            },
        )
    }

    /// Fails a write that too few replicas acknowledged.
    fn replicated(wait: Option<Replicas>, acked: Option<i64>) -> Result<(), StoreError> {
        match (wait, acked) {
            (Some(w), Some(n)) if n < i64::from(w.count) => {
                Err(StoreError::Unavailable(Box::new(ReplicationShortfall {
                    acked: n,
                    wanted: w.count,
                    timeout: w.timeout,
                })))
            }
            (Some(w), None) => Err(StoreError::Unavailable(Box::new(ReplicationShortfall {
                acked: 0,
                wanted: w.count,
                timeout: w.timeout,
            }))),
            _ => Ok(()),
        }
    }
}

fn ms(t: Timestamp) -> Vec<u8> {
    t.as_millis().to_string().into_bytes()
}

impl RedisStore {
    /// The store's connection, for commands of your own on the same connections.
    pub fn connection(&self) -> RedisConnection {
        self.inner.conn.clone()
    }

    /// The shards in the order a sequential walk visits them, starting at a rotating one (so
    /// a walk that stops at its limit does not always favour the first shards).
    fn shard_walk(&self) -> impl Iterator<Item = usize> + use<> {
        let start = self.inner.next_shard.fetch_add(1, Ordering::Relaxed) % SHARDS;
        (0..SHARDS).map(move |i| (start + i) % SHARDS)
    }
}
