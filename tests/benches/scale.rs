//! Background work at size: each store on a steady-state table of N records (100k, 1M, 10M by
//! default), one line per store and N:
//!
//! ```text
//! scale store=postgres rows=1000000 claim_p50_ratio=1.03 purge_batch_ms=12.4 reconcile_ms=3.1 purge_rows_per_s=80000 fresh_p50_with_purge_ratio=1.07 bytes_per_row=241
//! ```
//!
//! ```text
//! DATABASE_URL=postgres://root@127.0.0.1:5432/test cargo bench -p idempotency-tests --bench scale
//! ```
//!
//! The table is built with one set-based `INSERT … SELECT` (no calls), as days of 15-minute
//! windows, a 48 h retention and a purger that kept up would leave it: every record's claim time
//! is drawn independently of where it lands in the heap (free space reused by vacuum puts new
//! rows anywhere), so the expired ones, 0.2 % (windows that ended up to 6 h past the retention),
//! are scattered through the heap; 100 are unsettled (in flight with the lease ended 10 minutes
//! ago, or unknown), scattered too. The time-ordered index is then rebuilt, since in service its
//! entries arrive in time order (packed at the b-tree's right-edge fill) while the build's random
//! order would leave it a third empty; the primary key keeps its random-insert fill, as in
//! service. A further band of records (35 % of the table at 1M, at most 500k) has windows that
//! end 20 minutes to 2 h inside the retention: the steady-state figures leave it alone, and the
//! load figures purge it with a 46 h retention, so the purger has scattered rows to delete.
//!
//! Figures, per store and N:
//! - `claim_p50_ratio`: the median of 2,000 fresh claims, one client, against the same store's at
//!   100k rows, whose table is kept for it: blocks of 50 claims alternate between the two tables,
//!   so both see the same machine (`NA` when 100k is not among the sizes);
//! - `purge_batch_ms`: the median batch of the purge of the expired 0.2 % (batches of 1,000; the
//!   single, smaller batch where there are fewer);
//! - `reconcile_ms`: the median of 21 reconciler queries (`unsettled(now, 100)`, the engine's
//!   batch) finding the 100 unsettled records, on the steady state and again after the load
//!   (whose calls the first round after it reads: they were claimed since the mark): the
//!   larger;
//! - `purge_rows_per_s`: the purger deleting batches of 1,000 as fast as it can while 32 clients
//!   make fresh calls (claim + complete);
//! - `fresh_p50_with_purge_ratio`: those clients' median fresh call while the purger deletes at 3×
//!   their insert rate, against the same load without it (slices alternating without / with);
//! - `bytes_per_row`: everything the table takes (heap, primary key, the window index) over
//!   its rows, after the build (PostgreSQL: `pg_total_relation_size`; SQLite: used pages).
//!
//! Environment: `DATABASE_URL` (the PostgreSQL lines are skipped without it), `SCALE_ROWS`
//! (comma-separated sizes, `100000,1000000,10000000`; each at least 10,000 and a multiple of 100),
//! `SCALE_SQLITE_ROWS` (SQLite's sizes, default `SCALE_ROWS`), `SCALE_SECS` (seconds of load
//! per side, 8), `SCALE_CLIENTS` (32), `SCALE_ONLY` (`postgres` or `sqlite`). Details of each
//! phase go to stderr; the result lines to stdout.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idempotency::store::{Fenced, Maintenance, PostgresStore, SqliteStore};
use idempotency::{
    clock::Timestamp,
    key::Key,
    store::{Claim, ClaimRequest, Completion, Store, StoredResponse, Token},
    Caller,
};
use idempotency_tests::pg::{unique_name, TestSchema};
use sqlx::postgres::PgPoolOptions;

/// A 70-byte JSON answer, like a charge receipt (the stores bench's).
const RESPONSE: &str = r#"{"charge_id":"ch_3PqR8sT2uV4wX5yZ6a7b","amount":4200,"currency":"EUR"}"#;
const TENANT: &str = "acme";
const TOOL: &str = "charge_card";
const WINDOW: Duration = Duration::from_secs(900);
const LEASE: Duration = Duration::from_secs(30);
const HOUR: u64 = 3_600;
/// The retention of the steady state: 0.2 % of the table is past it.
const RETENTION: Duration = Duration::from_secs(48 * HOUR);
/// The retention of the load phases: the reserve band is past it too.
const LOAD_RETENTION: Duration = Duration::from_secs(46 * HOUR);
const BATCH: u32 = 1_000;
const CLAIM_SAMPLES: usize = 2_000;

/// The steady-state table (see the module docs). `$1` rows, `$2` now (ms), `$3` the reserve
/// band's share in 1/100,000, `$4` the response; `SERIES` yields `i` from 1 to `$1`, `KEY_REST`
/// 24 bytes, `EMPTY` an empty blob. Classes by a multiplicative hash of `i`: 200 in 100,000
/// expired, `$3` in the reserve band, every `$1 / 100`-th row (exactly 100) unsettled.
const STEADY_STATE: &str = "\
INSERT INTO idempotency_records (ref, token, claimed_at, ends_at, window_ms, completed_at, generation, state,
    key_rest, tenant, subject, tool, fingerprint, response)
SELECT (h - 2147483648) * 4294967296 + i, 1, c,
    CASE WHEN st IN (0, 2) THEN c + 30000 ELSE c + 900000 END, 900000,
    CASE WHEN st IN (0, 2) THEN NULL ELSE c END,
    1, st, KEY_REST, 'acme', '', 'charge_card', EMPTY,
    CASE WHEN st IN (0, 2) THEN NULL ELSE $4 END
FROM (SELECT i, h,
        CASE WHEN i % ($1 / 100) = 17 THEN ((i / ($1 / 100)) % 2) * 2 ELSE 1 END AS st,
        CASE WHEN i % ($1 / 100) = 17 THEN $2 - 600000 - i % 1000
             WHEN h % 100000 < 200 THEN $2 - 172800000 - 900000 - 1 - h2 % 21600000
             WHEN h % 100000 < 200 + $3 THEN $2 - 172800000 + 1200000 - 900000 + h2 % 4800000
             ELSE $2 - 165600000 + 1200000 + h2 % 164400000 END AS c
      FROM (SELECT i, h, (h * 69069 + 1) % 4294967296 AS h2
            FROM (SELECT i, (i * 2654435761) % 4294967296 AS h FROM SERIES) a) b) s";

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn sizes(name: &str, default: &[u64]) -> Vec<u64> {
    let Ok(v) = std::env::var(name) else {
        return default.to_vec();
    };
    let mut sizes: Vec<u64> = v
        .split(',')
        .map(|s| s.trim().parse().expect("a size in SCALE_ROWS"))
        .collect();
    sizes.sort_unstable();
    for n in &sizes {
        assert!(
            *n >= 10_000 && n % 100 == 0,
            "{n}: sizes are at least 10,000 and multiples of 100"
        );
    }
    sizes
}

struct Config {
    secs: f64,
    clients: usize,
}

fn wall_now() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    Timestamp::from_millis(ms)
}

/// Fresh keys: `run` keeps sizes apart, `n` counts.
fn key(run: u64, n: u64) -> Key {
    Key::for_call(
        &idempotency::key::Secret::demo(),
        &Caller::new(TENANT, "scale"),
        TOOL,
        &(run, n),
    )
    .expect("key")
}

fn claim_request(k: Key) -> ClaimRequest<'static> {
    let now = wall_now();
    ClaimRequest {
        key: k,
        tenant: TENANT,
        subject: None,
        tool: TOOL,
        fingerprint: None,
        now,
        lease: LEASE,
        window: WINDOW,
        token: Token(now.as_millis() << 20 | (k.as_bytes()[31] as i64)),
    }
}

async fn claim(store: &dyn Store, k: Key) -> Token {
    match store.claim(&claim_request(k)).await.expect("claim") {
        Claim::New { token, .. } => token,
        other => panic!("a fresh key was not new: {other:?}"),
    }
}

async fn complete(store: &dyn Store, k: Key, token: Token) {
    let response = StoredResponse {
        ok: true,
        body: RESPONSE.into(),
    };
    let now = wall_now();
    let c = Completion {
        key: k,
        token,
        response: &response,
        now,
        outbox: &[],
    };
    store.complete(&c).await.expect("complete");
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One fresh claim (completed afterwards, untimed): how long the claim took.
async fn timed_claim(store: &dyn Store, k: Key) -> Duration {
    let t = Instant::now();
    let token = claim(store, k).await;
    let took = t.elapsed();
    complete(store, k, token).await;
    took
}

/// Fresh claims, one client, on this store and (when given) the 100k-row one, alternating in
/// blocks of 50 so that both see the same machine: the two medians.
async fn claim_p50(
    store: &dyn Store,
    base: Option<&Built>,
    run: u64,
    next: &AtomicU64,
) -> (Duration, Option<Duration>) {
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut round = 0;
    while ours.len() < CLAIM_SAMPLES {
        for _ in 0..50 {
            let took = timed_claim(store, key(run, next.fetch_add(1, Ordering::Relaxed))).await;
            if round >= 4 {
                ours.push(took);
            }
        }
        if let Some(b) = base {
            for _ in 0..50 {
                let n = b.next.fetch_add(1, Ordering::Relaxed);
                let took = timed_claim(&*b.store, key(b.rows, n)).await;
                if round >= 4 {
                    theirs.push(took);
                }
            }
        }
        round += 1;
    }
    (median(ours), base.map(|_| median(theirs)))
}

/// Purges the expired records in batches: every batch's time and size.
async fn purge_batches(store: &dyn Store) -> Vec<(Duration, u64)> {
    let mut batches = Vec::new();
    loop {
        let now = wall_now();
        let t = Instant::now();
        let n = store
            .purge(now, now - RETENTION, BATCH)
            .await
            .expect("purge");
        batches.push((t.elapsed(), n));
        if n < u64::from(BATCH) {
            return batches;
        }
    }
}

/// The median of 21 reconciler queries, which must each find the 100 unsettled records.
async fn reconcile(store: &dyn Store) -> Duration {
    let mut samples = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        let found = store.unsettled(wall_now(), 100).await.expect("unsettled");
        samples.push(t.elapsed());
        assert_eq!(found.len(), 100, "the 100 unsettled records");
    }
    median(samples)
}

/// `clients` clients making fresh calls for `secs`: every call's latency, and calls per second.
async fn load(
    store: &Arc<dyn Store>,
    clients: usize,
    secs: f64,
    run: u64,
    next: &Arc<AtomicU64>,
) -> (Vec<Duration>, f64) {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (store, next) = (store.clone(), next.clone());
        tasks.spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let k = key(run, next.fetch_add(1, Ordering::Relaxed));
                let t = Instant::now();
                let token = claim(&*store, k).await;
                complete(&*store, k, token).await;
                lat.push(t.elapsed());
            }
            lat
        });
    }
    let mut all = Vec::new();
    while let Some(lat) = tasks.join_next().await {
        all.extend(lat.expect("client"));
    }
    let rate = all.len() as f64 / started.elapsed().as_secs_f64();
    (all, rate)
}

/// A purger deleting batches of 1,000 (retention [`LOAD_RETENTION`]), at `rate` rows per second
/// (`None`: as fast as it can), until stopped or out of rows. Returns rows deleted and seconds.
fn purger(
    store: Arc<dyn Store>,
    rate: Option<f64>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, f64)> {
    tokio::spawn(async move {
        let started = Instant::now();
        let mut total = 0u64;
        while !stop.load(Ordering::Relaxed) {
            if let Some(rate) = rate {
                let due = started.elapsed().as_secs_f64() * rate;
                if (total as f64) >= due {
                    let wait = (total as f64 - due) / rate;
                    tokio::time::sleep(Duration::from_secs_f64(wait.min(0.05))).await;
                    continue;
                }
            }
            let now = wall_now();
            let n = store
                .purge(now, now - LOAD_RETENTION, BATCH)
                .await
                .expect("purge");
            total += n;
            if n < u64::from(BATCH) {
                eprintln!("    (the purger ran out of expired rows)");
                break;
            }
        }
        (total, started.elapsed().as_secs_f64())
    })
}

/// One store at one size: the figures of its line.
struct Figures {
    /// The claim p50 against the 100k-row table's, measured side by side.
    claim_ratio: Option<f64>,
    purge_batch: Duration,
    reconcile: Duration,
    purge_rows_per_s: f64,
    with_purge_ratio: f64,
    bytes_per_row: f64,
}

async fn measure(built: &Built, cfg: &Config, base: Option<&Built>) -> Figures {
    let (store, run, next) = (built.store.clone(), built.rows, built.next.clone());
    let reserve = reserve_of(built.rows);
    let (claim_p50, base_p50) = claim_p50(&*store, base, run, &next).await;
    let claim_ratio = match base_p50 {
        Some(b) => Some(claim_p50.as_secs_f64() / b.as_secs_f64()),
        None if built.rows == 100_000 => Some(1.0),
        None => None,
    };
    eprintln!(
        "  claim p50 {:.3} ms (the 100k-row table's beside it: {})",
        ms(claim_p50),
        base_p50.map_or("-".to_owned(), |b| format!("{:.3} ms", ms(b)))
    );
    let settled = reconcile(&*store).await;
    eprintln!("  reconcile p50 {:.3} ms", ms(settled));
    let batches = purge_batches(&*store).await;
    let full: Vec<Duration> = batches
        .iter()
        .filter(|b| b.1 == u64::from(BATCH))
        .map(|b| b.0)
        .collect();
    let purged: u64 = batches.iter().map(|b| b.1).sum();
    let worst = batches.iter().map(|b| b.0).max().unwrap_or_default();
    eprintln!(
        "  purge batches (ms): {:?}",
        batches.iter().map(|b| ms(b.0).round()).collect::<Vec<_>>()
    );
    let purge_batch = if full.is_empty() {
        batches.first().map(|b| b.0).unwrap_or_default()
    } else {
        median(full)
    };
    eprintln!(
        "  purge: {purged} expired rows in {} batches, median {:.2} ms, slowest {:.2} ms",
        batches.len(),
        ms(purge_batch),
        ms(worst)
    );

    // The load: without / with a purger at 3x the insert rate, alternating, then flat out.
    let warm = load(&store, cfg.clients, 1.0, run, &next).await.1;
    let insert_rate = warm;
    let paced = 3.0 * insert_rate;
    // The paced purge gets 60 % of the reserve, the flat-out one the rest.
    let slice = (cfg.secs / 2.0).min(0.6 * reserve as f64 / paced / 2.0);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let (mut rate_without, mut rate_with, mut purged_paced, mut paced_secs) = (0.0, 0.0, 0, 0.0);
    for _ in 0..2 {
        let (lat, rate) = load(&store, cfg.clients, slice, run, &next).await;
        without.extend(lat);
        rate_without += rate / 2.0;
        let stop = Arc::new(AtomicBool::new(false));
        let p = purger(store.clone(), Some(paced), stop.clone());
        let (lat, rate) = load(&store, cfg.clients, slice, run, &next).await;
        stop.store(true, Ordering::Relaxed);
        let (n, s) = p.await.expect("purger");
        with.extend(lat);
        rate_with += rate / 2.0;
        purged_paced += n;
        paced_secs += s;
    }
    let (p_without, p_with) = (median(without), median(with));
    eprintln!(
        "  load, {} clients, {slice:.1} s slices: without purge {rate_without:.0} calls/s p50 {:.3} ms; \
         with the purger at {paced:.0} rows/s (3x) {rate_with:.0} calls/s p50 {:.3} ms, purged {:.0} rows/s",
        cfg.clients,
        ms(p_without),
        ms(p_with),
        purged_paced as f64 / paced_secs
    );
    let stop = Arc::new(AtomicBool::new(false));
    let p = purger(store.clone(), None, stop.clone());
    let (_, flat) = load(&store, cfg.clients, cfg.secs / 2.0, run, &next).await;
    stop.store(true, Ordering::Relaxed);
    let (n, s) = p.await.expect("purger");
    let purge_rows_per_s = n as f64 / s;
    eprintln!(
        "  flat out: purged {n} rows in {s:.1} s = {purge_rows_per_s:.0} rows/s ({:.1}x the insert rate of {flat:.0} calls/s beside it)",
        purge_rows_per_s / flat
    );
    // Again after the load, whose finished calls left entries in the open index.
    let after = reconcile(&*store).await;
    eprintln!("  reconcile p50 after the load {:.3} ms", ms(after));
    Figures {
        claim_ratio,
        purge_batch,
        reconcile: settled.max(after),
        purge_rows_per_s,
        with_purge_ratio: p_with.as_secs_f64() / p_without.as_secs_f64(),
        bytes_per_row: built.bytes_per_row,
    }
}

fn reserve_of(rows: u64) -> u64 {
    (rows * 35 / 100).min(500_000)
}

/// The reserve band's share of the table, in 1/100,000.
fn reserve_share(rows: u64) -> i64 {
    (reserve_of(rows) * 100_000 / rows) as i64
}

async fn build_postgres(cfg: &Config, rows: u64) -> Option<Built> {
    let schema = TestSchema::create("scale").await?;
    let mut options = PostgresStore::tune(schema.options());
    if std::env::var_os("SCALE_AUTO_EXPLAIN").is_some() {
        // Slow statements' plans to the server's log, for a figure that needs explaining.
        options = options.options([
            ("session_preload_libraries", "auto_explain"),
            ("auto_explain.log_min_duration", "100ms"),
            ("auto_explain.log_analyze", "on"),
            ("auto_explain.log_buffers", "on"),
            ("auto_explain.log_wal", "on"),
        ]);
    }
    let pool = PgPoolOptions::new()
        .max_connections(cfg.clients as u32 + 2)
        .connect_with(options)
        .await
        .expect("pool");
    let store = PostgresStore::from_pool(pool.clone()).await.expect("store");
    let started = Instant::now();
    let now: i64 =
        sqlx::query_scalar("SELECT (extract(epoch FROM statement_timestamp()) * 1000)::BIGINT")
            .fetch_one(&pool)
            .await
            .expect("clock");
    // PostgreSQL's row keeps the window's length and one time (the lease's end while
    // unsettled, else the completion's): the same records in its columns.
    let fill = STEADY_STATE
        .replace("ends_at, window_ms, completed_at", "window_s, lease_or_settled_at")
        .replace(
            "    CASE WHEN st IN (0, 2) THEN c + 30000 ELSE c + 900000 END, 900000,\n    CASE WHEN st IN (0, 2) THEN NULL ELSE c END,",
            "    900, CASE WHEN st IN (0, 2) THEN c + 30000 ELSE c END,",
        )
        .replace("FROM SERIES", "FROM generate_series(1, $1::BIGINT) AS g(i)")
        .replace("KEY_REST", "decode(lpad(to_hex(i), 48, '0'), 'hex')")
        .replace("EMPTY", "''::BYTEA");
    sqlx::query(sqlx::AssertSqlSafe(fill))
        .bind(rows as i64)
        .bind(now)
        .bind(reserve_share(rows))
        .bind(RESPONSE)
        .execute(&pool)
        .await
        .expect("fill");
    for sql in [
        "REINDEX INDEX idempotency_records_window",
        "VACUUM (ANALYZE) idempotency_records",
        "CHECKPOINT",
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .expect(sql);
    }
    let (bytes, count, heap, pkey, settled): (f64, i64, f64, f64, f64) = sqlx::query_as(
        "SELECT pg_total_relation_size('idempotency_records')::FLOAT8 / count(*), count(*), \
                pg_relation_size('idempotency_records')::FLOAT8 / count(*), \
                pg_relation_size('idempotency_records_pkey')::FLOAT8 / count(*), \
                pg_relation_size('idempotency_records_window')::FLOAT8 / count(*) \
         FROM idempotency_records",
    )
    .fetch_one(&pool)
    .await
    .expect("size");
    assert_eq!(count as u64, rows);
    eprintln!(
        "postgres, {rows} rows built in {:.0} s: {bytes:.0} bytes/row (heap {heap:.0}, primary key {pkey:.0}, window index {settled:.0})",
        started.elapsed().as_secs_f64()
    );
    first_round(&store).await;
    Some(Built {
        store: Arc::new(store),
        rows,
        next: Arc::new(AtomicU64::new(0)),
        bytes_per_row: bytes,
        keep: Keep::Postgres(schema, pool),
    })
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

async fn build_sqlite(rows: u64) -> Built {
    let file = TempFile(std::env::temp_dir().join(format!("{}.db", unique_name("scale"))));
    let store = SqliteStore::open(&file.0).await.expect("store");
    let pool = store.pool().clone();
    let started = Instant::now();
    let fill = STEADY_STATE
        .replace(
            "FROM SERIES",
            "FROM (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) SELECT i FROM n)",
        )
        .replace("KEY_REST", "randomblob(24)")
        .replace("EMPTY", "X''");
    sqlx::query(sqlx::AssertSqlSafe(fill))
        .bind(rows as i64)
        .bind(wall_now().as_millis())
        .bind(reserve_share(rows))
        .bind(RESPONSE)
        .execute(&pool)
        .await
        .expect("fill");
    for sql in [
        "REINDEX idempotency_records_window",
        "ANALYZE",
        "PRAGMA wal_checkpoint(TRUNCATE)",
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .expect(sql);
    }
    let (pages, page, count): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT page_count - freelist_count FROM pragma_page_count, pragma_freelist_count), \
                (SELECT page_size FROM pragma_page_size), (SELECT count(*) FROM idempotency_records)",
    )
    .fetch_one(&pool)
    .await
    .expect("size");
    assert_eq!(count as u64, rows);
    let bytes = (pages * page) as f64 / count as f64;
    eprintln!(
        "sqlite, {rows} rows built in {:.0} s: {bytes:.0} bytes/row",
        started.elapsed().as_secs_f64()
    );
    first_round(&store).await;
    Built {
        store: Arc::new(store),
        rows,
        next: Arc::new(AtomicU64::new(0)),
        bytes_per_row: bytes,
        keep: Keep::Sqlite(file, pool),
    }
}

/// The table was built behind the reconciler's back: its first round reads every claim (the
/// mark starts before them all), watches the unsettled ones and moves the mark, which is the
/// state a reconciler running all along would have left. Timed, and checked to find the 100
/// unsettled records.
async fn first_round(store: &impl Maintenance) {
    let t = Instant::now();
    let found = store.unsettled(wall_now(), 100).await.expect("unsettled");
    assert_eq!(found.len(), 100, "the 100 unsettled records");
    eprintln!(
        "  the reconciler's first round over the whole table: {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
}

/// A store at one size, its table built.
struct Built {
    store: Arc<dyn Store>,
    rows: u64,
    /// The next fresh key's number.
    next: Arc<AtomicU64>,
    bytes_per_row: f64,
    keep: Keep,
}

/// What a built store lives in, removed by [`Built::close`].
enum Keep {
    Postgres(TestSchema, sqlx::PgPool),
    Sqlite(TempFile, sqlx::SqlitePool),
}

impl Built {
    async fn close(self) {
        match self.keep {
            Keep::Postgres(schema, pool) => {
                pool.close().await;
                schema.drop_schema().await;
            }
            Keep::Sqlite(file, pool) => {
                pool.close().await;
                drop(file);
            }
        }
    }
}

fn line(store: &str, rows: u64, f: &Figures) -> String {
    let ratio = f.claim_ratio.map_or("NA".to_owned(), |r| format!("{r:.2}"));
    format!(
        "scale store={store} rows={rows} claim_p50_ratio={ratio} purge_batch_ms={:.1} reconcile_ms={:.1} \
         purge_rows_per_s={:.0} fresh_p50_with_purge_ratio={:.2} bytes_per_row={:.0}",
        ms(f.purge_batch),
        ms(f.reconcile),
        f.purge_rows_per_s,
        f.with_purge_ratio,
        f.bytes_per_row
    )
}

/// Every size of one store, smallest first; the 100k-row table is kept until the end, for the
/// claim figures of the larger ones.
async fn each_size<F, Fut>(store: &str, sizes: &[u64], cfg: &Config, mut build: F) -> Vec<String>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Option<Built>>,
{
    let mut base: Option<Built> = None;
    let mut lines = Vec::new();
    for &rows in sizes {
        let Some(built) = build(rows).await else {
            break;
        };
        let f = measure(&built, cfg, base.as_ref()).await;
        let l = line(store, rows, &f);
        println!("{l}");
        lines.push(l);
        if rows == 100_000 {
            base = Some(built);
        } else {
            built.close().await;
        }
    }
    if let Some(b) = base {
        b.close().await;
    }
    lines
}

fn main() {
    let default = [100_000, 1_000_000, 10_000_000];
    let pg_sizes = sizes("SCALE_ROWS", &default);
    let sqlite_sizes = sizes("SCALE_SQLITE_ROWS", &pg_sizes);
    let cfg = Config {
        secs: env("SCALE_SECS", 8) as f64,
        clients: env("SCALE_CLIENTS", 32) as usize,
    };
    let only = std::env::var("SCALE_ONLY").unwrap_or_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    let lines = rt.block_on(async {
        let mut lines = Vec::new();
        if only != "sqlite" {
            if idempotency_tests::pg::database_url().is_some() {
                lines.extend(
                    each_size("postgres", &pg_sizes, &cfg, |n| build_postgres(&cfg, n)).await,
                );
            } else {
                eprintln!("(DATABASE_URL is not set: no postgres lines)");
            }
        }
        if only != "postgres" {
            lines.extend(
                each_size("sqlite", &sqlite_sizes, &cfg, |n| async move {
                    Some(build_sqlite(n).await)
                })
                .await,
            );
        }
        lines
    });
    eprintln!("(total {:.0} s)", started.elapsed().as_secs_f64());
    // Again at the end, together, for scripts that read the tail.
    println!();
    for l in lines {
        println!("{l}");
    }
}
