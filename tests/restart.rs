//! A server restart does not forget: a call completed through the engine on a `SqliteStore`
//! file is replayed after the store and the engine are dropped and the file is reopened.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::SqliteStore;
use idempotency::{
    clock::{ManualClock, Timestamp},
    outcome::{ErrorPolicy, Outcome},
    tool::{Prepared, ToolSpec},
    Caller, Error, Idempotency,
};
use idempotency_tests::pg::unique_name;
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
    let spec = ToolSpec::new("charge_card", WINDOW);
    let caller = Caller::new("acme", "alice");
    let args = serde_json::json!({"amount": 4200, "currency": "EUR"});
    let prepared = Prepared::call(&caller, "charge_card", &args).expect("key");
    let out = engine
        .execute(
            &spec,
            &caller,
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
