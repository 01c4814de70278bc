//! A SQLite database file in the temp directory for one test, removed with its WAL files
//! afterwards.

use std::path::{Path, PathBuf};

use crate::pg::unique_name;

/// A SQLite file in the temp directory, deleted (with its WAL files) when dropped.
#[derive(Debug)]
pub struct SqliteFile(pub PathBuf);

impl SqliteFile {
    /// A new file name in the temp directory, unique to this process and `what`.
    pub fn new(what: &str) -> Self {
        SqliteFile(std::env::temp_dir().join(format!("{}.db", unique_name(what))))
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        remove_sqlite_files(&self.0);
    }
}

/// Removes the SQLite database at `path` and its `-wal` and `-shm` files, those that exist.
pub fn remove_sqlite_files(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.to_path_buf().into_os_string();
        p.push(suffix);
        std::fs::remove_file(p).ok();
    }
}
