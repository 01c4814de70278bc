//! The `transactional` lines of the `stores` bench (described in its header): a transactional
//! call against the same writes by hand and against the store's ordinary call, per store.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotency::key::{Key, Secret};
use idempotency::outcome::ErrorPolicy;
use idempotency::store::{PostgresStore, SqliteStore, Store};
use idempotency::tool::{Prepared, ToolSpec};
use idempotency::{Call, Caller, Idempotency};
use idempotency_tests::pg::{database_url, unique_name, TestSchema};
use idempotency_tests::raw::{self, now, TENANT};
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{Connection, PgConnection, PgPool, SqlitePool};

use super::{latency_pair, throughput_pair, Config, Keys, Op, TempFile};

/// The domain table, beside the store's records.
const ORDERS: &str = "CREATE TABLE orders (order_id TEXT PRIMARY KEY, reference TEXT NOT NULL)";
/// The domain side effect: `$1` order id, `$2` the call's reference.
const INSERT_ORDER: &str = "INSERT INTO orders (order_id, reference) VALUES ($1, $2)";
/// The hand-written side's idempotency row (in `raw_records`), with the call's answer: `$1`
/// key, `$2` tenant, `$3` tool, `$4` time, `$5` answer.
const INSERT_RECORD: &str = "INSERT INTO raw_records (key, tenant, tool, created_at, response) \
                             VALUES ($1, $2, $3, $4, $5)";

const TOOL: &str = "place_order";
/// The tool, transactional (ours) and not (two commits).
const TX: ToolSpec = ToolSpec::new(TOOL, Duration::from_secs(3600)).with_transactional();
const PLAIN: ToolSpec = ToolSpec::new(TOOL, Duration::from_secs(3600));

/// Calls whose commits are counted, per round; the figure is the median round's.
const COMMIT_CALLS: u64 = 200;
const COMMIT_ROUNDS: usize = 3;

#[derive(Serialize)]
struct PlaceOrder {
    order_id: String,
}

#[derive(Serialize, serde::Deserialize)]
struct Placed {
    order_id: String,
    reference: String,
}

/// The handler's error (every one retryable: none is expected).
#[derive(Debug)]
struct Failed(String);

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<idempotency::Error> for Failed {
    fn from(e: idempotency::Error) -> Self {
        Failed(e.to_string())
    }
}

impl From<idempotency::TransactionError> for Failed {
    fn from(e: idempotency::TransactionError) -> Self {
        Failed(e.to_string())
    }
}

impl From<sqlx::Error> for Failed {
    fn from(e: sqlx::Error) -> Self {
        Failed(e.to_string())
    }
}

fn caller() -> Caller {
    Caller::new(TENANT, "bench")
}

/// The three sides on one store's database, each with an order-id prefix of its own.
macro_rules! tx_ops {
    ($ours:ident, $hand:ident, $two:ident, $db:ty, $pool:ty) => {
        /// Ours: a fresh transactional call whose body inserts the order in the call's
        /// transaction.
        fn $ours(engine: Idempotency) -> Op {
            let caller = caller();
            Arc::new(move |n| {
                let (engine, caller) = (engine.clone(), caller.clone());
                Box::pin(async move {
                    let args = PlaceOrder {
                        order_id: format!("tx-{n}"),
                    };
                    let prepared = Prepared::call(&caller, &TX, &args).expect("key");
                    let out = engine
                        .execute(prepared, ErrorPolicy::retryable(), async move {
                            let call = Call::current().ok_or_else(|| Failed("no call".into()))?;
                            let reference = call.reference().to_string();
                            let mut tx = call.transaction::<$db>()?;
                            sqlx::query(INSERT_ORDER)
                                .bind(&args.order_id)
                                .bind(&reference)
                                .execute(&mut *tx)
                                .await?;
                            Ok::<_, Failed>(Placed {
                                order_id: args.order_id,
                                reference,
                            })
                        })
                        .await;
                    assert!(!out.replayed, "order tx-{n} was not fresh");
                    out.result.expect("transactional call");
                })
            })
        }

        /// By hand: the order and an idempotency row with the answer, in one transaction.
        fn $hand(pool: $pool) -> Op {
            let (caller, secret) = (caller(), Secret::demo());
            Arc::new(move |n| {
                let (pool, caller, secret) = (pool.clone(), caller.clone(), secret.clone());
                Box::pin(async move {
                    let args = PlaceOrder {
                        order_id: format!("hand-{n}"),
                    };
                    let key = Key::for_call(&secret, &caller, TOOL, &args).expect("key");
                    let reference = key.reference(1).to_string();
                    let mut tx = pool.begin().await.expect("begin");
                    sqlx::query(INSERT_ORDER)
                        .bind(&args.order_id)
                        .bind(&reference)
                        .execute(&mut *tx)
                        .await
                        .expect("order");
                    let answer = serde_json::to_string(&Placed {
                        order_id: args.order_id,
                        reference,
                    })
                    .expect("answer");
                    sqlx::query(INSERT_RECORD)
                        .bind(&key.as_bytes()[..])
                        .bind(TENANT)
                        .bind(TOOL)
                        .bind(now().as_millis())
                        .bind(answer)
                        .execute(&mut *tx)
                        .await
                        .expect("idempotency row");
                    tx.commit().await.expect("commit");
                })
            })
        }

        /// The store's ordinary call (claim, then completion), the order inserted on the pool.
        fn $two(engine: Idempotency, pool: $pool) -> Op {
            let caller = caller();
            Arc::new(move |n| {
                let (engine, caller, pool) = (engine.clone(), caller.clone(), pool.clone());
                Box::pin(async move {
                    let args = PlaceOrder {
                        order_id: format!("2c-{n}"),
                    };
                    let prepared = Prepared::call(&caller, &PLAIN, &args).expect("key");
                    let out = engine
                        .execute(prepared, ErrorPolicy::retryable(), async move {
                            let call = Call::current().ok_or_else(|| Failed("no call".into()))?;
                            let reference = call.reference().to_string();
                            sqlx::query(INSERT_ORDER)
                                .bind(&args.order_id)
                                .bind(&reference)
                                .execute(&pool)
                                .await?;
                            Ok::<_, Failed>(Placed {
                                order_id: args.order_id,
                                reference,
                            })
                        })
                        .await;
                    assert!(!out.replayed, "order 2c-{n} was not fresh");
                    out.result.expect("ordinary call");
                })
            })
        }
    };
}

tx_ops!(pg_ours, pg_hand, pg_two, sqlx::Postgres, PgPool);
tx_ops!(
    sqlite_ours,
    sqlite_hand,
    sqlite_two,
    sqlx::Sqlite,
    SqlitePool
);

/// The engine the bench calls through: the demo secret (no warning), no lease-expiry rounds
/// (their statements would be counted as the calls' commits).
async fn engine(store: Arc<dyn Store>) -> Idempotency {
    Idempotency::builder_shared(store)
        .secret(Secret::demo())
        .without_reconciler()
        .start()
        .await
        .expect("start the engine")
}

struct Sides {
    ours: Op,
    hand: Op,
    two: Op,
}

/// Commits per call, as the database counted them; `None` where it cannot be counted.
struct Commits {
    ours: Option<f64>,
    hand: Option<f64>,
    two: Option<f64>,
}

fn per_call(c: Option<f64>) -> String {
    match c {
        None => "na".into(),
        Some(c) if c.fract() == 0.0 => format!("{c:.0}"),
        Some(c) => format!("{c:.2}"),
    }
}

/// Measures the three sides (interleaved: they share the `orders` table), prints the line and,
/// on stderr, the absolute figures behind it.
async fn line<F, Fut>(store: &str, cfg: &Config, sides: &Sides, count: F) -> String
where
    F: Fn(Op, Arc<Keys>) -> Fut,
    Fut: std::future::Future<Output = Option<f64>>,
{
    let (ok, hk, tk) = (Keys::new(), Keys::new(), Keys::new());
    let started = Instant::now();
    let (a, b) = (ok.clone(), hk.clone());
    let vs_hand = latency_pair(
        cfg.samples,
        (&sides.ours, &mut || a.take()),
        (&sides.hand, &mut || b.take()),
    )
    .await;
    let rate = throughput_pair(
        cfg.clients,
        cfg.secs,
        (&sides.ours, &ok),
        (&sides.hand, &hk),
    )
    .await;
    let (a, c) = (ok.clone(), tk.clone());
    let vs_two = latency_pair(
        cfg.samples,
        (&sides.ours, &mut || a.take()),
        (&sides.two, &mut || c.take()),
    )
    .await;
    let commits = Commits {
        ours: count(sides.ours.clone(), ok.clone()).await,
        hand: count(sides.hand.clone(), hk.clone()).await,
        two: count(sides.two.clone(), tk.clone()).await,
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let ratio = |(a, b): (Duration, Duration)| a.as_secs_f64() / b.as_secs_f64();
    eprintln!(
        "(transactional {store}: fresh p50 ours {:.3} ms / hand {:.3} ms, ours {:.3} ms / two commits {:.3} ms; \
         {} clients ours {:.0}/s, hand {:.0}/s; commits per call ours {}, hand {}, two commits {}; {} calls per side at most, {:.0} s)",
        ms(vs_hand.0),
        ms(vs_hand.1),
        ms(vs_two.0),
        ms(vs_two.1),
        cfg.clients,
        rate.a,
        rate.b,
        per_call(commits.ours),
        per_call(commits.hand),
        per_call(commits.two),
        ok.issued().max(hk.issued()).max(tk.issued()),
        started.elapsed().as_secs_f64(),
    );
    let line = format!(
        "transactional store={store} fresh_p50_ratio_hand={:.2} tps{}_ratio_hand={:.2} fresh_p50_ratio_two_commits={:.2} commits_per_call={}",
        ratio(vs_hand),
        cfg.clients,
        rate.ratio,
        ratio(vs_two),
        per_call(commits.ours),
    );
    println!("{line}");
    line
}

/// The median of `rounds` counts of the commits of `calls` calls.
fn median_per_call(mut counts: Vec<u64>, calls: u64) -> f64 {
    counts.sort_unstable();
    counts[counts.len() / 2] as f64 / calls as f64
}

/// Where the PostgreSQL part runs: a database of its own, so that the server's commit counter of
/// that database counts this bench's transactions only (others' tests may be running in
/// `DATABASE_URL`'s); a schema in `DATABASE_URL`'s database where databases cannot be created.
enum Place {
    Database { url: String, name: String },
    Schema(TestSchema),
}

impl Place {
    async fn create(url: &str) -> Place {
        let name = unique_name("txbench");
        let mut admin = PgConnection::connect(url).await.expect("connect");
        let sql = format!("CREATE DATABASE \"{name}\"");
        let made = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await;
        admin.close().await.ok();
        match made {
            Ok(_) => Place::Database {
                url: url.to_owned(),
                name,
            },
            Err(e) => {
                eprintln!(
                    "(transactional: cannot create a database ({e}); running in a schema of DATABASE_URL's \
                     database, whose commit counter other sessions may move)"
                );
                Place::Schema(TestSchema::create("txbench").await.expect("schema"))
            }
        }
    }

    fn options(&self) -> PgConnectOptions {
        match self {
            Place::Database { url, name } => {
                let options: PgConnectOptions = url.parse().expect("DATABASE_URL parses");
                options.database(name)
            }
            Place::Schema(schema) => schema.options(),
        }
    }

    async fn drop_place(self) {
        match self {
            Place::Database { url, name } => {
                if let Ok(mut admin) = PgConnection::connect(&url).await {
                    let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                    if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&mut admin)
                        .await
                    {
                        eprintln!("could not drop database {name}: {e}");
                    }
                    admin.close().await.ok();
                }
            }
            Place::Schema(schema) => schema.drop_schema().await,
        }
    }
}

/// Reads `pg_stat_database.xact_commit` of the bench's database from a connection of its own
/// (to `DATABASE_URL`'s database). Each read is a transaction of the monitor's, flushed to the
/// server's statistics before its answer (`pg_stat_force_next_flush`): counted in the bench's
/// database only when the monitor is in it, and then subtracted.
struct Monitor {
    conn: PgConnection,
    database: String,
    /// The monitor is in the bench's database: its reads are commits there.
    inside: bool,
    reads: u64,
}

impl Monitor {
    async fn read(&mut self) -> u64 {
        self.reads += 1;
        let n: i64 = sqlx::query_scalar(
            "SELECT d.xact_commit FROM pg_stat_database AS d, pg_stat_force_next_flush() AS f \
             WHERE d.datname = $1",
        )
        .bind(&self.database)
        .fetch_one(&mut self.conn)
        .await
        .expect("read pg_stat_database");
        n as u64
    }

    /// The counter once it stopped moving (read every 50 ms, two equal reads apart from the
    /// monitor's own, 3 s at most), and the number of reads so far.
    async fn settled(&mut self) -> (u64, u64) {
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut last = self.read().await;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = self.read().await;
            let own = u64::from(self.inside);
            if now == last + own || Instant::now() > deadline {
                return (now, self.reads);
            }
            last = now;
        }
    }
}

/// Has the connection report its statistics before it answers. A backend whose transactions
/// read no relation has nothing pending but its transaction counts, and then reports nothing
/// (not even those): the statement reads a catalog's row, so that its report is made, with its
/// own commit in it.
const FLUSH: &str = "SELECT pg_stat_force_next_flush() FROM pg_catalog.pg_namespace LIMIT 1";

/// Makes every connection of `pool` (`size` of them, all held at once) report its statistics:
/// one `SELECT` each, a transaction each, flushed before its answer. The number of them.
async fn flush_all(pool: &PgPool, size: u32) -> u64 {
    let mut held = Vec::new();
    for _ in 0..size {
        held.push(pool.acquire().await.expect("acquire"));
    }
    for conn in &mut held {
        sqlx::raw_sql(FLUSH)
            .execute(&mut **conn)
            .await
            .expect("flush statistics");
    }
    held.len() as u64
}

/// Commits per call of `op`, counted by the server: `pg_stat_database.xact_commit`'s move over
/// [`COMMIT_CALLS`] fresh calls, one at a time, less the flushes' and the monitor's own.
async fn pg_commits(
    pool: &PgPool,
    size: u32,
    monitor: &tokio::sync::Mutex<Monitor>,
    op: Op,
    keys: Arc<Keys>,
) -> Option<f64> {
    let mut monitor = monitor.lock().await;
    let mut counts = Vec::new();
    for _ in 0..COMMIT_ROUNDS {
        // Everything before is in `before` (these flushes too).
        flush_all(pool, size).await;
        let (before, reads_before) = monitor.settled().await;
        for _ in 0..COMMIT_CALLS {
            op(keys.take()).await;
        }
        let flushes = flush_all(pool, size).await;
        let (after, reads_after) = monitor.settled().await;
        // The monitor's reads from `before`'s up to `after`'s, if they are in this database.
        let own = if monitor.inside {
            reads_after - reads_before
        } else {
            0
        };
        counts.push((after - before).saturating_sub(flushes + own));
    }
    Some(median_per_call(counts, COMMIT_CALLS))
}

/// The PostgreSQL line (skipped without `DATABASE_URL`).
pub(crate) async fn postgres(cfg: &Config) -> Option<String> {
    let url = database_url()?;
    let place = Place::create(&url).await;
    let size = cfg.clients as u32;
    let pool = PgPoolOptions::new()
        .max_connections(size)
        .min_connections(size)
        .connect_with(PostgresStore::tune(place.options()))
        .await
        .expect("pool");
    let store = PostgresStore::from_pool(pool.clone()).await.expect("store");
    for sql in [raw::TABLE_PG, ORDERS] {
        sqlx::query(sql).execute(&pool).await.expect("tables");
    }
    for sql in [
        "VACUUM ANALYZE idempotency_records",
        "VACUUM ANALYZE raw_records",
        "VACUUM ANALYZE orders",
    ] {
        sqlx::raw_sql(sql).execute(&pool).await.expect("analyze");
    }
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .expect("database");
    let mut conn = PgConnection::connect(&url).await.expect("monitor");
    let inside = sqlx::query_scalar::<_, String>("SELECT current_database()")
        .fetch_one(&mut conn)
        .await
        .expect("database")
        == database;
    let monitor = tokio::sync::Mutex::new(Monitor {
        conn,
        database,
        inside,
        reads: 0,
    });
    // Before PostgreSQL 15 there is no forced flush (and no shared-memory statistics).
    let countable = sqlx::raw_sql(FLUSH).execute(&pool).await.is_ok();
    if !countable {
        eprintln!("(transactional: no pg_stat_force_next_flush() before PostgreSQL 15: commits not counted)");
    }

    let engine = engine(Arc::new(store)).await;
    let sides = Sides {
        ours: pg_ours(engine.clone()),
        hand: pg_hand(pool.clone()),
        two: pg_two(engine.clone(), pool.clone()),
    };
    let line = line("postgres", cfg, &sides, |op, keys| {
        let (pool, monitor) = (&pool, &monitor);
        async move {
            if countable {
                pg_commits(pool, size, monitor, op, keys).await
            } else {
                None
            }
        }
    })
    .await;
    drop((sides, engine));
    pool.close().await;
    monitor.into_inner().conn.close().await.ok();
    place.drop_place().await;
    Some(line)
}

/// Write transactions committed on the SQLite pool's connections, as SQLite reports them: its
/// commit hook (`sqlite3_commit_hook`, called by SQLite as it commits a transaction that wrote;
/// a read-only one is not a commit there), set on every connection when it opens.
static SQLITE_COMMITS: AtomicU64 = AtomicU64::new(0);

async fn sqlite_commits(op: Op, keys: Arc<Keys>) -> Option<f64> {
    let mut counts = Vec::new();
    for _ in 0..COMMIT_ROUNDS {
        let before = SQLITE_COMMITS.load(Ordering::SeqCst);
        for _ in 0..COMMIT_CALLS {
            op(keys.take()).await;
        }
        counts.push(SQLITE_COMMITS.load(Ordering::SeqCst) - before);
    }
    Some(median_per_call(counts, COMMIT_CALLS))
}

/// The SQLite line: a store on a file (`SqliteStore::connect_options`, a pool of 4 like
/// `SqliteStore::open`'s) whose connections count their commits; every side on that pool.
pub(crate) async fn sqlite(cfg: &Config) -> String {
    let file = TempFile(std::env::temp_dir().join(format!("{}.db", unique_name("bench_tx"))));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.lock_handle().await?.set_commit_hook(|| {
                    SQLITE_COMMITS.fetch_add(1, Ordering::SeqCst);
                    true
                });
                Ok(())
            })
        })
        .connect_with(SqliteStore::connect_options(&file.0))
        .await
        .expect("pool");
    let store = SqliteStore::from_pool(pool.clone()).await.expect("store");
    for sql in [raw::TABLE_SQLITE, ORDERS] {
        sqlx::query(sql).execute(&pool).await.expect("tables");
    }
    let engine = engine(Arc::new(store)).await;
    let sides = Sides {
        ours: sqlite_ours(engine.clone()),
        hand: sqlite_hand(pool.clone()),
        two: sqlite_two(engine.clone(), pool.clone()),
    };
    let line = line("sqlite", cfg, &sides, sqlite_commits).await;
    drop((sides, engine));
    pool.close().await;
    line
}
