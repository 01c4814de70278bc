//! Faults: the states where a record exists and the outcome does not. Every test counts the side
//! effect at the far side (a processor table in the database, or an atomic counter).
//!
//! Postgres cases read `DATABASE_URL` and print that they were skipped without it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency::outbox::Dispatcher;
use idempotency::store::{PostgresStore, SqliteStore, Store};
use idempotency::tasks::Reconciler;
use idempotency::{
    clock::{Clock, ManualClock, SystemClock, Timestamp},
    error::UnknownReason,
    outcome::{ErrorPolicy, Failure, Outcome},
    store::{MemoryStore, RecordState, Settlement, StoredResponse},
    tool::Prepared,
    Caller, Error, Idempotency,
};
use idempotency_tests::charge::{current_reference, ChargeError};
use idempotency_tests::proxy::Proxy;
use idempotency_tests::sqlite_file::remove_sqlite_files;
use serde::{Deserialize, Serialize};

const WINDOW: Duration = Duration::from_secs(900);

fn caller() -> Caller {
    Caller::new("acme", "alice")
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Receipt {
    charge_id: i64,
    reference: String,
}

/// Runs `body` as the `charge_card` call keyed by `prepared`, classifying `ChargeError`s.
async fn charge_with<Fut>(
    engine: &Idempotency,
    prepared: Prepared,
    body: Fut,
) -> Outcome<Receipt, Failure<ChargeError>>
where
    Fut: std::future::Future<Output = Result<Receipt, ChargeError>> + Send,
{
    engine
        .execute_raw(prepared, ErrorPolicy::classified(), body)
        .await
}

fn temp_path(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!(
        "idem-faults-{name}-{}-{}.db",
        std::process::id(),
        nanos()
    ));
    let _ = std::fs::remove_file(&p);
    p
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn database_url() -> Option<String> {
    idempotency_tests::pg::database_url_or_skip()
}

/// A fresh schema on the test database; returns a URL whose connections use it.
async fn pg_schema(url: &str, label: &str) -> (String, String) {
    let schema = format!("idem_fault_{label}_{}", nanos() % 1_000_000_000);
    let pool = sqlx::PgPool::connect(url)
        .await
        .expect("connect to DATABASE_URL");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&pool)
        .await
        .expect("create schema");
    pool.close().await;
    let sep = if url.contains('?') { '&' } else { '?' };
    (
        format!("{url}{sep}options=-c%20search_path%3D{schema}"),
        schema,
    )
}

async fn pg_drop(url: &str, schema: &str) {
    if let Ok(pool) = sqlx::PgPool::connect(url).await {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&pool)
            .await;
    }
}

// ---------------------------------------------------------------------------------------------
// kill -9 between claim and complete

/// The processor's own record, in the same database as the store: `charges(reference, id)`.
enum Db {
    Sqlite(sqlx::SqlitePool),
    Pg(sqlx::PgPool),
}

impl Db {
    async fn open(target: &str) -> Db {
        if let Some(path) = target.strip_prefix("sqlite:") {
            let opts = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5));
            let pool = sqlx::SqlitePool::connect_with(opts).await.expect("sqlite");
            sqlx::query("CREATE TABLE IF NOT EXISTS charges (reference TEXT PRIMARY KEY, id INTEGER NOT NULL)").execute(&pool).await.expect("ddl");
            Db::Sqlite(pool)
        } else {
            let pool = sqlx::PgPool::connect(target).await.expect("pg");
            sqlx::query("CREATE TABLE IF NOT EXISTS charges (reference TEXT PRIMARY KEY, id BIGINT NOT NULL)").execute(&pool).await.expect("ddl");
            Db::Pg(pool)
        }
    }

    async fn store(target: &str) -> Arc<dyn Store> {
        if let Some(path) = target.strip_prefix("sqlite:") {
            Arc::new(SqliteStore::open(path).await.expect("open sqlite store"))
        } else {
            // The scenario moves time with a ManualClock: the store takes the engine's times.
            Arc::new(
                PostgresStore::connect(target)
                    .await
                    .expect("open pg store")
                    .trusting_engine_clock(),
            )
        }
    }

    async fn charge(&self, reference: &str) -> i64 {
        let sql = "INSERT INTO charges (reference, id) VALUES ($1, 1000 + (SELECT COUNT(*) FROM charges))";
        match self {
            Db::Sqlite(p) => sqlx::query(sql)
                .bind(reference)
                .execute(p)
                .await
                .map(|_| ()),
            Db::Pg(p) => sqlx::query(sql)
                .bind(reference)
                .execute(p)
                .await
                .map(|_| ()),
        }
        .expect("processor insert");
        self.find(reference).await.unwrap_or(-1)
    }

    async fn find(&self, reference: &str) -> Option<i64> {
        let sql = "SELECT id FROM charges WHERE reference = $1";
        match self {
            Db::Sqlite(p) => sqlx::query_scalar(sql)
                .bind(reference)
                .fetch_optional(p)
                .await
                .ok()
                .flatten(),
            Db::Pg(p) => sqlx::query_scalar(sql)
                .bind(reference)
                .fetch_optional(p)
                .await
                .ok()
                .flatten(),
        }
    }

    async fn count(&self) -> i64 {
        let sql = "SELECT COUNT(*) FROM charges";
        match self {
            Db::Sqlite(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap_or(-1),
            Db::Pg(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap_or(-1),
        }
    }
}

const WORKER_ENV: &str = "IDEM_KILL9_TARGET";
const LEASE: Duration = Duration::from_secs(2);

/// Not a test on its own: the child process of the kill -9 tests (does nothing unless the
/// environment names a target).
#[tokio::test]
async fn kill9_worker() {
    let Ok(target) = std::env::var(WORKER_ENV) else {
        return;
    };
    let db = Db::open(&target).await;
    let engine = Idempotency::builder_shared(Db::store(&target).await)
        .lease(LEASE)
        .without_reconciler()
        .build();
    let prepared =
        Prepared::call(&caller(), &idempotency_tests::CHARGE_CARD, &4200u64).expect("key");
    let _: Outcome<Receipt, ChargeError> = engine
        .execute(prepared, ErrorPolicy::classified(), async move {
            let reference = current_reference();
            let id = db.charge(&reference).await;
            println!("CHARGED {reference}");
            use std::io::Write;
            let _ = std::io::stdout().flush();
            tokio::time::sleep(Duration::from_secs(3600)).await; // killed here
            Ok(Receipt {
                charge_id: id,
                reference,
            })
        })
        .await;
}

async fn kill9_scenario(target: String) {
    use tokio::io::AsyncBufReadExt;
    let db = Db::open(&target).await;
    let mut child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            &idempotency_tests::processes::test_path("kill9_worker"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(WORKER_ENV, &target)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn worker");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let reference = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            // libtest prints "test kill9_worker ... " before the worker's own output.
            if let Some(at) = line.find("CHARGED ") {
                return line[at + "CHARGED ".len()..].trim().to_owned();
            }
        }
        String::new()
    })
    .await
    .expect("the worker charged in time");
    assert!(!reference.is_empty());
    child.start_kill().expect("SIGKILL"); // tokio's kill is SIGKILL on Unix
    let status = child.wait().await.expect("reap");
    assert!(!status.success(), "the worker was killed");
    assert_eq!(db.count().await, 1);

    // The repeat, with the worker dead and its lease still running: in flight, not re-run.
    let store = Db::store(&target).await;
    let clock = ManualClock::new(SystemClock.now());
    let engine = Idempotency::builder_shared(store.clone())
        .clock(clock.clone())
        .lease(LEASE)
        .without_reconciler()
        .build();
    let repeat = || {
        let engine = engine.clone();
        let prepared =
            Prepared::call(&caller(), &idempotency_tests::CHARGE_CARD, &4200u64).expect("key");
        async move {
            charge_with(&engine, prepared, async {
                panic!("the repeat must not run the side effect")
            })
            .await
        }
    };
    let r = repeat().await;
    match &r.result {
        Err(Failure::Wrapper(e @ Error::InFlight { .. })) => {
            assert!(e.to_string().contains(&reference))
        }
        other => panic!("expected in flight, got {other:?}"),
    }
    let parsed: idempotency::Reference = reference.parse().expect("ref");
    let st = engine
        .status(&caller(), parsed)
        .await
        .expect("status")
        .expect("found");
    assert_eq!(st.state, RecordState::InFlight);

    // Before the lease passes the reconciler leaves it alone; after, it asks the processor.
    let asked = Arc::new(AtomicUsize::new(0));
    let make_reconciler = |engine: &Idempotency| {
        let asked = asked.clone();
        let target = target.clone();
        Reconciler::new(engine, move |claim: idempotency::store::Unsettled| {
            let asked = asked.clone();
            let target = target.clone();
            async move {
                asked.fetch_add(1, Ordering::SeqCst);
                let db = Db::open(&target).await;
                let reference = claim.reference.to_string();
                Ok(match db.find(&reference).await {
                    Some(id) => Settlement::Completed(StoredResponse {
                        ok: true,
                        body: serde_json::to_string(&Receipt {
                            charge_id: id,
                            reference,
                        })
                        .map_err(|e| e.to_string())?,
                    }),
                    None => Settlement::Released,
                })
            }
        })
    };
    let report = make_reconciler(&engine).run_once().await.expect("round");
    assert_eq!(report.examined, 0, "a live lease is not reconciled");
    clock.advance(LEASE + Duration::from_secs(1));
    let report = make_reconciler(&engine).run_once().await.expect("round");
    assert_eq!((report.examined, report.completed), (1, 1), "{report:?}");
    assert_eq!(asked.load(Ordering::SeqCst), 1);

    let r = repeat().await;
    assert!(r.replayed);
    let Ok(receipt) = r.result else {
        panic!("expected the settled receipt")
    };
    assert_eq!(receipt.reference, reference);
    assert_eq!(db.count().await, 1, "exactly one charge throughout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_between_claim_and_complete_sqlite() {
    let path = temp_path("kill9");
    kill9_scenario(format!("sqlite:{}", path.display())).await;
    remove_sqlite_files(&path);
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_between_claim_and_complete_postgres() {
    let Some(url) = database_url() else { return };
    let (scoped, schema) = pg_schema(&url, "kill9").await;
    kill9_scenario(scoped).await;
    pg_drop(&url, &schema).await;
}

// ---------------------------------------------------------------------------------------------
// Store outage: fail closed, recover without a restart; a failed completion is "unknown".

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_fails_closed_and_recovers() {
    let Some(url) = database_url() else { return };
    let (_, schema) = pg_schema(&url, "outage").await;
    let proxy = Proxy::start("127.0.0.1:5432".parse().expect("addr"))
        .await
        .expect("proxy");
    let mut opts: sqlx::postgres::PgConnectOptions = url.parse().expect("DATABASE_URL parses");
    opts = opts
        .host("127.0.0.1")
        .port(proxy.addr().port())
        .options([("search_path", schema.as_str())]);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(opts)
        .await
        .expect("pool through the proxy");
    let store = PostgresStore::from_pool(pool).await.expect("store");
    let engine = Idempotency::new(store);
    let charges = Arc::new(AtomicUsize::new(0));
    let cut_in_body = Arc::new(Mutex::new(None::<Arc<Proxy>>));
    let proxy = Arc::new(proxy);
    let call = |amount: u64| {
        let (engine, charges, cut) = (engine.clone(), charges.clone(), cut_in_body.clone());
        async move {
            let prepared =
                Prepared::call(&caller(), &idempotency_tests::CHARGE_CARD, &amount).expect("key");
            charge_with(&engine, prepared, async move {
                charges.fetch_add(1, Ordering::SeqCst);
                if let Some(p) = cut.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    p.cut(); // the database goes away after the side effect
                }
                Ok(Receipt {
                    charge_id: amount as i64,
                    reference: current_reference(),
                })
            })
            .await
        }
    };
    assert!(call(1).await.result.is_ok());
    proxy.cut();
    for amount in 2..5 {
        match call(amount).await.result {
            Err(Failure::Wrapper(e @ Error::Store { .. })) => {
                assert!(e.nothing_done());
                assert!(
                    e.advice().contains("Nothing was done") && e.safe_to_retry(),
                    "{}",
                    e.advice()
                );
            }
            other => panic!("expected a fail-closed answer, got {other:?}"),
        }
    }
    assert_eq!(
        charges.load(Ordering::SeqCst),
        1,
        "no side effect ran without a claim"
    );
    proxy.restore();
    let mut recovered = false;
    for _ in 0..20 {
        if call(5).await.result.is_ok() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        recovered,
        "calls succeed again when the database returns, same engine, same pool"
    );
    assert_eq!(charges.load(Ordering::SeqCst), 2);

    // The database disappears after the side effect ran: the answer is "outcome unknown" with the ref.
    *cut_in_body.lock().unwrap_or_else(|e| e.into_inner()) = Some(proxy.clone());
    let r = call(6).await;
    match &r.result {
        Err(Failure::Wrapper(
            e @ Error::OutcomeUnknown {
                reason: UnknownReason::NotRecorded,
                ..
            },
        )) => {
            assert!(!e.nothing_done());
            assert!(e
                .to_string()
                .contains(&r.reference.expect("ref").to_string()));
        }
        other => panic!("expected outcome unknown, got {other:?}"),
    }
    proxy.restore();
    // Until the pool has reconnected, a repeat fails closed with a store error; retry it then.
    let mut answered = None;
    for _ in 0..20 {
        match call(6).await.result {
            Err(Failure::Wrapper(Error::Store { .. })) => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            other => {
                answered = Some(other);
                break;
            }
        }
    }
    match answered {
        Some(Err(Failure::Wrapper(Error::InFlight { .. } | Error::OutcomeUnknown { .. }))) => {}
        other => panic!("the repeat must be told in flight / unknown, got {other:?}"),
    }
    assert_eq!(
        charges.load(Ordering::SeqCst),
        3,
        "the repeat did not run the side effect again"
    );
    pg_drop(&url, &schema).await;
}

// ---------------------------------------------------------------------------------------------
// Follow-on work: the receipt email is written with the completion and sent exactly once.

#[tokio::test]
async fn outbox_survives_a_crash_and_a_replay_sends_nothing_more() {
    let path = temp_path("outbox");
    let charges = Arc::new(AtomicUsize::new(0));
    let go = |engine: Idempotency| {
        let charges = charges.clone();
        async move {
            let prepared =
                Prepared::call(&caller(), &idempotency_tests::CHARGE_CARD, &77u64).expect("key");
            engine
                .execute(
                    prepared,
                    ErrorPolicy::<ChargeError>::classified(),
                    async move {
                        charges.fetch_add(1, Ordering::SeqCst);
                        let call = idempotency::Call::current().expect("in body");
                        call.enqueue(
                            "receipt_email",
                            &serde_json::json!({"to": "alice@example.com"}),
                        )
                        .map_err(|e| ChargeError::Wrapper(e.to_string()))?;
                        Ok(Receipt {
                            charge_id: 1,
                            reference: call.reference().to_string(),
                        })
                    },
                )
                .await
        }
    };
    {
        let engine = Idempotency::new(SqliteStore::open(&path).await.expect("open"));
        go(engine).await.result.expect("charged");
        // the process "crashes" here: charged, email not sent yet
    }
    let engine = Idempotency::new(SqliteStore::open(&path).await.expect("reopen"));
    assert!(
        go(engine.clone()).await.replayed,
        "the replay does not enqueue another email"
    );

    // The mail service dedupes by reference; the first delivery is sent but its ack is lost.
    let sent: Arc<Mutex<Vec<String>>> = Arc::default();
    let attempts = Arc::new(AtomicUsize::new(0));
    let deliver = {
        let (sent, attempts) = (sent.clone(), attempts.clone());
        move |m: idempotency::store::OutboxEntry| {
            let (sent, attempts) = (sent.clone(), attempts.clone());
            async move {
                let n = attempts.fetch_add(1, Ordering::SeqCst);
                let mut s = sent.lock().unwrap_or_else(|e| e.into_inner());
                let r = m.reference.to_string();
                if !s.contains(&r) {
                    s.push(r);
                }
                if n == 0 {
                    Err("connection reset before the ack".into())
                } else {
                    Ok(())
                }
            }
        }
    };
    let dispatcher = Dispatcher::new(&engine, deliver).redeliver_after(Duration::ZERO);
    assert_eq!(dispatcher.run_once().await.expect("round 1"), 0);
    assert_eq!(dispatcher.run_once().await.expect("round 2"), 1);
    assert_eq!(
        dispatcher.run_once().await.expect("round 3"),
        0,
        "acknowledged: nothing left"
    );
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        2,
        "delivered at least once (twice here)"
    );
    assert_eq!(
        sent.lock().unwrap_or_else(|e| e.into_inner()).len(),
        1,
        "one email per reference"
    );
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    remove_sqlite_files(&path);
}

// ---------------------------------------------------------------------------------------------
// Expired claims under contention; exact lease edges; panics before the side effect.

async fn contention_after_release(store: Arc<dyn Store>) {
    let clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
    let engine = Idempotency::builder_shared(store)
        .clock(clock.clone())
        .lease(Duration::from_secs(30))
        .without_reconciler()
        .build();
    let key = Prepared::call(&caller(), &idempotency_tests::CHARGE_CARD, &9u64).expect("key");
    // A worker claims and dies (no completion).
    let req = idempotency::store::ClaimRequest {
        key: key.key.key(&idempotency::key::Secret::demo()),
        tenant: "acme",
        subject: None,
        tool: "charge_card",
        fingerprint: None,
        now: clock.now(),
        lease: Duration::from_secs(30),
        window: WINDOW,
        token: idempotency::store::Token(clock.now().as_millis()),
    };
    assert!(matches!(
        engine.store().claim(&req).await.expect("claim"),
        idempotency::store::Claim::New { .. }
    ));
    let released = || {
        Reconciler::new(&engine, |_c: idempotency::store::Unsettled| async {
            Ok(Settlement::Released)
        })
    };
    clock.advance(Duration::from_secs(29));
    assert_eq!(
        released().run_once().await.expect("round").examined,
        0,
        "lease − 1 s: still live"
    );
    clock.advance(Duration::from_secs(1));
    let at = engine
        .store()
        .unsettled(clock.now(), 10)
        .await
        .expect("unsettled");
    assert_eq!(at.len(), 1, "at the lease's end it is due");
    clock.advance(Duration::from_secs(1));
    assert_eq!(released().run_once().await.expect("round").released, 1);

    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (engine, runs, barrier) = (engine.clone(), runs.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let prepared =
                    Prepared::call(&caller(), &idempotency_tests::CHARGE_CARD, &9u64).expect("key");
                charge_with(&engine, prepared, async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok(Receipt {
                        charge_id: 9,
                        reference: current_reference(),
                    })
                })
                .await
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await.expect("join").result {
            Ok(_) => ok += 1,
            Err(Failure::Wrapper(Error::InFlight { .. })) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "exactly one of 32 takes the released claim over"
    );
    assert!(ok >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_claim_is_taken_over_by_exactly_one_of_32_memory() {
    contention_after_release(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_claim_is_taken_over_by_exactly_one_of_32_sqlite() {
    let path = temp_path("contention");
    contention_after_release(Arc::new(SqliteStore::open(&path).await.expect("open"))).await;
    remove_sqlite_files(&path);
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_claim_is_taken_over_by_exactly_one_of_32_postgres() {
    let Some(url) = database_url() else { return };
    let (scoped, schema) = pg_schema(&url, "contention").await;
    contention_after_release(Arc::new(
        PostgresStore::connect(&scoped)
            .await
            .expect("store")
            .trusting_engine_clock(),
    ))
    .await;
    pg_drop(&url, &schema).await;
}

#[tokio::test]
async fn a_panic_before_the_side_effect_is_unknown_until_reconciled_then_runs_once() {
    let clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
    let engine = Idempotency::builder(MemoryStore::new())
        .clock(clock.clone())
        .without_reconciler()
        .build();
    let charges = Arc::new(AtomicUsize::new(0));
    let run = |fail: bool| {
        let (engine, charges) = (engine.clone(), charges.clone());
        tokio::spawn(async move {
            let prepared =
                Prepared::call(&caller(), &idempotency_tests::CHARGE_CARD, &5u64).expect("key");
            charge_with(&engine, prepared, async move {
                if fail {
                    panic!("bug before the processor call");
                }
                charges.fetch_add(1, Ordering::SeqCst);
                Ok(Receipt {
                    charge_id: 5,
                    reference: current_reference(),
                })
            })
            .await
        })
    };
    let panicked = run(true).await.expect("a panic is answered, not re-raised");
    assert!(
        matches!(
            panicked.result,
            Err(Failure::Wrapper(Error::OutcomeUnknown {
                reason: UnknownReason::Panicked(_),
                ..
            }))
        ),
        "{:?}",
        panicked.result
    );
    let r = run(false).await.expect("no panic");
    assert!(
        matches!(
            r.result,
            Err(Failure::Wrapper(Error::OutcomeUnknown { .. }))
        ),
        "never silently re-runnable"
    );
    assert_eq!(charges.load(Ordering::SeqCst), 0);
    // The processor has no record of the ref: the reconciler releases it; the next call runs once.
    let report = Reconciler::new(&engine, |_c: idempotency::store::Unsettled| async {
        Ok(Settlement::Released)
    })
    .run_once()
    .await
    .expect("round");
    assert_eq!(report.released, 1);
    assert!(run(false).await.expect("runs").result.is_ok());
    assert!(run(false).await.expect("replays").replayed);
    assert_eq!(charges.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_late_completion_after_settlement_is_rejected() {
    let clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
    let engine = Idempotency::builder(MemoryStore::new())
        .clock(clock.clone())
        .lease(Duration::from_secs(1))
        .without_reconciler()
        .build();
    let gate = Arc::new(tokio::sync::Notify::new());
    let g2 = gate.clone();
    let e2 = engine.clone();
    let slow = tokio::spawn(async move {
        let prepared =
            Prepared::call(&caller(), &idempotency_tests::CHARGE_CARD, &8u64).expect("key");
        e2.execute(
            prepared,
            ErrorPolicy::<ChargeError>::classified(),
            async move {
                g2.notified().await;
                Ok(Receipt {
                    charge_id: 111,
                    reference: current_reference(),
                })
            },
        )
        .await
    });
    while engine
        .store()
        .unsettled(clock.now() + Duration::from_secs(3600), 1)
        .await
        .expect("u")
        .is_empty()
    {
        tokio::task::yield_now().await;
    }
    clock.advance(Duration::from_secs(5));
    let settled = StoredResponse {
        ok: true,
        body: serde_json::to_string(&Receipt {
            charge_id: 222,
            reference: String::new(),
        })
        .expect("json"),
    };
    let report = Reconciler::new(&engine, move |_c: idempotency::store::Unsettled| {
        let s = settled.clone();
        async move { Ok(Settlement::Completed(s)) }
    })
    .run_once()
    .await
    .expect("round");
    assert_eq!(report.completed, 1);
    gate.notify_one();
    slow.await
        .expect("join")
        .result
        .expect("the worker's own answer");
    // The record keeps the reconciler's answer: the fencing token rejected the late write.
    let prepared = Prepared::call(&caller(), &idempotency_tests::CHARGE_CARD, &8u64).expect("key");
    let r: Outcome<Receipt, ChargeError> = engine
        .execute(prepared, ErrorPolicy::classified(), async {
            panic!("must replay")
        })
        .await;
    assert_eq!(r.result.expect("replay").charge_id, 222);
}

// ---------------------------------------------------------------------------------------------
// Bad input: a clear error or a correct key, never a panic, and never a side effect.

#[tokio::test]
async fn bad_input_is_refused_before_anything_runs() {
    let engine = Idempotency::new(MemoryStore::new());
    let ran = Arc::new(AtomicUsize::new(0));
    async fn attempt<A: Serialize>(
        engine: &Idempotency,
        who: &Caller,
        args: &A,
        ran: &Arc<AtomicUsize>,
    ) -> Result<(), Error> {
        let prepared = Prepared::call(who, &idempotency_tests::CHARGE_CARD, args)?;
        let ran = ran.clone();
        let out: Outcome<u8, ChargeError> = engine
            .execute(prepared, ErrorPolicy::classified(), async move {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(1)
            })
            .await;
        out.result.map(|_| ()).map_err(|e| Error::InvalidCaller {
            reason: e.to_string(),
        })
    }
    // 1 MB of arguments: keyed fine.
    let huge = "x".repeat(1 << 20);
    attempt(&engine, &caller(), &serde_json::json!({"memo": huge}), &ran)
        .await
        .expect("1 MB keys fine");
    // NaN (typed: serde_json's json! would already have turned it into null): a clear error.
    #[derive(Serialize)]
    struct Amount {
        amount: f64,
    }
    let e = attempt(&engine, &caller(), &Amount { amount: f64::NAN }, &ran)
        .await
        .expect_err("NaN refused");
    assert!(e.to_string().starts_with("charge_card:"), "{e}");
    assert!(e.advice().contains("NaN"), "{}", e.advice());
    // Deep nesting: refused, no stack overflow.
    let mut deep = serde_json::Value::Null;
    for _ in 0..5_000 {
        deep = serde_json::Value::Array(vec![deep]);
    }
    let handle = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || {
            let r = Prepared::call(&caller(), &idempotency_tests::CHARGE_CARD, &deep).map(|_| ());
            std::mem::forget(deep); // serde_json's recursive Drop is not what is under test
            r
        });
    let r = handle.expect("thread").join().expect("no panic");
    assert!(r.is_err(), "deep nesting is a clear error");
    // An empty tenant: refused.
    let e = attempt(&engine, &Caller::new("", "alice"), &1u8, &ran)
        .await
        .expect_err("empty tenant");
    assert!(e.to_string().contains("tenant"), "{e}");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "only the valid call ran");
}
