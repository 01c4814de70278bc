//! Fresh calls on SQLite, one client, for counting their instructions with callgrind: the
//! store's (claim, then completion, through the `Store` trait) or the raw SQL of the `stores`
//! bench (`idempotency_tests::raw`: `INSERT … RETURNING`, then `UPDATE`), on a file of
//! `SqliteStore::connect_options` in a pool of 4.
//!
//! ```text
//! cargo bench -p idempotency-tests --bench sqlite_calls --no-run
//! CALLS_SIDE=store CALLS_FILE=/tmp/full.db CALLS_FILL=100000 target/release/deps/sqlite_calls-…
//! cp /tmp/full.db /tmp/run.db   # and for 500 and 1,500 calls:
//! CALLS_SIDE=store CALLS_FILE=/tmp/run.db CALLS_N=500 valgrind --tool=callgrind target/…
//! ```
//!
//! Environment: `CALLS_SIDE` (`store` or `raw`), `CALLS_FILE` (the database file; created when
//! missing), `CALLS_FILL` (fill the file with that many calls from 32 clients, checkpoint it and
//! exit: run it natively, then copy the file for each counted run, so every run starts from the
//! same file), `CALLS_N` (fresh calls to make, one at a time, 1000; their keys follow the fill's).
//! Instructions per call: the difference of two runs' totals (`Collected` on callgrind's stderr)
//! over the difference of their `CALLS_N`, so opening, migrating and the first statements'
//! preparation drop out.

use std::sync::Arc;

use idempotency::store::{SqliteStore, Store};
use idempotency_tests::raw;
use sqlx::SqlitePool;

/// Keys of the counted calls start here, past any fill.
const FIRST_COUNTED: u64 = 1 << 40;

enum Side {
    Store(Arc<dyn Store>),
    Raw(SqlitePool),
}

impl Side {
    async fn fresh(&self, n: u64) {
        match self {
            Side::Store(store) => raw::store_fresh(&**store, n).await,
            Side::Raw(pool) => raw::sqlite_fresh(pool, n).await,
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn main() {
    let side = env("CALLS_SIDE").unwrap_or_else(|| "store".into());
    let file = env("CALLS_FILE").expect("CALLS_FILE: the database file");
    let fill: u64 = env("CALLS_FILL").map_or(0, |v| v.parse().expect("CALLS_FILL"));
    let calls: u64 = env("CALLS_N").map_or(1000, |v| v.parse().expect("CALLS_N"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let (side, pool) = if side == "raw" {
            let pool = raw::sqlite_pool(std::path::Path::new(&file)).await;
            (Side::Raw(pool.clone()), pool)
        } else {
            let store = SqliteStore::open(&file).await.expect("store");
            let pool = store.pool().clone();
            (Side::Store(Arc::new(store)), pool)
        };
        let side = Arc::new(side);
        if fill > 0 {
            let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..32 {
                let (side, next) = (side.clone(), next.clone());
                tasks.spawn(async move {
                    loop {
                        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if n >= fill {
                            break;
                        }
                        side.fresh(n).await;
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
            sqlx::raw_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&pool)
                .await
                .expect("checkpoint");
            eprintln!("filled {file} with {fill} calls");
        } else {
            for n in FIRST_COUNTED..FIRST_COUNTED + calls {
                side.fresh(n).await;
            }
        }
        pool.close().await;
    });
}
