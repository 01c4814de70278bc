//! A payment processor at the far side, shared by every process of a test through a SQLite
//! file the library never sees: it records every charge it is asked for (no deduplication, so a
//! second side effect shows as a second row) and answers a reconciler's question "is there a
//! charge under this reference?".

use std::time::Duration;

use sqlx::SqlitePool;

/// The processor.
#[derive(Clone, Debug)]
pub struct FarSide {
    pool: SqlitePool,
}

impl FarSide {
    /// Opens (or creates) the processor's file at `path`.
    ///
    /// # Panics
    /// If the file cannot be opened.
    pub async fn open(path: &str) -> FarSide {
        let opts = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePool::connect_with(opts).await.expect("the processor");
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS charges (
                 id INTEGER PRIMARY KEY AUTOINCREMENT, reference TEXT NOT NULL)",
        )
        .execute(&pool)
        .await
        .expect("the processor's table");
        FarSide { pool }
    }

    /// Charges under `reference`: a new charge every time it is asked; its id.
    ///
    /// # Panics
    /// If the file cannot be written.
    pub async fn charge(&self, reference: &str) -> i64 {
        sqlx::query_scalar("INSERT INTO charges (reference) VALUES ($1) RETURNING id")
            .bind(reference)
            .fetch_one(&self.pool)
            .await
            .expect("charge")
    }

    /// The first charge under `reference`, if any.
    ///
    /// # Panics
    /// If the file cannot be read.
    pub async fn charged(&self, reference: &str) -> Option<i64> {
        sqlx::query_scalar("SELECT MIN(id) FROM charges WHERE reference = $1")
            .bind(reference)
            .fetch_one(&self.pool)
            .await
            .expect("read the charges")
    }

    /// Every charge under `reference`, oldest first (more than one: a side effect twice).
    ///
    /// # Panics
    /// If the file cannot be read.
    pub async fn charges(&self, reference: &str) -> Vec<i64> {
        sqlx::query_scalar("SELECT id FROM charges WHERE reference = $1 ORDER BY id")
            .bind(reference)
            .fetch_all(&self.pool)
            .await
            .expect("read the charges")
    }

    /// Every charge made: the side effects, counted where they land.
    ///
    /// # Panics
    /// If the file cannot be read.
    pub async fn effects(&self) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM charges")
            .fetch_one(&self.pool)
            .await
            .expect("count the charges")
    }
}
