//! The `Purger` end to end on a MemoryStore: a pass deletes everything past retention in
//! batches, leaves in-flight, unknown and still-retained records alone, and a failed pass is
//! retried at the next tick. The store is wrapped to count (and once, fail) its purge calls.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::clock::{ManualClock, Timestamp};
use idempotency::key::Key;
use idempotency::store::{
    BoxFuture, Claim, ClaimRequest, Completion, Maintenance, MemoryStore, OutboxEntry, OutboxStore,
    Receipt, RecordStatus, RecordStore, Settlement, Store, StoreError, StoredResponse, Token,
    Unsettled, DEFAULT_RETENTION,
};
use idempotency::tasks::Purger;
use idempotency::{Caller, Idempotency, Reference};

const T0: i64 = 1_796_000_000_000;
const WINDOW: Duration = Duration::from_secs(900);
const EVERY: Duration = Duration::from_secs(300);

/// A MemoryStore whose `purge` calls are counted, the first `fail_first` of them failing.
struct Counting {
    inner: MemoryStore,
    purges: AtomicU32,
    fail_first: u32,
}

impl RecordStore for Counting {
    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        self.inner.claim(req)
    }
    fn complete<'a>(&'a self, c: &'a Completion<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.complete(c)
    }
    fn release(
        &self,
        key: Key,
        token: Token,
        at: Timestamp,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.release(key, token, at)
    }
    fn mark_unknown(&self, key: Key, token: Token) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.mark_unknown(key, token)
    }
    fn renew(
        &self,
        key: Key,
        token: Token,
        until: Timestamp,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.renew(key, token, until)
    }
    fn settle<'a>(
        &'a self,
        key: Key,
        token: Token,
        settlement: &'a Settlement,
        at: Timestamp,
        expires_at: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.settle(key, token, settlement, at, expires_at)
    }
    fn status<'a>(
        &'a self,
        tenant: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>> {
        self.inner.status(tenant, reference)
    }
}

impl Maintenance for Counting {
    fn purge(&self, older_than: Timestamp, limit: u32) -> BoxFuture<'_, Result<u64, StoreError>> {
        let n = self.purges.fetch_add(1, Ordering::SeqCst);
        if n < self.fail_first {
            return Box::pin(async {
                Err(StoreError::Unavailable("the database is restarting".into()))
            });
        }
        self.inner.purge(older_than, limit)
    }
    fn unsettled(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Unsettled>, StoreError>> {
        self.inner.unsettled(now, limit)
    }
}

impl OutboxStore for Counting {
    fn fetch(
        &self,
        now: Timestamp,
        invisible_until: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<OutboxEntry>, StoreError>> {
        self.inner.fetch(now, invisible_until, limit)
    }
    fn ack<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.ack(receipt)
    }
}

fn key(n: u32) -> Key {
    Key::for_call(&Caller::new("acme", "purger"), "charge_card", &n).expect("key")
}

async fn claim(store: &Counting, k: Key, now: i64) -> Token {
    let req = ClaimRequest {
        key: k,
        tenant: "acme",
        tool: "charge_card",
        fingerprint: None,
        now: Timestamp::from_millis(now),
        lease_expires_at: Timestamp::from_millis(now + 30_000),
    };
    match store.claim(&req).await.expect("claim") {
        Claim::New { token, .. } => token,
        other => panic!("expected a new claim, got {other:?}"),
    }
}

async fn complete(store: &Counting, k: Key, token: Token, now: i64) {
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
            expires_at: Timestamp::from_millis(now + WINDOW.as_millis() as i64),
            outbox: &[],
        })
        .await
        .expect("complete");
}

async fn present(store: &Counting, k: Key) -> bool {
    store
        .status("acme", k.reference(1))
        .await
        .expect("status")
        .is_some()
}

#[tokio::test(start_paused = true)]
async fn the_purger_deletes_in_batches_keeps_what_it_must_and_retries_after_a_failure() {
    const OLD: u32 = 2_500;
    let store = Arc::new(Counting {
        inner: MemoryStore::new(),
        purges: AtomicU32::new(0),
        fail_first: 1,
    });
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
    assert_eq!(
        store.purges.load(Ordering::SeqCst),
        1,
        "one failed attempt, then wait"
    );
    assert!(
        present(&store, key(0)).await,
        "nothing deleted by the failed pass"
    );

    // The next tick: three batches (1,000 + 1,000 + 500).
    tokio::time::sleep(EVERY).await;
    assert_eq!(store.purges.load(Ordering::SeqCst), 1 + 3);
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
    assert_eq!(store.purges.load(Ordering::SeqCst), 1 + 3 + 1);
    assert!(present(&store, recent).await);
    purger.abort();
}
