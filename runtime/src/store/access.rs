//! [`Access`]: what opening an existing store may do to it.

/// How an operator's tool opens a store that must already exist
/// (`SqliteStore::open_existing`, `PostgresStore::connect_existing`): neither creates nor
/// migrates anything, and a place with no store is refused with
/// [`StoreError::NoStore`](super::StoreError::NoStore).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Reads only: a SQLite file opened read-only (its journal mode kept), PostgreSQL sessions
    /// with `default_transaction_read_only`. The store is left byte for byte as it was.
    ReadOnly,
    /// Reads and writes records (settle, purge); still creates no table.
    ReadWrite,
}
