//! The connection to one Redis or a Redis Cluster, the scripts run over it (EVALSHA, with EVAL
//! as the NOSCRIPT fallback, which also caches the script on that node), `WAIT` for replicas,
//! and what a Redis error or reply means for the store.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use crate::store::StoreError;

/// How long a command may take before the store gives up on it (a node that does not answer).
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting to a node may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

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

/// A command named `name` with room for `args` more arguments of `data` bytes in all, so its
/// buffers do not grow (and copy) as a record-sized argument goes in.
pub(super) fn command(name: &str, args: usize, data: usize) -> Cmd {
    let mut c = Cmd::with_capacity(1 + args, name.len() + data);
    c.arg(name);
    c
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

/// What one run of a script is given: its keys (`KEYS`) and its arguments (`ARGV`).
#[derive(Clone, Copy)]
struct ScriptInput<'a> {
    keys: &'a [&'a str],
    args: &'a [&'a [u8]],
}

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
        let input = ScriptInput { keys, args };
        match self.try_run(script, input, wait, true).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.try_run(script, input, wait, false).await
            }
            other => other,
        }
        .map_err(redis_error)
    }

    async fn try_run(
        &self,
        script: &Script,
        input: ScriptInput<'_>,
        wait: Option<Replicas>,
        cached: bool,
    ) -> Result<(Value, Option<i64>), RedisError> {
        let ScriptInput { keys, args } = input;
        // Sized up front: the command's buffers would otherwise grow (and copy) several times
        // for a record-sized argument.
        let (name, body) = if cached {
            ("EVALSHA", script.sha.as_bytes())
        } else {
            ("EVAL", script.source.as_bytes())
        };
        let data = keys.iter().map(|k| k.len()).sum::<usize>()
            + args.iter().map(|a| a.len()).sum::<usize>()
            + body.len()
            + 4;
        let mut cmd = command(name, 2 + keys.len() + args.len(), data);
        cmd.arg(body).arg(keys.len()).arg(keys);
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

/// The code the store's scripts give the errors they raise about a record they cannot use
/// (`redis.error_reply(CORRUPT .. ' …')`).
pub(super) const CORRUPT: &str = "CORRUPT";

/// A Redis error, classified:
///
/// - [`StoreError::Corrupt`]: the record cannot be read, and trying again finds it the same. A
///   script's own `CORRUPT` error, a Lua runtime error in a script (`struct.unpack` of a record
///   too short or of the wrong layout: the server's `ERR` naming the script), `WRONGTYPE` (the
///   record's key holds something else), or a reply of the wrong type.
/// - [`StoreError::Config`]: the server refuses this client (authentication, `NOPERM`).
/// - [`StoreError::Unavailable`], everything else: unreachable, timed out, a dropped
///   connection, a cluster without a majority or being resharded (`CLUSTERDOWN`, `TRYAGAIN`,
///   `MOVED`/`ASK` that kept failing, `READONLY` after a failover, `MASTERDOWN`), a server
///   `LOADING` its data, `BUSY` with a script, out of memory, too few replicas.
pub(super) fn redis_error(e: RedisError) -> StoreError {
    use redis::{ErrorKind, ServerErrorKind};
    let corrupt = |problem: &str, e: RedisError| StoreError::Corrupt {
        problem: problem.into(),
        source: Some(Box::new(e)),
    };
    match e.kind() {
        ErrorKind::Extension if e.code() == Some(CORRUPT) => {
            corrupt("a record does not have the layout the store writes", e)
        }
        ErrorKind::Extension if e.code() == Some("WRONGTYPE") => {
            corrupt("a record's key holds a value of another type", e)
        }
        ErrorKind::Server(ServerErrorKind::ResponseError) if script_failed(&e) => corrupt(
            "a record does not have the layout the store writes (the script reading it failed)",
            e,
        ),
        ErrorKind::UnexpectedReturnType => corrupt("a Redis reply has the wrong type", e),
        ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm) => {
            StoreError::Config {
                problem: "Redis refuses the store's commands; check the user and its permissions"
                    .into(),
                source: Some(Box::new(e)),
            }
        }
        _ => StoreError::Unavailable(Box::new(e)),
    }
}

/// Whether an `ERR` is a Lua runtime error of a script (Redis 7 and Valkey: `user_script:N: …
/// script: <sha>`; Redis 6: `Error running script (call to f_<sha>): …`), rather than the
/// server's own `ERR` (too many clients, a bad argument).
fn script_failed(e: &RedisError) -> bool {
    // Redis 6 wraps the error of a command a script ran in its own `ERR`: those that pass are
    // not about the record.
    const PASSING: [&str; 8] = [
        "-READONLY",
        "-OOM",
        "-LOADING",
        "-BUSY",
        "-MASTERDOWN",
        "-NOREPLICAS",
        "-TRYAGAIN",
        "-CLUSTERDOWN",
    ];
    e.detail().is_some_and(|d| {
        (d.contains("user_script:") || d.starts_with("Error running script"))
            && !PASSING.iter().any(|code| d.contains(code))
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's error reply, as the client reads it.
    fn reply(text: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()) {
            Ok(Value::ServerError(e)) => e.into(),
            other => panic!("{text}: parsed as {other:?}"),
        }
    }

    #[test]
    fn record_errors_are_corrupt_and_passing_ones_transient() {
        let corrupt = [
            // Redis 7 and Valkey: a Lua runtime error in the script (the text is Redis 7.0's).
            "ERR user_script:1: bad argument #2 to 'unpack' (data string too short) script: 843387a86c35ccad5c499b140aaa0d077acec5c3, on @user_script:1.",
            // Redis 6.
            "ERR Error running script (call to f_843387a86c35ccad5c499b140aaa0d077acec5c3): @user_script:1: user_script:1: bad argument #2 to 'unpack' (data string too short)",
            // The scripts' own refusal.
            "CORRUPT the record idem:{3f}:r:3f9a0c1b2d4e5f60 is 20 bytes long, shorter than its fixed fields",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ];
        for text in corrupt {
            let e = redis_error(reply(text));
            assert!(matches!(e, StoreError::Corrupt { .. }), "{text}: {e:?}");
            assert!(!e.is_transient(), "{text}");
            // The server's words are the source, not repeated.
            assert!(!e.to_string().contains("unpack"), "{e}");
        }
        let passing = [
            "LOADING Redis is loading the dataset in memory",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "READONLY You can't write against a read only replica.",
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "NOREPLICAS Not enough good replicas to write.",
            "MOVED 3999 127.0.0.1:6381",
            "ERR max number of clients reached",
            // Redis 6 wraps a command's passing error in the script's.
            "ERR Error running script (call to f_843387a86c35ccad5c499b140aaa0d077acec5c3): @user_script:22: @user_script: 22: -READONLY You can't write against a read only replica.",
        ];
        for text in passing {
            let e = redis_error(reply(text));
            assert!(matches!(e, StoreError::Unavailable(_)), "{text}: {e:?}");
            assert!(e.is_transient(), "{text}");
        }
        for kind in [
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::TimedOut,
            std::io::ErrorKind::ConnectionRefused,
        ] {
            let e = redis_error(RedisError::from(std::io::Error::from(kind)));
            assert!(e.is_transient(), "{kind:?}: {e:?}");
        }
        let refused = redis_error(reply(
            "NOPERM User app has no permissions to run the 'evalsha' command",
        ));
        assert!(
            matches!(refused, StoreError::Config { .. }) && !refused.is_transient(),
            "{refused:?}"
        );
    }
}
