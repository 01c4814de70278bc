//! The engine's cache of completed answers: a repeat of an answer this engine recorded is
//! replayed with no store round trip (counted at the store: a `Scripted` wrapper counts every
//! claim that reaches it), and never once the record's window has ended (a `ManualClock` at the
//! window's last millisecond and at its end, on every store that takes the engine's times), to
//! another caller, for other arguments under the same business key, or for a call in flight. A
//! property test compares the answers of engines with the cache on and off over random
//! sequences of calls, window ends and mismatches.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::clock::{ManualClock, Timestamp};
use idempotency::key::Scope;
use idempotency::outcome::{ErrorPolicy, Failure, Outcome};
use idempotency::store::{MemoryStore, Store};
use idempotency::tool::{BusinessKey, Prepared, ToolSpec};
use idempotency::{Caller, Error, Idempotency, IdempotencyBuilder};
use idempotency_tests::backends::Backend;
use idempotency_tests::charge::ChargeError;
use idempotency_tests::scripted::{Op, Scripted};
use proptest::prelude::*;

const T0: i64 = 1_796_000_000_000;
const WINDOW: Duration = Duration::from_secs(10);
const CHARGE: ToolSpec = ToolSpec::new("charge_card", WINDOW);
const SHIP: ToolSpec = ToolSpec::new("create_shipment", WINDOW).with_scope(Scope::Subject);

struct World {
    engine: Idempotency,
    store: Arc<Scripted>,
    clock: ManualClock,
    /// Body runs, counted at the far side.
    runs: Arc<AtomicUsize>,
}

fn world(
    store: Arc<dyn Store>,
    configure: impl FnOnce(IdempotencyBuilder) -> IdempotencyBuilder,
) -> World {
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let scripted = Scripted::new(store);
    let shared: Arc<dyn Store> = scripted.clone();
    World {
        engine: configure(
            Idempotency::builder_shared(shared)
                .clock(clock.clone())
                .without_reconciler(),
        )
        .build(),
        store: scripted,
        clock,
        runs: Arc::default(),
    }
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

/// A call of `spec` by `caller` with `args`; the body counts a run and answers `args` with the
/// run's number, or the definitive `Declined` when `decline`.
async fn call(
    w: &World,
    prepared: Prepared,
    answer: u64,
    decline: bool,
) -> Outcome<u64, Failure<ChargeError>> {
    let runs = w.runs.clone();
    w.engine
        .execute_raw(
            prepared,
            ErrorPolicy::<ChargeError>::classified(),
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) as u64 + 1;
                if decline {
                    Err(ChargeError::Declined)
                } else {
                    Ok(answer * 1_000 + n)
                }
            },
        )
        .await
}

/// A `create_shipment` call of `order` with `items`, keyed by the order (a business key).
fn ship(caller: &Caller, order: &str, items: u64) -> Prepared {
    Prepared::business(
        caller,
        &SHIP,
        BusinessKey {
            field: "order_id",
            value: &order,
        },
        &(order, items),
    )
    .expect("key")
}

fn charge(caller: &Caller, amount: u64) -> Prepared {
    Prepared::call(caller, &CHARGE, &amount).expect("key")
}

/// The window's last millisecond replays from the cache (no claim reaches the store); at its
/// end the cache serves nothing, and the store lets the call run again.
async fn window_edge(backend: Backend) {
    let w = world(backend.store.clone(), |b| b);
    let first = call(&w, charge(&alice(), 7), 7, false).await;
    let value = first.result.expect("fresh");
    assert!(!first.replayed);
    assert_eq!(w.store.calls(Op::Claim), 1);

    w.clock.advance(WINDOW - Duration::from_millis(1));
    let last = call(&w, charge(&alice(), 7), 7, false).await;
    assert!(last.replayed, "the window's last millisecond replays");
    assert_eq!(last.result.expect("replayed"), value);
    assert_eq!(last.reference, first.reference);
    assert_eq!(
        w.store.calls(Op::Claim),
        1,
        "replayed with no store round trip"
    );

    w.clock.advance(Duration::from_millis(1));
    let after = call(&w, charge(&alice(), 7), 7, false).await;
    assert!(!after.replayed, "at the window's end the call runs again");
    assert_ne!(after.result.expect("fresh"), value);
    assert_eq!(w.store.calls(Op::Claim), 2);
    assert_eq!(w.runs.load(Ordering::SeqCst), 2);

    // The new answer is kept in its turn: replayed from the cache.
    let again = call(&w, charge(&alice(), 7), 7, false).await;
    assert!(again.replayed);
    assert_eq!(w.store.calls(Op::Claim), 2);
    backend.finish().await;
}

#[tokio::test]
async fn window_edge_memory() {
    window_edge(Backend::memory()).await;
}

#[tokio::test]
async fn window_edge_sqlite() {
    window_edge(Backend::sqlite("cache-edge").await).await;
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn window_edge_postgres() {
    let Some(b) = Backend::postgres("cache_edge").await else {
        return;
    };
    window_edge(b).await;
}

#[tokio::test]
async fn window_edge_redis() {
    window_edge(Backend::redis("cache-edge", true).await).await;
}

/// On the stores' own clocks (PostgreSQL's and Redis's, as in production) a repeat is replayed
/// from the cache too.
async fn own_clock_replays(store: Arc<dyn Store>) {
    let w = world(store, |b| b);
    let first = call(&w, charge(&alice(), 9), 9, false).await;
    let again = call(&w, charge(&alice(), 9), 9, false).await;
    assert!(again.replayed);
    assert_eq!(again.result.ok(), first.result.ok());
    assert_eq!(
        w.store.calls(Op::Claim),
        1,
        "replayed with no store round trip"
    );
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn own_clock_replays_postgres() {
    let Some(schema) = idempotency_tests::pg::TestSchema::create("cache_own").await else {
        return;
    };
    own_clock_replays(Arc::new(schema.server_clock_store().await)).await;
    schema.drop_schema().await;
}

#[tokio::test]
async fn own_clock_replays_redis() {
    let b = Backend::redis("cache-own", false).await;
    own_clock_replays(b.store.clone()).await;
    b.finish().await;
}

#[tokio::test]
async fn another_caller_is_never_served() {
    let w = world(Arc::new(MemoryStore::new()), |b| b);
    let bob = Caller::new("acme", "bob");
    let globex = Caller::new("globex", "alice");
    assert!(!call(&w, ship(&alice(), "o-1", 1), 1, false).await.replayed);
    assert!(call(&w, ship(&alice(), "o-1", 1), 1, false).await.replayed);
    assert_eq!(w.store.calls(Op::Claim), 1);
    // Another subject of the tenant (the tool is subject-scoped), another tenant: their own.
    assert!(!call(&w, ship(&bob, "o-1", 1), 1, false).await.replayed);
    assert!(!call(&w, charge(&globex, 1), 1, false).await.replayed);
    assert_eq!(w.runs.load(Ordering::SeqCst), 3);
    // Other arguments under the same business key: the store's "mismatch", never the answer.
    let other = call(&w, ship(&alice(), "o-1", 2), 2, false).await;
    assert!(
        matches!(
            other.result,
            Err(Failure::Wrapper(Error::PayloadMismatch { .. }))
        ),
        "{:?}",
        other.result
    );
    assert_eq!(w.runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_call_in_flight_is_not_served() {
    let w = world(Arc::new(MemoryStore::new()), |b| b);
    let (entered_tx, entered) = tokio::sync::oneshot::channel();
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let first = w.engine.execute_raw(
        charge(&alice(), 3),
        ErrorPolicy::<ChargeError>::classified(),
        async move {
            let _ = entered_tx.send(());
            g.notified().await;
            Ok::<u64, ChargeError>(3)
        },
    );
    let repeat = async {
        entered.await.expect("the body started");
        let out = call(&w, charge(&alice(), 3), 3, false).await;
        gate.notify_one();
        out
    };
    let (first, repeat) = tokio::join!(first, repeat);
    assert!(
        matches!(repeat.result, Err(Failure::Wrapper(Error::InFlight { .. }))),
        "{:?}",
        repeat.result
    );
    assert_eq!(first.result.ok(), Some(3));
    assert!(call(&w, charge(&alice(), 3), 3, false).await.replayed);
    assert_eq!(
        w.store.calls(Op::Claim),
        2,
        "the repeat in flight asked the store"
    );
}

#[tokio::test]
async fn definitive_errors_are_kept_large_answers_and_cache_zero_are_not() {
    let w = world(Arc::new(MemoryStore::new()), |b| b.cache_max_answer(12));
    // A definitive error is a completed answer: kept (`"Declined"`, 10 bytes).
    let declined = call(&w, charge(&alice(), 1), 1, true).await;
    assert!(matches!(
        declined.result,
        Err(Failure::Handler(ChargeError::Declined))
    ));
    let again = call(&w, charge(&alice(), 1), 1, true).await;
    assert!(again.replayed);
    assert!(matches!(
        again.result,
        Err(Failure::Handler(ChargeError::Declined))
    ));
    assert_eq!(w.store.calls(Op::Claim), 1);
    // An answer over the limit (14 digits > 12 bytes) is replayed from the store.
    let big = 10_000_000_000;
    call(&w, charge(&alice(), big), big, false).await;
    assert!(call(&w, charge(&alice(), big), big, false).await.replayed);
    assert_eq!(w.store.calls(Op::Claim), 3);

    let off = world(Arc::new(MemoryStore::new()), |b| b.cache(0));
    call(&off, charge(&alice(), 1), 1, false).await;
    assert!(call(&off, charge(&alice(), 1), 1, false).await.replayed);
    assert_eq!(
        off.store.calls(Op::Claim),
        2,
        "cache(0): every repeat asks the store"
    );
}

/// One step of the property test.
#[derive(Clone, Debug)]
enum Step {
    /// A `create_shipment` call: caller (0–1), order (0–2), items (0–1: the same order with
    /// other items is a mismatch), declined or not.
    Call {
        caller: u8,
        order: u8,
        items: u8,
        decline: bool,
    },
    /// Time passes: 1 ms, the window less 1 ms, or the window.
    Advance(Duration),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..2u8, 0..3u8, 0..2u8, any::<bool>()).prop_map(|(caller, order, items, decline)| Step::Call {
            caller,
            order,
            items,
            decline
        }),
        1 => prop_oneof![
            Just(Duration::from_millis(1)),
            Just(WINDOW - Duration::from_millis(1)),
            Just(WINDOW),
        ]
        .prop_map(Step::Advance),
    ]
}

/// What a caller sees of an answer: the value or error, replayed or not, the reference.
fn seen(o: &Outcome<u64, Failure<ChargeError>>) -> String {
    let result = match &o.result {
        Ok(v) => format!("ok {v}"),
        Err(Failure::Handler(e)) => format!("handler {e:?}"),
        Err(Failure::Wrapper(e)) => format!("wrapper {}", e.advice()),
    };
    format!("{result} replayed={} ref={:?}", o.replayed, o.reference)
}

/// Runs `steps` on an engine with the cache (of `entries`) and one without, each on a memory
/// store of its own: every answer must be the same.
async fn same_answers(steps: &[Step], entries: usize) -> Result<(), TestCaseError> {
    let on = world(Arc::new(MemoryStore::new()), |b| b.cache(entries));
    let off = world(Arc::new(MemoryStore::new()), |b| b.cache(0));
    let callers = [alice(), Caller::new("acme", "bob")];
    for (i, s) in steps.iter().enumerate() {
        match s {
            Step::Advance(d) => {
                on.clock.advance(*d);
                off.clock.advance(*d);
            }
            Step::Call {
                caller,
                order,
                items,
                decline,
            } => {
                let caller = &callers[usize::from(*caller)];
                let order = format!("o-{order}");
                let items = u64::from(*items);
                let a = call(&on, ship(caller, &order, items), items, *decline).await;
                let b = call(&off, ship(caller, &order, items), items, *decline).await;
                prop_assert_eq!(seen(&a), seen(&b), "step {}: {:?}", i, s);
            }
        }
    }
    prop_assert_eq!(
        on.runs.load(Ordering::SeqCst),
        off.runs.load(Ordering::SeqCst),
        "the bodies ran as often"
    );
    prop_assert!(
        on.store.calls(Op::Claim) <= off.store.calls(Op::Claim),
        "the cache never adds a round trip"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn the_cache_changes_no_answer(steps in proptest::collection::vec(step(), 1..60), entries in prop_oneof![Just(1usize), Just(2), Just(64)]) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(same_answers(&steps, entries))?;
    }
}

/// The cache's hits, misses and evictions, through the metrics facade.
#[test]
fn hits_misses_and_evictions_are_counted() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let w = world(Arc::new(MemoryStore::new()), |b| b.cache(1));
            call(&w, charge(&alice(), 1), 1, false).await; // miss, kept
            call(&w, charge(&alice(), 1), 1, false).await; // hit
            call(&w, charge(&alice(), 2), 2, false).await; // miss, kept, evicts 1
                                                           // A miss, replayed by the store (only answers this engine recorded are kept).
            call(&w, charge(&alice(), 1), 1, false).await;
        })
    });
    let mut counts: HashMap<String, u64> = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if let metrics_util::debugging::DebugValue::Counter(n) = value {
            let key = key.key();
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            counts.insert(format!("{} {}", key.name(), labels.join(",")), n);
        }
    }
    let get = |k: &str| counts.get(k).copied().unwrap_or(0);
    assert_eq!(
        get("idempotency_cache_total tool=charge_card,result=hit"),
        1,
        "{counts:?}"
    );
    assert_eq!(
        get("idempotency_cache_total tool=charge_card,result=miss"),
        3,
        "{counts:?}"
    );
    assert_eq!(
        get("idempotency_cache_evictions_total tool=charge_card"),
        1,
        "{counts:?}"
    );
}

/// A transactional call's committed answer is kept too: its repeats open no transaction until
/// the window ends.
#[tokio::test]
async fn transactional_answers_are_kept_sqlite() {
    const PLACE: ToolSpec = ToolSpec::new("place_order", WINDOW).with_transactional();
    let backend = Backend::sqlite("cache-tx").await;
    let w = world(backend.store.clone(), |b| b);
    let place = || Prepared::call(&alice(), &PLACE, &5u64).expect("key");
    let first = call(&w, place(), 5, false).await;
    assert!(!first.replayed);
    w.clock.advance(WINDOW - Duration::from_millis(1));
    let again = call(&w, place(), 5, false).await;
    assert!(again.replayed);
    assert_eq!(again.result.ok(), first.result.ok());
    assert_eq!(w.store.calls(Op::Begin), 1, "replayed with no transaction");
    w.clock.advance(Duration::from_millis(1));
    assert!(!call(&w, place(), 5, false).await.replayed);
    assert_eq!(w.store.calls(Op::Begin), 2);
    assert_eq!(w.runs.load(Ordering::SeqCst), 2);
    backend.finish().await;
}
