//! The stores against the seed's raw SQL (`idempotency_tests::raw`): `INSERT … ON CONFLICT (key)
//! DO NOTHING RETURNING` then `UPDATE … SET response = $2 WHERE key = $1` (a repeat: the insert,
//! then a `SELECT`), on a comparable raw table through the SAME pool. Figures from an empty table (analysed while empty,
//! so generic plans are made on it) and from a full one.
//!
//! ```text
//! cargo bench -p idempotency-tests --bench stores
//! ```
//!
//! Environment: `DATABASE_URL` (the PostgreSQL part is skipped without it), `BENCH_ROWS` (rows
//! in the full table, 100000), `BENCH_SAMPLES` (latency samples per figure, 2000), `BENCH_SECS`
//! (seconds per side per throughput figure, 16; its ratio is the median of paired 1 s slices),
//! `BENCH_CLIENTS` (concurrent clients and pool size, 32), `BENCH_ONLY` (`postgres`, `sqlite`,
//! `wait`, `cache` or `transactional`: run one part), `BENCH_KEEP_SCHEMA` (set: keep the PostgreSQL schema,
//! with both full tables, for inspection).
//!
//! Then, per store, a line on repeats that wait for the call in progress (`wait`):
//! `wait store=<postgres|redis|sqlite> waiters=100 answer_after_completion_p50_ms=..
//! answer_after_completion_p99_ms=.. extra_connections=..`. One engine holds a first call; 100
//! repeats of it wait on a second engine with a store of its own over the same records (another
//! replica: they hear of the completion through the store's notices on PostgreSQL and Redis, and
//! through their status reads on SQLite, never this engine's in-process wake-up); the figures
//! are from the first call's answer to each waiter's, over `BENCH_WAIT_ROUNDS` (5) rounds, and
//! the connections open while they wait beyond those a burst of 100 calls answered at once left
//! open (PostgreSQL: counted by the server, so the listening connection counts).
//! `BENCH_ONLY=wait` runs only these lines.
//!
//! Then, per store, a line on transactional calls (`#[idempotent(transactional)]`):
//! `transactional store=<postgres|sqlite> fresh_p50_ratio_hand=.. tps32_ratio_hand=..
//! fresh_p50_ratio_two_commits=.. commits_per_call=..`. The domain side effect is a row in an
//! `orders` table (`order_id TEXT PRIMARY KEY, reference TEXT NOT NULL`) beside the store's
//! records; three sides, each a fresh call with an order id (so a key) of its own, sharing that
//! table and interleaved (blocks of 50 for latency, 1 s slices for throughput) so that its
//! growth falls on all alike:
//! - *ours*: a transactional call through the engine whose body inserts the order through
//!   `Call::transaction` (claim, order, record: one transaction, one commit);
//! - *hand*: what a user writes by hand with sqlx: `pool.begin()`, insert the order, insert a row
//!   keyed by the call's key with its answer into a comparable table (`raw_records`), `commit`;
//! - *two_commits*: the store's ordinary call of the same tool (not transactional), its body
//!   inserting the order on the pool (autocommit): claim, order, completion, each committed.
//!
//! `fresh_p50_ratio_hand` is ours p50 over hand p50 (1 client), `tps32_ratio_hand` ours calls/s
//! over hand's with `BENCH_CLIENTS` clients (the paired-slice median; the key says the number of
//! clients), `fresh_p50_ratio_two_commits` ours p50 over two_commits'. The engines run without
//! lease-expiry rounds (`without_reconciler`), whose statements would count as the calls'.
//! `commits_per_call` is ours, counted by the database over 200 fresh calls one at a time (the
//! median of 3 rounds):
//! - PostgreSQL: the move of `pg_stat_database.xact_commit`, read from a connection of its own
//!   to `DATABASE_URL`'s database, while the calls run in a database the bench creates for this
//!   part (so other sessions' transactions are not counted; in a schema of `DATABASE_URL`'s
//!   database, said on stderr, where it cannot create one) over a pool of `BENCH_CLIENTS`
//!   connections shared by all sides. Backends report their counts at most once a second (and
//!   an idle one after up to 10 s), so before each reading every pool connection runs `SELECT
//!   pg_stat_force_next_flush()` (PostgreSQL 15+; `na` before), which reports it before it
//!   answers, and the counter is read until it stops moving; those statements' commits (and
//!   the reader's, when it is in the same database) are subtracted.
//! - SQLite: SQLite's commit hook (`sqlite3_commit_hook`), set on every connection of the
//!   store's pool (4, as `SqliteStore::open`'s) as it opens, which SQLite calls as it commits a
//!   transaction that wrote (a read-only transaction is no commit there; none of the sides has
//!   one).
//!
//! On stderr, the absolute figures behind the line, and the commits per call of hand and
//! two_commits (1 and 3: a check of the counting). `BENCH_ONLY=transactional` runs only these
//! lines.
//!
//! Then, per SQL store, a line on what a repeat costs with the engine's cache of completed
//! answers and without it (see `stores/cache.rs`): `cache store=<postgres|sqlite>
//! repeat_p50_us=.. cached_repeat_p50_us=.. cached_repeat_ratio_store=..`. `BENCH_ONLY=cache`
//! runs only these lines.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotency::store::SqliteStore;
use idempotency::store::{Claim, Store};
use idempotency_tests::pg::{unique_name, TestSchema};
use idempotency_tests::raw::{self, key, now, RESPONSE, TENANT, TOOL};
use sqlx::{PgPool, SqlitePool};

#[path = "stores/cache.rs"]
mod cache;
#[path = "stores/transactional.rs"]
mod transactional;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Config {
    rows: u64,
    samples: usize,
    secs: f64,
    clients: usize,
}

type Op = Arc<dyn Fn(u64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A fresh call or a repeat, through the `Store` trait.
fn store_fresh(store: Arc<dyn Store>) -> Op {
    Arc::new(move |n| {
        let store = store.clone();
        Box::pin(async move { raw::store_fresh(&*store, n).await })
    })
}

fn store_repeat(store: Arc<dyn Store>) -> Op {
    Arc::new(move |n| {
        let store = store.clone();
        Box::pin(async move {
            let req = raw::claim_request(key(n));
            let answer = store.claim(&req).await.expect("claim");
            assert!(
                matches!(answer, Claim::Completed { .. }),
                "key {n}: {answer:?}"
            );
        })
    })
}

macro_rules! raw_ops {
    ($fresh:ident, $repeat:ident, $pool:ty, $call:path) => {
        fn $fresh(pool: $pool) -> Op {
            Arc::new(move |n| {
                let pool = pool.clone();
                Box::pin(async move { $call(&pool, n).await })
            })
        }

        fn $repeat(pool: $pool) -> Op {
            Arc::new(move |n| {
                let pool = pool.clone();
                Box::pin(async move {
                    let k = key(n);
                    let won: Option<Vec<u8>> = sqlx::query_scalar(raw::CLAIM)
                        .bind(&k.as_bytes()[..])
                        .bind(TENANT)
                        .bind(TOOL)
                        .bind(now().as_millis())
                        .fetch_optional(&pool)
                        .await
                        .expect("raw claim");
                    assert!(won.is_none());
                    let response: Option<String> = sqlx::query_scalar(raw::READ)
                        .bind(&k.as_bytes()[..])
                        .fetch_one(&pool)
                        .await
                        .expect("raw read");
                    assert!(response.is_some());
                })
            })
        }
    };
}

raw_ops!(pg_raw_fresh, pg_raw_repeat, PgPool, raw::pg_fresh);
raw_ops!(
    sqlite_raw_fresh,
    sqlite_raw_repeat,
    SqlitePool,
    raw::sqlite_fresh
);

/// Fresh keys for one side (each side has its own table, so both use the same key sequence).
struct Keys {
    next: AtomicU64,
}

impl Keys {
    fn new() -> Arc<Keys> {
        Arc::new(Keys {
            next: AtomicU64::new(0),
        })
    }
    fn take(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
    fn issued(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }
}

/// A small deterministic generator for picking existing keys.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Median latency of `samples` calls of each op, one at a time, alternating in blocks.
async fn latency_pair(
    samples: usize,
    a: (&Op, &mut dyn FnMut() -> u64),
    b: (&Op, &mut dyn FnMut() -> u64),
) -> (Duration, Duration) {
    let (op_a, next_a) = a;
    let (op_b, next_b) = b;
    let (mut ta, mut tb) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for _ in 0..20 {
        op_a(next_a()).await;
        op_b(next_b()).await;
    }
    while ta.len() < samples {
        for _ in 0..50 {
            let t = Instant::now();
            op_a(next_a()).await;
            ta.push(t.elapsed());
        }
        for _ in 0..50 {
            let t = Instant::now();
            op_b(next_b()).await;
            tb.push(t.elapsed());
        }
    }
    (p50(ta), p50(tb))
}

/// On-CPU time of this process so far (every thread's, from `/proc/self/task/*/schedstat`), in
/// ns; `None` where the kernel does not offer it.
fn process_cpu_ns() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// The bench process's own CPU per call (the client side: sqlx, the store's code, the runtime),
/// one client, sides alternating in blocks of 50 like [`latency_pair`].
async fn client_cpu_pair(
    calls: usize,
    a: (&Op, &mut dyn FnMut() -> u64),
    b: (&Op, &mut dyn FnMut() -> u64),
) -> Option<(Duration, Duration)> {
    let (op_a, next_a) = a;
    let (op_b, next_b) = b;
    let (mut ca, mut cb) = (0u64, 0u64);
    let mut n = 0;
    while n < calls {
        let t = process_cpu_ns()?;
        for _ in 0..50 {
            op_a(next_a()).await;
        }
        let u = process_cpu_ns()?;
        for _ in 0..50 {
            op_b(next_b()).await;
        }
        let v = process_cpu_ns()?;
        ca += u - t;
        cb += v - u;
        n += 50;
    }
    let per = |ns: u64| Duration::from_nanos(ns / n as u64);
    Some((per(ca), per(cb)))
}

/// Calls per second with `clients` concurrent clients for `secs` seconds.
async fn throughput(clients: usize, secs: f64, op: &Op, keys: &Arc<Keys>) -> f64 {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (op, keys, done) = (op.clone(), keys.clone(), done.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                op(keys.take()).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Throughput of two ops over `secs` seconds each, in one-second slices alternating A B B A …:
/// each side's mean rate, and the median of the ratios of adjacent slices, so drift and a passing
/// disturbance (a checkpoint, a noisy neighbour) fall on both alike.
async fn throughput_pair(
    clients: usize,
    secs: f64,
    a: (&Op, &Arc<Keys>),
    b: (&Op, &Arc<Keys>),
) -> Rates {
    let rounds = secs.round().max(2.0) as usize;
    let slice = secs / rounds as f64;
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round.is_multiple_of(2) {
            ra.push(throughput(clients, slice, a.0, a.1).await);
            rb.push(throughput(clients, slice, b.0, b.1).await);
        } else {
            rb.push(throughput(clients, slice, b.0, b.1).await);
            ra.push(throughput(clients, slice, a.0, a.1).await);
        }
    }
    let mut ratios: Vec<f64> = ra.iter().zip(&rb).map(|(x, y)| x / y).collect();
    ratios.sort_by(f64::total_cmp);
    let mid = ratios.len() / 2;
    let ratio = if ratios.len().is_multiple_of(2) {
        (ratios[mid - 1] + ratios[mid]) / 2.0
    } else {
        ratios[mid]
    };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    Rates {
        a: mean(&ra),
        b: mean(&rb),
        ratio,
    }
}

/// Two sides' throughput and their paired ratio.
struct Rates {
    a: f64,
    b: f64,
    ratio: f64,
}

/// Fills a side's table up to `rows` completed rows.
async fn fill(clients: usize, rows: u64, op: &Op, keys: &Arc<Keys>) {
    if keys.issued() >= rows {
        return;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (op, keys) = (op.clone(), keys.clone());
        tasks.spawn(async move {
            loop {
                let n = keys.take();
                if n >= rows {
                    break;
                }
                op(n).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    // Keys past `rows` were taken but not used.
    keys.next.store(rows, Ordering::Relaxed);
}

// Counting the round trips a repeat takes: sqlx emits one `sqlx::query` event per query it sends
// (on SQLite, per call into its worker thread, however many statements the call holds).
static COUNTING: AtomicBool = AtomicBool::new(false);
static STATEMENTS: AtomicU64 = AtomicU64::new(0);

struct CountStatements;

impl tracing::Subscriber for CountStatements {
    fn register_callsite(
        &self,
        m: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if m.target() == "sqlx::query" {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        m.target() == "sqlx::query" && COUNTING.load(Ordering::Relaxed)
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        if e.metadata().target() == "sqlx::query" {
            STATEMENTS.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

async fn statements_per_call(op: &Op, mut next: impl FnMut() -> u64) -> f64 {
    const N: u64 = 200;
    STATEMENTS.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
    for _ in 0..N {
        op(next()).await;
    }
    COUNTING.store(false, Ordering::Relaxed);
    STATEMENTS.load(Ordering::Relaxed) as f64 / N as f64
}

struct Table {
    lines: Vec<String>,
}

impl Table {
    fn new(title: &str) -> Table {
        let mut t = Table {
            lines: vec![title.to_owned()],
        };
        t.lines.push(format!(
            "{:<30} {:<6} {:>12} {:>12} {:>7}  {}",
            "figure", "table", "store", "raw SQL", "ratio", "target"
        ));
        t
    }
    fn row(
        &mut self,
        figure: &str,
        table: &str,
        store: String,
        raw: String,
        ratio: Option<f64>,
        target: &str,
    ) {
        let ratio = ratio.map(|r| format!("{r:.2}x")).unwrap_or_default();
        let line = format!("{figure:<30} {table:<6} {store:>12} {raw:>12} {ratio:>7}  {target}");
        println!("{line}");
        self.lines.push(line);
    }
    fn latency(&mut self, figure: &str, table: &str, (s, r): (Duration, Duration), target: &str) {
        let ms = |d: Duration| format!("{:.3} ms", d.as_secs_f64() * 1e3);
        self.row(
            figure,
            table,
            ms(s),
            ms(r),
            Some(s.as_secs_f64() / r.as_secs_f64()),
            target,
        );
    }
    fn cpu(&mut self, figure: &str, table: &str, (s, r): (Duration, Duration)) {
        let us = |d: Duration| format!("{:.1} us", d.as_secs_f64() * 1e6);
        self.row(
            figure,
            table,
            us(s),
            us(r),
            Some(s.as_secs_f64() / r.as_secs_f64()),
            "",
        );
    }
    fn rate(&mut self, figure: &str, table: &str, r: Rates, target: &str) {
        self.row(
            figure,
            table,
            format!("{:.0}/s", r.a),
            format!("{:.0}/s", r.b),
            Some(r.ratio),
            target,
        );
    }
}

/// One side under test: its fresh and repeat ops and its keys.
struct Side {
    fresh: Op,
    repeat: Op,
    keys: Arc<Keys>,
}

async fn phase(
    t: &mut Table,
    cfg: &Config,
    label: &str,
    store: &Side,
    raw: &Side,
    rng: &mut Rng,
    targets: bool,
) {
    let target = |s: &'static str| if targets { s } else { "" };
    let (sk, rk) = (store.keys.clone(), raw.keys.clone());
    let fresh = latency_pair(
        cfg.samples,
        (&store.fresh, &mut || sk.take()),
        (&raw.fresh, &mut || rk.take()),
    )
    .await;
    t.latency(
        "fresh call p50, 1 client",
        label,
        fresh,
        target("store <= 1.05x raw"),
    );
    let rate = format!("fresh calls/s, {} clients", cfg.clients);
    let rows = [
        label,
        &rate,
        "client CPU per fresh call",
        target("store >= 0.95x raw"),
    ];
    rate_and_cpu(t, cfg, (store, raw), rows).await;
    let (sn, rn) = (store.keys.issued(), raw.keys.issued());
    let (mut r1, mut r2) = (Rng(rng.0), Rng(rng.0 ^ 0x9e37_79b9));
    let repeat = latency_pair(
        cfg.samples,
        (&store.repeat, &mut || r1.below(sn)),
        (&raw.repeat, &mut || r2.below(rn)),
    )
    .await;
    t.latency("repeat p50, 1 client", label, repeat, "");
    let s = statements_per_call(&store.repeat, || rng.below(sn)).await;
    let r = statements_per_call(&raw.repeat, || rng.below(rn)).await;
    t.row(
        "round trips per repeat",
        label,
        format!("{s:.2}"),
        format!("{r:.2}"),
        None,
        target("store: 1 round trip"),
    );
}

/// Fresh calls/s with `cfg.clients` clients, then client CPU per fresh call, of `a` against
/// `b`: two rows, `rows` being the phase's label, the two rows' names and the first's target.
async fn rate_and_cpu(t: &mut Table, cfg: &Config, (a, b): (&Side, &Side), rows: [&str; 4]) {
    let [label, rate_row, cpu_row, target] = rows;
    let rate = throughput_pair(
        cfg.clients,
        cfg.secs,
        (&a.fresh, &a.keys),
        (&b.fresh, &b.keys),
    )
    .await;
    t.rate(rate_row, label, rate, target);
    let (ak, bk) = (a.keys.clone(), b.keys.clone());
    if let Some(cpu) = client_cpu_pair(
        cfg.samples,
        (&a.fresh, &mut || ak.take()),
        (&b.fresh, &mut || bk.take()),
    )
    .await
    {
        t.cpu(cpu_row, label, cpu);
    }
}

/// The store's fresh calls against raw SQL that keeps the store's one index too
/// (`raw::sqlite_indexed_pool`): throughput and client CPU again, so that what is left of the
/// gap is the store's own code, the index's share being measured apart.
async fn against_indexed(
    t: &mut Table,
    cfg: &Config,
    label: &str,
    (store, indexed): (&Side, &Side),
) {
    let rate = format!("calls/s, {} clients, raw+index", cfg.clients);
    let rows = [label, &rate, "client CPU per call, raw+index", ""];
    rate_and_cpu(t, cfg, (store, indexed), rows).await;
}

async fn postgres(cfg: &Config) -> Option<Table> {
    let schema = TestSchema::create("bench").await?;
    let (pool, store) = raw::pg_pool_and_store(&schema, cfg.clients as u32).await;
    for table in [
        "VACUUM ANALYZE idempotency_records",
        "VACUUM ANALYZE raw_records",
    ] {
        sqlx::raw_sql(table).execute(&pool).await.expect("analyze");
    }
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&pool)
        .await
        .expect("version");
    let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&pool)
        .await
        .expect("setting");

    let store: Arc<dyn Store> = Arc::new(store);
    let ours = Side {
        fresh: store_fresh(store.clone()),
        repeat: store_repeat(store.clone()),
        keys: Keys::new(),
    };
    let raw = Side {
        fresh: pg_raw_fresh(pool.clone()),
        repeat: pg_raw_repeat(pool.clone()),
        keys: Keys::new(),
    };
    let mut t = Table::new(&format!(
        "PostgreSQL {version} (synchronous_commit={sync}), pool {} shared by store and raw SQL, {}-byte response, full = {} rows",
        cfg.clients,
        RESPONSE.len(),
        cfg.rows
    ));
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    phase(&mut t, cfg, "empty", &ours, &raw, &mut rng, true).await;

    let started = Instant::now();
    fill(cfg.clients, cfg.rows, &ours.fresh, &ours.keys).await;
    fill(cfg.clients, cfg.rows, &raw.fresh, &raw.keys).await;
    eprintln!(
        "(filled both tables to {} rows in {:.1} s)",
        cfg.rows,
        started.elapsed().as_secs_f64()
    );
    let size = |table: &'static str| {
        let pool = pool.clone();
        async move {
            let sql = format!(
                "SELECT pg_total_relation_size('{table}')::FLOAT8 / greatest(count(*), 1), \
                        pg_relation_size('{table}')::FLOAT8 / greatest(count(*), 1), \
                        pg_indexes_size('{table}')::FLOAT8 / greatest(count(*), 1) FROM {table}"
            );
            let (total, heap, index): (f64, f64, f64) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
                .expect("size");
            Size { total, heap, index }
        }
    };
    let (s, r) = (size("idempotency_records").await, size("raw_records").await);
    t.row(
        &format!("bytes per row, {} rows", cfg.rows),
        "full",
        format!("{:.0}", s.total),
        format!("{:.0}", r.total),
        Some(s.total / r.total),
        "store <= 260",
    );
    t.row(
        "  of which table / index",
        "full",
        format!("{:.0} / {:.0}", s.heap, s.index),
        format!("{:.0} / {:.0}", r.heap, r.index),
        None,
        "",
    );
    // Vacuum reclaims what the fill's updates left behind (old versions' index entries): the
    // size the tables keep in service, where autovacuum runs.
    for table in ["VACUUM idempotency_records", "VACUUM raw_records"] {
        sqlx::raw_sql(table).execute(&pool).await.expect("vacuum");
    }
    let (s, r) = (size("idempotency_records").await, size("raw_records").await);
    t.row(
        "  after VACUUM",
        "full",
        format!("{:.0}", s.total),
        format!("{:.0}", r.total),
        Some(s.total / r.total),
        "store <= 260",
    );
    t.row(
        "  of which table / index",
        "full",
        format!("{:.0} / {:.0}", s.heap, s.index),
        format!("{:.0} / {:.0}", r.heap, r.index),
        None,
        "",
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await; // backends flush their statistics
    let hot = |table: &'static str| {
        let pool = pool.clone();
        async move {
            let sql = format!(
                "SELECT 100 * n_tup_hot_upd::FLOAT8 / greatest(n_tup_upd, 1) FROM pg_stat_user_tables \
                 WHERE relid = '{table}'::regclass"
            );
            let v: f64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(&pool)
                .await
                .expect("hot");
            v
        }
    };
    let (s, r) = (hot("idempotency_records").await, hot("raw_records").await);
    t.row(
        "HOT updates (completions)",
        "full",
        format!("{s:.0}%"),
        format!("{r:.0}%"),
        None,
        "",
    );
    phase(&mut t, cfg, "full", &ours, &raw, &mut rng, true).await;
    pool.close().await;
    if std::env::var_os("BENCH_KEEP_SCHEMA").is_some() {
        eprintln!("(kept schema {} for inspection)", schema.name());
        std::mem::forget(schema);
    } else {
        schema.drop_schema().await;
    }
    Some(t)
}

/// Bytes per row: all of the relation, its table (main fork), its indexes.
struct Size {
    total: f64,
    heap: f64,
    index: f64,
}

struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.0.clone().into_os_string();
            p.push(suffix);
            std::fs::remove_file(p).ok();
        }
    }
}

async fn sqlite_bytes_per_row(pool: &SqlitePool, table: &str) -> f64 {
    sqlx::raw_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(pool)
        .await
        .expect("checkpoint");
    let pages: i64 = sqlx::query_scalar(
        "SELECT page_count - freelist_count FROM pragma_page_count, pragma_freelist_count",
    )
    .fetch_one(pool)
    .await
    .expect("pages");
    let page: i64 = sqlx::query_scalar("SELECT page_size FROM pragma_page_size")
        .fetch_one(pool)
        .await
        .expect("page size");
    let sql = format!("SELECT count(*) FROM {table}");
    let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .expect("count");
    (pages * page) as f64 / rows.max(1) as f64
}

async fn sqlite(cfg: &Config) -> Table {
    // Each side in a file of its own, so a file's size is its table's.
    let file =
        |what: &str| TempFile(std::env::temp_dir().join(format!("{}.db", unique_name(what))));
    let (f_store, f_raw, f_indexed) = (file("bench_store"), file("bench_raw"), file("bench_index"));
    let store = SqliteStore::open(&f_store.0).await.expect("store");
    let raw_pool = raw::sqlite_pool(&f_raw.0).await;
    let indexed_pool = raw::sqlite_indexed_pool(&f_indexed.0).await;
    let store_pool = store.pool().clone();
    let store: Arc<dyn Store> = Arc::new(store);
    let ours = Side {
        fresh: store_fresh(store.clone()),
        repeat: store_repeat(store.clone()),
        keys: Keys::new(),
    };
    let raw = Side {
        fresh: sqlite_raw_fresh(raw_pool.clone()),
        repeat: sqlite_raw_repeat(raw_pool.clone()),
        keys: Keys::new(),
    };
    let indexed = Side {
        fresh: sqlite_raw_fresh(indexed_pool.clone()),
        repeat: sqlite_raw_repeat(indexed_pool.clone()),
        keys: Keys::new(),
    };
    let mut t = Table::new(&format!(
        "SQLite (WAL, synchronous=NORMAL), pool of 4 per file, {}-byte response, full = {} rows",
        RESPONSE.len(),
        cfg.rows
    ));
    let mut rng = Rng(0x853c_49e6_748f_ea9b);
    phase(&mut t, cfg, "empty", &ours, &raw, &mut rng, false).await;
    against_indexed(&mut t, cfg, "empty", (&ours, &indexed)).await;
    fill(cfg.clients, cfg.rows, &ours.fresh, &ours.keys).await;
    fill(cfg.clients, cfg.rows, &raw.fresh, &raw.keys).await;
    fill(cfg.clients, cfg.rows, &indexed.fresh, &indexed.keys).await;
    let s = sqlite_bytes_per_row(&store_pool, "idempotency_records").await;
    let r = sqlite_bytes_per_row(&raw_pool, "raw_records").await;
    t.row(
        &format!("bytes per row, {} rows", cfg.rows),
        "full",
        format!("{s:.0}"),
        format!("{r:.0}"),
        Some(s / r),
        "",
    );
    phase(&mut t, cfg, "full", &ours, &raw, &mut rng, false).await;
    against_indexed(&mut t, cfg, "full", (&ours, &indexed)).await;
    store_pool.close().await;
    raw_pool.close().await;
    indexed_pool.close().await;
    t
}

/// One `wait` line: `rounds` rounds of a held first call on `first` and 100 waiters on `second`
/// (same store); `connections` counts the store connections open now.
async fn wait_line(
    store: &str,
    first: Arc<dyn Store>,
    second: Arc<dyn Store>,
    connections: impl Fn() -> Pin<Box<dyn Future<Output = usize> + Send>>,
    rounds: u64,
) -> String {
    use idempotency::outcome::ErrorPolicy;
    use idempotency::tool::{Prepared, ToolSpec};
    use idempotency::{Caller, Idempotency};
    const WAITERS: usize = 100;
    let spec =
        ToolSpec::new("charge_card", Duration::from_secs(900)).with_wait(Duration::from_secs(30));
    let caller = Caller::new("acme", "alice");
    let here = Idempotency::builder_shared(first).build();
    let there = Idempotency::builder_shared(second).build();
    let call = |engine: &Idempotency, n: u64, gate: Option<tokio::sync::oneshot::Receiver<()>>| {
        let (engine, caller) = (engine.clone(), caller.clone());
        tokio::spawn(async move {
            let prepared = Prepared::call(&caller, &spec, &n).expect("key");
            let out = engine
                .execute_raw(prepared, ErrorPolicy::<String>::retryable(), async move {
                    if let Some(gate) = gate {
                        gate.await.ok();
                    }
                    Ok::<u64, String>(n)
                })
                .await;
            assert_eq!(out.result.ok(), Some(n));
            (Instant::now(), out.replayed)
        })
    };
    // Warm both engines (the secret check, a connection each), and the second one's pool with a
    // burst of as many calls as there will be waiters, so that what the figure counts is what
    // waiting adds to the same burst of repeats answered at once.
    call(&here, u64::MAX, None).await.expect("warm");
    let burst: Vec<_> = (0..WAITERS as u64)
        .map(|i| call(&there, u64::MAX - 1 - i, None))
        .collect();
    for c in burst {
        c.await.expect("warm");
    }
    let mut latencies = Vec::new();
    let mut extra = 0;
    for round in 0..rounds {
        let n = 1_000_000 + round;
        let (open, gate) = tokio::sync::oneshot::channel();
        let held = call(&here, n, Some(gate));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = connections().await;
        let waiters: Vec<_> = (0..WAITERS).map(|_| call(&there, n, None)).collect();
        // Let every waiter settle into its reads (and their pauses) before the answer comes.
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            extra = extra.max(connections().await.saturating_sub(before));
        }
        open.send(()).expect("gate");
        let (completed, _) = held.await.expect("first call");
        for w in waiters {
            let (answered, replayed) = w.await.expect("waiter");
            assert!(replayed, "a waiter ran the body");
            latencies.push(answered.saturating_duration_since(completed));
        }
    }
    latencies.sort();
    let at = |q: f64| {
        let i = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1e3
    };
    format!(
        "wait store={store} waiters={WAITERS} answer_after_completion_p50_ms={:.1} answer_after_completion_p99_ms={:.1} extra_connections={extra}",
        at(0.5),
        at(0.99)
    )
}

/// The `wait` lines of the stores there are (PostgreSQL with `DATABASE_URL`).
async fn wait_lines() -> Vec<String> {
    let rounds = env("BENCH_WAIT_ROUNDS", 5);
    let mut lines = Vec::new();
    if let Some(schema) = TestSchema::create("bench_wait").await {
        let first = schema.server_clock_store().await;
        let second = schema.server_clock_store().await;
        // Counted by the server, so that every connection a store opens is seen (the one that
        // listens for notices is not in the store's pool).
        let counter = schema.pool(1).await;
        let line = wait_line(
            "postgres",
            Arc::new(first),
            Arc::new(second),
            move || {
                let counter = counter.clone();
                Box::pin(async move {
                    let n: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                         AND backend_type = 'client backend'",
                    )
                    .fetch_one(&counter)
                    .await
                    .expect("count connections");
                    n as usize
                })
            },
            rounds,
        )
        .await;
        println!("{line}");
        lines.push(line);
        schema.drop_schema().await;
    }
    #[cfg(feature = "redis")]
    {
        use idempotency::store::RedisStore;
        use idempotency_tests::redis_servers::shared_server;
        let namespace = unique_name("bench_wait");
        let connect = || async {
            RedisStore::builder()
                .namespace(namespace.clone())
                .connect(&shared_server().url())
                .await
                .expect("redis")
        };
        let (first, second) = (connect().await, connect().await);
        let line = wait_line(
            "redis",
            Arc::new(first),
            Arc::new(second),
            || {
                Box::pin(async {
                    tokio::task::spawn_blocking(|| {
                        shared_server()
                            .node
                            .text(&["CLIENT", "LIST"])
                            .lines()
                            .count()
                    })
                    .await
                    .expect("client list")
                })
            },
            rounds,
        )
        .await;
        println!("{line}");
        lines.push(line);
    }
    {
        let file = TempFile(std::env::temp_dir().join(format!("{}.db", unique_name("bench_wait"))));
        let first = SqliteStore::open(&file.0).await.expect("store");
        let second = SqliteStore::open(&file.0).await.expect("store");
        let pool = second.pool().clone();
        let line = wait_line(
            "sqlite",
            Arc::new(first),
            Arc::new(second),
            move || {
                let pool = pool.clone();
                Box::pin(async move { pool.size() as usize })
            },
            rounds,
        )
        .await;
        println!("{line}");
        lines.push(line);
    }
    lines
}

fn main() {
    if tracing::subscriber::set_global_default(CountStatements).is_err() {
        eprintln!("a tracing subscriber was already set; statement counts will read 0");
    }
    let cfg = Config {
        rows: env("BENCH_ROWS", 100_000),
        samples: env("BENCH_SAMPLES", 2_000) as usize,
        secs: env("BENCH_SECS", 16) as f64,
        clients: env("BENCH_CLIENTS", 32) as usize,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    let tables = rt.block_on(async {
        let mut tables = Vec::new();
        let only = std::env::var("BENCH_ONLY").unwrap_or_default();
        if (only.is_empty() || only == "postgres")
            && let Some(t) = postgres(&cfg).await
        {
            tables.push(t);
        }
        if only.is_empty() || only == "sqlite" {
            tables.push(sqlite(&cfg).await);
        }
        if only.is_empty() || only == "wait" {
            tables.push(Table {
                lines: wait_lines().await,
            });
        }
        if only.is_empty() || only == "cache" {
            tables.push(Table {
                lines: cache::lines(&cfg).await,
            });
        }
        if only.is_empty() || only == "transactional" {
            let mut lines = Vec::new();
            lines.extend(transactional::postgres(&cfg).await);
            lines.push(transactional::sqlite(&cfg).await);
            tables.push(Table { lines });
        }
        tables
    });
    println!();
    for t in tables {
        for line in t.lines {
            println!("{line}");
        }
        println!();
    }
    println!("(total {:.0} s)", started.elapsed().as_secs_f64());
}
