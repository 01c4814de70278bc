//! The connection to one Redis or a Redis Cluster, the scripts run over it (EVALSHA, with EVAL
//! as the NOSCRIPT fallback, which also caches the script on that node), `WAIT` for replicas,
//! and what a Redis error or reply means for the store.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use crate::store::StoreError;

/// A connection the store shares between all its calls: one multiplexed connection to a single
/// Redis (reconnecting by itself), or the cluster client's connections (one per node, following
/// MOVED and ASK redirections and refreshing its slot map).
///
/// Implements [`redis::aio::ConnectionLike`], so an application (or a benchmark) can run its own
/// commands on the store's connections.
#[derive(Clone)]
pub struct RedisConnection(pub(super) Conn);

#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Conn::Single(_) => "RedisConnection(single)",
            Conn::Cluster(_) => "RedisConnection(cluster)",
        })
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// A Lua script of the store: its source and SHA-1.
pub(super) struct Script {
    source: &'static str,
    sha: String,
}

impl Script {
    pub(super) fn new(source: &'static str) -> Self {
        Script {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }
}

/// How many replicas must acknowledge a write, and how long to wait for them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Replicas {
    pub count: u32,
    pub timeout: Duration,
}

/// Fewer replicas than required acknowledged a write within the timeout.
#[derive(Debug, thiserror::Error)]
#[error("{acked} of the {wanted} replicas required acknowledged the write within {timeout:?}; a failover now could lose it")]
pub(super) struct ReplicationShortfall {
    pub acked: i64,
    pub wanted: u32,
    pub timeout: Duration,
}

/// A reply the store cannot read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct BadReply(pub String);

impl RedisConnection {
    /// Runs `script` on the node of its keys' slot. With `wait`, `WAIT` follows in the same
    /// pipeline (same connection, so it covers this write) and the number of replicas that
    /// acknowledged comes back too.
    pub(super) async fn run(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
        wait: Option<Replicas>,
    ) -> Result<(Value, Option<i64>), StoreError> {
        match self.try_run(script, keys, args, wait, true).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.try_run(script, keys, args, wait, false).await
            }
            other => other,
        }
        .map_err(redis_error)
    }

    async fn try_run(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
        wait: Option<Replicas>,
        cached: bool,
    ) -> Result<(Value, Option<i64>), RedisError> {
        let mut cmd = if cached {
            let mut c = redis::cmd("EVALSHA");
            c.arg(&script.sha);
            c
        } else {
            let mut c = redis::cmd("EVAL");
            c.arg(script.source);
            c
        };
        cmd.arg(keys.len()).arg(keys);
        for a in args {
            cmd.arg(*a);
        }
        let mut conn = self.clone();
        let Some(w) = wait else {
            return Ok((cmd.query_async(&mut conn).await?, None));
        };
        let mut pipe = redis::pipe();
        pipe.add_command(cmd)
            .cmd("WAIT")
            .arg(w.count)
            .arg(w.timeout.as_millis() as u64);
        pipe.ignore_errors();
        let mut replies: Vec<Value> = pipe.query_async(&mut conn).await?;
        let acked = match replies.pop() {
            Some(Value::Int(n)) => Some(n),
            Some(Value::ServerError(e)) => return Err(e.into()),
            _ => None,
        };
        match replies.pop() {
            Some(Value::ServerError(e)) => Err(e.into()),
            Some(v) => Ok((v, acked)),
            None => Err(RedisError::from((
                redis::ErrorKind::Client,
                "the pipeline answered nothing",
            ))),
        }
    }

    /// One command.
    pub(super) async fn query(&self, cmd: &Cmd) -> Result<Value, StoreError> {
        let mut conn = self.clone();
        cmd.query_async(&mut conn).await.map_err(redis_error)
    }
}

/// A Redis error: the store could not do its work (unreachable, timed out, a cluster without a
/// majority, a redirection that kept failing, a script error).
pub(super) fn redis_error(e: RedisError) -> StoreError {
    StoreError::Unavailable(Box::new(e))
}

/// A reply that does not have the shape the scripts return.
pub(super) fn bad(what: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        problem: "a Redis reply could not be read".into(),
        source: Some(Box::new(BadReply(what.into()))),
    }
}

pub(super) fn array(v: Value) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(a) | Value::Set(a) => Ok(a),
        Value::Nil => Ok(Vec::new()),
        other => Err(bad(format!("expected an array, got {other:?}"))),
    }
}

pub(super) fn int(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("expected an integer")),
        Value::SimpleString(s) => s.parse().map_err(|_| bad("expected an integer")),
        other => Err(bad(format!("expected an integer, got {other:?}"))),
    }
}

pub(super) fn bytes(v: Value) -> Result<Vec<u8>, StoreError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(i) => Ok(i.to_string().into_bytes()),
        other => Err(bad(format!("expected a string, got {other:?}"))),
    }
}

pub(super) fn text(v: Value) -> Result<String, StoreError> {
    String::from_utf8(bytes(v)?).map_err(|_| bad("a text field is not UTF-8"))
}

/// The field-value pairs of a hash or a stream entry (RESP2 flat array or RESP3 map).
pub(super) fn pairs(v: Value) -> Result<Vec<(Vec<u8>, Value)>, StoreError> {
    match v {
        Value::Map(m) => m.into_iter().map(|(k, v)| Ok((bytes(k)?, v))).collect(),
        v => {
            let flat = array(v)?;
            let mut out = Vec::with_capacity(flat.len() / 2);
            let mut it = flat.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((bytes(k)?, v));
            }
            Ok(out)
        }
    }
}
