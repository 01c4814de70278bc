//! `#[idempotent(transactional)]` when the worker dies: proof at the far side, with real
//! processes (this test binary run again as the victim and as the workers).
//!
//! The victim process runs a transactional `place_order` whose body inserts the order, says so on
//! its stdout and blocks; the parent kills it there (`kill -9`: after the handler's insert, before
//! the commit). Then eight worker processes, released together, each place the same 20 orders
//! (the victim's first, the rest in an order of each worker's own) and report every answer. On
//! PostgreSQL a repeat during another process's transaction is answered "in flight" at once: the
//! workers retry such answers (a bounded loop) and count them. On SQLite another process waits
//! for the file's write lock instead.
//!
//! Then, read through a connection of the parent's own: one `orders` row per order id; no record
//! left in flight or unknown; every worker got the same answer per order, the one the row holds
//! (reference, the process that ran it, the row's id); the body committed once per order, and
//! started once per order (twice for the victim's: the victim, then one fresh run after the
//! kill) according to a log every body start appends to, a file outside every process.
//!
//! Each run has a secret of its own, so runs at once against one server never share a key.
//! The PostgreSQL test is ignored without `DATABASE_URL` at build time (see `build.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::key::Secret;
use idempotency::store::{SqliteStore, Store};
use idempotency::{idempotent, Call, Caller, Classify, Disposition, Error, Idempotency};
use idempotency_tests::pg::{unique_name, TestSchema};
use idempotency_tests::processes::{
    ready_then_wait, say, worker_command, Finished, Victim, Workers,
};
use idempotency_tests::sqlite_file::SqliteFile;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Worker processes placing the orders after the kill.
const WORKERS: usize = 8;
/// Order ids placed by every worker.
const ORDERS: usize = 20;
/// The order the victim was placing when it was killed (one of the [`ORDERS`]).
const VICTIM_ORDER: usize = 7;

const VICTIM_TEST: &str = "txkill_victim";
const WORKER_TEST: &str = "txkill_worker";
/// `postgres` or `sqlite`: which database the child processes use.
const DB_ENV: &str = "IDEMPOTENCY_TXKILL_DB";
/// The database URL (PostgreSQL) or the file's path (SQLite).
const TARGET_ENV: &str = "IDEMPOTENCY_TXKILL_TARGET";
/// The PostgreSQL schema.
const SCHEMA_ENV: &str = "IDEMPOTENCY_TXKILL_SCHEMA";
/// The engines' secret.
const SECRET_ENV: &str = "IDEMPOTENCY_TXKILL_SECRET";
/// The file every body start is appended to.
const LOG_ENV: &str = "IDEMPOTENCY_TXKILL_LOG";
const ID_ENV: &str = "IDEMPOTENCY_TXKILL_WORKER";

/// What the victim says once its insert is in (its reference and its process id).
const INSIDE: &str = "TXKILL INSIDE";
/// What a worker says for each order: its in-flight answers, then the answer (JSON).
const ANSWER: &str = "TXKILL ANSWER";
/// What a worker says at the end: its process id and how many bodies it started.
const DONE: &str = "TXKILL DONE";

/// How long a worker keeps retrying an order answered "in flight" (a bound, never a wait the test
/// relies on), and the pause between its tries.
const RETRY_FOR: Duration = Duration::from_secs(30);
const RETRY_PAUSE: Duration = Duration::from_millis(5);

fn order_id(i: usize) -> String {
    format!("order-{i:02}")
}

/// A secret of this run's own: keys (and PostgreSQL's locks on them) shared by no other run.
fn fresh_secret() -> String {
    format!("{}, the secret of one run", unique_name("txkill"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Db {
    Postgres,
    Sqlite,
}

/// Where the child processes find the database and the log of body starts.
struct Target {
    db: Db,
    /// The database URL (PostgreSQL) or the file's path (SQLite).
    at: String,
    schema: String,
    secret: String,
    log: PathBuf,
}

impl Target {
    fn env(&self) -> Vec<(&'static str, String)> {
        let db = match self.db {
            Db::Postgres => "postgres",
            Db::Sqlite => "sqlite",
        };
        vec![
            (DB_ENV, db.to_owned()),
            (TARGET_ENV, self.at.clone()),
            (SCHEMA_ENV, self.schema.clone()),
            (SECRET_ENV, self.secret.clone()),
            (LOG_ENV, self.log.display().to_string()),
        ]
    }

    /// In a child process: the target its parent gave it, if it is one.
    fn from_env() -> Option<Target> {
        let db = match std::env::var(DB_ENV).ok()?.as_str() {
            "postgres" => Db::Postgres,
            "sqlite" => Db::Sqlite,
            other => panic!("unknown {DB_ENV}: {other}"),
        };
        Some(Target {
            db,
            at: std::env::var(TARGET_ENV).ok()?,
            schema: std::env::var(SCHEMA_ENV).unwrap_or_default(),
            secret: std::env::var(SECRET_ENV).ok()?,
            log: std::env::var(LOG_ENV).ok()?.into(),
        })
    }

    /// The store (already migrated by the parent) and an engine on it, started.
    async fn engine(&self) -> Idempotency {
        let store: Arc<dyn Store> = match self.db {
            Db::Postgres => {
                let schema = TestSchema::attach(&self.at, &self.schema);
                let store = idempotency::store::PostgresStore::from_pool(schema.pool(3).await)
                    .await
                    .expect("open the PostgreSQL store");
                Arc::new(store)
            }
            Db::Sqlite => Arc::new(SqliteStore::open(&self.at).await.expect("open sqlite")),
        };
        Idempotency::builder_shared(store)
            .secret(Secret::new(&self.secret).expect("a secret"))
            .start()
            .await
            .expect("start the engine")
    }
}

struct Ctx {
    engine: Idempotency,
    db: Db,
    log: PathBuf,
    /// The victim's: after its insert the body says [`INSIDE`] and never ends.
    hold: bool,
    /// Body starts in this process (reported; the far side is what the test counts).
    runs: AtomicUsize,
}

impl idempotency::IdempotencyContext<()> for Ctx {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, _: &()) -> Result<Caller, Error> {
        Ok(Caller::new("acme", "alice"))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Order {
    order_id: String,
}

/// The answer: the call's reference, the process that ran the body and the row it inserted.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Placed {
    order_id: String,
    reference: String,
    ran_by: i64,
    row: i64,
}

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
enum OrderError {
    #[error("{advice}")]
    Wrapper { in_flight: bool, advice: String },
    #[error("database: {0}")]
    Db(String),
}

impl Classify for OrderError {
    fn disposition(&self) -> Disposition {
        match self {
            OrderError::Db(_) => Disposition::Retryable,
            OrderError::Wrapper { .. } => Disposition::Unknown,
        }
    }
}

impl From<Error> for OrderError {
    fn from(e: Error) -> Self {
        OrderError::Wrapper {
            in_flight: matches!(e, Error::InFlight { .. }),
            advice: e.advice(),
        }
    }
}

impl From<idempotency::TransactionError> for OrderError {
    fn from(e: idempotency::TransactionError) -> Self {
        OrderError::Db(e.to_string())
    }
}

impl From<sqlx::Error> for OrderError {
    fn from(e: sqlx::Error) -> Self {
        OrderError::Db(e.to_string())
    }
}

const INSERT: &str =
    "INSERT INTO orders (order_id, reference, ran_by) VALUES ($1, $2, $3) RETURNING id";

/// Appends `order_id pid` to the log of body starts: one `write` of an `O_APPEND` file, kept
/// whatever happens to the process or its transaction afterwards.
fn log_start(log: &Path, order_id: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
        .expect("open the log of body starts");
    let line = format!("{order_id} {}\n", std::process::id());
    file.write_all(line.as_bytes())
        .expect("append to the log of body starts");
}

#[idempotent(window = "1h", business_key = "order_id", transactional)]
async fn place_order(ctx: &Ctx, args: Order) -> Result<Placed, OrderError> {
    ctx.runs.fetch_add(1, Ordering::SeqCst);
    log_start(&ctx.log, &args.order_id);
    let call = Call::current().ok_or_else(|| OrderError::Db("no call".into()))?;
    let reference = call.reference().to_string();
    let ran_by = i64::from(std::process::id());
    let row: i64 = match ctx.db {
        Db::Postgres => {
            let mut tx = call.transaction::<sqlx::Postgres>()?;
            let insert = sqlx::query_scalar(INSERT).bind(&args.order_id);
            insert
                .bind(&reference)
                .bind(ran_by)
                .fetch_one(&mut *tx)
                .await?
        }
        Db::Sqlite => {
            let mut tx = call.transaction::<sqlx::Sqlite>()?;
            let insert = sqlx::query_scalar(INSERT).bind(&args.order_id);
            insert
                .bind(&reference)
                .bind(ran_by)
                .fetch_one(&mut *tx)
                .await?
        }
    };
    if ctx.hold {
        // Killed here: the insert is in, the transaction open.
        say(INSIDE, format!("{reference} {ran_by}"));
        std::future::pending::<()>().await;
    }
    Ok(Placed {
        order_id: args.order_id,
        reference,
        ran_by,
        row,
    })
}

/// Places `order_id`, retrying "in flight" answers for at most [`RETRY_FOR`]; returns the answer
/// and how many in-flight answers came first.
async fn until_answered(ctx: &Ctx, order_id: &str) -> (Placed, usize) {
    let until = Instant::now() + RETRY_FOR;
    let mut in_flight = 0;
    loop {
        let order = Order {
            order_id: order_id.to_owned(),
        };
        match place_order(ctx, order).await {
            Ok(placed) => return (placed, in_flight),
            Err(OrderError::Wrapper {
                in_flight: true, ..
            }) if Instant::now() < until => {
                in_flight += 1;
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(e) => panic!("{order_id}: unexpected answer after {in_flight} in-flight ones: {e}"),
        }
    }
}

/// Runs only as the victim process a crash test starts: places the victim's order and is killed
/// inside its transaction. Otherwise passes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txkill_victim() {
    let Some(target) = Target::from_env() else {
        return;
    };
    let ctx = Ctx {
        engine: target.engine().await,
        db: target.db,
        log: target.log.clone(),
        hold: true,
        runs: AtomicUsize::new(0),
    };
    let order = Order {
        order_id: order_id(VICTIM_ORDER),
    };
    let out = place_order(&ctx, order).await;
    panic!("the victim's call ended instead of being killed: {out:?}");
}

/// Runs only as a worker process a crash test starts: once let go, places every order (the
/// victim's first, then the others in this worker's own order), saying each answer. Otherwise
/// passes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txkill_worker() {
    let Some(target) = Target::from_env() else {
        return;
    };
    let worker: usize = std::env::var(ID_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("the worker's number");
    let ctx = Ctx {
        engine: target.engine().await,
        db: target.db,
        log: target.log.clone(),
        hold: false,
        runs: AtomicUsize::new(0),
    };
    let mut rest: Vec<usize> = (0..ORDERS).filter(|&i| i != VICTIM_ORDER).collect();
    let shift = worker * 5 % rest.len();
    rest.rotate_left(shift);
    if worker % 2 == 1 {
        rest.reverse();
    }
    ready_then_wait().await;
    for i in std::iter::once(VICTIM_ORDER).chain(rest) {
        let (placed, in_flight) = until_answered(&ctx, &order_id(i)).await;
        let json = serde_json::to_string(&placed).expect("an answer as JSON");
        say(ANSWER, format!("{in_flight} {json}"));
    }
    say(
        DONE,
        format!("{} {}", std::process::id(), ctx.runs.load(Ordering::SeqCst)),
    );
}

/// What one worker reported.
struct Report {
    pid: i64,
    /// Bodies it started.
    runs: usize,
    /// Per order: its answer and the in-flight answers before it.
    answers: BTreeMap<String, (Placed, usize)>,
}

impl Report {
    fn parse(worker: usize, out: &Finished) -> Report {
        let (stdout, stderr) = (&out.stdout, &out.stderr);
        assert!(out.success, "worker {worker} failed:\n{stdout}\n{stderr}");
        let after = |line: &str, marker: &str| {
            line.find(marker)
                .map(|at| line[at + marker.len()..].trim().to_owned())
        };
        let mut answers = BTreeMap::new();
        let mut done = None;
        for line in stdout.lines() {
            if let Some(rest) = after(line, ANSWER) {
                let (n, json) = rest.split_once(' ').expect("in-flight count, answer");
                let placed: Placed = serde_json::from_str(json).expect("an answer");
                let n: usize = n.parse().expect("an in-flight count");
                let again = answers.insert(placed.order_id.clone(), (placed, n));
                assert!(again.is_none(), "worker {worker} answered an order twice");
            } else if let Some(rest) = after(line, DONE) {
                let (pid, runs) = rest.split_once(' ').expect("pid, runs");
                done = Some((pid.parse().expect("a pid"), runs.parse().expect("a count")));
            }
        }
        let (pid, runs) =
            done.unwrap_or_else(|| panic!("worker {worker} did not finish:\n{stdout}"));
        assert_eq!(answers.len(), ORDERS, "worker {worker}:\n{stdout}");
        Report { pid, runs, answers }
    }
}

/// The far side, read through connections of the parent's own.
enum Far {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

/// A row of `orders`: order id, reference, the process that inserted it, its id.
type OrderRow = (String, String, i64, i64);

impl Far {
    async fn scalar(&self, sql: &'static str) -> i64 {
        match self {
            Far::Postgres(p) => sqlx::query_scalar(sql).fetch_one(p).await,
            Far::Sqlite(p) => sqlx::query_scalar(sql).fetch_one(p).await,
        }
        .expect("read the far side")
    }

    async fn orders(&self) -> Vec<OrderRow> {
        let sql = "SELECT order_id, reference, ran_by, id FROM orders ORDER BY id";
        match self {
            Far::Postgres(p) => sqlx::query_as(sql).fetch_all(p).await,
            Far::Sqlite(p) => sqlx::query_as(sql).fetch_all(p).await,
        }
        .expect("read the orders")
    }

    async fn close(self) {
        match self {
            Far::Postgres(p) => p.close().await,
            Far::Sqlite(p) => p.close().await,
        }
    }
}

/// The log of body starts, removed when dropped.
struct StartLog(PathBuf);

impl StartLog {
    fn new() -> StartLog {
        StartLog(std::env::temp_dir().join(format!("{}.starts", unique_name("txkill"))))
    }

    /// `(order id, pid)` per body start, in the order they started.
    fn read(&self) -> Vec<(String, i64)> {
        let text = std::fs::read_to_string(&self.0).unwrap_or_default();
        text.lines()
            .map(|line| {
                let (order, pid) = line.split_once(' ').expect("order pid");
                (order.to_owned(), pid.parse().expect("a pid"))
            })
            .collect()
    }
}

impl Drop for StartLog {
    fn drop(&mut self) {
        std::fs::remove_file(&self.0).ok();
    }
}

/// The handler's table. No unique constraint on the order id: a second run would be a second
/// row, not an error.
const DOMAIN: &str =
    "CREATE TABLE orders (id {ID}, order_id TEXT NOT NULL, reference TEXT NOT NULL,
                                           ran_by BIGINT NOT NULL)";

/// The crash, the workers, the far side.
async fn kill_then_eight_workers(target: Target, far: Far, log: StartLog) {
    let what = format!("{:?}", target.db).to_lowercase();
    // The parent's engine stores the secret's fingerprint before any child starts.
    drop(target.engine().await);

    let env = target.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut victim = Victim::spawn(VICTIM_TEST, &env);
    let inside = victim.said(INSIDE).await;
    let (victim_reference, victim_pid) = inside.split_once(' ').expect("reference pid");
    let victim_pid: i64 = victim_pid.parse().expect("the victim's pid");
    // Its insert is in, uncommitted: nobody sees it, nor a record.
    assert_eq!(far.scalar("SELECT count(*) FROM orders").await, 0);
    assert_eq!(
        far.scalar("SELECT count(*) FROM idempotency_records").await,
        0
    );
    assert_eq!(log.read(), [(order_id(VICTIM_ORDER), victim_pid)]);
    victim.kill().await;

    let commands = (0..WORKERS)
        .map(|worker| {
            let mut command = worker_command(WORKER_TEST, ID_ENV, worker);
            command.envs(env.iter().copied());
            command
        })
        .collect();
    let started = Instant::now();
    let workers = Workers::start_together(commands).await;
    let reports: Vec<Report> = workers
        .finish()
        .await
        .iter()
        .enumerate()
        .map(|(worker, out)| Report::parse(worker, out))
        .collect();
    let took = started.elapsed();

    // One row per order id, no other.
    let rows = far.orders().await;
    let mut by_order: BTreeMap<String, Vec<&OrderRow>> = BTreeMap::new();
    for row in &rows {
        by_order.entry(row.0.clone()).or_default().push(row);
    }
    let expected: Vec<String> = (0..ORDERS).map(order_id).collect();
    assert_eq!(
        by_order.keys().cloned().collect::<Vec<_>>(),
        expected,
        "{rows:?}"
    );
    assert_eq!(rows.len(), ORDERS, "one row per order id: {rows:?}");
    // No record in flight or unknown; one completed record per order.
    assert_eq!(
        far.scalar("SELECT count(*) FROM idempotency_records WHERE state IN (0, 2)")
            .await,
        0,
        "a record left in flight or unknown"
    );
    assert_eq!(
        far.scalar("SELECT count(*) FROM idempotency_records WHERE state IN (1, 4)")
            .await,
        ORDERS as i64
    );
    assert_eq!(
        far.scalar("SELECT count(*) FROM idempotency_records").await,
        ORDERS as i64
    );

    // Every worker got, for each order, the answer its row holds.
    let pids: Vec<i64> = reports.iter().map(|r| r.pid).collect();
    for (order, rows) in &by_order {
        let (_, reference, ran_by, id) = rows[0].clone();
        let placed = Placed {
            order_id: order.clone(),
            reference,
            ran_by,
            row: id,
        };
        for (worker, report) in reports.iter().enumerate() {
            assert_eq!(report.answers[order].0, placed, "worker {worker}, {order}");
        }
        assert!(
            pids.contains(&ran_by),
            "{order} ran in no worker: {placed:?}"
        );
    }

    // Started once per order, at the far side's count; the victim's twice: it, then one worker.
    let starts = log.read();
    for (i, order) in expected.iter().enumerate() {
        let by: Vec<i64> = starts
            .iter()
            .filter(|(o, _)| o == order)
            .map(|(_, pid)| *pid)
            .collect();
        let ran_by = by_order[order][0].2;
        if i == VICTIM_ORDER {
            assert_eq!(
                by,
                [victim_pid, ran_by],
                "{order}: the victim, then one run"
            );
        } else {
            assert_eq!(by, [ran_by], "{order} started once");
        }
    }
    assert_eq!(starts.len(), ORDERS + 1, "{starts:?}");
    // The workers' own counts agree: each ran the orders whose rows name it.
    for (worker, report) in reports.iter().enumerate() {
        let mine = rows.iter().filter(|r| r.2 == report.pid).count();
        assert_eq!(report.runs, mine, "worker {worker}");
    }

    // The victim's order: not lost, run again as a fresh call (nothing of the killed one stayed,
    // so the same generation's reference).
    let victims = by_order[&order_id(VICTIM_ORDER)][0];
    assert_ne!(victims.2, victim_pid);
    assert_eq!(victims.1, victim_reference);

    let in_flight: usize = reports
        .iter()
        .flat_map(|r| r.answers.values())
        .map(|(_, n)| n)
        .sum();
    let on_victims: usize = reports
        .iter()
        .map(|r| r.answers[&order_id(VICTIM_ORDER)].1)
        .sum();
    println!(
        "{what}: kill -9 inside the transaction, then {WORKERS} processes x {ORDERS} orders in \
         {took:?}: {in_flight} in-flight answers retried ({on_victims} on the victim's order); \
         one row and one completed record per order"
    );
    if target.db == Db::Sqlite {
        // Another process waits for the file's write lock; it is never told "in flight".
        assert_eq!(in_flight, 0);
    }
    far.close().await;
}

/// A schema of its own, migrated, with the `orders` table; its target for the child processes and
/// a connection of the parent's own.
async fn postgres(what: &str, secret: &str, log: &StartLog) -> Option<(TestSchema, Target, Far)> {
    let schema = TestSchema::create(what).await?;
    // Migrated here, once.
    drop(schema.server_clock_store().await);
    let far = schema.pool(2).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        DOMAIN.replace("{ID}", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"),
    ))
    .execute(&far)
    .await
    .expect("create the orders table");
    let target = Target {
        db: Db::Postgres,
        at: schema.url().to_owned(),
        schema: schema.name().to_owned(),
        secret: secret.to_owned(),
        log: log.0.clone(),
    };
    Some((schema, target, Far::Postgres(far)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn kill_9_inside_the_transaction_on_postgres() {
    let log = StartLog::new();
    let Some((schema, target, far)) = postgres("txkill", &fresh_secret(), &log).await else {
        return;
    };
    kill_then_eight_workers(target, far, log).await;
    schema.drop_schema().await;
}

/// Two stores in two schemas of one database, their engines with one secret: the victim's
/// transaction, open in the first, holds nothing in the second, where the same call (the same
/// key, the same reference) runs at once instead of being told "in flight".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn a_transaction_in_another_schema_holds_no_key_here() {
    let (log, secret) = (StartLog::new(), fresh_secret());
    let Some((first, there, there_far)) = postgres("txkeya", &secret, &log).await else {
        return;
    };
    let Some((second, here, here_far)) = postgres("txkeyb", &secret, &log).await else {
        return;
    };
    drop(there.engine().await);
    let env = there.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut victim = Victim::spawn(VICTIM_TEST, &env);
    let inside = victim.said(INSIDE).await;
    let (victim_reference, _) = inside.split_once(' ').expect("reference pid");

    let ctx = Ctx {
        engine: here.engine().await,
        db: Db::Postgres,
        log: log.0.clone(),
        hold: false,
        runs: AtomicUsize::new(0),
    };
    let order = Order {
        order_id: order_id(VICTIM_ORDER),
    };
    let placed = place_order(&ctx, order)
        .await
        .expect("the call runs in its own schema");
    assert_eq!(placed.reference, victim_reference, "the same key");
    assert_eq!(placed.ran_by, i64::from(std::process::id()));
    assert_eq!(here_far.scalar("SELECT count(*) FROM orders").await, 1);
    assert_eq!(there_far.scalar("SELECT count(*) FROM orders").await, 0);

    victim.kill().await;
    here_far.close().await;
    there_far.close().await;
    first.drop_schema().await;
    second.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_inside_the_transaction_on_a_sqlite_file() {
    let file = SqliteFile::new("txkill");
    // Created and migrated here, once.
    let store = SqliteStore::open(&file.0).await.expect("open sqlite");
    let far = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(sqlx::sqlite::SqliteConnectOptions::new().filename(&file.0))
        .await
        .expect("a connection of the parent's own");
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        DOMAIN.replace("{ID}", "INTEGER PRIMARY KEY"),
    ))
    .execute(&far)
    .await
    .expect("create the orders table");
    drop(store);
    let log = StartLog::new();
    let target = Target {
        db: Db::Sqlite,
        at: file.0.display().to_string(),
        schema: String::new(),
        secret: fresh_secret(),
        log: log.0.clone(),
    };
    kill_then_eight_workers(target, Far::Sqlite(far), log).await;
}
