//! A server restart does not forget: a call completed through the engine on a `SqliteStore`
//! file is replayed after the store and the engine are dropped and the file is reopened.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::SqliteStore;
use idempotency::store::Store;
use idempotency::{
    clock::{ManualClock, Timestamp},
    outcome::{ErrorPolicy, Outcome},
    tool::Prepared,
    Caller, Error, Idempotency,
};
use idempotency_tests::pg::unique_name;
use idempotency_tests::scripted::{Act, Op, Scripted};
use serde::{Deserialize, Serialize};

const WINDOW: Duration = Duration::from_secs(900);

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error(transparent)]
    Wrapper(#[from] Error),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    charge: usize,
    reference: String,
}

/// The far side: counts the charges it was asked for.
#[derive(Clone, Default)]
struct Processor(Arc<AtomicUsize>);

impl Processor {
    async fn charge(self) -> Result<Receipt, ChargeError> {
        let charge = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        let reference = idempotency::Call::current()
            .map(|c| c.reference().to_string())
            .unwrap_or_default();
        Ok(Receipt { charge, reference })
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

struct File(PathBuf);

impl Drop for File {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.0.clone().into_os_string();
            p.push(suffix);
            std::fs::remove_file(p).ok();
        }
    }
}

/// Starts a "server" on the file, makes the call once, and shuts the server down.
async fn serve_once(
    path: &Path,
    clock: &ManualClock,
    processor: &Processor,
) -> Outcome<Receipt, ChargeError> {
    let store = SqliteStore::open(path).await.expect("open the store");
    let engine = Idempotency::builder(store.clone())
        .clock(clock.clone())
        .build();
    let caller = Caller::new("acme", "alice");
    let args = serde_json::json!({"amount": 4200, "currency": "EUR"});
    let prepared = Prepared::call(&caller, &idempotency_tests::CHARGE_CARD, &args).expect("key");
    let out = engine
        .execute(
            prepared,
            ErrorPolicy::retryable(),
            processor.clone().charge(),
        )
        .await;
    drop(engine);
    store.pool().close().await;
    out
}

#[tokio::test]
async fn a_repeat_after_a_restart_replays() {
    let file = File(std::env::temp_dir().join(format!("{}.db", unique_name("restart"))));
    let clock = ManualClock::new(Timestamp::from_millis(1_796_000_000_000));
    let processor = Processor::default();

    let first = serve_once(&file.0, &clock, &processor).await;
    assert!(!first.replayed);
    let receipt = first.result.expect("the first call charges");
    assert_eq!(processor.count(), 1);

    clock.advance(Duration::from_secs(60));
    let again = serve_once(&file.0, &clock, &processor).await;
    assert!(
        again.replayed,
        "the restarted server replays the stored answer"
    );
    assert_eq!(again.result.expect("replay"), receipt);
    assert_eq!(again.reference, first.reference);
    assert_eq!(processor.count(), 1, "no second charge");

    // Past the window it is a new operation, with the next reference.
    clock.advance(WINDOW);
    let later = serve_once(&file.0, &clock, &processor).await;
    assert!(!later.replayed);
    assert_eq!(later.result.expect("a new charge").charge, 2);
    assert_ne!(later.reference, first.reference);
    assert_eq!(processor.count(), 2);
}

/// The runtime shuts down in the middle of a call (the body is running): whatever its drop guard
/// could do went down with the runtime. After a restart on the same file the record is not "in
/// progress" forever: once its lease has passed, the restarted engine's lease-expiry rounds make
/// it "outcome unknown", and a repeat is told so without running.
#[test]
fn a_call_cut_off_by_a_runtime_shutdown_is_not_in_flight_after_a_restart() {
    let file = File(std::env::temp_dir().join(format!("{}.db", unique_name("shutdown"))));
    let clock = ManualClock::new(Timestamp::from_millis(1_796_000_000_000));
    let processor = Processor::default();
    let lease = Duration::from_secs(30);
    let caller = Caller::new("acme", "alice");
    let prepared = Prepared::call(&caller, &idempotency_tests::CHARGE_CARD, &7u64).expect("key");
    let reference = prepared
        .key
        .key(&idempotency::key::Secret::demo())
        .reference(1);

    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    first.block_on(async {
        let store = SqliteStore::open(&file.0).await.expect("open");
        let engine = Idempotency::builder(store)
            .clock(clock.clone())
            .lease(lease)
            .build();
        let entered = Arc::new(tokio::sync::Notify::new());
        let (e, p) = (entered.clone(), processor.clone());
        tokio::spawn(async move {
            let _ = engine
                .execute(prepared, ErrorPolicy::retryable(), async move {
                    let charged = p.charge().await;
                    e.notify_one();
                    std::future::pending::<()>().await;
                    charged
                })
                .await;
        });
        entered.notified().await;
    });
    drop(first); // the server goes down mid-call
    assert_eq!(processor.count(), 1);

    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    second.block_on(async {
        clock.advance(lease + Duration::from_secs(1));
        let store = SqliteStore::open(&file.0).await.expect("reopen");
        // The second lease-expiry round parks, so the test knows the first one has finished.
        let scripted = Scripted::new(Arc::new(store.clone()));
        scripted.script(Op::Unsettled, [Act::Pass, Act::Park]);
        let shared: Arc<dyn Store> = scripted.clone();
        let engine = Idempotency::builder_shared(shared)
            .clock(clock.clone())
            .lease(lease)
            .reconcile_every(Duration::from_millis(10))
            .build();
        let repeat = |p: Processor| {
            let prepared =
                Prepared::call(&caller, &idempotency_tests::CHARGE_CARD, &7u64).expect("key");
            let engine = engine.clone();
            async move {
                engine
                    .execute(prepared, ErrorPolicy::retryable(), p.charge())
                    .await
            }
        };
        // The lease has passed with no word from the worker: never "in progress".
        let told = repeat(processor.clone()).await;
        assert!(
            matches!(
                told.result,
                Err(ChargeError::Wrapper(Error::OutcomeUnknown { .. }))
            ),
            "{:?}",
            told.result
        );
        // The restarted engine's first round (started by that call) settles the record itself
        // as unknown; the second round parks.
        assert_eq!(scripted.parked().await, Op::Unsettled);
        let state = engine
            .status(&caller, reference)
            .await
            .expect("status")
            .map(|s| s.state);
        assert_eq!(state, Some(idempotency::store::RecordState::Unknown));
        scripted.unpark();
        assert_eq!(processor.count(), 1, "nothing ran again");
        drop(engine);
        store.pool().close().await;
    });
}
