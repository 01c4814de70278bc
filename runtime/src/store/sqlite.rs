//! [`SqliteStore`]: the embedded default. One file, so a repeat after a server restart is still
//! recognised (an in-memory store would forget, and charge twice). WAL mode, a 5 s busy timeout.

use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::Row;

use super::sql::{self, fenced_failure, unavailable, Migration, RecordRow, MIGRATIONS_TABLE};
use super::{
    BoxFuture, Claim, ClaimRequest, Completion, OutboxEntry, Settlement, Store, StoreError, Token,
    Unsettled,
};
use crate::clock::Timestamp;
use crate::key::{Key, Reference};
use crate::record::{RecordState, RecordStatus};

const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    description: "records and outbox",
    sql: include_str!("../../migrations/sqlite/0001_records.sql"),
}];

const CLAIM_ATTEMPTS: usize = 5;

const UPSERT: &str = "\
INSERT INTO idempotency_records
    (key, tenant, tool, generation, state, fingerprint, token, claimed_at, lease_expires_at)
VALUES ($1, $2, $3, 1, 0, $4, 1, $5, $6)
ON CONFLICT (key) DO UPDATE SET
    generation = CASE WHEN idempotency_records.state = 3 THEN idempotency_records.generation ELSE idempotency_records.generation + 1 END,
    state = 0, tenant = excluded.tenant, tool = excluded.tool, fingerprint = excluded.fingerprint,
    token = idempotency_records.token + 1, claimed_at = excluded.claimed_at,
    lease_expires_at = excluded.lease_expires_at,
    completed_at = NULL, expires_at = NULL, ok = NULL, response = NULL
WHERE idempotency_records.state = 3
   OR (idempotency_records.state = 1 AND idempotency_records.expires_at <= excluded.claimed_at)
RETURNING generation, token";

const SELECT_ROW: &str = "SELECT generation, state, fingerprint, token, claimed_at, lease_expires_at, completed_at, expires_at, ok, response \
     FROM idempotency_records WHERE key = $1";

/// A [`Store`] in a SQLite file.
///
/// ```no_run
/// # async fn demo() -> Result<(), idempotency::StoreError> {
/// use idempotency::{store::sqlite::SqliteStore, Idempotency};
/// let engine = Idempotency::new(SqliteStore::open("idempotency.db").await?);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating it if needed) the database file at `path`, in WAL mode with a 5 s busy
    /// timeout, and runs the migrations.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await
            .map_err(unavailable)?;
        Self::from_pool(pool).await
    }

    /// A store on an existing pool; runs the migrations.
    pub async fn from_pool(pool: SqlitePool) -> Result<Self, StoreError> {
        let store = SqliteStore { pool };
        store.migrate().await?;
        Ok(store)
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Applies the embedded migrations this build knows, recording them in
    /// `idempotency_migrations`; refuses a file migrated by a newer build.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mig = |e: sqlx::Error| StoreError::Migration(e.to_string());
        let mut conn = self.pool.acquire().await.map_err(unavailable)?;
        // IMMEDIATE takes the write lock up front: two processes opening one file apply once.
        sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut *conn).await.map_err(mig)?;
        let result = async {
            sqlx::raw_sql(
                "CREATE TABLE IF NOT EXISTS idempotency_migrations (version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)",
            )
            .execute(&mut *conn)
            .await
            .map_err(mig)?;
            let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM idempotency_migrations ORDER BY version")
                .fetch_all(&mut *conn)
                .await
                .map_err(mig)?;
            let known = MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(0);
            if let Some(newer) = applied.iter().find(|v| **v > known) {
                return Err(StoreError::Migration(format!(
                    "{MIGRATIONS_TABLE} records version {newer}, newer than this build knows ({known}); upgrade the library or use another file"
                )));
            }
            for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
                sqlx::raw_sql(m.sql).execute(&mut *conn).await.map_err(mig)?;
                sqlx::query("INSERT INTO idempotency_migrations (version, description) VALUES ($1, $2)")
                    .bind(m.version)
                    .bind(m.description)
                    .execute(&mut *conn)
                    .await
                    .map_err(mig)?;
            }
            Ok(())
        }
        .await;
        let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
        sqlx::raw_sql(end).execute(&mut *conn).await.map_err(mig)?;
        result
    }

    async fn row_now(&self, key: &Key) -> Result<Option<(i64, i64, i16)>, StoreError> {
        let row = sqlx::query("SELECT generation, token, state FROM idempotency_records WHERE key = $1")
            .bind(&key.as_bytes()[..])
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)?;
        row.map(|r| Ok((r.try_get(0).map_err(unavailable)?, r.try_get(1).map_err(unavailable)?, r.try_get(2).map_err(unavailable)?)))
            .transpose()
    }

    async fn fenced(&self, key: Key, token: Token, rows: u64, allowed: &[RecordState]) -> Result<(), StoreError> {
        if rows == 1 {
            return Ok(());
        }
        Err(fenced_failure(&key, token, self.row_now(&key).await?, allowed))
    }
}

fn record_row(r: &SqliteRow, offset: usize) -> Result<RecordRow, sqlx::Error> {
    Ok(RecordRow {
        generation: r.try_get(offset)?,
        state: r.try_get(offset + 1)?,
        fingerprint: r.try_get(offset + 2)?,
        token: r.try_get(offset + 3)?,
        claimed_at: r.try_get(offset + 4)?,
        lease_expires_at: r.try_get(offset + 5)?,
        completed_at: r.try_get(offset + 6)?,
        expires_at: r.try_get(offset + 7)?,
        ok: r.try_get(offset + 8)?,
        response: r.try_get(offset + 9)?,
    })
}

impl Store for SqliteStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let key = &req.key.as_bytes()[..];
            for _ in 0..CLAIM_ATTEMPTS {
                let won = sqlx::query(UPSERT)
                    .bind(key)
                    .bind(req.tenant)
                    .bind(req.tool)
                    .bind(req.fingerprint.as_ref().map(|f| &f.as_bytes()[..]))
                    .bind(req.now.as_millis())
                    .bind(req.lease_expires_at.as_millis())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(unavailable)?;
                if let Some(row) = won {
                    let generation: i64 = row.try_get(0).map_err(unavailable)?;
                    let token: i64 = row.try_get(1).map_err(unavailable)?;
                    return Ok(Claim::New { reference: req.key.reference(sql::u32_gen(generation)?), token: Token(token) });
                }
                let Some(row) = sqlx::query(SELECT_ROW).bind(key).fetch_optional(&self.pool).await.map_err(unavailable)? else {
                    continue; // purged between the two statements
                };
                match record_row(&row, 0).map_err(unavailable)?.existing_claim(&req.key, &req.fingerprint) {
                    Err(StoreError::Unavailable(_)) => continue,
                    other => return other,
                }
            }
            Err(StoreError::Unavailable("the claim kept racing with concurrent writers; try again".into()))
        })
    }

    fn complete<'a>(&'a self, c: &'a Completion<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.pool.begin().await.map_err(unavailable)?;
            let generation: Option<i64> = sqlx::query_scalar(
                "UPDATE idempotency_records SET state = 1, ok = $3, response = $4, completed_at = $5, expires_at = $6 \
                 WHERE key = $1 AND token = $2 AND state = 0 RETURNING generation",
            )
            .bind(&c.key.as_bytes()[..])
            .bind(c.token.0)
            .bind(c.response.ok)
            .bind(&c.response.body)
            .bind(c.now.as_millis())
            .bind(c.expires_at.as_millis())
            .fetch_optional(&mut *tx)
            .await
            .map_err(unavailable)?;
            let Some(generation) = generation else {
                drop(tx);
                return self.fenced(c.key, c.token, 0, &[RecordState::InFlight]).await;
            };
            for m in c.outbox {
                sqlx::query("INSERT INTO idempotency_outbox (key, generation, topic, payload, visible_at) VALUES ($1, $2, $3, $4, $5)")
                    .bind(&c.key.as_bytes()[..])
                    .bind(generation)
                    .bind(&m.topic)
                    .bind(&m.payload)
                    .bind(c.now.as_millis())
                    .execute(&mut *tx)
                    .await
                    .map_err(unavailable)?;
            }
            tx.commit().await.map_err(unavailable)
        })
    }

    fn release(&self, key: Key, token: Token, now: Timestamp) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let done = sqlx::query(
                "UPDATE idempotency_records SET state = 3, completed_at = $3, expires_at = $3 WHERE key = $1 AND token = $2 AND state = 0",
            )
            .bind(&key.as_bytes()[..])
            .bind(token.0)
            .bind(now.as_millis())
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
            self.fenced(key, token, done.rows_affected(), &[RecordState::InFlight]).await
        })
    }

    fn mark_unknown(&self, key: Key, token: Token, _now: Timestamp) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let done = sqlx::query("UPDATE idempotency_records SET state = 2 WHERE key = $1 AND token = $2 AND state = 0")
                .bind(&key.as_bytes()[..])
                .bind(token.0)
                .execute(&self.pool)
                .await
                .map_err(unavailable)?;
            self.fenced(key, token, done.rows_affected(), &[RecordState::InFlight]).await
        })
    }

    fn renew(&self, key: Key, token: Token, lease_expires_at: Timestamp) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let done = sqlx::query("UPDATE idempotency_records SET lease_expires_at = $3 WHERE key = $1 AND token = $2 AND state = 0")
                .bind(&key.as_bytes()[..])
                .bind(token.0)
                .bind(lease_expires_at.as_millis())
                .execute(&self.pool)
                .await
                .map_err(unavailable)?;
            self.fenced(key, token, done.rows_affected(), &[RecordState::InFlight]).await
        })
    }

    fn status<'a>(&'a self, tenant: &'a str, reference: Reference) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>> {
        Box::pin(async move {
            let (lo, hi) = reference.key_range();
            let row = sqlx::query(
                "SELECT tool, generation, state, fingerprint, token, claimed_at, lease_expires_at, completed_at, expires_at, ok, response \
                 FROM idempotency_records WHERE key BETWEEN $1 AND $2 AND tenant = $3 AND generation = $4 LIMIT 1",
            )
            .bind(&lo[..])
            .bind(&hi[..])
            .bind(tenant)
            .bind(i64::from(reference.generation()))
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)?;
            let Some(row) = row else { return Ok(None) };
            let tool: String = row.try_get(0).map_err(unavailable)?;
            record_row(&row, 1).map_err(unavailable)?.status(reference, tool).map(Some)
        })
    }

    fn purge(&self, older_than: Timestamp, limit: u32) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let done = sqlx::query(
                "DELETE FROM idempotency_records WHERE key IN \
                 (SELECT key FROM idempotency_records WHERE state IN (1, 3) AND expires_at < $1 LIMIT $2)",
            )
            .bind(older_than.as_millis())
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
            Ok(done.rows_affected())
        })
    }

    fn unsettled(&self, now: Timestamp, limit: u32) -> BoxFuture<'_, Result<Vec<Unsettled>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT key, generation, tenant, tool, state, token, claimed_at FROM idempotency_records \
                 WHERE state = 2 OR (state = 0 AND lease_expires_at <= $1) ORDER BY claimed_at, key LIMIT $2",
            )
            .bind(now.as_millis())
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(unavailable)?;
            rows.iter()
                .map(|r| {
                    let key: Vec<u8> = r.try_get(0).map_err(unavailable)?;
                    sql::unsettled(
                        &key,
                        r.try_get(1).map_err(unavailable)?,
                        r.try_get(2).map_err(unavailable)?,
                        r.try_get(3).map_err(unavailable)?,
                        r.try_get(4).map_err(unavailable)?,
                        r.try_get(5).map_err(unavailable)?,
                        r.try_get(6).map_err(unavailable)?,
                    )
                })
                .collect()
        })
    }

    fn settle<'a>(
        &'a self,
        key: Key,
        token: Token,
        settlement: &'a Settlement,
        now: Timestamp,
        window: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let (state, ok, body, expires) = match settlement {
                Settlement::Completed(r) => (1i16, Some(r.ok), Some(r.body.as_str()), Some((now + window).as_millis())),
                Settlement::Released => (3, None, None, Some(now.as_millis())),
                Settlement::Unknown => (2, None, None, None),
            };
            let completed = if state == 2 { None } else { Some(now.as_millis()) };
            let done = sqlx::query(
                "UPDATE idempotency_records SET token = token + 1, state = $3, ok = $4, response = $5, completed_at = $6, expires_at = $7 \
                 WHERE key = $1 AND token = $2 AND state IN (0, 2)",
            )
            .bind(&key.as_bytes()[..])
            .bind(token.0)
            .bind(state)
            .bind(ok)
            .bind(body)
            .bind(completed)
            .bind(expires)
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
            self.fenced(key, token, done.rows_affected(), &[RecordState::InFlight, RecordState::Unknown]).await
        })
    }

    fn outbox_fetch(&self, now: Timestamp, redeliver_after: Duration, limit: u32) -> BoxFuture<'_, Result<Vec<OutboxEntry>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "UPDATE idempotency_outbox SET attempts = attempts + 1, visible_at = $2 WHERE id IN \
                 (SELECT id FROM idempotency_outbox WHERE visible_at <= $1 ORDER BY id LIMIT $3) \
                 RETURNING id, key, generation, topic, payload, attempts - 1",
            )
            .bind(now.as_millis())
            .bind((now + redeliver_after).as_millis())
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(unavailable)?;
            let mut out = rows
                .iter()
                .map(|r| {
                    let key: Vec<u8> = r.try_get(1).map_err(unavailable)?;
                    let attempts: i64 = r.try_get(5).map_err(unavailable)?;
                    Ok(OutboxEntry {
                        id: r.try_get(0).map_err(unavailable)?,
                        reference: sql::key_of(&key)?.reference(sql::u32_gen(r.try_get(2).map_err(unavailable)?)?),
                        topic: r.try_get(3).map_err(unavailable)?,
                        payload: r.try_get(4).map_err(unavailable)?,
                        attempts: i32::try_from(attempts).unwrap_or(i32::MAX),
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            out.sort_by_key(|e| e.id);
            Ok(out)
        })
    }

    fn outbox_ack(&self, id: i64) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query("DELETE FROM idempotency_outbox WHERE id = $1").bind(id).execute(&self.pool).await.map_err(unavailable)?;
            Ok(())
        })
    }
}
