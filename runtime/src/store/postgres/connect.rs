//! Connecting the PostgreSQL store: the pool, the session settings its statements are planned
//! for (`tune`), the test clocks, the migrations, and connecting to a schema that must already
//! hold a store (`connect_existing`, for operators' tools).

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::super::sql::{self, db_error, Bookkeeping, Migration};
use super::{PostgresStore, StoreError};
use crate::store::Access;

const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    description: "records and outbox",
    sql: include_str!("../../../migrations/postgres/0001_records.sql"),
}];

/// How long [`PostgresStore::connect`] waits for a database that does not answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The pool size [`PostgresStore::connect`] uses.
const POOL_SIZE: u32 = 10;

/// Two-key advisory lock for migrations: a constant ("idmp") and the schema, so stores in
/// different schemas of one database migrate independently.
const MIGRATION_LOCK: &str =
    "SELECT pg_advisory_xact_lock(1768189296, hashtext(coalesce(current_schema(), '')))";

/// The migration runner's statements for PostgreSQL: a transaction under [`MIGRATION_LOCK`].
const BOOKKEEPING: Bookkeeping = Bookkeeping {
    begin: "BEGIN",
    lock: Some(MIGRATION_LOCK),
    exists: "SELECT to_regclass('idempotency_migrations')::TEXT",
    create: "CREATE TABLE idempotency_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
             checksum BYTEA NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    place: "this schema",
};

impl PostgresStore {
    /// Connects to `url` (a pool of 10 connections, tuned by [`PostgresStore::tune`]) and runs the
    /// migrations.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options: PgConnectOptions =
            url.parse().map_err(|e: sqlx::Error| StoreError::Config {
                problem: "the PostgreSQL connection URL is not usable".into(),
                source: Some(Box::new(e)),
            })?;
        Self::connect_with(options).await
    }

    /// Like [`PostgresStore::connect`], from connection options (say, with a `search_path`).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), idempotency::store::StoreError> {
    /// use idempotency::store::PostgresStore;
    /// use sqlx::postgres::PgConnectOptions;
    /// let options = PgConnectOptions::new().host("db.internal").database("app")
    ///     .options([("search_path", "idempotency")]);
    /// let store = PostgresStore::connect_with(options).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// A database that cannot be reached fails with the driver's reason (connection refused, no
    /// such database, authentication, TLS) and the target (`postgres://user@host:port/database`,
    /// never the password) in the error's sources; one that does not answer, after 10 s.
    pub async fn connect_with(options: PgConnectOptions) -> Result<Self, StoreError> {
        Self::from_pool(Self::pool_for(options).await?).await
    }

    /// The store's pool on `options` (tuned), after one connection that says why when there is
    /// none.
    async fn pool_for(options: PgConnectOptions) -> Result<PgPool, StoreError> {
        // One connection first, for the driver's own reason when there is none: the pool
        // would only say that it timed out, 5 s later.
        let target = format!(
            "postgres://{}@{}:{}/{}",
            options.get_username(),
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or(options.get_username()),
        );
        let unreachable = |source: super::super::BoxError| {
            StoreError::Unavailable(Box::new(super::super::error::Unreachable {
                target: target.clone(),
                source,
            }))
        };
        let probe = Self::tune(options.clone());
        match tokio::time::timeout(
            CONNECT_TIMEOUT,
            <sqlx::PgConnection as sqlx::Connection>::connect_with(&probe),
        )
        .await
        {
            Ok(Ok(conn)) => {
                let _ = sqlx::Connection::close(conn).await;
            }
            // The server's own words ("database \"app\" does not exist"), without sqlx's
            // "error returned from database" and the server's source line.
            Ok(Err(sqlx::Error::Database(e))) => {
                let code = e
                    .code()
                    .map(|c| format!(" (SQLSTATE {c})"))
                    .unwrap_or_default();
                return Err(unreachable(format!("{}{code}", e.message()).into()));
            }
            Ok(Err(e)) => return Err(unreachable(Box::new(e))),
            Err(elapsed) => return Err(unreachable(Box::new(elapsed))),
        }
        PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(Self::tune(options))
            .await
            .map_err(db_error)
    }

    /// Adds the session settings this store's statements are planned for: `enable_seqscan = off`
    /// (a lookup never falls back to a sequential scan, even with a generic plan made on an empty
    /// table) and `jit = off`; and the server's TCP keepalives on the session (first probe after
    /// 10 s idle, every 5 s, 3 unanswered end it; `tcp_user_timeout` 20 s), so a session whose
    /// client host is gone ends in about 25 s instead of the system's two hours. Use it on the options of a pool you build yourself for
    /// [`PostgresStore::from_pool`]; keep that pool for the store, as the settings apply to every
    /// statement on its connections.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idempotency::store::PostgresStore;
    /// let options = "postgres://app@db.internal/app".parse()?;
    /// let pool = sqlx::postgres::PgPoolOptions::new()
    ///     .max_connections(32)
    ///     .connect_with(PostgresStore::tune(options))
    ///     .await?;
    /// let store = PostgresStore::from_pool(pool).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn tune(options: PgConnectOptions) -> PgConnectOptions {
        options.options([
            ("enable_seqscan", "off"),
            ("jit", "off"),
            ("tcp_keepalives_idle", "10"),
            ("tcp_keepalives_interval", "5"),
            ("tcp_keepalives_count", "3"),
            ("tcp_user_timeout", "20000"),
        ])
    }

    /// A store on an existing pool; runs the migrations. Build the pool's options with
    /// [`PostgresStore::tune`] (a warning is logged if its connections are not tuned).
    pub async fn from_pool(pool: PgPool) -> Result<Self, StoreError> {
        let store = Self::unmigrated(pool);
        store.migrate().await?;
        store.check_tuned().await?;
        Ok(store)
    }

    /// A store on `pool` as it is, not migrated.
    fn unmigrated(pool: PgPool) -> Self {
        PostgresStore {
            pool,
            clock_offset: Some(0),
            notices: std::sync::Arc::default(),
        }
    }

    /// Logs a warning when the pool's connections are not [tuned](PostgresStore::tune).
    async fn check_tuned(&self) -> Result<(), StoreError> {
        let seqscan: String = sqlx::query_scalar("SELECT current_setting('enable_seqscan')")
            .fetch_one(&self.pool)
            .await
            .map_err(db_error)?;
        if seqscan != "off" {
            tracing::warn!(
                "PostgresStore: this pool's connections run with enable_seqscan = on; a statement first planned \
                 while the records table was empty can keep a sequential-scan plan as it grows. Build the pool \
                 from PostgresStore::tune(options)."
            );
        }
        Ok(())
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// For tests that move time by hand (`ManualClock`): this store uses the engine's times as
    /// given instead of the database server's clock. Never for replicas: their clocks disagree.
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn trusting_engine_clock(mut self) -> Self {
        self.clock_offset = None;
        self
    }

    /// For tests: this store reads the database server's clock shifted by `offset_ms`, as if the
    /// database's clock had jumped (a window's end reached without waiting for it).
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn with_server_clock_offset(mut self, offset_ms: i64) -> Self {
        self.clock_offset = Some(offset_ms);
        self
    }

    /// Applies the migrations this build embeds that the database lacks, in one transaction under
    /// an advisory lock (replicas starting together apply them once), and records them in the
    /// library's own `idempotency_migrations` table. Refuses a database that records a migration
    /// this build does not know. The constructors call it; running it again changes nothing.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sql::migrate(&self.pool, MIGRATIONS, &BOOKKEEPING).await
    }
}

impl PostgresStore {
    /// Connects to `url` only if its schema (the first of the `search_path` that exists) already
    /// holds a store: never creates a table, never migrates. A schema without this library's
    /// `idempotency_migrations` table is refused with [`StoreError::NoStore`] naming the schema
    /// and the database, a store at an older schema than this build's with
    /// [`StoreError::Migration`]. With [`Access::ReadOnly`] every session runs with
    /// `default_transaction_read_only = on`, so not even a stray statement could write.
    ///
    /// Connection failures say why, as [`PostgresStore::connect`]'s do.
    pub async fn connect_existing(url: &str, access: Access) -> Result<Self, StoreError> {
        let mut options: PgConnectOptions =
            url.parse().map_err(|e: sqlx::Error| StoreError::Config {
                problem: "the PostgreSQL connection URL is not usable".into(),
                source: Some(Box::new(e)),
            })?;
        if access == Access::ReadOnly {
            options = options.options([("default_transaction_read_only", "on")]);
        }
        let database = format!(
            "postgres://{}@{}:{}/{}",
            options.get_username(),
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or(options.get_username()),
        );
        let pool = Self::pool_for(options).await?;
        if !sql::is_current(&pool, MIGRATIONS, &BOOKKEEPING).await? {
            let schema: Option<String> = sqlx::query_scalar("SELECT current_schema()::TEXT")
                .fetch_one(&pool)
                .await
                .map_err(sql::db_error)?;
            pool.close().await;
            let schema = schema.map_or_else(
                || "no schema of the search_path".to_owned(),
                |s| format!("the schema {s}"),
            );
            return Err(StoreError::NoStore {
                place: format!(
                    "{schema} of {database} has no idempotency tables (no idempotency_migrations table)"
                ),
            });
        }
        let store = Self::unmigrated(pool);
        store.check_tuned().await?;
        Ok(store)
    }
}
