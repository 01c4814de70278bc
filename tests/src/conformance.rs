//! The fixtures of `tests/sql_conformance.rs` (what only the SQL stores have): the store
//! conformance suite's own (`idempotency::store::conformance::fixtures`), so that its cases read
//! like the suite's, and a SQLite file that removes itself.

pub use idempotency::store::conformance::fixtures::*;

pub use crate::sqlite_file::SqliteFile;
