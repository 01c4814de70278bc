//! One store of each kind for a test case: memory, a SQLite file in the temp directory, a
//! PostgreSQL schema of its own (none without `DATABASE_URL`) and a namespace on this process's
//! Redis. [`Backend::finish`] removes what the case made.

use std::path::PathBuf;
use std::sync::Arc;

use idempotency::store::{MemoryStore, RedisStore, SqliteStore, Store};

use crate::pg::{unique_name, TestSchema};
use crate::redis_servers::shared_server;
use crate::sqlite_file::remove_sqlite_files;

/// A store under test, and what to clean up after it.
pub struct Backend {
    /// The store.
    pub store: Arc<dyn Store>,
    schema: Option<TestSchema>,
    file: Option<PathBuf>,
}

impl Backend {
    fn of(store: Arc<dyn Store>) -> Backend {
        Backend {
            store,
            schema: None,
            file: None,
        }
    }

    /// A [`MemoryStore`].
    pub fn memory() -> Backend {
        Backend::of(Arc::new(MemoryStore::new()))
    }

    /// A SQLite file named after `what`, removed (with its WAL files) by [`Backend::finish`].
    ///
    /// # Panics
    /// If the file cannot be opened.
    pub async fn sqlite(what: &str) -> Backend {
        let path = std::env::temp_dir().join(format!("{}.db", unique_name(what)));
        Backend {
            file: Some(path.clone()),
            ..Backend::of(Arc::new(
                SqliteStore::open(&path).await.expect("open sqlite"),
            ))
        }
    }

    /// A PostgreSQL schema of its own that takes the engine's times (so a `ManualClock` moves
    /// them); `None` without `DATABASE_URL` (the build script then marks the test ignored).
    pub async fn postgres(what: &str) -> Option<Backend> {
        let schema = TestSchema::create(what).await?;
        Some(Backend {
            store: Arc::new(schema.store().await),
            schema: Some(schema),
            file: None,
        })
    }

    /// A namespace of its own on this process's Redis; `trust_engine_clock` makes it take the
    /// engine's times (for a `ManualClock`).
    ///
    /// # Panics
    /// If Redis cannot be reached.
    pub async fn redis(what: &str, trust_engine_clock: bool) -> Backend {
        let mut builder = RedisStore::builder().namespace(unique_name(what));
        if trust_engine_clock {
            builder = builder.trust_engine_clock();
        }
        let store = builder
            .connect(&shared_server().url())
            .await
            .expect("redis");
        Backend::of(Arc::new(store))
    }

    /// Drops the PostgreSQL schema or removes the SQLite files the case made.
    pub async fn finish(self) {
        if let Some(schema) = self.schema {
            schema.drop_schema().await;
        }
        if let Some(path) = self.file {
            remove_sqlite_files(&path);
        }
    }
}
