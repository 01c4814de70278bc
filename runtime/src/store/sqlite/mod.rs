//! [`SqliteStore`]: the embedded default. One file, so a repeat after a server restart is still
//! recognised (an in-memory store would forget, and run the side effect again).
//!
//! The record row is PostgreSQL's, column for column (`migrations/sqlite/0001_records.sql`): the
//! primary key is the reference (the key's first 8 bytes as a 64-bit integer, here the rowid
//! itself) with the key's other 24 bytes beside it, so a claim whose reference is held by a
//! different key is refused with
//! [`StoreError::ReferenceTaken`](crate::store::StoreError::ReferenceTaken) and a status lookup
//! is a primary-key probe. One index on two columns a completion keeps (`window_ms`,
//! `claimed_at`) serves the background work (purge and the reconciler), as on PostgreSQL.
//!
//! Opening the file is in `open.rs`, the record calls ([`RecordStore`](crate::store::RecordStore))
//! in `record_store.rs`.

use std::time::Duration;

use sqlx::sqlite::SqlitePool;

use super::sql::{Bookkeeping, Migration};
use crate::key::Key;

mod admin;
mod background;
mod existing;
mod open;
mod record_store;
mod secret;
mod statements;
mod transaction;

const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    description: "records and outbox",
    sql: include_str!("../../../migrations/sqlite/0001_records.sql"),
}];

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
    /// timeout and 5 s (see [`WATCH_AFTER`](record_store::WATCH_AFTER)).
    mark_lag_ms: i64,
}

/// A window's length as the row keeps it: whole milliseconds, saturating.
fn window_ms(window: Duration) -> i64 {
    i64::try_from(window.as_millis()).unwrap_or(i64::MAX)
}

fn bytes(key: &Key) -> &[u8] {
    &key.as_bytes()[..]
}
