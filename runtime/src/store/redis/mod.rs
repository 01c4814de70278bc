//! [`RedisStore`]: the records on one Redis (or Valkey) or a Redis Cluster. Every call is one
//! Lua script, so one round trip, whatever its answer; every script runs on the server's clock.
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
//! | `{ns}:{XX}:w:<ref>` | string, and a channel | set (with an expiry) while a repeat on another process waits for the record; a settlement deletes it and announces itself on the channel of that name (`SPUBLISH` on a cluster), see `notices.rs` |
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
//! the call by `TIME - now` (see [Time](crate::store#time)); the times a claim or the reconciler
//! reads come back shifted into the caller's frame, [`status`](crate::store::RecordStore::status)
//! reports the server's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::Value;

use super::{
    BoxFuture, Claim, ClaimRequest, Completion, RecordStore, Settlement, StoreError, Token, Wake,
    DEFAULT_RETENTION,
};
use crate::clock::Timestamp;
use crate::key::{Key, Reference};
use crate::record::{RecordState, RecordStatus, StoredResponse};

mod admin;
mod background;
mod conn;
mod notices;
mod secret;

pub use conn::RedisConnection;
use conn::{array, bad, bytes, int, text, Conn, Replicas, ReplicationShortfall, Script};

/// How many shards the records are spread over (one hash tag each).
const SHARDS: usize = 256;

/// How long a command may take before the store gives up on it (a node that does not answer).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections for writes followed by `WAIT` (which blocks its connection until the replicas
/// answer, holding up whatever else is pipelined on it), so other calls never queue behind a
/// `WAIT` and concurrent waits do not queue behind each other.
const WAIT_CONNECTIONS: usize = 8;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The state codes of the records (the SQL stores' codes).
const IN_FLIGHT: i64 = 0;
const COMPLETED_OK: i64 = 1;
const UNKNOWN: i64 = 2;
const RELEASED: i64 = 3;
const COMPLETED_ERR: i64 = 4;

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
/// // A cluster, from seed nodes; a claim and a completion wait for one replica:
/// let store = RedisStore::builder()
///     .wait_for_replicas(1, Duration::from_millis(100))
///     .connect_cluster(&["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
///     .await?;
/// let engine = Idempotency::new(store);
/// # let _ = engine; Ok(()) }
/// ```
///
/// ## Durability
///
/// Redis replicates asynchronously: a master that fails over may lose a write it acknowledged.
/// Without [`wait_for_replicas`](RedisStoreBuilder::wait_for_replicas), a claim lost that way
/// lets a repeat run the body again. With it, a claim that created or took over a record and a
/// completion (or settlement) are followed by `WAIT` on the same connection: fewer replicas than
/// required within the timeout fails the claim ("nothing was done", and the claim is released)
/// and the completion (the engine reports the outcome unknown).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: RedisConnection,
    /// With `wait`: the connections the writes that wait use, in turn.
    waiting: Vec<RedisConnection>,
    next_waiting: AtomicUsize,
    namespace: String,
    retention_ms: i64,
    wait: Option<Replicas>,
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
            .field("wait", &self.inner.wait)
            .finish()
    }
}

/// Configures a [`RedisStore`]; [`connect`](RedisStoreBuilder::connect) or
/// [`connect_cluster`](RedisStoreBuilder::connect_cluster) finishes it.
#[derive(Clone, Debug)]
pub struct RedisStoreBuilder {
    namespace: String,
    retention: Duration,
    wait: Option<Replicas>,
    trusted: bool,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        RedisStoreBuilder {
            namespace: "idem".into(),
            retention: DEFAULT_RETENTION,
            wait: None,
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

    /// After a claim that wrote and after a completion or settlement, waits (`WAIT`) until
    /// `replicas` replicas of the record's master acknowledged it, at most `timeout`; a
    /// shortfall fails the call (see [Durability](RedisStore#durability)).
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait = Some(Replicas {
            count: replicas,
            timeout,
        });
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
        if let Some(w) = self.wait {
            if w.timeout.is_zero() || w.timeout >= RESPONSE_TIMEOUT {
                return Err(StoreError::Config {
                    problem: format!(
                        "the WAIT timeout must be above zero (zero waits forever) and below the {RESPONSE_TIMEOUT:?} response timeout"
                    ),
                    source: None,
                });
            }
        }
        Ok(())
    }

    /// Connects to one Redis at `url` (`redis://host:port/db`, `rediss://` for TLS is not
    /// built in).
    pub async fn connect(self, url: &str) -> Result<RedisStore, StoreError> {
        self.check()?;
        let client = redis::Client::open(url).map_err(|e| StoreError::Config {
            problem: format!("the Redis URL {url:?} is not usable"),
            source: Some(Box::new(e)),
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(2);
        let unreachable = |e| {
            StoreError::Unavailable(Box::new(Unreachable {
                what: format!("Redis at {url}"),
                source: e,
            }))
        };
        let conn = ConnectionManager::new_with_config(client.clone(), config.clone())
            .await
            .map_err(unreachable)?;
        let mut waiting = Vec::new();
        for _ in 0..self.wait.map_or(0, |_| WAIT_CONNECTIONS) {
            let c = ConnectionManager::new_with_config(client.clone(), config.clone())
                .await
                .map_err(unreachable)?;
            waiting.push(Conn::Single(c));
        }
        Ok(self.finish(Conn::Single(conn), waiting, notices::Source::Single(client)))
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
                what: format!("no node of the Redis Cluster seeded by {seeds:?} answered"),
                source: e,
            }))
        };
        let conn = client.get_async_connection().await.map_err(unreachable)?;
        let mut waiting = Vec::new();
        for _ in 0..self.wait.map_or(0, |_| WAIT_CONNECTIONS) {
            waiting.push(Conn::Cluster(
                client.get_async_connection().await.map_err(unreachable)?,
            ));
        }
        Ok(self.finish(
            Conn::Cluster(conn),
            waiting,
            notices::Source::Cluster(seeds.iter().map(|s| (*s).to_owned()).collect()),
        ))
    }

    fn finish(self, conn: Conn, waiting: Vec<Conn>, source: notices::Source) -> RedisStore {
        RedisStore {
            inner: Arc::new(Inner {
                conn: RedisConnection(conn),
                waiting: waiting.into_iter().map(RedisConnection).collect(),
                next_waiting: AtomicUsize::new(0),
                namespace: self.namespace,
                retention_ms: i64::try_from(self.retention.as_millis()).unwrap_or(i64::MAX / 4),
                wait: self.wait,
                trusted: if self.trusted { b"1" } else { b"0" },
                scripts: Scripts::new(),
                next_shard: AtomicUsize::new(0),
                notices: notices::Notices::new(source),
            }),
        }
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

/// A record's shard: the reference's first byte.
fn shard_of(prefix: &[u8; 8]) -> usize {
    usize::from(prefix[0])
}

fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
    s
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
    record: String,
    index: String,
    outbox: String,
    /// Set while a repeat on another process waits for the record; also the name of the
    /// channel that announces its settlement (see `notices.rs`).
    watch: String,
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
        let base = self.shard_base(shard_of(prefix));
        ShardKeys {
            record: format!("{base}:r:{}", hex(prefix)),
            index: format!("{base}:i"),
            outbox: format!("{base}:o"),
            watch: format!("{base}:w:{}", hex(prefix)),
        }
    }

    /// The connection for a script: one of the waiting ones when it is followed by `WAIT`.
    fn conn_for(&self, wait: Option<Replicas>) -> &RedisConnection {
        match (wait, self.waiting.len()) {
            (Some(_), n) if n > 0 => {
                &self.waiting[self.next_waiting.fetch_add(1, Ordering::Relaxed) % n]
            }
            _ => &self.conn,
        }
    }

    /// Fails a write that too few replicas acknowledged.
    fn replicated(&self, acked: Option<i64>) -> Result<(), StoreError> {
        match (self.wait, acked) {
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

fn generation(v: &Value) -> Result<u32, StoreError> {
    let g = int(v)?;
    u32::try_from(g)
        .ok()
        .filter(|g| *g >= 1)
        .ok_or_else(|| StoreError::corrupt(format!("generation {g} is out of range")))
}

fn state_name(code: i64) -> Result<(RecordState, Option<bool>), StoreError> {
    Ok(match code {
        IN_FLIGHT => (RecordState::InFlight, None),
        COMPLETED_OK => (RecordState::Completed, Some(true)),
        UNKNOWN => (RecordState::Unknown, None),
        RELEASED => (RecordState::Released, None),
        COMPLETED_ERR => (RecordState::Completed, Some(false)),
        other => return Err(StoreError::corrupt(format!("unknown record state {other}"))),
    })
}

fn ms(t: Timestamp) -> Vec<u8> {
    t.as_millis().to_string().into_bytes()
}

/// What a fenced update is.
enum Op<'a> {
    Complete(&'a Completion<'a>),
    Release(Timestamp),
    Unknown,
    Renew(Timestamp, Timestamp),
    TakeOver(Timestamp, Timestamp),
    Settle(&'a Settlement, Timestamp),
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

    /// The store's connection, for commands of your own on the same connections.
    pub fn connection(&self) -> RedisConnection {
        self.inner.conn.clone()
    }

    /// Runs a fenced update.
    async fn fenced(&self, key: Key, token: Token, op: Op<'_>) -> Result<(), StoreError> {
        self.fenced_update(key, token, op).await.map(|_| ())
    }

    /// Runs a fenced update; the record's reference when it applied.
    async fn fenced_update(
        &self,
        key: Key,
        token: Token,
        op: Op<'_>,
    ) -> Result<Reference, StoreError> {
        let inner = &*self.inner;
        let prefix = *key.reference(1).prefix();
        let k = inner.keys(&prefix);
        let token_b = token.0.to_be_bytes();
        let retention = inner.retention_ms.to_string();
        let (code, now): (&[u8], Vec<u8>) = match &op {
            Op::Complete(c) => (b"c", ms(c.now)),
            Op::Release(at) => (b"r", ms(*at)),
            Op::Unknown => (b"u", b"0".to_vec()),
            Op::Renew(now, _) => (b"n", ms(*now)),
            Op::TakeOver(now, _) => (b"t", ms(*now)),
            Op::Settle(_, at) => (b"s", ms(*at)),
        };
        let flags = [
            inner.trusted[0],
            if matches!(inner.conn.0, Conn::Cluster(_)) {
                b's'
            } else {
                b'p'
            },
        ];
        let mut args: Vec<Vec<u8>> = vec![
            code.to_vec(),
            key.as_bytes()[8..].to_vec(),
            token_b.to_vec(),
            flags.to_vec(),
            now,
            retention.into_bytes(),
        ];
        let mut wait = None;
        match &op {
            Op::Complete(c) => {
                let code = if c.response.ok {
                    COMPLETED_OK
                } else {
                    COMPLETED_ERR
                };
                args.push(code.to_string().into_bytes());
                args.push(c.response.body.as_bytes().to_vec());
                args.push(c.outbox.len().to_string().into_bytes());
                for m in c.outbox {
                    args.push(m.topic.as_bytes().to_vec());
                    args.push(m.payload.as_bytes().to_vec());
                }
                wait = inner.wait;
            }
            Op::Renew(_, lease) => args.push(ms(*lease)),
            Op::TakeOver(_, lease) => {
                args.push(ms(*lease));
                wait = inner.wait;
            }
            Op::Settle(s, _) => {
                args.push((token.0 + 1).to_be_bytes().to_vec());
                let (code, body) = match s {
                    Settlement::Completed(r) if r.ok => (COMPLETED_OK, r.body.as_str()),
                    Settlement::Completed(r) => (COMPLETED_ERR, r.body.as_str()),
                    Settlement::Released => (RELEASED, ""),
                    Settlement::Unknown => (UNKNOWN, ""),
                };
                args.push(code.to_string().into_bytes());
                args.push(body.as_bytes().to_vec());
                wait = inner.wait;
            }
            Op::Release(_) | Op::Unknown => {}
        }
        let keys = [
            k.record.as_str(),
            k.index.as_str(),
            k.outbox.as_str(),
            k.watch.as_str(),
        ];
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let (reply, acked) = inner
            .conn_for(wait)
            .run(&inner.scripts.fenced, &keys, &args, wait)
            .await?;
        let reply = array(reply)?;
        let answer = reply.first().map(int).transpose()?;
        let reference = || -> Result<Reference, StoreError> {
            Ok(key.reference(generation(
                reply.get(1).ok_or_else(|| bad("no generation"))?,
            )?))
        };
        match answer {
            Some(0) => inner.replicated(acked).and_then(|()| reference()),
            Some(-1) => Err(StoreError::NotFound),
            Some(-2) => Err(StoreError::Fenced {
                reference: reference()?,
            }),
            Some(-3) => {
                let state = int(reply.get(2).ok_or_else(|| bad("no state"))?)?;
                Err(StoreError::WrongState {
                    reference: reference()?,
                    state: state_name(state)?.0.as_str(),
                })
            }
            other => Err(bad(format!("unexpected fenced answer {other:?}"))),
        }
    }
}

impl RecordStore for RedisStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let prefix = *req.key.reference(1).prefix();
            let k = inner.keys(&prefix);
            let (now, lease) = (ms(req.now), ms(req.now + req.lease));
            let window = u64::try_from(req.window.as_millis())
                .unwrap_or(u64::MAX)
                .to_string();
            let tail = Record::tail(req)?;
            let args: [&[u8]; 5] = [&now, &lease, inner.trusted, &tail, window.as_bytes()];
            let keys = [k.record.as_str(), k.index.as_str()];
            let (reply, acked) = inner
                .conn_for(inner.wait)
                .run(&inner.scripts.claim, &keys, &args, inner.wait)
                .await?;
            let mut reply = array(reply)?.into_iter();
            let code = int(&reply.next().ok_or_else(|| bad("empty claim answer"))?)?;
            let reference = req.key.reference(generation(
                &reply.next().ok_or_else(|| bad("no generation"))?,
            )?);
            let time = |v: Option<Value>| -> Result<Timestamp, StoreError> {
                Ok(Timestamp::from_millis(int(
                    &v.ok_or_else(|| bad("a time is missing"))?
                )?))
            };
            Ok(match code {
                0 => {
                    inner.replicated(acked)?;
                    Claim::New {
                        reference,
                        token: req.token,
                    }
                }
                1 => Claim::InFlight {
                    reference,
                    claimed_at: time(reply.next())?,
                    lease_expires_at: time(reply.next())?,
                },
                2 => {
                    let state = int(&reply.next().ok_or_else(|| bad("no state"))?)?;
                    let ok = match state_name(state)? {
                        (RecordState::Completed, Some(ok)) => ok,
                        _ => return Err(bad(format!("a completed answer in state {state}"))),
                    };
                    let completed_at = time(reply.next())?;
                    let body = reply.next().ok_or_else(|| {
                        StoreError::corrupt(format!(
                            "ref {reference} is completed without an answer"
                        ))
                    })?;
                    Claim::Completed {
                        reference,
                        response: StoredResponse {
                            ok,
                            body: text(body)?,
                        },
                        completed_at,
                    }
                }
                3 => Claim::Unknown {
                    reference,
                    since: time(reply.next())?,
                },
                4 => Claim::Mismatch { reference },
                5 => return Err(StoreError::ReferenceTaken { reference }),
                other => return Err(bad(format!("unexpected claim answer {other}"))),
            })
        })
    }

    fn complete<'a>(&'a self, c: &'a Completion<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.fenced(c.key, c.token, Op::Complete(c)))
    }

    fn release(
        &self,
        key: Key,
        token: Token,
        at: Timestamp,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.fenced(key, token, Op::Release(at)))
    }

    fn mark_unknown(&self, key: Key, token: Token) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.fenced(key, token, Op::Unknown))
    }

    fn renew(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.fenced(key, token, Op::Renew(now, now + lease)))
    }

    /// The fenced script's takeover: fenced by the state and the lease on the server's clock
    /// (its token is the new one); one script, so concurrent takeovers run one at a time.
    fn take_over(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Reference, StoreError>> {
        Box::pin(self.fenced_update(key, token, Op::TakeOver(now, now + lease)))
    }

    fn settle<'a>(
        &'a self,
        key: Key,
        token: Token,
        settlement: &'a Settlement,
        at: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.fenced(key, token, Op::Settle(settlement, at)))
    }

    /// One `GET` of the record the reference names (its times as the server recorded them).
    fn status<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>> {
        Box::pin(async move {
            let k = self.inner.keys(reference.prefix());
            let reply = self
                .inner
                .conn
                .query(redis::cmd("GET").arg(&k.record))
                .await?;
            let blob = match reply {
                Value::Nil => return Ok(None),
                v => bytes(v)?,
            };
            let r = Record::parse(&blob)?;
            if r.tenant != tenant.as_bytes()
                || !(r.subject.is_empty() || r.subject == subject.as_bytes())
                || r.generation < reference.generation()
            {
                return Ok(None);
            }
            let (state, ok) = state_name(i64::from(r.state))?;
            let settled = matches!(state, RecordState::Completed | RecordState::Released);
            let ends = Timestamp::from_millis(r.ends);
            let completed = settled.then(|| Timestamp::from_millis(r.completed));
            let tool = String::from_utf8(r.tool.to_vec())
                .map_err(|_| StoreError::corrupt("a record's tool name is not UTF-8"))?;
            let response = match ok {
                Some(ok) => Some(StoredResponse {
                    ok,
                    body: String::from_utf8(r.response.to_vec())
                        .map_err(|_| StoreError::corrupt("a stored answer is not UTF-8"))?,
                }),
                None => None,
            };
            Ok(Some(RecordStatus {
                reference: reference.with_generation(r.generation),
                tool,
                state,
                claimed_at: Timestamp::from_millis(r.claimed),
                lease_expires_at: state.lease_shown(ends, completed),
                completed_at: completed,
                expires_at: settled.then_some(ends),
                response,
            }))
        })
    }

    /// A watch key beside the record, and a notice on the channel of its name (see
    /// `notices.rs`).
    fn watch<'a>(
        &'a self,
        key: Key,
        _reference: Reference,
        wake: Wake,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let k = self.inner.keys(key.reference(1).prefix());
            self.inner
                .notices
                .watch(&self.inner.conn, &k.watch, wake)
                .await
        })
    }
}

/// A record as the scripts store it: one string. A 37-byte head `>BI4dddd` (state, generation,
/// claim time, lease or window end, completion time, the tool's window from the claim; doubles
/// hold milliseconds exactly), then
/// the key rest (24 bytes) and the token (8 bytes, big-endian) at fixed places, so a fenced
/// script compares them without unpacking the rest; then the fingerprint (after a 1-byte
/// length), tenant, subject and tool (2-byte lengths) and the answer (4-byte length, empty
/// until settled). The client packs everything after the head (the claim's "tail"); the script
/// only prefixes the head, on the server's clock. One string is a third of the memory of a hash
/// of the same fields once the answer passes the hash's compact encoding.
struct Record<'a> {
    state: u8,
    generation: u32,
    key_rest: &'a [u8],
    claimed: i64,
    ends: i64,
    completed: i64,
    /// The tool's window in ms, as the claim recorded it.
    window: i64,
    tenant: &'a [u8],
    subject: &'a [u8],
    tool: &'a [u8],
    response: &'a [u8],
}

impl<'a> Record<'a> {
    /// What follows the head of a new record, with an empty answer.
    fn tail(req: &ClaimRequest<'_>) -> Result<Vec<u8>, StoreError> {
        let fingerprint = req
            .fingerprint
            .as_ref()
            .map_or(&[][..], |f| &f.as_bytes()[..]);
        let subject = req.subject.unwrap_or("");
        let mut tail = Vec::with_capacity(
            24 + 8
                + 1
                + fingerprint.len()
                + 6
                + req.tenant.len()
                + subject.len()
                + req.tool.len()
                + 4,
        );
        tail.extend_from_slice(&req.key.as_bytes()[8..]);
        tail.extend_from_slice(&req.token.0.to_be_bytes());
        let too_long = |what: &str| StoreError::Config {
            problem: format!(
                "the {what} of a call is too long for the Redis record (at most 65,535 bytes)"
            ),
            source: None,
        };
        tail.push(u8::try_from(fingerprint.len()).map_err(|_| too_long("fingerprint"))?);
        tail.extend_from_slice(fingerprint);
        for (what, field) in [
            ("tenant", req.tenant),
            ("subject", subject),
            ("tool name", req.tool),
        ] {
            let n = u16::try_from(field.len()).map_err(|_| too_long(what))?;
            tail.extend_from_slice(&n.to_be_bytes());
            tail.extend_from_slice(field.as_bytes());
        }
        tail.extend_from_slice(&[0; 4]);
        Ok(tail)
    }

    fn parse(b: &'a [u8]) -> Result<Self, StoreError> {
        let short = || StoreError::corrupt("a record is shorter than its fields say");
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&'a [u8], StoreError> {
            let s = b.get(at..at + n).ok_or_else(short)?;
            at += n;
            Ok(s)
        };
        let state = take(1)?[0];
        let generation = u32::from_be_bytes(take(4)?.try_into().map_err(|_| short())?);
        let mut time = || -> Result<i64, StoreError> {
            let t = f64::from_be_bytes(take(8)?.try_into().map_err(|_| short())?);
            if !t.is_finite() {
                return Err(StoreError::corrupt(
                    "a record holds a time that is not a number",
                ));
            }
            Ok(t as i64)
        };
        let (claimed, ends, completed, window) = (time()?, time()?, time()?, time()?);
        let (key_rest, _token) = (take(24)?, take(8)?);
        let mut string = |len_bytes: usize| -> Result<&'a [u8], StoreError> {
            let mut n = 0usize;
            for byte in take(len_bytes)? {
                n = n << 8 | usize::from(*byte);
            }
            take(n)
        };
        let fingerprint = string(1)?;
        let (tenant, subject, tool) = (string(2)?, string(2)?, string(2)?);
        let response = string(4)?;
        if at != b.len() {
            return Err(StoreError::corrupt(format!(
                "a record is {} bytes long, {} more than its fields say",
                b.len(),
                b.len() - at.min(b.len())
            )));
        }
        if generation == 0 {
            return Err(StoreError::corrupt("a record's generation is 0"));
        }
        if !matches!(fingerprint.len(), 0 | 32) {
            return Err(StoreError::corrupt(format!(
                "a record's fingerprint is {} bytes long, not 32",
                fingerprint.len()
            )));
        }
        Ok(Record {
            state,
            generation,
            key_rest,
            claimed,
            ends,
            completed,
            window,
            tenant,
            subject,
            tool,
            response,
        })
    }
}

impl RedisStore {
    /// The shards in the order a sequential walk visits them, starting at a rotating one (so
    /// a walk that stops at its limit does not always favour the first shards).
    fn shard_walk(&self) -> impl Iterator<Item = usize> {
        let start = self.inner.next_shard.fetch_add(1, Ordering::Relaxed) % SHARDS;
        (0..SHARDS).map(move |i| (start + i) % SHARDS)
    }
}
