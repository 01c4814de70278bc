//! One store of each kind for a test case: memory, a SQLite file in the temp directory, a
//! PostgreSQL schema of its own (none without `DATABASE_URL`) and a namespace on this process's
//! Redis. [`Backend::finish`] removes what the case made.

use std::path::PathBuf;
use std::sync::Arc;

use idempotency::store::{MemoryStore, RedisStore, SqliteStore, Store};

use crate::pg::{unique_name, TestSchema};
use crate::redis_servers::{shared_cluster, shared_server, shared_valkey};
use crate::sqlite_file::remove_sqlite_files;

/// A store under test, and what to clean up after it.
pub struct Backend {
    /// The store.
    pub store: Arc<dyn Store>,
    schema: Option<TestSchema>,
    file: Option<PathBuf>,
    /// Where the Redis records are.
    redis: Option<RedisAt>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("schema", &self.schema)
            .field("file", &self.file)
            .field("redis", &self.redis)
            .finish_non_exhaustive()
    }
}

impl Backend {
    fn of(store: Arc<dyn Store>) -> Backend {
        Backend {
            store,
            schema: None,
            file: None,
            redis: None,
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
            redis: None,
        })
    }

    /// A namespace of its own on this process's Redis; `trust_engine_clock` makes it take the
    /// engine's times (for a `ManualClock`).
    ///
    /// # Panics
    /// If Redis cannot be reached.
    pub async fn redis(what: &str, trust_engine_clock: bool) -> Backend {
        Backend::redis_at(RedisAt {
            namespace: unique_name(what),
            trust_engine_clock,
            seeds: None,
            valkey: false,
        })
        .await
    }

    /// A namespace of its own on this process's Valkey (`SET … IFEQ`), on its clock.
    ///
    /// # Panics
    /// If Valkey cannot be started or reached.
    pub async fn valkey(what: &str) -> Backend {
        Backend::redis_at(RedisAt {
            namespace: unique_name(what),
            trust_engine_clock: false,
            seeds: None,
            valkey: true,
        })
        .await
    }

    /// A namespace of its own on this process's Redis Cluster (3 masters), on the servers'
    /// clocks.
    ///
    /// # Panics
    /// If the cluster cannot be started or reached.
    pub async fn redis_cluster(what: &str) -> Backend {
        Backend::redis_at(RedisAt {
            namespace: unique_name(what),
            trust_engine_clock: false,
            seeds: Some(shared_cluster().seeds()),
            valkey: false,
        })
        .await
    }

    async fn redis_at(at: RedisAt) -> Backend {
        let store = Arc::new(at.connect().await);
        Backend {
            redis: Some(at),
            ..Backend::of(store)
        }
    }

    /// Another replica's store over the same records: a store of its own (its own connections)
    /// on the same file, schema or namespace; for memory, the same store (one process).
    ///
    /// # Panics
    /// If it cannot connect.
    pub async fn replica(&self) -> Arc<dyn Store> {
        if let Some(schema) = &self.schema {
            return Arc::new(schema.store().await);
        }
        if let Some(path) = &self.file {
            return Arc::new(SqliteStore::open(path).await.expect("open sqlite"));
        }
        if let Some(at) = &self.redis {
            return Arc::new(at.connect().await);
        }
        self.store.clone()
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

/// A Redis namespace, on the shared server or a cluster.
#[derive(Debug)]
struct RedisAt {
    namespace: String,
    trust_engine_clock: bool,
    seeds: Option<Vec<String>>,
    /// Without seeds: the shared Valkey rather than the shared Redis.
    valkey: bool,
}

impl RedisAt {
    async fn connect(&self) -> RedisStore {
        // Writes wait for a replica on the cluster (the default), here up to 2 s: test
        // processes start clusters of their own at once on a small machine.
        let mut builder = RedisStore::builder()
            .namespace(self.namespace.clone())
            .replica_ack_timeout(std::time::Duration::from_secs(2));
        if self.trust_engine_clock {
            builder = builder.trust_engine_clock();
        }
        match &self.seeds {
            Some(seeds) => {
                let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
                builder.connect_cluster(&seeds).await
            }
            None if self.valkey => builder.connect(&shared_valkey().url()).await,
            None => builder.connect(&shared_server().url()).await,
        }
        .expect("redis")
    }
}

/// One `#[tokio::test]` per case and store, each case an `async fn(Backend)` in the invoking
/// module: modules `memory`, `sqlite` and `postgres` (ignored without `DATABASE_URL`), and
/// `redis` when asked (`on_every_store!("wait", redis; a_case, another)`). `name` names the
/// case's files, schemas and namespaces.
#[macro_export]
macro_rules! on_every_store {
    (@sql $name:literal; $($case:ident),*) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case($crate::backends::Backend::memory()).await;
                }
            )*
        }
        mod sqlite {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case($crate::backends::Backend::sqlite($name).await).await;
                }
            )*
        }
        mod postgres {
            use super::*;
            $(
                #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(b) = $crate::backends::Backend::postgres($name).await else {
                        return;
                    };
                    super::$case(b).await;
                }
            )*
        }
    };
    ($name:literal, redis; $($case:ident),* $(,)?) => {
        $crate::on_every_store!(@sql $name; $($case),*);
        mod redis {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case($crate::backends::Backend::redis($name, false).await).await;
                }
            )*
        }
    };
    ($name:literal; $($case:ident),* $(,)?) => {
        $crate::on_every_store!(@sql $name; $($case),*);
    };
}
