//! The migration runner both SQL stores use: embedded migrations, applied in one transaction
//! under the backend's lock, recorded in the library's own table.
//!
//! Why not sqlx's `Migrator`: it records every migration in one table per database,
//! `_sqlx_migrations`, which the application's own sqlx migrations use too, so a library's
//! versions would mix with the application's (and a `Migrator` that finds versions it does not
//! know refuses to run, whichever of the two ran first). It also needs the `migrate` feature and
//! its macros' build-time file access, and on PostgreSQL takes a database-wide advisory lock,
//! where this store takes one per schema so that stores in different schemas of one database
//! migrate independently. This runner is the part of `Migrator` the stores need: checksummed
//! embedded migrations, one transaction, the library's own table (`idempotency_migrations`),
//! and a refusal, naming the version, of a database that records a migration this build does
//! not know or one whose text changed.

use sha2::{Digest, Sha256};
use sqlx::{
    AssertSqlSafe, ColumnIndex, Connection, Database, Decode, Encode, Executor, IntoArguments,
    Pool, Row, Type,
};

use crate::store::StoreError;

/// The library's own migrations table (never the application's `_sqlx_migrations`).
const MIGRATIONS_TABLE: &str = "idempotency_migrations";

/// An embedded migration: its version, a description and its SQL (several statements).
#[derive(Debug)]
pub(crate) struct Migration {
    pub version: i64,
    pub description: &'static str,
    pub sql: &'static str,
}

impl Migration {
    /// sha256 of the SQL with line endings normalised, so a CRLF checkout does not look edited.
    pub(crate) fn checksum(&self) -> Vec<u8> {
        let mut h = Sha256::new();
        for part in self.sql.split('\r') {
            h.update(part.as_bytes());
        }
        h.finalize().to_vec()
    }
}

/// The migrations of `known` that a database recording `applied` (version, checksum) still
/// needs, in order. Refuses a database that records a version this build does not know (it was
/// migrated by a newer build) or a known version whose SQL has changed since it was applied.
fn pending<'m>(
    known: &'m [Migration],
    applied: &[(i64, Vec<u8>)],
    place: &str,
) -> Result<Vec<&'m Migration>, StoreError> {
    let newest = known.iter().map(|m| m.version).max().unwrap_or(0);
    for (version, checksum) in applied {
        match known.iter().find(|m| m.version == *version) {
            None => {
                return Err(StoreError::migration(format!(
                    "{place} records migration {version} in {MIGRATIONS_TABLE}, which this build of the idempotency \
                     crate does not know (it knows 1 to {newest}): a newer build migrated it. Upgrade this server, \
                     or give it its own {place}"
                )))
            }
            Some(m) if m.checksum() != *checksum => {
                return Err(StoreError::migration(format!(
                    "migration {version} ({}) recorded in {MIGRATIONS_TABLE} differs from the one this build embeds; \
                     applied migrations must not change",
                    m.description
                )))
            }
            Some(_) => {}
        }
    }
    let mut todo: Vec<&Migration> = known
        .iter()
        .filter(|m| !applied.iter().any(|(v, _)| *v == m.version))
        .collect();
    todo.sort_by_key(|m| m.version);
    Ok(todo)
}

/// What the migration runner needs from a backend: a few statements of its own dialect. The
/// bookkeeping statements themselves (read the applied versions, record one) are the same SQL
/// on both.
pub(crate) struct Bookkeeping {
    /// Opens the one transaction everything runs in.
    pub begin: &'static str,
    /// Runs first in that transaction and serialises concurrent runs until it ends, if `begin`
    /// does not already (SQLite's `BEGIN IMMEDIATE` takes the file's write lock).
    pub lock: Option<&'static str>,
    /// One row, one nullable text column: the migrations table's name if it exists. (A check
    /// rather than `CREATE TABLE IF NOT EXISTS`: PostgreSQL requires the CREATE privilege on the
    /// schema even when the table exists, and logs a notice on every start.)
    pub exists: &'static str,
    /// Creates the migrations table: `version`, `description`, `checksum`, `applied_at`.
    pub create: &'static str,
    /// Where the records live, for messages: "this schema", "this database file".
    pub place: &'static str,
}

/// Applies the migrations of `known` that the database lacks, in one transaction (opened by
/// `b.begin`, locked by `b.lock`), and records each in [`MIGRATIONS_TABLE`] in that same
/// transaction, so a failed migration leaves nothing behind. Refuses a database recording a
/// migration this build does not know, or one whose SQL changed ([`pending`]).
pub(crate) async fn migrate<DB>(
    pool: &Pool<DB>,
    known: &[Migration],
    b: &Bookkeeping,
) -> Result<(), StoreError>
where
    DB: Database,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Vec<u8>: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> String: Decode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let mig = migration_error;
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| StoreError::Unavailable(Box::new(e)))?;
    // `AssertSqlSafe` (it is a constant): with the `&'static str` impl, this generic fn's future
    // fails the callers' `Send` check ("implementation of `SqlSafeStr` is not general enough").
    let mut tx = conn.begin_with(AssertSqlSafe(b.begin)).await.map_err(mig)?;
    if let Some(lock) = b.lock {
        sqlx::query(lock).execute(&mut *tx).await.map_err(mig)?;
    }
    let exists: Option<String> = sqlx::query_scalar(b.exists)
        .fetch_one(&mut *tx)
        .await
        .map_err(mig)?;
    if exists.is_none() {
        sqlx::query(b.create).execute(&mut *tx).await.map_err(mig)?;
    }
    let rows = sqlx::query("SELECT version, checksum FROM idempotency_migrations ORDER BY version")
        .fetch_all(&mut *tx)
        .await
        .map_err(mig)?;
    let applied = rows
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<Vec<(i64, Vec<u8>)>, sqlx::Error>>()
        .map_err(mig)?;
    for m in pending(known, &applied, b.place)? {
        sqlx::raw_sql(m.sql)
            .execute(&mut *tx)
            .await
            .map_err(|e| migration_failed(m, e))?;
        sqlx::query(
            "INSERT INTO idempotency_migrations (version, description, checksum) VALUES ($1, $2, $3)",
        )
        .bind(m.version)
        .bind(m.description)
        .bind(m.checksum())
        .execute(&mut *tx)
        .await
        .map_err(|e| migration_failed(m, e))?;
    }
    tx.commit().await.map_err(mig)
}

/// Whether the database holds a store at this build's schema, without changing anything (no
/// transaction, no lock, nothing created): `Ok(false)` when it has no migrations table; a
/// [`StoreError::Migration`] when it records a migration this build does not know, or lacks one
/// it embeds (an older schema: run the migrations first).
pub(crate) async fn is_current<DB>(
    pool: &Pool<DB>,
    known: &[Migration],
    b: &Bookkeeping,
) -> Result<bool, StoreError>
where
    DB: Database,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'q> i64: Decode<'q, DB> + Type<DB>,
    for<'q> Vec<u8>: Decode<'q, DB> + Type<DB>,
    for<'q> String: Decode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let mig = migration_error;
    let exists: Option<String> = sqlx::query_scalar(AssertSqlSafe(b.exists))
        .fetch_one(pool)
        .await
        .map_err(mig)?;
    if exists.is_none() {
        return Ok(false);
    }
    let rows = sqlx::query("SELECT version, checksum FROM idempotency_migrations ORDER BY version")
        .fetch_all(pool)
        .await
        .map_err(mig)?;
    let applied = rows
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<Vec<(i64, Vec<u8>)>, sqlx::Error>>()
        .map_err(mig)?;
    match pending(known, &applied, b.place)?.first() {
        None => Ok(true),
        Some(m) => Err(StoreError::migration(format!(
            "{} lacks migration {} ({}) of this build: apply the migrations first (start a server of \
             this build on it, or `idempotency-admin migrate`)",
            b.place, m.version, m.description
        ))),
    }
}

/// A migration statement failed: say which one.
fn migration_failed(m: &Migration, e: sqlx::Error) -> StoreError {
    StoreError::Migration {
        problem: format!("migration {} ({}) failed", m.version, m.description),
        source: Some(Box::new(e)),
    }
}

/// The migrations' own bookkeeping failed (the lock, the migrations table).
fn migration_error(e: sqlx::Error) -> StoreError {
    StoreError::Migration {
        problem: format!("the {MIGRATIONS_TABLE} bookkeeping failed"),
        source: Some(Box::new(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_or_edited_migrations_are_refused() {
        const KNOWN: &[Migration] = &[
            Migration {
                version: 1,
                description: "one",
                sql: "CREATE TABLE a (x INT);\n",
            },
            Migration {
                version: 2,
                description: "two",
                sql: "CREATE TABLE b (x INT);\n",
            },
        ];
        let sum = |i: usize| KNOWN[i].checksum();
        let todo = pending(KNOWN, &[(1, sum(0))], "schema").unwrap();
        assert_eq!(todo.iter().map(|m| m.version).collect::<Vec<_>>(), vec![2]);
        assert!(pending(KNOWN, &[(1, sum(0)), (2, sum(1))], "schema")
            .unwrap()
            .is_empty());
        let err = pending(KNOWN, &[(1, sum(0)), (3, vec![0])], "schema")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("migration 3") && err.contains("newer build"),
            "{err}"
        );
        let err = pending(KNOWN, &[(1, vec![0])], "schema")
            .unwrap_err()
            .to_string();
        assert!(err.contains("differs"), "{err}");
        let crlf = Migration {
            version: 1,
            description: "one",
            sql: "CREATE TABLE a (x INT);\r\n",
        };
        assert_eq!(crlf.checksum(), sum(0));
    }
}
