//! Opening a SQLite file that must already hold a store ([`SqliteStore::open_existing`], for
//! operators' tools), and riding out the lock race of servers creating one file together.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use super::super::sql;
use super::{SqliteStore, BOOKKEEPING, MIGRATIONS, POOL_SIZE};
use crate::store::{Access, StoreError};

/// How many times an open that lost the race for the file's lock is tried in all.
const BUSY_ATTEMPTS: u32 = 12;

/// The first wait after a lost race; each next one doubles, up to [`BUSY_MAX_WAIT`].
const BUSY_FIRST_WAIT: Duration = Duration::from_millis(10);

/// The longest wait between two tries (all of them add up to under 3 s).
const BUSY_MAX_WAIT: Duration = Duration::from_millis(320);

impl SqliteStore {
    /// A pool of `size` connections to the file at `path`, its failure named by the path.
    pub(super) async fn pool_at(
        path: &Path,
        options: SqliteConnectOptions,
        size: u32,
    ) -> Result<SqlitePool, StoreError> {
        SqlitePoolOptions::new()
            .max_connections(size)
            .connect_with(options)
            .await
            .map_err(|e| {
                StoreError::Unavailable(Box::new(super::super::error::Unreachable {
                    target: format!("the SQLite file {}", path.display()),
                    source: Box::new(e),
                }))
            })
    }

    /// Opens the store in the SQLite file at `path` only if there is one: never creates the file,
    /// a table or an index, never migrates, and never switches the file's journal mode. A missing
    /// file, or a file without this library's tables (an application's own database), is
    /// refused with [`StoreError::NoStore`], the file left as it was; a store at an older
    /// schema than this build's, with [`StoreError::Migration`].
    ///
    /// With [`Access::ReadOnly`] the one connection is read-only, so the file is left byte for
    /// byte as it was; with [`Access::ReadWrite`] the store is opened as
    /// [`SqliteStore::open`] opens it (WAL, 4 connections), after the check.
    pub async fn open_existing(path: impl AsRef<Path>, access: Access) -> Result<Self, StoreError> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(StoreError::NoStore {
                place: format!("the SQLite file {} does not exist", path.display()),
            });
        }
        let read_only = SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .busy_timeout(Duration::from_secs(5));
        let pool = Self::pool_at(path, read_only, 1).await?;
        let current = sql::is_current(&pool, MIGRATIONS, &BOOKKEEPING).await;
        if !matches!(current, Ok(true)) || access == Access::ReadWrite {
            pool.close().await;
        }
        if !current? {
            return Err(StoreError::NoStore {
                place: format!(
                    "the SQLite file {} has no idempotency tables (no idempotency_migrations table)",
                    path.display()
                ),
            });
        }
        match access {
            Access::ReadOnly => Self::unmigrated(pool).await,
            Access::ReadWrite => {
                retry_busy(|| async {
                    let options = Self::connect_options(path).create_if_missing(false);
                    let pool = Self::pool_at(path, options, POOL_SIZE).await?;
                    Self::unmigrated(pool).await
                })
                .await
            }
        }
    }
}

/// Runs `open` again while it fails because another connection held the file's lock where
/// SQLite does not wait for it (switching the journal mode to WAL): up to [`BUSY_ATTEMPTS`]
/// times, waiting 10 ms, 20 ms, … 320 ms (a little less, varied per process, so that racers
/// part) between tries. Any other error is returned at once.
pub(super) async fn retry_busy<F, Fut>(mut open: F) -> Result<SqliteStore, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<SqliteStore, StoreError>>,
{
    let mut wait = BUSY_FIRST_WAIT;
    let mut attempt = 1;
    loop {
        match open().await {
            Err(e) if attempt < BUSY_ATTEMPTS && is_busy(&e) => {
                let spread = u64::from(std::process::id() ^ attempt) % 8;
                tokio::time::sleep(wait.mul_f64(1.0 - spread as f64 / 16.0)).await;
                wait = (wait * 2).min(BUSY_MAX_WAIT);
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Whether `e` comes from SQLite's `SQLITE_BUSY` or `SQLITE_LOCKED` (any extended code).
fn is_busy(e: &StoreError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(db) = err
            .downcast_ref::<sqlx::Error>()
            .and_then(sqlx::Error::as_database_error)
        {
            let code = db.code().and_then(|c| c.parse::<i32>().ok());
            return code.is_some_and(|c| matches!(c & 0xff, 5 | 6));
        }
        source = err.source();
    }
    false
}
