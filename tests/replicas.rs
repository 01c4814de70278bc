//! Eight server replicas (eight OS processes: this test binary run again as workers) share one
//! PostgreSQL schema and receive 1,000 identical `charge_card` calls between them, 125 each, all
//! at once. Each call goes through the engine; the handler inserts a row into a `charges` table in
//! the same database. Exactly one row may exist afterwards, and every call must have been answered
//! with the charge (fresh or replayed) or with "in progress".
//!
//! Skipped with a printed line without `DATABASE_URL`.

use std::time::Duration;

use idempotency::store::PostgresStore;
use idempotency::{Error, Idempotency};
use idempotency_tests::charge::current_reference;
use idempotency_tests::pg::{database_url, TestSchema};
use idempotency_tests::processes::{replica_calls, worker_command, Receipt, Tally, Workers};
use sqlx::PgPool;

const REPLICAS: usize = 8;
const CALLS_PER_REPLICA: usize = 125;
const WORKER_TEST: &str = "replica_worker";
const SCHEMA_ENV: &str = "IDEMPOTENCY_REPLICA_SCHEMA";
const ID_ENV: &str = "IDEMPOTENCY_REPLICA_ID";

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error(transparent)]
    Wrapper(#[from] Error),
    #[error("the charges table: {0}")]
    Db(String),
}

/// The processor: records the charge in the database, then takes its time.
async fn charge(pool: PgPool, replica: usize) -> Result<Receipt, ChargeError> {
    let reference = current_reference();
    sqlx::query("INSERT INTO charges (reference, replica) VALUES ($1, $2)")
        .bind(&reference)
        .bind(replica as i32)
        .execute(&pool)
        .await
        .map_err(|e| ChargeError::Db(e.to_string()))?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(Receipt { reference })
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_replicas_charge_once() {
    let Some(schema) = TestSchema::create("replicas").await else {
        return;
    };
    let pool = schema.pool(2).await;
    sqlx::query("CREATE TABLE charges (id BIGSERIAL PRIMARY KEY, reference TEXT NOT NULL, replica INTEGER NOT NULL)")
        .execute(&pool)
        .await
        .expect("create charges");

    // The replicas migrate the empty schema themselves, all at once, and start calling together
    // (each says when it is set up; all are let go at once).
    let commands = (0..REPLICAS)
        .map(|replica| {
            let mut command = worker_command(WORKER_TEST, ID_ENV, replica);
            command
                .env("DATABASE_URL", schema.url())
                .env(SCHEMA_ENV, schema.name());
            command
        })
        .collect();
    let workers = Workers::start_together(commands).await;
    let total = Tally::total(workers.finish().await);

    let rows: Vec<(String, i32)> = sqlx::query_as("SELECT reference, replica FROM charges")
        .fetch_all(&pool)
        .await
        .expect("charges");
    println!(
        "{REPLICAS} replicas x {CALLS_PER_REPLICA} calls: fresh={} replayed={} in_flight={} other={}; rows in charges: {}",
        total.fresh,
        total.replayed,
        total.in_flight,
        total.other,
        rows.len()
    );
    assert_eq!(rows.len(), 1, "exactly one charge: {rows:?}");
    total.assert_one_run(REPLICAS * CALLS_PER_REPLICA);
    pool.close().await;
    schema.drop_schema().await;
}

/// Runs only as a worker process started by `eight_replicas_charge_once`; otherwise passes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_worker() {
    let (Ok(name), Some(url)) = (std::env::var(SCHEMA_ENV), database_url()) else {
        return;
    };
    let replica: usize = std::env::var(ID_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let schema = TestSchema::attach(&url, &name);
    let pool = schema.pool(4).await;
    let store = PostgresStore::from_pool(pool.clone())
        .await
        .expect("the replica's store");
    let engine = Idempotency::new(store);
    replica_calls(
        &engine,
        replica,
        CALLS_PER_REPLICA,
        || charge(pool.clone(), replica),
        |e| matches!(e, ChargeError::Wrapper(Error::InFlight { .. })),
    )
    .await;
}
