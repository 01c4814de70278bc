//! `recover = "rerun"` across processes: a worker process is killed (`kill -9`) in the middle of
//! a call, after the processor acted and before anything was recorded; two more replicas keep
//! repeating the call. Once the dead worker's lease has passed, one repeat runs the body again
//! under the same reference; the processor (a table in a SQLite file all processes share, which
//! deduplicates on the reference) acted exactly once, and every caller ends with its charge.
//! On PostgreSQL (skipped without `DATABASE_URL`) and on a Redis Cluster (3 masters + 3
//! replicas, started by this test process).

use std::time::{Duration, Instant};

use idempotency::outcome::{ErrorPolicy, Failure, Outcome};
use idempotency::store::{PostgresStore, RedisStore, Store};
use idempotency::tool::{Prepared, Recover, ToolSpec};
use idempotency::{Caller, Error, Idempotency};
use idempotency_tests::pg::{database_url, unique_name, TestSchema};
use idempotency_tests::processes::{say, Victim};
use idempotency_tests::redis_servers::shared_cluster;
use sqlx::SqlitePool;

const LEASE: Duration = Duration::from_secs(2);
const VICTIM_TEST: &str = "rerun_victim";
const STORE_ENV: &str = "IDEMPOTENCY_RERUN_STORE";
const FAR_ENV: &str = "IDEMPOTENCY_RERUN_PROCESSOR";
/// What the victim prints once the processor has acted.
const CHARGED: &str = "RERUN CHARGED";

const CHARGE: ToolSpec =
    ToolSpec::new("charge_card", Duration::from_secs(900)).with_recover(Recover::Rerun);

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
enum ChargeError {
    #[error("{0}")]
    Wrapper(String),
}

impl From<Error> for ChargeError {
    fn from(e: Error) -> Self {
        ChargeError::Wrapper(e.advice())
    }
}

/// The processor at the far side: a SQLite file every process opens. A request under a known
/// reference returns the first charge's id; every request is counted.
async fn processor(path: &str) -> SqlitePool {
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    let pool = SqlitePool::connect_with(opts).await.expect("the processor");
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS charges (reference TEXT PRIMARY KEY, id INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS requests (reference TEXT NOT NULL)",
    )
    .execute(&pool)
    .await
    .expect("the processor's tables");
    pool
}

async fn charge(pool: &SqlitePool, reference: &str) -> i64 {
    sqlx::query("INSERT INTO requests (reference) VALUES ($1)")
        .bind(reference)
        .execute(pool)
        .await
        .expect("request");
    sqlx::query(
        "INSERT OR IGNORE INTO charges (reference, id) VALUES ($1, 1000 + (SELECT COUNT(*) FROM charges))",
    )
    .bind(reference)
    .execute(pool)
    .await
    .expect("charge");
    sqlx::query_scalar("SELECT id FROM charges WHERE reference = $1")
        .bind(reference)
        .fetch_one(pool)
        .await
        .expect("the charge")
}

/// The store a process opens from `spec`: `postgres:<url>` or `redis-cluster:<ns>:<seed>,...`.
async fn open_store(spec: &str) -> std::sync::Arc<dyn Store> {
    if let Some(url) = spec.strip_prefix("postgres:") {
        std::sync::Arc::new(PostgresStore::connect(url).await.expect("postgres store"))
    } else if let Some(rest) = spec.strip_prefix("redis-cluster:") {
        let (namespace, seeds) = rest.split_once(':').expect("namespace:seeds");
        let seeds: Vec<&str> = seeds.split(',').collect();
        std::sync::Arc::new(
            RedisStore::builder()
                .namespace(namespace)
                // A loaded machine's replica may take longer than the default 250 ms.
                .replica_ack_timeout(std::time::Duration::from_secs(2))
                .connect_cluster(&seeds)
                .await
                .expect("redis cluster store"),
        )
    } else {
        panic!("unknown store {spec}")
    }
}

fn engine(store: std::sync::Arc<dyn Store>) -> Idempotency {
    Idempotency::builder_shared(store).lease(LEASE).build()
}

/// One `charge_card` call; `victim` signals the parent after the processor acted and never
/// returns (it is killed there).
async fn call(
    engine: &Idempotency,
    far: &SqlitePool,
    victim: bool,
) -> Outcome<i64, Failure<ChargeError>> {
    let caller = Caller::new("acme", "alice");
    let args = serde_json::json!({"amount_cents": 4200, "currency": "EUR"});
    engine
        .execute_raw(
            Prepared::call(&caller, &CHARGE, &args).expect("key"),
            ErrorPolicy::<ChargeError>::retryable(),
            async move {
                let reference = idempotency::Call::current()
                    .expect("a call")
                    .reference()
                    .to_string();
                let id = charge(far, &reference).await;
                if victim {
                    say(CHARGED, &reference);
                    std::future::pending::<()>().await;
                }
                Ok(id)
            },
        )
        .await
}

/// Runs only as the worker process `a_killed_worker` starts; otherwise passes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_victim() {
    let (Ok(store), Ok(far)) = (std::env::var(STORE_ENV), std::env::var(FAR_ENV)) else {
        return;
    };
    let far = processor(&far).await;
    let engine = engine(open_store(&store).await);
    let out = call(&engine, &far, true).await;
    panic!("the victim's call returned: {:?}", out.result);
}

/// Kills a worker mid-call, then two replicas repeat the call until each has its answer.
async fn a_killed_worker(store: String) {
    let far_path = std::env::temp_dir().join(format!("{}.db", unique_name("rerun-processor")));
    let far_path = far_path.to_str().expect("a UTF-8 path").to_owned();
    let far = processor(&far_path).await;
    let replicas = [
        engine(open_store(&store).await),
        engine(open_store(&store).await),
    ];

    let mut victim = Victim::spawn(VICTIM_TEST, &[(STORE_ENV, &store), (FAR_ENV, &far_path)]);
    let reference = victim.said(CHARGED).await;
    victim.kill().await;
    let killed = Instant::now();

    // Each replica repeats the call (every 100 ms, as a client retrying "in progress") until it
    // has an answer, within the lease plus a bounded allowance.
    let repeat = |engine: Idempotency| {
        let far = far.clone();
        async move {
            let deadline = Instant::now() + LEASE + Duration::from_secs(20);
            let mut in_flight = 0;
            loop {
                let out = call(&engine, &far, false).await;
                match &out.result {
                    Ok(id) => break (*id, out.reference, in_flight, killed.elapsed()),
                    Err(Failure::Wrapper(Error::InFlight { .. })) => in_flight += 1,
                    other => panic!("a repeat got {other:?}"),
                }
                assert!(Instant::now() < deadline, "the call never recovered");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let [a, b] = replicas;
    let (a, b) = tokio::join!(repeat(a), repeat(b));
    println!(
        "replica answers (id, ref, in-flight answers first, time since the kill): {a:?} {b:?}"
    );
    let charges: Vec<(String, i64)> = sqlx::query_as("SELECT reference, id FROM charges")
        .fetch_all(&far)
        .await
        .expect("charges");
    let requests: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM requests")
        .fetch_one(&far)
        .await
        .expect("requests");
    assert_eq!(
        charges,
        vec![(reference.clone(), 1000)],
        "the processor acted once"
    );
    assert_eq!(requests, 2, "the dead worker's request and one rerun");
    for (id, r, _, _) in [&a, &b] {
        assert_eq!(*id, 1000, "every caller ends with the one charge");
        assert_eq!(r.map(|r| r.to_string()), Some(reference.clone()));
    }
    far.close().await;
    for suffix in ["", "-wal", "-shm"] {
        std::fs::remove_file(format!("{far_path}{suffix}")).ok();
    }
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_reruns_once_postgres() {
    if database_url().is_none() {
        return;
    }
    let Some(schema) = TestSchema::create("rerun").await else {
        return;
    };
    // Migrated once here, so the processes do not race to create the schema's tables.
    schema.server_clock_store().await;
    let url = schema.url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let scoped = format!("{url}{sep}options=-c%20search_path%3D{}", schema.name());
    a_killed_worker(format!("postgres:{scoped}")).await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_reruns_once_redis_cluster() {
    let seeds = shared_cluster().seeds().join(",");
    a_killed_worker(format!("redis-cluster:{}:{seeds}", unique_name("rerun"))).await;
}
