//! Windows the clock cannot shorten: a clock stepped back while the handler ran must not make
//! the completion earlier than the claim (a repeat a minute later would otherwise find the
//! window over and charge again under a new reference). Memory, SQLite and PostgreSQL.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::clock::{ManualClock, Timestamp};
use idempotency::store::{MemoryStore, SqliteStore, Store};
use idempotency::Idempotency;
use idempotency_tests::charge::counted_charge;
use idempotency_tests::pg::{unique_name, TestSchema};
use idempotency_tests::sqlite_file::remove_sqlite_files;

const T0: i64 = 1_796_000_000_000;
const WINDOW: Duration = Duration::from_secs(900);

async fn step_back_while_running(store: Arc<dyn Store>) {
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let engine = Idempotency::builder_shared(store)
        .clock(clock.clone())
        .without_reconciler()
        .build();
    let charges = Arc::new(AtomicUsize::new(0));
    let run = |step_back: bool| {
        let clock = clock.clone();
        counted_charge(&engine, &charges, 4200, async move {
            if step_back {
                // The system clock is stepped back an hour while the processor works.
                clock.set(Timestamp::from_millis(T0 - 3_600_000));
            }
        })
    };
    let first = run(true).await;
    assert!(first.result.is_ok());
    // The step is corrected; a minute after the claim, well inside the window counted from it.
    clock.set(Timestamp::from_millis(T0) + Duration::from_secs(60));
    let again = run(false).await;
    assert!(again.replayed, "the repeat replays: {:?}", again.result);
    assert_eq!(again.reference, first.reference);
    assert_eq!(charges.load(Ordering::SeqCst), 1, "no second charge");
    // The window still ends WINDOW after the claim, not later: the clock is back at T0 + 15 min.
    clock.set(Timestamp::from_millis(T0) + WINDOW);
    let later = run(false).await;
    assert!(!later.replayed, "the window ended");
    assert_eq!(charges.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_clock_stepped_back_does_not_shorten_the_window_memory() {
    step_back_while_running(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn a_clock_stepped_back_does_not_shorten_the_window_sqlite() {
    let path = std::env::temp_dir().join(format!("{}.db", unique_name("clocks")));
    let store = SqliteStore::open(&path).await.expect("open");
    step_back_while_running(Arc::new(store.clone())).await;
    store.pool().close().await;
    remove_sqlite_files(&path);
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn a_clock_stepped_back_does_not_shorten_the_window_postgres() {
    let Some(schema) = TestSchema::create("clocks").await else {
        return;
    };
    step_back_while_running(Arc::new(schema.store().await)).await;
    schema.drop_schema().await;
}
