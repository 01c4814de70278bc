//! Replicas whose clocks disagree, on one PostgreSQL: the store decides every time by the
//! database server's clock, so a replica 16 minutes ahead or behind claims, replays, expires
//! leases and purges exactly as one whose clock is right. Each engine gets a `ManualClock` set
//! 16 minutes off the real time (what `faketime` would do to a replica's process); the store is
//! the one users get (`PostgresStore::from_pool`, server clock).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::clock::{Clock, ManualClock, SystemClock};
use idempotency::outcome::Outcome;
use idempotency::store::{
    BoxError, Claim, ClaimRequest, Fenced, Maintenance, PostgresStore, RecordState, RecordStore,
    Settlement, Store, Token, Unsettled,
};
use idempotency::tasks::{Purger, Reconciler};
use idempotency::{Caller, Error, Idempotency};
use idempotency_tests::charge::{counted_charge, Wrapper};
use idempotency_tests::pg::TestSchema;
use tokio::sync::Notify;

const WINDOW: Duration = Duration::from_secs(15 * 60);
const SKEW: Duration = Duration::from_secs(16 * 60);

/// A replica: an engine on the shared store whose clock is `ahead` (or behind) of the real time
/// by [`SKEW`].
fn replica(store: &PostgresStore, ahead: bool) -> Idempotency {
    let real = SystemClock.now();
    let skewed = if ahead { real + SKEW } else { real - SKEW };
    Idempotency::builder_shared(Arc::new(store.clone()) as Arc<dyn Store>)
        .clock(ManualClock::new(skewed))
        .without_reconciler()
        .build()
}

/// Charges `amount` through `engine`, counting the processor's charges.
async fn charge(
    engine: &Idempotency,
    charges: &Arc<AtomicUsize>,
    amount: u64,
) -> Outcome<u64, Wrapper> {
    counted_charge(engine, charges, amount, async {}).await
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn a_repeat_on_a_replica_with_another_clock_replays() {
    let Some(schema) = TestSchema::create("skew_replay").await else {
        return;
    };
    let store = schema.server_clock_store().await;
    let slow = replica(&store, false);
    let fast = replica(&store, true);
    let charges = Arc::new(AtomicUsize::new(0));

    // First on the slow replica, repeats on both; then the other way round.
    for (first, second, amount) in [(&slow, &fast, 100), (&fast, &slow, 200)] {
        let one = charge(first, &charges, amount).await;
        assert!(one.result.is_ok() && !one.replayed);
        for engine in [second, first, second] {
            let again = charge(engine, &charges, amount).await;
            assert!(
                again.replayed,
                "a repeat within the window replays: {:?}",
                again.result
            );
            assert_eq!(again.reference, one.reference);
        }
    }
    assert_eq!(
        charges.load(Ordering::SeqCst),
        2,
        "one charge per amount, 0 second runs"
    );
    schema.drop_schema().await;
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn a_live_lease_is_live_for_every_replica_and_its_reconciler() {
    let Some(schema) = TestSchema::create("skew_lease").await else {
        return;
    };
    let store = schema.server_clock_store().await;
    let slow = replica(&store, false);
    let fast = replica(&store, true);
    let charges = Arc::new(AtomicUsize::new(0));

    // The slow replica's call is running (its lease, 30 s by the server's clock, is live).
    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let mut running = {
        let (slow, started, finish, charges) = (
            slow.clone(),
            started.clone(),
            finish.clone(),
            charges.clone(),
        );
        tokio::spawn(async move {
            counted_charge(&slow, &charges, 300, async move {
                started.notify_one();
                finish.notified().await;
            })
            .await
        })
    };
    // The body signals that it runs; a call that ends before that (a store error) fails the test
    // here instead of leaving it waiting.
    tokio::select! {
        () = started.notified() => {}
        ended = &mut running => panic!(
            "the slow replica's call ended before its body ran: {:?}",
            ended.map(|out| out.result)
        ),
    }

    // The fast replica (16 minutes ahead, so past the lease by its own clock) neither runs it
    // again nor hands it to its reconciler.
    let repeat = charge(&fast, &charges, 300).await;
    assert!(
        matches!(repeat.result, Err(Wrapper(Error::InFlight { .. }))),
        "in flight: {:?}",
        repeat.result
    );
    let asked = Arc::new(AtomicUsize::new(0));
    let reconciler = {
        let asked = asked.clone();
        Reconciler::new(&fast, move |_: Unsettled| {
            let asked = asked.clone();
            async move {
                asked.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(Settlement::Unknown)
            }
        })
    };
    let report = reconciler.run_once().await.expect("round");
    assert_eq!(
        report.examined, 0,
        "a live lease is not reconciled: {report:?}"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 0);
    let unsettled = store
        .unsettled(fast.clock().now(), 10)
        .await
        .expect("unsettled");
    assert!(unsettled.is_empty());

    // When the server's clock passes the lease (as if the worker had died 31 s ago), every
    // replica's reconciler sees it, whatever its own clock says.
    let later = store.clone().with_server_clock_offset(31_000);
    for engine in [&slow, &fast] {
        let seen = later
            .unsettled(engine.clock().now(), 10)
            .await
            .expect("unsettled");
        assert_eq!(seen.len(), 1, "lease ended by the server's clock");
        assert_eq!(seen[0].state, RecordState::InFlight);
    }

    finish.notify_one();
    let done = running.await.expect("join");
    assert!(done.result.is_ok());
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    schema.drop_schema().await;
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn a_replica_ahead_does_not_purge_a_live_answer() {
    let Some(schema) = TestSchema::create("skew_purge").await else {
        return;
    };
    let store = schema.server_clock_store().await;
    let slow = replica(&store, false);
    let fast = replica(&store, true);
    let charges = Arc::new(AtomicUsize::new(0));
    let one = charge(&slow, &charges, 400).await;
    assert!(one.result.is_ok());

    // With no retention, a purger whose clock is 16 minutes ahead would find the 15-minute
    // window over by its own clock; by the server's it is not.
    let purged = Purger::new(&fast)
        .retention(Duration::ZERO)
        .run_once()
        .await
        .expect("purge");
    assert_eq!(purged, 0);
    let again = charge(&fast, &charges, 400).await;
    assert!(again.replayed);

    // Once the server's clock is past the window, it goes.
    let later = store
        .clone()
        .with_server_clock_offset(WINDOW.as_millis() as i64 + 1_000);
    let gone = later
        .purge(slow.clock().now(), slow.clock().now(), 10)
        .await
        .expect("purge");
    assert_eq!(gone, 1);
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    schema.drop_schema().await;
}

/// The database server's clock stepping back between claim and completion (or an engine whose
/// times say so) cannot count the window from before the claim.
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn the_server_clock_stepping_back_does_not_shorten_the_window() {
    let Some(schema) = TestSchema::create("skew_step").await else {
        return;
    };
    let store = schema.server_clock_store().await;
    let key = idempotency::key::Key::for_call(
        &idempotency::key::Secret::demo(),
        &Caller::new("acme", "alice"),
        "charge_card",
        &500u64,
    )
    .expect("key");
    let now = SystemClock.now();
    let claim = |store: PostgresStore, token| async move {
        let req = ClaimRequest {
            key,
            tenant: "acme",
            subject: Some("alice"),
            tool: "charge_card",
            fingerprint: None,
            now,
            lease: Duration::from_secs(30),
            window: WINDOW,
            token: Token(token),
        };
        store.claim(&req).await.expect("claim")
    };
    let Claim::New { token, .. } = claim(store.clone(), 1).await else {
        panic!("a fresh claim");
    };
    let answer = idempotency::store::StoredResponse {
        ok: true,
        body: "500".into(),
    };
    // Completed while the server's clock reads an hour earlier.
    let stepped = store.clone().with_server_clock_offset(-3_600_000);
    stepped
        .complete(&idempotency::store::Completion {
            key,
            token,
            response: &answer,
            now,
            outbox: &[],
        })
        .await
        .expect("complete");
    // A minute after the claim (the clock corrected), the answer is replayed...
    let minute = store.clone().with_server_clock_offset(60_000);
    assert!(matches!(claim(minute, 2).await, Claim::Completed { .. }));
    // ...until the window, counted from the claim, ends.
    let just_before = store
        .clone()
        .with_server_clock_offset(WINDOW.as_millis() as i64 - 1_000);
    assert!(matches!(
        claim(just_before, 3).await,
        Claim::Completed { .. }
    ));
    let after = store
        .clone()
        .with_server_clock_offset(WINDOW.as_millis() as i64 + 1_000);
    assert!(matches!(claim(after, 4).await, Claim::New { .. }));
    schema.drop_schema().await;
}

// ---------------------------------------------------------------------------------------------
// Every reader judges by the store's clock: a waiting repeat, the status tool, a repeat.
// ---------------------------------------------------------------------------------------------

mod readers {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use idempotency::clock::{Clock, ManualClock, SystemClock};
    use idempotency::outcome::{ErrorPolicy, Outcome};
    use idempotency::store::{Standing, Store};
    use idempotency::tool::{Prepared, ToolSpec};
    use idempotency::{Caller, Error, Idempotency, Reference};
    use idempotency_tests::charge::Wrapper;
    use idempotency_tests::pg::TestSchema;
    use idempotency_tests::scripted::{Op, Scripted};
    use tokio::sync::Notify;

    const WAIT: Duration = Duration::from_secs(2);
    const SPEC: ToolSpec =
        ToolSpec::new("charge_card", Duration::from_secs(15 * 60)).with_wait(WAIT);
    /// The skews tried: right, 16 minutes ahead, 31 s ahead (past the 30 s lease), 16 minutes
    /// behind.
    const SKEWS: [i64; 4] = [0, 16 * 60_000, 31_000, -16 * 60_000];

    fn engine(store: Arc<dyn Store>, skew_ms: i64) -> Idempotency {
        let real = SystemClock.now().as_millis();
        Idempotency::builder_shared(store)
            .clock(ManualClock::new(
                idempotency::clock::Timestamp::from_millis(real + skew_ms),
            ))
            .without_reconciler()
            .build()
    }

    async fn charge(
        engine: &Idempotency,
        charges: &Arc<AtomicUsize>,
        meanwhile: impl std::future::Future<Output = ()> + Send,
    ) -> Outcome<u64, Wrapper> {
        let prepared = Prepared::call(&Caller::new("acme", "alice"), &SPEC, &700u64).expect("key");
        let charges = charges.clone();
        engine
            .execute(prepared, ErrorPolicy::retryable(), async move {
                charges.fetch_add(1, Ordering::SeqCst);
                meanwhile.await;
                Ok(700)
            })
            .await
    }

    /// What the status tool says of `r` on `engine` (its reading: `RecordStatus::standing`).
    async fn standing(engine: &Idempotency, r: Reference) -> Standing {
        engine
            .status(&Caller::new("acme", "alice"), r)
            .await
            .expect("status")
            .expect("the record")
            .standing(r, engine.clock().now())
    }

    /// A call in flight on a right-clock replica; a repeat on a replica of each skew waits for it
    /// (`wait = 2s`) and is answered "in progress" at the end. The store calls each waiter makes
    /// (claims, status reads, watches) are counted: a skewed replica makes no more than twice a
    /// right one's. Meanwhile its status tool says in flight, as the repeat does.
    async fn waiters_read_the_store_alike(store: Arc<dyn Store>) {
        let runner = engine(store.clone(), 0);
        let charges = Arc::new(AtomicUsize::new(0));
        let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let running = {
            let (runner, charges, started, finish) = (
                runner.clone(),
                charges.clone(),
                started.clone(),
                finish.clone(),
            );
            tokio::spawn(async move {
                charge(&runner, &charges, async move {
                    started.notify_one();
                    finish.notified().await;
                })
                .await
            })
        };
        started.notified().await;
        let mut counts = Vec::new();
        for skew in SKEWS {
            let counted = Scripted::new(store.clone());
            let shared: Arc<dyn Store> = counted.clone();
            let replica = engine(shared, skew);
            let out = charge(&replica, &charges, async {}).await;
            let reference = match out.result {
                Err(Wrapper(Error::InFlight { reference, .. })) => reference,
                other => panic!("skew {skew} ms: in progress expected, got {other:?}"),
            };
            assert_eq!(
                standing(&replica, reference).await,
                Standing::InFlight,
                "skew {skew} ms: the status tool agrees with the repeat"
            );
            let calls = [Op::Claim, Op::Status, Op::Watch]
                .map(|op| counted.calls(op))
                .iter()
                .sum::<usize>()
                - 1; // the status read just above
            counts.push((skew, calls));
        }
        println!("store calls of one waiter over {WAIT:?}, by skew (ms): {counts:?}");
        let right = counts[0].1.max(3);
        for (skew, calls) in &counts {
            assert!(
                *calls <= 2 * right,
                "skew {skew} ms: {calls} store calls against {right} on a right clock"
            );
        }
        finish.notify_one();
        assert!(running.await.expect("join").result.is_ok());
        assert_eq!(charges.load(Ordering::SeqCst), 1);

        // Completed, inside its window: replayed, and read as completed, by every replica.
        for skew in SKEWS {
            let replica = engine(store.clone(), skew);
            let out = charge(&replica, &charges, async {}).await;
            assert!(out.replayed, "skew {skew} ms: {:?}", out.result);
            let r = out.reference.expect("a reference");
            assert_eq!(
                standing(&replica, r).await,
                Standing::Completed,
                "skew {skew} ms: not expired while the repeat replays"
            );
        }
        assert_eq!(charges.load(Ordering::SeqCst), 1);
    }

    #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_and_the_status_tool_judge_by_the_servers_clock_postgres() {
        let Some(schema) = TestSchema::create("skew_wait").await else {
            return;
        };
        waiters_read_the_store_alike(Arc::new(schema.server_clock_store().await)).await;
        schema.drop_schema().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_and_the_status_tool_judge_by_the_servers_clock_redis() {
        let store = idempotency::store::RedisStore::builder()
            .namespace(idempotency_tests::pg::unique_name("skew_wait"))
            .connect(&idempotency_tests::redis_servers::shared_server().url())
            .await
            .expect("redis store");
        waiters_read_the_store_alike(Arc::new(store)).await;
    }
}
