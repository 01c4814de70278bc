//! Every call ends in a truthful, terminal state: dropped at any await point of the engine, a
//! store that hangs or fails after the body, a panicking body, a renewal that finds its record
//! settled elsewhere, a failed release, a worker that could not record. Paused time and a
//! scripted store wrapper; no sleeps stand in for synchronisation.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::clock::{Clock, ManualClock, Timestamp};
use idempotency::error::UnknownReason;
use idempotency::outcome::{ErrorPolicy, Failure, Outcome};
use idempotency::store::{Fenced, MemoryStore, RecordState, Settlement, Store};
use idempotency::store::{StoredResponse, Unsettled};
use idempotency::tool::{Prepared, ToolSpec};
use idempotency::{Caller, Error, Idempotency, IdempotencyBuilder, Reference};
use idempotency_tests::charge::ChargeError;
use idempotency_tests::scripted::{Act, Op, Scripted};

const T0: i64 = 1_796_000_000_000;
const WINDOW: Duration = Duration::from_secs(900);
const LEASE: Duration = Duration::from_secs(30);

struct World {
    engine: Idempotency,
    store: Arc<Scripted>,
    clock: ManualClock,
    charges: Arc<AtomicUsize>,
    caller: Caller,
}

/// An engine whose lease expiry is driven by the test (no background rounds).
fn world() -> World {
    world_with(|b| b.without_reconciler())
}

fn world_with(configure: impl FnOnce(IdempotencyBuilder) -> IdempotencyBuilder) -> World {
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let inner: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let store = Scripted::new(inner);
    let shared: Arc<dyn Store> = store.clone();
    let engine = configure(
        Idempotency::builder_shared(shared)
            .clock(clock.clone())
            .lease(LEASE),
    )
    .build();
    World {
        engine,
        store,
        clock,
        charges: Arc::default(),
        caller: Caller::new("acme", "alice"),
    }
}

fn prepared(w: &World, spec: &ToolSpec, amount: u64) -> Prepared {
    Prepared::call(&w.caller, spec, &amount).expect("key")
}

fn reference(w: &World, amount: u64) -> Reference {
    prepared(w, &spec(), amount)
        .key
        .key(&idempotency::key::Secret::demo())
        .reference(1)
}

/// A charge: counts at the far side, then returns `Ok`, or `Err(Down)` when `fail`.
async fn charge(
    w: &World,
    spec: ToolSpec,
    amount: u64,
    fail: bool,
) -> Outcome<u64, Failure<ChargeError>> {
    let charges = w.charges.clone();
    w.engine
        .execute_raw(
            prepared(w, &spec, amount),
            ErrorPolicy::<ChargeError>::retryable(),
            async move {
                if fail {
                    return Err(ChargeError::Down);
                }
                charges.fetch_add(1, Ordering::SeqCst);
                Ok(amount)
            },
        )
        .await
}

fn spec() -> ToolSpec {
    ToolSpec::new("charge_card", WINDOW)
}

async fn state(w: &World, r: Reference) -> Option<RecordState> {
    w.engine
        .status(&w.caller, r)
        .await
        .expect("status")
        .map(|s| s.state)
}

/// Waits (a bounded number of scheduler turns, no time passing) until the record of `r` is no
/// longer in flight: the drop guard settles it from a spawned task.
async fn settled(w: &World, r: Reference) -> Option<RecordState> {
    for _ in 0..1_000 {
        let s = state(w, r).await;
        if s != Some(RecordState::InFlight) {
            return s;
        }
        tokio::task::yield_now().await;
    }
    state(w, r).await
}

/// Drives `call` until the store parks a method, checks it is `expected`, and drops the call
/// there.
async fn drop_at<F: std::future::Future>(w: &World, expected: Op, call: F) {
    let call = std::pin::pin!(call);
    tokio::select! {
        _ = call => panic!("the call finished before parking at {expected:?}"),
        op = w.store.parked() => assert_eq!(op, expected),
    }
}

#[tokio::test(start_paused = true)]
async fn dropped_in_the_body_the_record_ends_unknown() {
    let w = world();
    let r = reference(&w, 1);
    let gate = Arc::new(tokio::sync::Notify::new());
    let entered = Arc::new(tokio::sync::Notify::new());
    let (g, e) = (gate.clone(), entered.clone());
    let spec = spec();
    {
        let call = w.engine.execute_raw(
            prepared(&w, &spec, 1),
            ErrorPolicy::<ChargeError>::retryable(),
            async move {
                e.notify_one();
                g.notified().await;
                Ok::<u64, ChargeError>(1)
            },
        );
        let call = std::pin::pin!(call);
        tokio::select! {
            _ = call => panic!("the body is held"),
            () = entered.notified() => {}
        }
    }
    assert_eq!(settled(&w, r).await, Some(RecordState::Unknown));
}

/// Dropped while its completion was in progress: the answer is known, so the guard completes
/// the record in the background; a repeat replays it and nothing runs twice.
#[tokio::test(start_paused = true)]
async fn dropped_while_completing_the_record_ends_completed_not_in_flight() {
    let w = world();
    let r = reference(&w, 2);
    w.store.script(Op::Complete, [Act::Park]);
    drop_at(&w, Op::Complete, charge(&w, spec(), 2, false)).await;
    assert_eq!(w.charges.load(Ordering::SeqCst), 1);
    assert_eq!(settled(&w, r).await, Some(RecordState::Completed));
    let again = charge(&w, spec(), 2, false).await;
    assert!(again.replayed, "{:?}", again.result);
    assert_eq!(again.result.ok(), Some(2));
    assert_eq!(w.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn dropped_while_marking_unknown_the_record_ends_unknown() {
    let w = world();
    let r = reference(&w, 3);
    w.store.script(Op::MarkUnknown, [Act::Park]);
    let with_timeout = spec().with_timeout(Duration::from_secs(2));
    let charges = w.charges.clone();
    let call = w.engine.execute_raw(
        prepared(&w, &with_timeout, 3),
        ErrorPolicy::<ChargeError>::retryable(),
        async move {
            charges.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Result<u64, ChargeError>>().await
        },
    );
    drop_at(&w, Op::MarkUnknown, call).await;
    assert_eq!(settled(&w, r).await, Some(RecordState::Unknown));
}

/// Dropped while releasing after a retryable error: nothing was done, so the guard releases the
/// claim and a repeat runs.
#[tokio::test(start_paused = true)]
async fn dropped_while_releasing_the_record_ends_released() {
    let w = world();
    let r = reference(&w, 4);
    w.store.script(Op::Release, [Act::Park]);
    drop_at(&w, Op::Release, charge(&w, spec(), 4, true)).await;
    assert_eq!(settled(&w, r).await, Some(RecordState::Released));
    assert_eq!(charge(&w, spec(), 4, false).await.result.ok(), Some(4));
    assert_eq!(w.charges.load(Ordering::SeqCst), 1);
}

/// The store freezes after the claim: the caller still hears "outcome unknown, ref X" within
/// the timeout plus one second, and the body is not held up by a hung lease renewal (but it is
/// stopped once its lease has passed unrenewed).
#[tokio::test(start_paused = true)]
async fn a_timeout_holds_when_the_store_hangs() {
    let w = world();
    for op in [Op::Renew, Op::MarkUnknown, Op::Complete, Op::Release] {
        w.store.script(op, [Act::Hang; 8]);
    }
    let timeout = Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    // A body that outlives the timeout: the deadline, not the store, ends the call.
    let short = spec().with_timeout(timeout);
    let slow = w.engine.execute_raw(
        prepared(&w, &short, 5),
        ErrorPolicy::<ChargeError>::retryable(),
        std::future::pending::<Result<u64, ChargeError>>(),
    );
    let out = slow.await;
    assert!(started.elapsed() <= timeout + Duration::from_secs(1));
    assert!(
        matches!(
            out.result,
            Err(Failure::Wrapper(Error::OutcomeUnknown {
                reason: UnknownReason::TimedOut(_),
                ..
            }))
        ),
        "{:?}",
        out.result
    );
    assert_eq!(out.reference, Some(reference(&w, 5)));
    // A body that finishes at once, then a completion that never answers.
    let started = tokio::time::Instant::now();
    let out = charge(&w, spec().with_timeout(timeout), 6, false).await;
    assert!(started.elapsed() <= timeout + Duration::from_secs(1));
    match out.result {
        Err(Failure::Wrapper(e @ Error::OutcomeUnknown { .. })) => {
            assert!(matches!(
                &e,
                Error::OutcomeUnknown {
                    reason: UnknownReason::NotRecorded,
                    source: Some(_),
                    ..
                }
            ));
            assert!(e.advice().contains(&reference(&w, 6).to_string()));
        }
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
    // Every renewal hangs (renewals run beside the body, never holding it up): a long body is
    // stopped once the worker's own lease (30 s less a tenth) passes, long before its 120 s,
    // and its caller hears "outcome unknown" within the store's grace even as the store hangs.
    let started = tokio::time::Instant::now();
    let generous = spec().with_timeout(Duration::from_secs(600));
    let charges = w.charges.clone();
    let before = w.charges.load(Ordering::SeqCst);
    let long = w.engine.execute_raw(
        prepared(&w, &generous, 7),
        ErrorPolicy::<ChargeError>::retryable(),
        async move {
            tokio::time::sleep(Duration::from_secs(120)).await;
            charges.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, ChargeError>(7)
        },
    );
    let out = long.await;
    let stopped = started.elapsed();
    assert!(
        stopped >= LEASE - LEASE / 10 && stopped <= LEASE - LEASE / 10 + Duration::from_secs(1),
        "stopped after {stopped:?}"
    );
    assert!(
        matches!(
            out.result,
            Err(Failure::Wrapper(Error::OutcomeUnknown {
                reason: UnknownReason::LeaseExpired,
                ..
            }))
        ),
        "{:?}",
        out.result
    );
    assert_eq!(
        w.charges.load(Ordering::SeqCst),
        before,
        "the body never acted"
    );
    assert!(
        w.store.calls(Op::Renew) >= 2,
        "renewals were attempted beside the body"
    );
}

/// A store that does not answer the claim cannot hold a caller with a timeout: "not done"
/// within the timeout (nothing ran), and a repeat is not blocked by a claim that was never made.
#[tokio::test(start_paused = true)]
async fn a_timeout_holds_when_the_claim_hangs() {
    let w = world();
    w.store.script(Op::Claim, [Act::Hang]);
    let timeout = Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let out = charge(&w, spec().with_timeout(timeout), 15, false).await;
    assert!(started.elapsed() <= timeout);
    match out.result {
        Err(Failure::Wrapper(e @ Error::Store { .. })) => assert!(e.nothing_done()),
        other => panic!("expected not done, got {other:?}"),
    }
    assert_eq!(w.charges.load(Ordering::SeqCst), 0);
    assert_eq!(charge(&w, spec(), 15, false).await.result.ok(), Some(15));
    assert_eq!(w.charges.load(Ordering::SeqCst), 1);
}

/// A renewal that finds the record settled elsewhere stops the renewals and the attempt tells
/// the truth: its result was not recorded; the settlement stands.
#[tokio::test(start_paused = true)]
async fn a_lost_lease_is_acted_on() {
    let w = world();
    let r = reference(&w, 8);
    let store: Arc<dyn Store> = w.store.clone();
    let (clock, charges) = (w.clock.clone(), w.charges.clone());
    let body = async move {
        // Meanwhile the lease "passed" and a reconciler settled the claim as released.
        clock.advance(LEASE + Duration::from_secs(1));
        let unsettled = store.unsettled(clock.now(), 10).await.expect("unsettled");
        let claim = &unsettled[0];
        store
            .settle(claim.key, claim.token, &Settlement::Released, clock.now())
            .await
            .expect("settled");
        tokio::time::sleep(LEASE).await; // the next renewals run, and are refused
        charges.fetch_add(1, Ordering::SeqCst);
        Ok::<u64, ChargeError>(8)
    };
    let out = w
        .engine
        .execute_raw(
            prepared(&w, &spec(), 8),
            ErrorPolicy::<ChargeError>::retryable(),
            body,
        )
        .await;
    assert!(
        matches!(
            out.result,
            Err(Failure::Wrapper(Error::OutcomeUnknown {
                reason: UnknownReason::LeaseLost,
                ..
            }))
        ),
        "{:?}",
        out.result
    );
    assert_eq!(w.store.calls(Op::Renew), 1, "renewals stop once refused");
    assert_eq!(
        w.charges.load(Ordering::SeqCst),
        0,
        "the body is stopped at the refusal, before it acts"
    );
    assert_eq!(
        w.store.calls(Op::Complete),
        0,
        "nothing is recorded over the settlement"
    );
    assert_eq!(state(&w, r).await, Some(RecordState::Released));
}

#[tokio::test(start_paused = true)]
async fn a_failed_release_is_retried_once_then_said() {
    let w = world();
    // One failure: retried, released, the handler's own error.
    w.store.script(Op::Release, [Act::Fail]);
    let out = charge(&w, spec(), 9, true).await;
    assert!(matches!(
        out.result,
        Err(Failure::Handler(ChargeError::Down))
    ));
    assert_eq!(w.store.calls(Op::Release), 2);
    assert_eq!(
        state(&w, reference(&w, 9)).await,
        Some(RecordState::Released)
    );
    // Two failures: the wrapper says the claim could not be released, with the store's error.
    w.store.script(Op::Release, [Act::Fail, Act::Fail]);
    let out = charge(&w, spec(), 10, true).await;
    match out.result {
        Err(Failure::Wrapper(e @ Error::NotReleased { .. })) => {
            let advice = e.advice();
            assert!(advice.contains("processor unreachable"), "{advice}");
            assert!(
                advice.contains("in progress until its lease passes"),
                "{advice}"
            );
            assert!(std::error::Error::source(&e).is_some());
            assert!(e.nothing_done());
        }
        other => panic!("expected NotReleased, got {other:?}"),
    }
    assert_eq!(w.store.calls(Op::Release), 4);
}

/// Complete and mark-unknown both fail: within the lease a repeat hears "in flight"; once the
/// lease has passed, "outcome unknown" (nobody is working on it), never "in progress".
#[tokio::test(start_paused = true)]
async fn a_worker_that_could_not_record_is_not_in_progress_forever() {
    let w = world();
    w.store.script(Op::Complete, [Act::Fail]);
    w.store.script(Op::MarkUnknown, [Act::Fail]);
    let out = charge(&w, spec(), 11, false).await;
    assert!(matches!(
        out.result,
        Err(Failure::Wrapper(Error::OutcomeUnknown {
            reason: UnknownReason::NotRecorded,
            ..
        }))
    ));
    let again = charge(&w, spec(), 11, false).await;
    assert!(matches!(
        again.result,
        Err(Failure::Wrapper(Error::InFlight { .. }))
    ));
    w.clock.advance(LEASE);
    let later = charge(&w, spec(), 11, false).await;
    assert!(
        matches!(
            later.result,
            Err(Failure::Wrapper(Error::OutcomeUnknown {
                reason: UnknownReason::Unreported { .. },
                ..
            }))
        ),
        "{:?}",
        later.result
    );
    assert_eq!(w.charges.load(Ordering::SeqCst), 1);
}

/// A call whose worker could not record leaves its claim in flight; once the lease has passed,
/// the engine's own lease-expiry rounds (on by default) make it "outcome unknown", and the
/// status says so instead of "in progress" forever.
#[tokio::test(start_paused = true)]
async fn by_default_an_expired_claim_becomes_unknown() {
    let w = world_with(|b| b.reconcile_every(Duration::from_secs(10)));
    let r = reference(&w, 12);
    w.store.script(Op::Complete, [Act::Fail]);
    w.store.script(Op::MarkUnknown, [Act::Fail]);
    let out = charge(&w, spec(), 12, false).await;
    assert!(out.result.is_err());
    assert_eq!(state(&w, r).await, Some(RecordState::InFlight));
    // A round before the lease passes leaves it alone.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(state(&w, r).await, Some(RecordState::InFlight));
    w.clock.advance(LEASE);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(settled(&w, r).await, Some(RecordState::Unknown));
    let again = charge(&w, spec(), 12, false).await;
    assert!(
        matches!(
            again.result,
            Err(Failure::Wrapper(Error::OutcomeUnknown {
                reason: UnknownReason::Earlier,
                ..
            }))
        ),
        "{:?}",
        again.result
    );
    assert_eq!(w.charges.load(Ordering::SeqCst), 1);
}

/// With a `Reconcile` of the server's, the expired claim is settled from the processor's own
/// record: a repeat gets that answer and nothing runs twice.
#[tokio::test(start_paused = true)]
async fn with_a_reconcile_function_the_processor_settles_it() {
    let asked = Arc::new(AtomicUsize::new(0));
    let seen = asked.clone();
    let w = world_with(move |b| {
        b.reconcile(move |claim: Unsettled| {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                assert_eq!(claim.state, RecordState::InFlight);
                // The processor's record of this reference: it charged 13.
                Ok(Settlement::Completed(StoredResponse {
                    ok: true,
                    body: "13".into(),
                }))
            }
        })
        .reconcile_every(Duration::from_secs(10))
    });
    let r = reference(&w, 13);
    w.store.script(Op::Complete, [Act::Fail]);
    w.store.script(Op::MarkUnknown, [Act::Fail]);
    assert!(charge(&w, spec(), 13, false).await.result.is_err());
    w.clock.advance(LEASE);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(settled(&w, r).await, Some(RecordState::Completed));
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    let again = charge(&w, spec(), 13, false).await;
    assert!(again.replayed);
    assert_eq!(again.result.ok(), Some(13));
    assert_eq!(w.charges.load(Ordering::SeqCst), 1);
}

/// The rounds stop with the engine: no background work outlives the last clone.
#[tokio::test(start_paused = true)]
async fn the_rounds_stop_with_the_engine() {
    let w = world_with(|b| b.reconcile_every(Duration::from_secs(10)));
    assert!(charge(&w, spec(), 14, false).await.result.is_ok());
    tokio::time::sleep(Duration::from_secs(25)).await;
    let rounds = w.store.calls(Op::Unsettled);
    assert!(
        rounds >= 3,
        "{rounds} rounds in 25 s at one every 10 s (the first at once)"
    );
    let store = w.store.clone();
    drop(w);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        store.calls(Op::Unsettled) <= rounds + 1,
        "at most the round already due"
    );
}

/// The next parked or reported store call; a guard of 60 s turns a missing one into a failure.
async fn reported(w: &World) -> Op {
    tokio::time::timeout(Duration::from_secs(60), w.store.parked())
        .await
        .expect("the store call came")
}

/// The store commits the claim but its reply is lost (an error after the commit): nothing ran, so
/// the caller hears "not done" and the claim it may hold is released in the background, fenced by
/// its own token; a repeat then runs once — never "in progress" forever.
async fn claim_reply_lost(store: Arc<dyn Store>) {
    let scripted = Scripted::new(store);
    let shared: Arc<dyn Store> = scripted.clone();
    let w = World {
        engine: Idempotency::builder_shared(shared)
            .clock(ManualClock::new(Timestamp::from_millis(T0)))
            .lease(LEASE)
            .without_reconciler()
            .build(),
        store: scripted,
        clock: ManualClock::new(Timestamp::from_millis(T0)),
        charges: Arc::default(),
        caller: Caller::new("acme", "alice"),
    };
    let r = reference(&w, 20);
    w.store.script(Op::Claim, [Act::CommitThenFail]);
    w.store.script(Op::Release, [Act::Report]);
    let out = charge(&w, spec(), 20, false).await;
    match out.result {
        Err(Failure::Wrapper(e @ Error::Store { .. })) => assert!(e.nothing_done()),
        other => panic!("expected not done, got {other:?}"),
    }
    assert_eq!(w.charges.load(Ordering::SeqCst), 0);
    assert_eq!(
        w.store.parked().await,
        Op::Release,
        "the lost claim is released"
    );
    assert_eq!(state(&w, r).await, Some(RecordState::Released));
    assert_eq!(charge(&w, spec(), 20, false).await.result.ok(), Some(20));
    assert_eq!(w.charges.load(Ordering::SeqCst), 1);

    // Dropped while the claim's reply is held (the claim is made): the reply, when it comes,
    // is heard in the background, and the claim released.
    let r = reference(&w, 21);
    w.store.script(Op::Claim, [Act::CommitThenPark]);
    w.store.script(Op::Release, [Act::Report]);
    drop_at(&w, Op::Claim, charge(&w, spec(), 21, false)).await;
    w.store.unpark();
    assert_eq!(reported(&w).await, Op::Release);
    assert_eq!(state(&w, r).await, Some(RecordState::Released));
    assert_eq!(charge(&w, spec(), 21, false).await.result.ok(), Some(21));
    assert_eq!(w.charges.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_lost_claim_reply_is_released_memory() {
    claim_reply_lost(Arc::new(MemoryStore::new())).await;
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn a_lost_claim_reply_is_released_postgres() {
    let Some(schema) = idempotency_tests::pg::TestSchema::create("lost_claim").await else {
        return;
    };
    let store = schema.store().await;
    claim_reply_lost(Arc::new(store.clone())).await;
    store.pool().close().await;
    schema.drop_schema().await;
}

#[tokio::test]
async fn a_lost_claim_reply_is_released_sqlite() {
    let path = std::env::temp_dir().join(format!(
        "{}.db",
        idempotency_tests::pg::unique_name("lost-claim")
    ));
    let store = idempotency::store::SqliteStore::open(&path)
        .await
        .expect("open");
    claim_reply_lost(Arc::new(store.clone())).await;
    store.pool().close().await;
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        std::fs::remove_file(p).ok();
    }
}

/// A claim whose caller stopped waiting lands long after (a database finishes a statement its
/// client stopped waiting for; SQLite's busy wait or a loaded server can take seconds): the
/// claim goes on in the background and, once it lands, is given back, fenced by its token. A
/// minute passes before it lands, past any schedule of retries looking for it, so only the
/// claim's own answer can tell the engine what to give back. Nothing ran: released, and the
/// next call runs once.
#[tokio::test(start_paused = true)]
async fn a_claim_that_lands_after_its_caller_left_is_given_back() {
    let w = world();
    let r = reference(&w, 30);
    w.store.script(Op::Claim, [Act::LandLate]);
    drop_at(&w, Op::Claim, charge(&w, spec(), 30, false)).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(state(&w, r).await, None, "the claim has not landed yet");
    w.store.script(Op::Release, [Act::Report]);
    w.store.unpark();
    assert_eq!(
        reported(&w).await,
        Op::Release,
        "the late claim is given back"
    );
    assert_eq!(state(&w, r).await, Some(RecordState::Released));
    assert_eq!(charge(&w, spec(), 30, false).await.result.ok(), Some(30));
    assert_eq!(w.charges.load(Ordering::SeqCst), 1);
}

/// A timeout sweep on PostgreSQL: 300 calls, each wrapped by its caller in a random short
/// timeout (so futures are dropped while claiming, running, completing). Once the lease has
/// passed and one lease-expiry round has run, no record is left in flight, and no body ran twice.
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_sweep_leaves_nothing_in_flight_postgres() {
    let Some(schema) = idempotency_tests::pg::TestSchema::create("sweep").await else {
        return;
    };
    let pg = schema.store().await;
    let scripted = Scripted::new(Arc::new(pg.clone()));
    let shared: Arc<dyn Store> = scripted.clone();
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let engine = Idempotency::builder_shared(shared)
        .clock(clock.clone())
        .lease(LEASE)
        .reconcile_every(Duration::from_millis(20))
        .build();
    let caller = Caller::new("acme", "alice");
    let runs: Arc<std::sync::Mutex<std::collections::HashMap<u64, usize>>> = Arc::default();
    let mut calls = tokio::task::JoinSet::new();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for n in 0..300u64 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let budget = Duration::from_micros(seed % 4_000);
        let (engine, caller, runs) = (engine.clone(), caller.clone(), runs.clone());
        calls.spawn(async move {
            let prepared =
                Prepared::call(&caller, &idempotency_tests::CHARGE_CARD, &(n % 100)).expect("key");
            let call = engine.execute_raw(
                prepared,
                ErrorPolicy::<ChargeError>::retryable(),
                async move {
                    *runs.lock().unwrap().entry(n % 100).or_default() += 1;
                    tokio::task::yield_now().await;
                    Ok::<u64, ChargeError>(n)
                },
            );
            let _ = tokio::time::timeout(budget, call).await;
        });
    }
    while calls.join_next().await.is_some() {}
    // A claim whose caller gave up before its answer came is released in the background (it
    // never ran): wait, through the store, until no never-run call is still in flight.
    let never_ran = |runs: &std::collections::HashMap<u64, usize>| -> Vec<Reference> {
        (0..100u64)
            .filter(|n| !runs.contains_key(n))
            .map(|n| {
                Prepared::call(&caller, &idempotency_tests::CHARGE_CARD, &n)
                    .expect("key")
                    .key
                    .key(&idempotency::key::Secret::demo())
                    .reference(1)
            })
            .collect()
    };
    let pending = never_ran(&runs.lock().unwrap());
    let mut still = pending.clone();
    for _ in 0..10_000 {
        let mut left = Vec::new();
        for r in &still {
            let s = engine.status(&caller, *r).await.expect("status");
            if s.map(|s| s.state) == Some(RecordState::InFlight) {
                left.push(*r);
            }
        }
        still = left;
        if still.is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(
        still.is_empty(),
        "claims that never ran are still in flight: {still:?}"
    );
    // The lease passes; wait for two rounds to finish (the second started after the first).
    clock.advance(LEASE + Duration::from_secs(1));
    scripted.script(Op::Unsettled, [Act::Report, Act::Report]);
    assert_eq!(reported_from(&scripted).await, Op::Unsettled);
    assert_eq!(reported_from(&scripted).await, Op::Unsettled);
    let in_flight: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_records WHERE state = 0")
            .fetch_one(pg.pool())
            .await
            .expect("count");
    assert_eq!(in_flight, 0, "nothing left in flight");
    let twice: Vec<u64> = runs
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, _)| *k)
        .collect();
    assert!(twice.is_empty(), "bodies ran twice for {twice:?}");
    // Truthful, not just terminal: a call whose body never ran is never "outcome unknown".
    let mut never_ran_but_unknown = Vec::new();
    for n in 0..100u64 {
        if runs.lock().unwrap().contains_key(&n) {
            continue;
        }
        let r = Prepared::call(&caller, &idempotency_tests::CHARGE_CARD, &n)
            .expect("key")
            .key
            .key(&idempotency::key::Secret::demo())
            .reference(1);
        let state = engine
            .status(&caller, r)
            .await
            .expect("status")
            .map(|s| s.state);
        if state == Some(RecordState::Unknown) {
            never_ran_but_unknown.push(n);
        }
    }
    assert!(
        never_ran_but_unknown.is_empty(),
        "claims whose body never ran were left unknown: {never_ran_but_unknown:?}"
    );
    drop(engine);
    pg.pool().close().await;
    schema.drop_schema().await;
}

async fn reported_from(store: &Scripted) -> Op {
    tokio::time::timeout(Duration::from_secs(60), store.parked())
        .await
        .expect("the store call came")
}
