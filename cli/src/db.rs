//! The store behind the CLI, opened from its URL. Everything it asks goes through the library:
//! the store traits for what a server does (unsettled, settle, purge) and the stores' [`Admin`]
//! reads for what an operator asks across tenants (one record, counts, what a purge would
//! delete). The CLI holds no SQL, no state codes and no record format.

use idempotency::clock::Timestamp;
use std::time::Duration;

use idempotency::store::{
    Admin, AdminRecord, PostgresStore, RedisStore, SqliteStore, Store, StoreStats,
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

impl Db {
    /// Opens (and migrates) the store at `url`.
    pub(crate) async fn open(url: &str, redis: RedisOptions<'_>) -> Result<Db, BoxError> {
        if let Some(path) = url.strip_prefix("sqlite:") {
            let store = SqliteStore::open(path)
                .await
                .map_err(|e| format!("cannot open the SQLite store {path}: {e}"))?;
            Ok(Db::Sqlite(store))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let store = PostgresStore::connect(url)
                .await
                .map_err(|e| format!("cannot open the PostgreSQL store: {e}"))?;
            Ok(Db::Postgres(store))
        } else if url.starts_with("redis://") {
            let store = RedisStore::builder()
                .namespace(redis.namespace)
                .retention(redis.retention)
                .connect(url)
                .await
                .map_err(|e| format!("cannot open the Redis store: {e}"))?;
            Ok(Db::Redis(store))
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
                .connect_cluster(&seeds)
                .await
                .map_err(|e| format!("cannot open the Redis Cluster store: {e}"))?;
            Ok(Db::Redis(store))
        } else {
            Err(format!(
                "`{url}` is not a store this tool opens: use sqlite:PATH, postgres://…, redis://HOST:PORT or redis+cluster://HOST:PORT,HOST:PORT"
            )
            .into())
        }
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
    fn admin(&self) -> &dyn Admin {
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
        "answer": r.answer,
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
