//! [`SqliteStore`]: the embedded default. One file, so a repeat after a server restart is still
//! recognised (an in-memory store would forget, and run the side effect again).
//!
//! The record row is PostgreSQL's, column for column (`migrations/sqlite/0001_records.sql`): the
//! primary key is the reference (the key's first 8 bytes as a 64-bit integer, here the rowid
//! itself) with the key's other 24 bytes beside it, so a claim whose reference is held by a
//! different key is refused with [`StoreError::ReferenceTaken`] and a status lookup is a
//! primary-key probe. One index on two columns a completion keeps (`window_ms`, `claimed_at`)
//! serves the background work (purge and the reconciler), as on PostgreSQL.

use std::path::Path;
use std::time::Duration;

use sqlx::query::Query;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous,
};
use sqlx::{Row, Sqlite};

use super::sql::{
    self, db_error, raced, ref_of, ref_value, rest_of, state_code, why_fenced, Bookkeeping,
    Migration, RecordRow, CLAIM_ATTEMPTS, FENCE_ATTEMPTS,
};
use super::{
    BoxFuture, Claim, ClaimRequest, Completion, RecordStore, Settlement, StoreError, Token,
    WORKER_SETTLES,
};
use crate::clock::Timestamp;
use crate::key::{Key, Reference};
use crate::record::{RecordState, RecordStatus};

mod admin;
mod background;
mod existing;
mod secret;
mod statements;
mod transaction;

use statements::{CLAIM, CLAIM_WATCHED, COMPLETE, COMPLETE_RETURNING, ROW_NOW};

const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    description: "records and outbox",
    sql: include_str!("../../../migrations/sqlite/0001_records.sql"),
}];

/// A claim that waited this long for its connection watches itself ([`CLAIM_WATCHED`]): the
/// reconciler's mark trails a round's clock by the busy timeout and 5 s, which covers a claim's
/// wait for the write lock (at most the busy timeout) and this one, not a longer wait for a
/// connection of the pool.
const WATCH_AFTER: Duration = Duration::from_secs(1);

/// The pool size [`SqliteStore::open`] uses: readers run side by side in WAL mode; writers
/// take turns on the file's lock.
const POOL_SIZE: u32 = 4;

/// The migration runner's statements for SQLite: `BEGIN IMMEDIATE` takes the file's write lock,
/// so processes opening one file together apply the migrations once.
const BOOKKEEPING: Bookkeeping = Bookkeeping {
    begin: "BEGIN IMMEDIATE",
    lock: None,
    exists: "SELECT (SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'idempotency_migrations')",
    create: "CREATE TABLE idempotency_migrations (version INTEGER PRIMARY KEY, \
             description TEXT NOT NULL, checksum BLOB NOT NULL, \
             applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))",
    place: "this database file",
};

type SqliteQuery = Query<'static, Sqlite, SqliteArguments>;

/// A [`Store`](super::Store) in a SQLite file: survives restarts, serves one machine.
///
/// ```no_run
/// # async fn demo() -> Result<(), idempotency::store::StoreError> {
/// use idempotency::{store::SqliteStore, Idempotency};
/// let engine = Idempotency::new(SqliteStore::open("idempotency.db").await?);
/// # let _ = engine; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// The keys this store (and its clones) runs a transactional call for now.
    busy: std::sync::Arc<transaction::Busy>,
    /// How far the reconciler's mark trails a round's clock, in ms: the connections' busy
    /// timeout and 5 s (see [`WATCH_AFTER`]).
    mark_lag_ms: i64,
}

impl SqliteStore {
    /// Opens the database file at `path` (creating it if needed) with
    /// [`SqliteStore::connect_options`], in a pool of 4 connections, and runs the migrations.
    ///
    /// A file that cannot be opened fails with its path and SQLite's reason in the error's
    /// sources (`cannot connect to the SQLite file /srv/app/idempotency.db: … unable to open
    /// database file`).
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        // Servers starting together on a new file race for its WAL switch: see `retry_busy`.
        existing::retry_busy(|| async {
            let pool = Self::pool_at(path, Self::connect_options(path), POOL_SIZE).await?;
            Self::from_pool(pool).await
        })
        .await
    }

    /// The options [`SqliteStore::open`] uses: create the file if missing, WAL journal,
    /// `synchronous = NORMAL` (a commit survives a crash of the process; a power loss may lose
    /// the last commits, never corrupt the file), a 5 s busy timeout. For a pool you build yourself.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idempotency::store::SqliteStore;
    /// let pool = sqlx::sqlite::SqlitePoolOptions::new()
    ///     .max_connections(8)
    ///     .connect_with(SqliteStore::connect_options("idempotency.db"))
    ///     .await?;
    /// let store = SqliteStore::from_pool(pool).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn connect_options(path: impl AsRef<Path>) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
    }

    /// A store on an existing pool; runs the migrations.
    ///
    /// Refuses a pool on an in-memory or temporary database (`:memory:`, `mode=memory`, an empty
    /// file name): each of its connections would see a database of its own, and records would
    /// vanish with a recycled connection, so a repeat could run again. Use
    /// [`MemoryStore`](crate::store::memory::MemoryStore) for records in memory. Logs a warning
    /// when the connections are not in WAL mode or have no busy timeout (build the pool from
    /// [`SqliteStore::connect_options`]).
    pub async fn from_pool(pool: SqlitePool) -> Result<Self, StoreError> {
        let store = Self::unmigrated(pool).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// A store on `pool` as it is (checked as [`SqliteStore::from_pool`] checks it), not migrated.
    async fn unmigrated(pool: SqlitePool) -> Result<Self, StoreError> {
        let (file, journal, busy): (Option<String>, String, i64) = sqlx::query_as(
            "SELECT (SELECT file FROM pragma_database_list WHERE name = 'main'), \
                    (SELECT journal_mode FROM pragma_journal_mode), (SELECT timeout FROM pragma_busy_timeout)",
        )
        .fetch_one(&pool)
        .await
        .map_err(db_error)?;
        if file.as_deref().unwrap_or("").is_empty() {
            return Err(StoreError::Config {
                problem: "SqliteStore needs a database file: this pool's database is in memory or temporary, so its \
                 records would not survive a recycled connection or a restart and a repeat could run twice. \
                 Open a file (SqliteStore::open(\"idempotency.db\")) or use MemoryStore for tests"
                    .into(),
                source: None,
            });
        }
        if !journal.eq_ignore_ascii_case("wal") || busy == 0 {
            tracing::warn!(
                journal_mode = %journal,
                busy_timeout_ms = busy,
                "SqliteStore: this pool's connections are not in WAL mode with a busy timeout; concurrent calls \
                 may fail with 'database is locked'. Build the pool from SqliteStore::connect_options(path)."
            );
        }
        Ok(SqliteStore {
            pool,
            busy: Default::default(),
            mark_lag_ms: busy.max(0).saturating_add(5_000),
        })
    }

    /// The connection pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// For the plan tests: the background statements as this store runs them, purge, the
    /// reconciler round's read, and its write (several statements, separated by `;`)
    /// (`EXPLAIN QUERY PLAN` shows which index each uses).
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn background_statements() -> [&'static str; 3] {
        [background::PURGE, background::FRESH, background::UNSETTLED]
    }

    /// Applies the migrations this build embeds that the file lacks, in one `BEGIN IMMEDIATE`
    /// transaction (it holds the file's write lock, so processes opening one file together apply
    /// them once), and records them in the library's own `idempotency_migrations` table. Refuses
    /// a file that records a migration this build does not know. The constructors call it;
    /// running it again changes nothing.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sql::migrate(&self.pool, MIGRATIONS, &BOOKKEEPING).await
    }

    /// The row under the key's `ref` now, for [`why_fenced`].
    async fn row_now(&self, key: &Key) -> Result<Option<sql::FenceRow>, StoreError> {
        sqlx::query_as(ROW_NOW)
            .bind(ref_of(key))
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)
    }

    /// Runs a fenced update; when it changes nothing, reads the row to say why.
    async fn fenced(
        &self,
        key: Key,
        token: Token,
        (allowed, what): (&[RecordState], &'static str),
        query: impl Fn() -> SqliteQuery + Send,
    ) -> Result<(), StoreError> {
        for _ in 0..FENCE_ATTEMPTS {
            let done = query().execute(&self.pool).await.map_err(db_error)?;
            if done.rows_affected() > 0 {
                return Ok(());
            }
            why_fenced(&key, token, self.row_now(&key).await?, allowed)?;
        }
        Err(raced(what, FENCE_ATTEMPTS))
    }

    /// A completion with outbox messages: the update and the inserts in one transaction.
    async fn complete_with_outbox(&self, c: &Completion<'_>) -> Result<bool, StoreError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db_error)?;
        let generation: Option<i64> = sqlx::query_scalar(COMPLETE_RETURNING)
            .bind(ref_of(&c.key))
            .bind(rest_of(&c.key))
            .bind(c.token.0)
            .bind(state_code(RecordState::Completed, Some(c.response.ok)))
            .bind(c.response.body.as_str())
            .bind(c.now.as_millis())
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_error)?;
        let Some(generation) = generation else {
            return Ok(false);
        };
        for m in c.outbox {
            sqlx::query("INSERT INTO idempotency_outbox (key, generation, topic, payload, visible_at) VALUES ($1, $2, $3, $4, $5)")
                .bind(bytes(&c.key))
                .bind(generation)
                .bind(m.topic.as_str())
                .bind(m.payload.as_str())
                .bind(c.now.as_millis())
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(true)
    }
}

/// A window's length as the row keeps it: whole milliseconds, saturating.
fn window_ms(window: Duration) -> i64 {
    i64::try_from(window.as_millis()).unwrap_or(i64::MAX)
}

fn bytes(key: &Key) -> &[u8] {
    &key.as_bytes()[..]
}

/// [`CLAIM`]'s parameters, in its text's order (see there), after whatever `query` holds.
fn claim_query<'q>(
    query: Query<'q, Sqlite, SqliteArguments>,
    req: &'q ClaimRequest<'q>,
    fingerprint: &'q [u8],
) -> Query<'q, Sqlite, SqliteArguments> {
    query
        .bind(ref_of(&req.key))
        .bind(req.token.0)
        .bind(req.now.as_millis())
        .bind((req.now + req.lease).as_millis())
        .bind(window_ms(req.window))
        .bind(rest_of(&req.key))
        .bind(req.tenant)
        .bind(req.subject.unwrap_or(""))
        .bind(req.tool)
        .bind(fingerprint)
        .bind(ref_of(&req.key))
}

/// A fenced statement's first three parameters: `$1` ref, `$2` key_rest, `$3` token.
fn fenced_query(sql: &'static str, key: &Key, token: Token) -> SqliteQuery {
    sqlx::query(sql)
        .bind(ref_of(key))
        .bind(rest_of(key).to_vec())
        .bind(token.0)
}

impl RecordStore for SqliteStore {
    /// The engine's times: `ends_at = now + window_ms` at the completion.
    fn window_clock(&self) -> super::WindowClock {
        super::WindowClock::Engine
    }

    /// One call to sqlx's SQLite worker answers a fresh claim, a takeover and a repeat alike:
    /// the upsert, then (only when it changed nothing) the row it found, in one prepared batch
    /// (`CLAIM`) read up to its first row: sqlx's worker stops there, so a claim that wins runs
    /// the upsert alone and sends one row back (reading the batch to its end cost a second
    /// statement and two more hand-offs from the worker thread, about 8,000 instructions a
    /// fresh call). The answer comes from that read; a row that changed between the two
    /// statements, so that it is now one to take over, makes the claim run again. A row of
    /// another key under the reference (a second call, about one claim in 2^64) is refused.
    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let fingerprint = req
                .fingerprint
                .as_ref()
                .map_or(&[][..], |f| &f.as_bytes()[..]);
            let started = std::time::Instant::now();
            for _ in 0..CLAIM_ATTEMPTS {
                let mut conn = self.pool.acquire().await.map_err(db_error)?;
                // Its time may be behind the reconciler's mark by now: watched, it is listed
                // once its lease ends whatever the mark.
                let query = if started.elapsed() >= WATCH_AFTER {
                    // The watch's row first: CLAIM_WATCHED's first parameter.
                    sqlx::query(CLAIM_WATCHED).bind(ref_of(&req.key))
                } else {
                    sqlx::query(CLAIM)
                };
                let row = claim_query(query, req, fingerprint)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(db_error)?;
                // Neither statement answered: the row went between them (a purge). Again.
                let Some(row) = row else { continue };
                let won: i64 = row.try_get(0).map_err(db_error)?;
                if won == 1 {
                    let generation: i64 = row.try_get(1).map_err(db_error)?;
                    let token: i64 = row.try_get(2).map_err(db_error)?;
                    return Ok(Claim::New {
                        reference: req.key.reference(sql::generation_of(generation)?),
                        token: Token(token),
                    });
                }
                let rec = RecordRow::read(&row, 1).map_err(db_error)?;
                if let Some(answer) = rec.existing_claim(&req.key, &req.fingerprint, req.now)? {
                    return Ok(answer);
                }
            }
            Err(raced("the claim", CLAIM_ATTEMPTS))
        })
    }

    fn complete<'a>(&'a self, c: &'a Completion<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if c.outbox.is_empty() {
                let state = state_code(RecordState::Completed, Some(c.response.ok));
                return self
                    .fenced(c.key, c.token, (WORKER_SETTLES, "the completion"), || {
                        sqlx::query(COMPLETE)
                            .bind(state)
                            .bind(c.response.body.as_str())
                            .bind(c.now.as_millis())
                            .bind(c.now.as_millis())
                            .bind(ref_of(&c.key))
                            .bind(rest_of(&c.key).to_vec())
                            .bind(c.token.0)
                    })
                    .await;
            }
            for _ in 0..FENCE_ATTEMPTS {
                if self.complete_with_outbox(c).await? {
                    return Ok(());
                }
                why_fenced(&c.key, c.token, self.row_now(&c.key).await?, WORKER_SETTLES)?;
            }
            Err(raced("the completion", FENCE_ATTEMPTS))
        })
    }

    fn release(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.fenced(
            key,
            token,
            (WORKER_SETTLES, "the release"),
            move || {
                fenced_query(
                    "UPDATE idempotency_records SET state = 3, completed_at = $4, ends_at = $4, \
                     window_ms = 0 WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state IN (0, 2)",
                    &key,
                    token,
                )
                .bind(now.as_millis())
            },
        ))
    }

    fn mark_unknown(&self, key: Key, token: Token) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.fenced(key, token, (&[RecordState::InFlight], "marking the outcome unknown"), move || {
            fenced_query(
                "UPDATE idempotency_records SET state = 2 WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state = 0",
                &key,
                token,
            )
        }))
    }

    /// One statement; the state and the lease are the fence (the first takeover makes the lease
    /// live for the others: SQLite runs writers one at a time).
    fn take_over(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Reference, StoreError>> {
        let lease_expires_at = now + lease;
        Box::pin(async move {
            let generation: Option<i64> = sqlx::query_scalar(
                "UPDATE idempotency_records SET token = $3, state = 0, ends_at = $5 \
                 WHERE ref = $1 AND key_rest = $2 AND ((state = 0 AND ends_at <= $4) OR state = 2) \
                 RETURNING generation",
            )
            .bind(ref_of(&key))
            .bind(rest_of(&key))
            .bind(token.0)
            .bind(now.as_millis())
            .bind(lease_expires_at.as_millis())
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
            match generation {
                Some(g) => Ok(key.reference(sql::generation_of(g)?)),
                None => Err(sql::why_not_taken(&key, self.row_now(&key).await?)),
            }
        })
    }

    fn renew(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let lease_expires_at = now + lease;
        Box::pin(self.fenced(key, token, (&[RecordState::InFlight], "the lease renewal"), move || {
            fenced_query(
                "UPDATE idempotency_records SET ends_at = $4 WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state = 0",
                &key,
                token,
            )
            .bind(lease_expires_at.as_millis())
        }))
    }

    /// A primary-key probe: the reference is the primary key.
    fn transactions(&self) -> Option<&dyn super::TransactionalStore> {
        Some(self)
    }

    fn status<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>> {
        Box::pin(async move {
            // A generation below 1 is read, and refused as corrupt, rather than hidden.
            let row = sqlx::query(
                "SELECT tool, key_rest, generation, state, fingerprint, claimed_at, ends_at, completed_at, \
                 response FROM idempotency_records WHERE ref = $1 AND tenant = $2 AND (generation >= $3 OR generation < 1) \
                 AND (subject = '' OR subject = $4)",
            )
            .bind(ref_value(&reference))
            .bind(tenant)
            .bind(i64::from(reference.generation()))
            .bind(subject)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
            let Some(row) = row else { return Ok(None) };
            let tool: String = row.try_get(0).map_err(db_error)?;
            RecordRow::read(&row, 1)
                .map_err(db_error)?
                .status(reference, tool, None)
                .map(Some)
        })
    }

    fn settle<'a>(
        &'a self,
        key: Key,
        token: Token,
        settlement: &'a Settlement,
        at: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (code, body, completed) = sql::settlement_columns(settlement, at);
        let allowed = &[RecordState::InFlight, RecordState::Unknown];
        // Unknown keeps its lease end in `ends_at`; released stops answering at once (its window
        // is 0, as a release's); completed answers for the record's own window from the
        // settlement.
        Box::pin(
            self.fenced(key, token, (allowed, "the settlement"), move || {
                fenced_query(
                    "UPDATE idempotency_records SET token = CASE WHEN $4 = 2 THEN token ELSE token + 1 END, state = $4, response = $5, \
                 completed_at = $6, \
                 ends_at = CASE $4 WHEN 2 THEN ends_at WHEN 3 THEN $6 ELSE $6 + window_ms END, \
                 window_ms = CASE $4 WHEN 3 THEN 0 ELSE window_ms END \
                 WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state IN (0, 2)",
                    &key,
                    token,
                )
                .bind(code)
                .bind(body)
                .bind(completed)
            }),
        )
    }
}
