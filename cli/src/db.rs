//! The store behind the CLI: the library's own store for everything it can answer, and read-only
//! queries on its table for what an operator asks across tenants (one record, counts, size).
//! The state codes are the ones the migrations document (0 in flight, 1 completed, 2 unknown,
//! 3 released, 4 completed with an error answer). On Redis, the store's own admin reads
//! (`RedisStore::record`, `each_record`, `purgeable`) answer those: its record format is the
//! store's business.

use idempotency::clock::Timestamp;
use std::collections::BTreeMap;
use std::time::Duration;

use idempotency::store::{
    PostgresStore, RecordState, RedisRecord, RedisStore, SqliteStore, Standing, Store,
};
use idempotency::Reference;
use serde_json::{json, Value};
use sqlx::Row;

use crate::BoxError;

pub enum Db {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
    Redis(RedisStore),
}

/// How the CLI opens a Redis store: the application's namespace and retention.
pub struct RedisOptions<'a> {
    pub namespace: &'a str,
    pub retention: Duration,
}

const RECORD: &str = "SELECT tenant, subject, tool, CAST(generation AS BIGINT), CAST(state AS BIGINT), \
                      claimed_at, ends_at, completed_at, response FROM idempotency_records WHERE ref = $1";
/// Records by state, tool and whether their time (`ends_at`: the lease's end while unsettled,
/// the window's end once settled) has passed at `$1`: what [`Standing::of`] needs.
const BY_STATE: &str =
    "SELECT CAST(state AS BIGINT), tool, CAST(ends_at <= $1 AS BIGINT), COUNT(*) \
                        FROM idempotency_records GROUP BY 1, 2, 3";
const PG_BY_STATE: &str = "SELECT CAST(state AS BIGINT), tool, \
                           CAST(CASE WHEN state IN (0, 2) THEN lease_or_settled_at ELSE lease_or_settled_at + 1000::BIGINT * window_s END <= $1 AS INTEGER)::BIGINT, \
                           COUNT(*) FROM idempotency_records GROUP BY 1, 2, 3";
const OLDEST_IN_FLIGHT: &str = "SELECT MIN(claimed_at) FROM idempotency_records WHERE state = 0";
const PURGEABLE: &str =
    "SELECT COUNT(*) FROM idempotency_records WHERE state IN (1, 3, 4) AND ends_at < $1";
/// PostgreSQL's row keeps the window's length and one time for the lease's end or the
/// settlement (see its migration); these read it as the SQLite row's `ends_at`, `completed_at`.
const PG_RECORD: &str = "SELECT tenant, subject, tool, CAST(generation AS BIGINT), CAST(state AS BIGINT), \
                         claimed_at, \
                         CASE WHEN state IN (0, 2) THEN lease_or_settled_at ELSE lease_or_settled_at + 1000::BIGINT * window_s END, \
                         CASE WHEN state IN (0, 2) THEN NULL ELSE lease_or_settled_at END, \
                         response FROM idempotency_records WHERE ref = $1";
const PG_PURGEABLE: &str = "SELECT COUNT(*) FROM idempotency_records \
                            WHERE state IN (1, 3, 4) AND lease_or_settled_at + 1000::BIGINT * window_s < $1";

/// A `state` column value: the state and, for a completed record, whether its answer is `Ok`
/// (the codes the migrations document); `None` for a value this version does not know.
fn state_of(code: i64) -> Option<(RecordState, Option<bool>)> {
    Some(match code {
        0 => (RecordState::InFlight, None),
        1 => (RecordState::Completed, Some(true)),
        2 => (RecordState::Unknown, None),
        3 => (RecordState::Released, None),
        4 => (RecordState::Completed, Some(false)),
        _ => return None,
    })
}

/// What a record in state `code` whose time (lease end, or window end once settled) has or has
/// not `passed` means: the library's own reading ([`Standing::of`]), so the CLI, a repeat and the
/// status tool say the same.
fn standing_name(code: i64, passed: bool) -> &'static str {
    match state_of(code) {
        Some((state, ok)) => Standing::of(state, ok, passed, passed).as_str(),
        None => "unreadable",
    }
}

fn time(ms: i64) -> String {
    Timestamp::from_millis(ms).to_string()
}

impl Db {
    /// Opens (and migrates) the store at `url`.
    pub async fn open(url: &str, redis: RedisOptions<'_>) -> Result<Db, BoxError> {
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

    pub fn name(&self) -> &'static str {
        match self {
            Db::Sqlite(_) => "SQLite",
            Db::Postgres(_) => "PostgreSQL",
            Db::Redis(_) => "Redis",
        }
    }

    pub fn store(&self) -> &dyn Store {
        match self {
            Db::Sqlite(s) => s,
            Db::Postgres(s) => s,
            Db::Redis(s) => s,
        }
    }

    /// The record `reference` names (any tenant, or only `tenant`'s), as JSON.
    pub async fn inspect(
        &self,
        reference: Reference,
        tenant: Option<&str>,
        now: Timestamp,
    ) -> Result<Option<Value>, BoxError> {
        let key = i64::from_be_bytes(*reference.prefix());
        let row = match self {
            Db::Sqlite(s) => sqlx::query(RECORD)
                .bind(key)
                .fetch_optional(s.pool())
                .await?
                .map(|r| record(&r, now))
                .transpose()?,
            Db::Postgres(s) => sqlx::query(PG_RECORD)
                .bind(key)
                .fetch_optional(s.pool())
                .await?
                .map(|r| record(&r, now))
                .transpose()?,
            Db::Redis(s) => s.record(reference).await?.map(|r| redis_record(&r, now)),
        };
        let Some(mut row) = row else { return Ok(None) };
        if tenant.is_some_and(|t| row["tenant"] != t) {
            return Ok(None);
        }
        let generation = row["generation"].as_u64().unwrap_or(0);
        if generation < u64::from(reference.generation()) {
            return Ok(None);
        }
        row["reference"] = json!(format!("{}-{generation}", &reference.to_string()[..16]));
        if generation > u64::from(reference.generation()) {
            row["superseded"] = json!(reference.to_string());
            row["standing"] = json!(Standing::Superseded.as_str());
        }
        Ok(Some(row))
    }

    /// Records by state and tool, the oldest claim in flight, the table's size.
    pub async fn stats(&self, now: Timestamp) -> Result<Value, BoxError> {
        if let Db::Redis(s) = self {
            return redis_stats(s, now).await;
        }
        type Groups = Vec<(i64, String, i64, i64)>;
        let (groups, oldest, bytes): (Groups, Option<i64>, i64) = match self {
            Db::Sqlite(s) => (
                sqlx::query_as(BY_STATE)
                    .bind(now.as_millis())
                    .fetch_all(s.pool())
                    .await?,
                sqlx::query_scalar(OLDEST_IN_FLIGHT)
                    .fetch_one(s.pool())
                    .await?,
                sqlx::query_scalar(
                    "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
                )
                .fetch_one(s.pool())
                .await?,
            ),
            Db::Postgres(s) => (
                sqlx::query_as(PG_BY_STATE)
                    .bind(now.as_millis())
                    .fetch_all(s.pool())
                    .await?,
                sqlx::query_scalar(OLDEST_IN_FLIGHT)
                    .fetch_one(s.pool())
                    .await?,
                sqlx::query_scalar("SELECT pg_total_relation_size('idempotency_records')::BIGINT")
                    .fetch_one(s.pool())
                    .await?,
            ),
            Db::Redis(_) => unreachable!("answered above"),
        };
        let mut by_standing: BTreeMap<(String, &'static str), i64> = BTreeMap::new();
        for (code, tool, passed, n) in &groups {
            *by_standing
                .entry((tool.clone(), standing_name(*code, *passed != 0)))
                .or_default() += n;
        }
        let by_state: Vec<Value> = by_standing
            .iter()
            .map(|((tool, state), n)| json!({"tool": tool, "state": state, "records": n}))
            .collect();
        Ok(json!({
            "records": groups.iter().map(|g| g.3).sum::<i64>(),
            "by_tool_and_state": by_state,
            "oldest_in_flight": oldest.map(time),
            "bytes": bytes,
        }))
    }

    /// How many records a purge at `older_than` would delete (by this machine's clock; on Redis,
    /// by the server's).
    pub async fn purgeable(&self, now: Timestamp, older_than: Timestamp) -> Result<u64, BoxError> {
        let n: i64 = match self {
            Db::Sqlite(s) => {
                sqlx::query_scalar(PURGEABLE)
                    .bind(older_than.as_millis())
                    .fetch_one(s.pool())
                    .await?
            }
            Db::Postgres(s) => {
                sqlx::query_scalar(PG_PURGEABLE)
                    .bind(older_than.as_millis())
                    .fetch_one(s.pool())
                    .await?
            }
            Db::Redis(s) => return Ok(s.purgeable(now, older_than).await?),
        };
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

fn record<R: Row>(r: &R, now: Timestamp) -> Result<Value, sqlx::Error>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let subject: String = r.try_get(1)?;
    let state: i64 = r.try_get(4)?;
    let completed_at: Option<i64> = r.try_get(7)?;
    let response: Option<String> = r.try_get(8)?;
    let ends_at: i64 = r.try_get(6)?;
    Ok(json!({
        "tenant": r.try_get::<String, _>(0)?,
        "subject": (!subject.is_empty()).then_some(subject),
        "tool": r.try_get::<String, _>(2)?,
        "generation": r.try_get::<i64, _>(3)?,
        "state": state_of(state).map_or("unreadable", |(s, _)| s.as_str()),
        "standing": standing_name(state, now.as_millis() >= ends_at),
        "error_answer": state == 4,
        "claimed_at": time(r.try_get(5)?),
        "ends_at": time(ends_at),
        "completed_at": completed_at.map(time),
        "answer": response,
    }))
}

/// A Redis record as [`record`] shapes a table row.
fn redis_record(r: &RedisRecord, now: Timestamp) -> Value {
    let ok = (r.state == RecordState::Completed).then_some(!r.error_answer);
    let passed = now >= r.ends_at;
    json!({
        "tenant": r.tenant,
        "subject": r.subject,
        "tool": r.tool,
        "generation": r.reference.generation(),
        "state": r.state.as_str(),
        "standing": Standing::of(r.state, ok, passed, passed).as_str(),
        "error_answer": r.error_answer,
        "claimed_at": r.claimed_at.to_string(),
        "ends_at": r.ends_at.to_string(),
        "completed_at": r.completed_at.map(|t| t.to_string()),
        "answer": r.answer,
    })
}

/// Counts over every record of the namespace, read through the store's shard indexes.
async fn redis_stats(store: &RedisStore, now: Timestamp) -> Result<Value, BoxError> {
    let mut groups: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
    let (mut oldest, mut bytes, mut records) = (None::<Timestamp>, 0usize, 0u64);
    store
        .each_record(|r| {
            records += 1;
            bytes += r.bytes;
            if r.state == idempotency::store::RecordState::InFlight {
                oldest = Some(oldest.map_or(r.claimed_at, |o| o.min(r.claimed_at)));
            }
            let ok = (r.state == RecordState::Completed).then_some(!r.error_answer);
            let passed = now >= r.ends_at;
            let standing = Standing::of(r.state, ok, passed, passed);
            *groups.entry((r.tool, standing.as_str())).or_default() += 1;
        })
        .await?;
    let by_state: Vec<Value> = groups
        .iter()
        .map(|((tool, state), n)| json!({"tool": tool, "state": state, "records": n}))
        .collect();
    Ok(json!({
        "records": records,
        "by_tool_and_state": by_state,
        "oldest_in_flight": oldest.map(|t| t.to_string()),
        "bytes": bytes,
    }))
}

/// A record for a person.
pub fn describe(record: &Value) -> String {
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
pub fn describe_stats(stats: &Value) -> String {
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
    use super::standing_name;

    /// Stats group by what a record means: a stored error is its own group, never a second
    /// "completed" row of the same tool.
    #[test]
    fn every_state_code_has_its_own_standing() {
        let names: Vec<_> = [
            (0, false),
            (0, true),
            (1, false),
            (1, true),
            (2, false),
            (3, false),
            (4, false),
            (9, false),
        ]
        .iter()
        .map(|(code, passed)| standing_name(*code, *passed))
        .collect();
        assert_eq!(
            names,
            [
                "in_flight",
                "lease_passed",
                "completed",
                "expired",
                "unknown",
                "released",
                "failed",
                "unreadable"
            ]
        );
    }
}
