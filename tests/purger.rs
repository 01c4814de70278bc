//! The `Purger` end to end on a MemoryStore: a pass deletes everything past retention in
//! batches, leaves in-flight, unknown and still-retained records alone, and a failed pass is
//! retried at the next tick. The store is wrapped to count (and once, fail) its purge calls.

use std::sync::Arc;
use std::time::Duration;

use idempotency::clock::{ManualClock, Timestamp};
use idempotency::key::Key;
use idempotency::store::{
    Claim, ClaimRequest, Completion, Fenced, MemoryStore, RecordStore, Store, StoredResponse,
    Token, DEFAULT_RETENTION,
};
use idempotency::tasks::Purger;
use idempotency::{Caller, Idempotency};
use idempotency_tests::scripted::{Act, Op, Scripted};

const T0: i64 = 1_796_000_000_000;
const WINDOW: Duration = Duration::from_secs(900);
const EVERY: Duration = Duration::from_secs(300);

fn key(n: u32) -> Key {
    Key::for_call(
        &idempotency::key::Secret::demo(),
        &Caller::new("acme", "purger"),
        "charge_card",
        &n,
    )
    .expect("key")
}

async fn claim(store: &Scripted, k: Key, now: i64) -> Token {
    let req = ClaimRequest {
        key: k,
        tenant: "acme",
        subject: None,
        tool: "charge_card",
        fingerprint: None,
        now: Timestamp::from_millis(now),
        lease: std::time::Duration::from_secs(30),
        window: WINDOW,
        token: Token(now),
    };
    match store.claim(&req).await.expect("claim") {
        Claim::New { token, .. } => token,
        other => panic!("expected a new claim, got {other:?}"),
    }
}

async fn complete(store: &Scripted, k: Key, token: Token, now: i64) {
    let response = StoredResponse {
        ok: true,
        body: r#"{"charge_id":"ch_1"}"#.to_owned(),
    };
    store
        .complete(&Completion {
            key: k,
            token,
            response: &response,
            now: Timestamp::from_millis(now),
            outbox: &[],
        })
        .await
        .expect("complete");
}

async fn present(store: &Scripted, k: Key) -> bool {
    store
        .status("acme", "alice", k.reference(1))
        .await
        .expect("status")
        .is_some()
}

#[tokio::test(start_paused = true)]
async fn the_purger_deletes_in_batches_keeps_what_it_must_and_retries_after_a_failure() {
    const OLD: u32 = 2_500;
    // The store's first purge fails ("the database is restarting").
    let store = Scripted::new(Arc::new(MemoryStore::new()));
    store.script(Op::Purge, [Act::Fail]);
    for n in 0..OLD {
        let t = claim(&store, key(n), T0).await;
        complete(&store, key(n), t, T0).await;
    }
    // Never purged: an in-flight claim, an unknown outcome (both as old as the rest), and an
    // answer completed an hour later, still inside its retention when the purger runs.
    let in_flight = key(OLD);
    claim(&store, in_flight, T0).await;
    let unknown = key(OLD + 1);
    let t = claim(&store, unknown, T0).await;
    store.mark_unknown(unknown, t).await.expect("mark unknown");
    let recent = key(OLD + 2);
    let t = claim(&store, recent, T0 + 3_600_000).await;
    complete(&store, recent, t, T0 + 3_600_000).await;

    // Now: 30 minutes past the old answers' retention (their window ended at T0 + 15 min).
    let now = T0 + WINDOW.as_millis() as i64 + DEFAULT_RETENTION.as_millis() as i64 + 1_800_000;
    let clock = ManualClock::new(Timestamp::from_millis(now));
    let dyn_store: Arc<dyn Store> = store.clone();
    let engine = Idempotency::builder_shared(dyn_store).clock(clock).build();
    let purger = Purger::new(&engine)
        .every(EVERY)
        .retention(DEFAULT_RETENTION)
        .spawn();

    // The first pass fails at once (the store is "restarting"): nothing is deleted, and the
    // purger does not spin on the error.
    tokio::time::sleep(EVERY / 2).await;
    assert_eq!(store.calls(Op::Purge), 1, "one failed attempt, then wait");
    assert!(
        present(&store, key(0)).await,
        "nothing deleted by the failed pass"
    );

    // The next tick: three batches (1,000 + 1,000 + 500).
    tokio::time::sleep(EVERY).await;
    assert_eq!(store.calls(Op::Purge), 1 + 3);
    for n in [0, 999, 1_000, OLD - 1] {
        assert!(!present(&store, key(n)).await, "record {n} was purged");
    }
    assert!(
        present(&store, in_flight).await,
        "in flight is never purged"
    );
    assert!(present(&store, unknown).await, "unknown is never purged");
    assert!(present(&store, recent).await, "still inside its retention");

    // A later tick finds nothing more to delete: one call.
    tokio::time::sleep(EVERY).await;
    assert_eq!(store.calls(Op::Purge), 1 + 3 + 1);
    assert!(present(&store, recent).await);
    purger.abort();
}
