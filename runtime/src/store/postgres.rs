//! [`PostgresStore`]: what users run when one machine is not enough. Every replica of the server
//! shares one database; the primary key makes exactly one replica win each claim.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, Row, Transaction};

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
    sql: include_str!("../../migrations/postgres/0001_records.sql"),
}];

/// How often a claim retries when a concurrent insert committed after its snapshot (rare).
const CLAIM_ATTEMPTS: usize = 5;

// One statement: insert, or take over a released / window-expired row, or return the row as it is.
const CLAIM: &str = "\
WITH ins AS (
    INSERT INTO idempotency_records AS r
        (key, tenant, tool, generation, state, fingerprint, token, claimed_at, lease_expires_at)
    VALUES ($1, $2, $3, 1, 0, $4, 1, $5, $6)
    ON CONFLICT (key) DO UPDATE SET
        generation = CASE WHEN r.state = 3 THEN r.generation ELSE r.generation + 1 END,
        state = 0, tenant = EXCLUDED.tenant, tool = EXCLUDED.tool, fingerprint = EXCLUDED.fingerprint,
        token = r.token + 1, claimed_at = EXCLUDED.claimed_at, lease_expires_at = EXCLUDED.lease_expires_at,
        completed_at = NULL, expires_at = NULL, ok = NULL, response = NULL
    WHERE r.state = 3 OR (r.state = 1 AND r.expires_at <= EXCLUDED.claimed_at)
    RETURNING true AS fresh, generation::BIGINT AS generation, state, fingerprint, token, claimed_at,
              lease_expires_at, completed_at, expires_at, ok, response
)
SELECT * FROM ins
UNION ALL
SELECT false, generation::BIGINT, state, fingerprint, token, claimed_at, lease_expires_at,
       completed_at, expires_at, ok, response
FROM idempotency_records WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM ins)";

const ROW_NOW: &str = "SELECT generation::BIGINT, token, state FROM idempotency_records WHERE key = $1";

/// A [`Store`] on PostgreSQL.
///
/// ```no_run
/// # async fn demo() -> Result<(), idempotency::StoreError> {
/// use idempotency::{store::postgres::PostgresStore, Idempotency};
/// let store = PostgresStore::connect("postgres://app@db/app").await?;
/// let engine = Idempotency::new(store);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects to `url` (a pool of up to 32 connections) and runs the migrations.
    ///
    /// Every connection plans each statement for its parameters (`plan_cache_mode =
    /// force_custom_plan`): a prepared statement first planned while the table was empty can
    /// otherwise keep a sequential-scan plan as the table grows.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let opts: PgConnectOptions = url
            .parse()
            .map_err(|e: sqlx::Error| StoreError::Unavailable(format!("DATABASE_URL is not a PostgreSQL URL: {e}").into()))?;
        let pool = PgPoolOptions::new()
            .max_connections(32)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(Self::tune(opts))
            .await
            .map_err(unavailable)?;
        Self::from_pool(pool).await
    }

    /// The connection options this store recommends (adds `plan_cache_mode = force_custom_plan`).
    pub fn tune(opts: PgConnectOptions) -> PgConnectOptions {
        opts.options([("plan_cache_mode", "force_custom_plan")])
    }

    /// A store on an existing pool (the application's own); runs the migrations.
    pub async fn from_pool(pool: PgPool) -> Result<Self, StoreError> {
        let store = PostgresStore { pool };
        store.migrate().await?;
        Ok(store)
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies the embedded migrations this build knows, under an advisory lock so replicas
    /// starting together do not race, recording them in `idempotency_migrations`. Refuses a
    /// database migrated by a newer build.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mig = |e: sqlx::Error| StoreError::Migration(e.to_string());
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        sqlx::query("SELECT pg_advisory_xact_lock(7306189431907655)").execute(&mut *tx).await.map_err(mig)?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS idempotency_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .execute(&mut *tx)
        .await
        .map_err(mig)?;
        let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM idempotency_migrations ORDER BY version")
            .fetch_all(&mut *tx)
            .await
            .map_err(mig)?;
        let known = MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(0);
        if let Some(newer) = applied.iter().find(|v| **v > known) {
            return Err(StoreError::Migration(format!(
                "{MIGRATIONS_TABLE} records version {newer}, newer than this build knows ({known}); upgrade the library or use another schema"
            )));
        }
        for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
            sqlx::raw_sql(m.sql).execute(&mut *tx).await.map_err(mig)?;
            sqlx::query("INSERT INTO idempotency_migrations (version, description) VALUES ($1, $2)")
                .bind(m.version)
                .bind(m.description)
                .execute(&mut *tx)
                .await
                .map_err(mig)?;
        }
        tx.commit().await.map_err(mig)
    }

    async fn row_now(&self, key: &Key) -> Result<Option<(i64, i64, i16)>, StoreError> {
        let row = sqlx::query(ROW_NOW).bind(&key.as_bytes()[..]).fetch_optional(&self.pool).await.map_err(unavailable)?;
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

fn record_row(r: &PgRow, offset: usize) -> Result<RecordRow, sqlx::Error> {
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

async fn write_outbox(tx: &mut Transaction<'_, Postgres>, c: &Completion<'_>, generation: i32) -> Result<(), sqlx::Error> {
    for m in c.outbox {
        sqlx::query("INSERT INTO idempotency_outbox (visible_at, generation, key, topic, payload) VALUES ($1, $2, $3, $4, $5)")
            .bind(c.now.as_millis())
            .bind(generation)
            .bind(&c.key.as_bytes()[..])
            .bind(&m.topic)
            .bind(&m.payload)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

const COMPLETE: &str = "UPDATE idempotency_records SET state = 1, ok = $3, response = $4, completed_at = $5, expires_at = $6 \
     WHERE key = $1 AND token = $2 AND state = 0";

impl Store for PostgresStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            for _ in 0..CLAIM_ATTEMPTS {
                let row = sqlx::query(CLAIM)
                    .bind(&req.key.as_bytes()[..])
                    .bind(req.tenant)
                    .bind(req.tool)
                    .bind(req.fingerprint.as_ref().map(|f| &f.as_bytes()[..]))
                    .bind(req.now.as_millis())
                    .bind(req.lease_expires_at.as_millis())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(unavailable)?;
                // No row: the conflicting row was committed after this statement's snapshot.
                let Some(row) = row else { continue };
                let fresh: bool = row.try_get(0).map_err(unavailable)?;
                let rec = record_row(&row, 1).map_err(unavailable)?;
                if fresh {
                    return Ok(Claim::New { reference: rec.reference(&req.key)?, token: Token(rec.token) });
                }
                match rec.existing_claim(&req.key, &req.fingerprint) {
                    Err(StoreError::Unavailable(_)) => continue,
                    other => return other,
                }
            }
            Err(StoreError::Unavailable("the claim kept racing with concurrent writers; try again".into()))
        })
    }

    fn complete<'a>(&'a self, c: &'a Completion<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let bind = |q: sqlx::query::Query<'a, Postgres, sqlx::postgres::PgArguments>| {
                q.bind(&c.key.as_bytes()[..])
                    .bind(c.token.0)
                    .bind(c.response.ok)
                    .bind(&c.response.body)
                    .bind(c.now.as_millis())
                    .bind(c.expires_at.as_millis())
            };
            if c.outbox.is_empty() {
                let done = bind(sqlx::query(COMPLETE)).execute(&self.pool).await.map_err(unavailable)?;
                return self.fenced(c.key, c.token, done.rows_affected(), &[RecordState::InFlight]).await;
            }
            let mut tx = self.pool.begin().await.map_err(unavailable)?;
            let generation: Option<i32> = sqlx::query_scalar(
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
            write_outbox(&mut tx, c, generation).await.map_err(unavailable)?;
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
                "SELECT tool, generation::BIGINT, state, fingerprint, token, claimed_at, lease_expires_at, completed_at, expires_at, ok, response \
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
                "SELECT key, generation::BIGINT, tenant, tool, state, token, claimed_at FROM idempotency_records \
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
                 (SELECT id FROM idempotency_outbox WHERE visible_at <= $1 ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) \
                 RETURNING id, key, generation::BIGINT, topic, payload, attempts - 1",
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
                    Ok(OutboxEntry {
                        id: r.try_get(0).map_err(unavailable)?,
                        reference: sql::key_of(&key)?.reference(sql::u32_gen(r.try_get(2).map_err(unavailable)?)?),
                        topic: r.try_get(3).map_err(unavailable)?,
                        payload: r.try_get(4).map_err(unavailable)?,
                        attempts: r.try_get(5).map_err(unavailable)?,
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
