//! Opening the SQLite store: the file and its pool, the options its connections need, a pool
//! of your own checked, and the migrations.

use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};

use super::existing::retry_busy;
use super::{SqliteStore, BOOKKEEPING, MIGRATIONS, POOL_SIZE};
use crate::store::sql::{self, db_error};
use crate::store::StoreError;

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
        retry_busy(|| async {
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
    pub(super) async fn unmigrated(pool: SqlitePool) -> Result<Self, StoreError> {
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
        [
            super::background::PURGE,
            super::background::FRESH,
            super::background::UNSETTLED,
        ]
    }

    /// Applies the migrations this build embeds that the file lacks, in one `BEGIN IMMEDIATE`
    /// transaction (it holds the file's write lock, so processes opening one file together apply
    /// them once), and records them in the library's own `idempotency_migrations` table. Refuses
    /// a file that records a migration this build does not know. The constructors call it;
    /// running it again changes nothing.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sql::migrate(&self.pool, MIGRATIONS, &BOOKKEEPING).await
    }
}
