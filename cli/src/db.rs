//! The store behind the CLI, opened from its URL. Everything it asks goes through the library:
//! the store traits for what a server does (unsettled, settle, purge) and the stores' [`Admin`]
//! reads for what an operator asks across tenants (one record, counts, what a purge would
//! delete). The CLI holds no SQL, no state codes and no record format.

use std::time::Duration;

use idempotency::clock::{Clock, SystemClock, Timestamp};
use idempotency::store::{
    Access, Admin, AdminRecord, PostgresStore, RedisStore, SqliteStore, Store, StoreError,
    StoreStats,
};
use idempotency::Reference;
use serde_json::{json, Value};

use crate::BoxError;

pub(crate) enum Db {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
    Redis(RedisStore),
}

/// How the CLI opens a Redis store: the application's namespace and retention.
pub(crate) struct RedisOptions<'a> {
    pub namespace: &'a str,
    pub retention: Duration,
}

/// What a command may do to the store it opens.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Reads only: the store must exist and is left byte for byte as it was.
    Read,
    /// Writes records (settle, purge): the store must exist; nothing is created.
    Write,
    /// Creates and migrates the store (`migrate`, the only command that does).
    Create,
}

impl Db {
    /// Opens the store at `url` as `mode` allows: only [`Mode::Create`] may create a SQLite file,
    /// a table or a migration; the others refuse a place without a store
    /// ([`StoreError::NoStore`], exit 3).
    pub(crate) async fn open(
        url: &str,
        redis: RedisOptions<'_>,
        mode: Mode,
    ) -> Result<Db, BoxError> {
        let access = match mode {
            Mode::Read => Access::ReadOnly,
            Mode::Write | Mode::Create => Access::ReadWrite,
        };
        // The error's sources name the server and say why; a file's path is said here. A
        // place without a store is said as the library says it (the CLI's exit 3).
        let failed = |what: &str, e: StoreError| -> BoxError {
            if matches!(e, StoreError::NoStore { .. }) {
                return Box::new(e);
            }
            let what = match url.strip_prefix("sqlite:") {
                Some(path) => format!("cannot open the {what} store at {path}"),
                None => format!("cannot open the {what} store"),
            };
            Box::new(OpenError {
                what,
                source: Box::new(e),
            })
        };
        let db = if let Some(path) = url.strip_prefix("sqlite:") {
            let store = if mode == Mode::Create {
                SqliteStore::open(path).await
            } else {
                SqliteStore::open_existing(path, access).await
            };
            Db::Sqlite(store.map_err(|e| failed("SQLite", e))?)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let store = if mode == Mode::Create {
                PostgresStore::connect(url).await
            } else {
                PostgresStore::connect_existing(url, access).await
            };
            Db::Postgres(store.map_err(|e| failed("PostgreSQL", e))?)
        } else if url.starts_with("redis://") {
            let store = RedisStore::builder()
                .namespace(redis.namespace)
                .retention(redis.retention)
                // An operator's command can wait longer for a replica than a call would.
                .replica_ack_timeout(Duration::from_secs(2))
                .connect(url)
                .await
                .map_err(|e| failed("Redis", e))?;
            Db::Redis(store)
        } else if let Some(nodes) = url.strip_prefix("redis+cluster://") {
            let seeds: Vec<String> = nodes
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if seeds.is_empty() {
                return Err(
                    format!("`{url}` names no node: redis+cluster://HOST:PORT,HOST:PORT").into(),
                );
            }
            let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
            let store = RedisStore::builder()
                .namespace(redis.namespace)
                .retention(redis.retention)
                // An operator's command can wait longer for a replica than a call would.
                .replica_ack_timeout(Duration::from_secs(2))
                .connect_cluster(&seeds)
                .await
                .map_err(|e| failed("Redis Cluster", e))?;
            Db::Redis(store)
        } else {
            return Err(format!(
                "`{}` is not a store this tool opens: use sqlite:PATH, postgres://…, redis://HOST:PORT or redis+cluster://HOST:PORT,HOST:PORT",
                redact(url)
            )
            .into());
        };
        // Redis has no schema: a namespace exists once something of a store is in it.
        if mode != Mode::Create && !db.admin().exists().await? {
            return Err(Box::new(StoreError::NoStore {
                place: format!(
                    "the Redis namespace {:?} at {} holds no record index and no secret fingerprint \
                     (check --namespace)",
                    redis.namespace,
                    redact(url)
                ),
            }));
        }
        Ok(db)
    }

    /// The store's clock now, and the words saying whose it is: the server's where the store
    /// has one (PostgreSQL `now()`, Redis `TIME`), else this machine's (SQLite).
    pub(crate) async fn clock(&self) -> Result<(Timestamp, &'static str), BoxError> {
        Ok(match self.admin().server_time().await? {
            Some(now) => (
                now,
                match self {
                    Db::Postgres(_) => "PostgreSQL server (now())",
                    _ => "Redis server (TIME)",
                },
            ),
            None => (
                SystemClock.now(),
                "this machine (SQLite has no server clock)",
            ),
        })
    }

    /// Whether the store has no clock of its own (SQLite): times are this machine's.
    pub(crate) fn has_no_server_clock(&self) -> bool {
        matches!(self, Db::Sqlite(_))
    }

    /// The record under `reference`'s key as the store has it (any tenant, any generation).
    pub(crate) async fn record(
        &self,
        reference: Reference,
    ) -> Result<Option<AdminRecord>, BoxError> {
        Ok(self.admin().record(reference).await?)
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Db::Sqlite(_) => "SQLite",
            Db::Postgres(_) => "PostgreSQL",
            Db::Redis(_) => "Redis",
        }
    }

    pub(crate) fn store(&self) -> &dyn Store {
        match self {
            Db::Sqlite(s) => s,
            Db::Postgres(s) => s,
            Db::Redis(s) => s,
        }
    }

    /// The store's reads for operators.
    pub(crate) fn admin(&self) -> &dyn Admin {
        match self {
            Db::Sqlite(s) => s,
            Db::Postgres(s) => s,
            Db::Redis(s) => s,
        }
    }

    /// The record `reference` names (any tenant, or only `tenant`'s), as JSON, read as it means
    /// at `now`.
    pub(crate) async fn inspect(
        &self,
        reference: Reference,
        tenant: Option<&str>,
        now: Timestamp,
    ) -> Result<Option<Value>, BoxError> {
        let Some(record) = self.admin().record(reference).await? else {
            return Ok(None);
        };
        if tenant.is_some_and(|t| record.tenant != t) {
            return Ok(None);
        }
        if record.reference.generation() < reference.generation() {
            return Ok(None);
        }
        let mut row = record_json(&record, now);
        if record.reference.generation() > reference.generation() {
            row["superseded"] = json!(reference.to_string());
            row["standing"] = json!("superseded");
        }
        Ok(Some(row))
    }

    /// Records by tool and standing at `now`, the oldest claim in flight, the store's size.
    pub(crate) async fn stats(&self, now: Timestamp) -> Result<Value, BoxError> {
        Ok(stats_json(&self.admin().stats(now).await?))
    }

    /// How many records a purge at `older_than` would delete.
    pub(crate) async fn purgeable(
        &self,
        now: Timestamp,
        older_than: Timestamp,
    ) -> Result<u64, BoxError> {
        Ok(self.admin().purgeable(now, older_than).await?)
    }
}

/// A store that could not be opened: which (its URL without a password), and why (the source).
#[derive(Debug)]
struct OpenError {
    what: String,
    source: BoxError,
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// `url` without its password (`user:secret@` becomes `user@`; a `password=` parameter goes).
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let kept: Vec<&str> = query
                .split('&')
                .filter(|p| !p.to_ascii_lowercase().starts_with("password="))
                .collect();
            if kept.is_empty() {
                path.to_owned()
            } else {
                format!("{path}?{}", kept.join("&"))
            }
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// A record as the CLI prints it in JSON.
fn record_json(r: &AdminRecord, now: Timestamp) -> Value {
    json!({
        "reference": r.reference.to_string(),
        "tenant": r.tenant,
        "subject": r.subject,
        "tool": r.tool,
        "generation": r.reference.generation(),
        "state": r.state.as_str(),
        "standing": r.standing(now).as_str(),
        "error_answer": r.error_answer,
        "claimed_at": r.claimed_at.to_string(),
        "ends_at": r.ends_at.to_string(),
        "completed_at": r.completed_at.map(|t| t.to_string()),
        "window_s": r.window.as_secs(),
        // The stored answer is JSON: a JSON value here, not a string of it. A response the HTTP
        // layer recorded is `http ` and its envelope: shown as the status tool shows it.
        "answer": r.answer.as_deref().map(|a| {
            let parsed = match a.strip_prefix("http ") {
                Some(envelope) => serde_json::from_str::<Value>(envelope)
                    .map(|v| json!({ "http_response": v })),
                None => serde_json::from_str::<Value>(a),
            };
            parsed.unwrap_or_else(|_| Value::String(a.to_owned()))
        }),
    })
}

/// Stats as the CLI prints them in JSON.
fn stats_json(s: &StoreStats) -> Value {
    let groups: Vec<Value> = s
        .by_tool_and_standing
        .iter()
        .map(|(tool, standing, n)| json!({"tool": tool, "state": standing.as_str(), "records": n}))
        .collect();
    json!({
        "records": s.records,
        "by_tool_and_state": groups,
        "oldest_in_flight": s.oldest_in_flight.map(|t| t.to_string()),
        "bytes": s.bytes,
    })
}

/// A record for a person.
pub(crate) fn describe(record: &Value) -> String {
    let field = |k: &str| match &record[k] {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out = format!(
        "ref        {}\nstate      {}\nstanding   {}\ntenant     {}\nsubject    {}\ntool       {}\nclaimed    {}\nends       {}\ncompleted  {}\nanswer     {}",
        field("reference"),
        field("state"),
        field("standing"),
        field("tenant"),
        field("subject"),
        field("tool"),
        field("claimed_at"),
        field("ends_at"),
        field("completed_at"),
        field("answer"),
    );
    if let Some(source) = record["clock"]["source"].as_str() {
        out.push_str(&format!(
            "\njudged by  {source}, now {}",
            record["clock"]["now"].as_str().unwrap_or("-")
        ));
    }
    if let Some(old) = record["superseded"].as_str() {
        out.push_str(&format!(
            "\n(asked for {old}: that operation completed and the key moved on)"
        ));
    }
    out
}

/// Stats for a person.
pub(crate) fn describe_stats(stats: &Value) -> String {
    let mut out = format!("records    {}\n", stats["records"]);
    if let Some(groups) = stats["by_tool_and_state"].as_array() {
        for g in groups {
            out.push_str(&format!(
                "  {:<24} {:<10} {}\n",
                g["tool"].as_str().unwrap_or(""),
                g["state"].as_str().unwrap_or(""),
                g["records"]
            ));
        }
    }
    out.push_str(&format!(
        "oldest in flight  {}\nsize       {} bytes",
        stats["oldest_in_flight"].as_str().unwrap_or("-"),
        stats["bytes"]
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_print() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/app?sslmode=require&password=x"),
            "postgres://app@db:5432/app?sslmode=require"
        );
        assert_eq!(redact("redis://:pw@h:6379/0"), "redis://@h:6379/0");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact("sqlite:/tmp/x.db"), "sqlite:/tmp/x.db");
    }
}
