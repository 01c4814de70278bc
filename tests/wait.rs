//! A repeat that finds its call in progress may wait for it (`wait`), on every store (memory, a
//! SQLite file, PostgreSQL, Redis): it gets the first call's answer as a replay once recorded;
//! without a wait it is told "in progress" at once; a first call that gives its claim back lets
//! exactly one waiter run; a first call whose outcome is lost answers the waiters "unknown"; a
//! wait that runs out answers "in progress"; past the cap of waiters a repeat is told "in
//! progress" at once; a waiter whose caller is gone frees its place.
//!
//! The first call's body is held by a gate the test opens; that a repeat is waiting is seen from
//! the store (its first status read parks, or reports). Side effects are counted at the far side.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::outcome::{ErrorPolicy, Failure, Outcome};
use idempotency::tool::{Prepared, ToolSpec};
use idempotency::{Caller, Error, Idempotency, IdempotencyBuilder};
use idempotency_tests::backends::Backend;
use idempotency_tests::scripted::{Act, Op, Scripted};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const SPEC: ToolSpec = ToolSpec::new("charge_card", Duration::from_secs(900));
const WAITING: ToolSpec = SPEC.with_wait(Duration::from_secs(3));
/// How long a test waits for something that must happen at once before it fails.
const BOUND: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
enum ToolError {
    #[error("{0}")]
    Wrapper(String),
    #[error("try again")]
    Busy,
}

impl From<Error> for ToolError {
    fn from(e: Error) -> Self {
        ToolError::Wrapper(e.advice())
    }
}

type Answer = Outcome<u64, Failure<ToolError>>;
type Configure = fn(IdempotencyBuilder) -> IdempotencyBuilder;

/// An engine over a scripted wrapper of the backend's store, and the far side's count.
struct World {
    engine: Idempotency,
    store: Arc<Scripted>,
    caller: Caller,
    effects: Arc<AtomicUsize>,
}

/// A first call held in its body: `started` fires once the body runs, `gate` lets it answer.
struct Held {
    started: oneshot::Receiver<()>,
    gate: oneshot::Sender<Result<u64, ToolError>>,
    call: JoinHandle<Answer>,
}

impl World {
    fn new(b: &Backend, configure: impl FnOnce(IdempotencyBuilder) -> IdempotencyBuilder) -> World {
        World::on(b.store.clone(), configure)
    }

    /// A world on another replica: a store of its own over the same records.
    async fn replica(b: &Backend) -> World {
        World::on(b.replica().await, |e| e)
    }

    fn on(
        store: Arc<dyn idempotency::store::Store>,
        configure: impl FnOnce(IdempotencyBuilder) -> IdempotencyBuilder,
    ) -> World {
        let store = Scripted::new(store);
        World {
            engine: configure(Idempotency::builder_shared(store.clone())).build(),
            store,
            caller: Caller::new("acme", "alice"),
            effects: Arc::default(),
        }
    }

    /// Calls `spec` with `n` in a task; the body counts an effect and answers `n * 10`.
    fn call(&self, spec: ToolSpec, n: u64) -> JoinHandle<Answer> {
        let effects = self.effects.clone();
        self.spawn(spec, n, async move {
            effects.fetch_add(1, Ordering::SeqCst);
            Ok(n * 10)
        })
    }

    /// Calls `spec` with `n` in a task whose body counts an effect, then answers what the gate
    /// says (a panic when the gate is dropped: the outcome is lost).
    async fn held(&self, spec: ToolSpec, n: u64) -> Held {
        let (started_tx, started) = oneshot::channel();
        let (gate, gate_rx) = oneshot::channel::<Result<u64, ToolError>>();
        let effects = self.effects.clone();
        let call = self.spawn(spec, n, async move {
            effects.fetch_add(1, Ordering::SeqCst);
            let _ = started_tx.send(());
            match gate_rx.await {
                Ok(answer) => answer,
                Err(_) => panic!("the worker lost the outcome after the side effect"),
            }
        });
        Held {
            started,
            gate,
            call,
        }
    }

    fn spawn(
        &self,
        spec: ToolSpec,
        n: u64,
        body: impl std::future::Future<Output = Result<u64, ToolError>> + Send + 'static,
    ) -> JoinHandle<Answer> {
        let (engine, caller) = (self.engine.clone(), self.caller.clone());
        tokio::spawn(async move {
            let prepared = Prepared::call(&caller, &spec, &n).expect("key");
            engine
                .execute_raw(prepared, ErrorPolicy::<ToolError>::retryable(), body)
                .await
        })
    }

    /// Waits until a scripted status read has parked or reported: a repeat is waiting.
    async fn a_repeat_waits(&self) {
        self.a_repeat_did(Op::Status).await;
    }

    /// Waits until a scripted call of `op` has parked or reported.
    async fn a_repeat_did(&self, op: Op) {
        let parked = tokio::time::timeout(BOUND, self.store.parked())
            .await
            .unwrap_or_else(|_| panic!("no repeat waited (no {op:?} reached the store)"));
        assert_eq!(parked, op);
    }
}

async fn started(held: &mut Held) {
    tokio::time::timeout(BOUND, &mut held.started)
        .await
        .expect("the first call's body never started")
        .expect("started");
}

async fn answer(call: JoinHandle<Answer>) -> Answer {
    tokio::time::timeout(BOUND, call)
        .await
        .expect("no answer in time")
        .expect("the call's task")
}

fn in_flight(a: &Answer) -> bool {
    matches!(a.result, Err(Failure::Wrapper(Error::InFlight { .. })))
}

/// A repeat with the engine's wait (3 s) during a held first call answers with the first call's
/// answer, as a replay, once it is recorded; the body ran once.
async fn a_waiting_repeat_gets_the_first_answer(b: Backend) {
    let w = World::new(&b, |e| e.wait(Duration::from_secs(3)));
    w.store.script(Op::Status, [Act::Report]);
    let mut first = w.held(SPEC, 7).await;
    started(&mut first).await;
    let repeat = w.call(SPEC, 7);
    w.a_repeat_waits().await;
    first.gate.send(Ok(70)).expect("gate");
    let first = answer(first.call).await;
    assert_eq!(first.result.ok(), Some(70));
    let repeat = answer(repeat).await;
    assert!(repeat.replayed, "{:?}", repeat.result);
    assert_eq!(repeat.result.ok(), Some(70));
    assert_eq!(w.effects.load(Ordering::SeqCst), 1);
    b.finish().await;
}

/// By default (no wait), a repeat during a held first call is told "in progress" at once and
/// reads nothing; so is one whose tool's zero wait overrides the engine's 3 s.
async fn without_a_wait_a_repeat_is_told_in_flight_at_once(b: Backend) {
    let cases: [(Configure, ToolSpec, u64); 2] = [
        (|e| e, SPEC, 7),
        (
            |e| e.wait(Duration::from_secs(3)),
            SPEC.with_wait(Duration::ZERO),
            8,
        ),
    ];
    for (configure, spec, n) in cases {
        let w = World::new(&b, configure);
        let mut first = w.held(spec, n).await;
        started(&mut first).await;
        let repeat = answer(w.call(spec, n)).await;
        assert!(in_flight(&repeat), "{spec:?}: {:?}", repeat.result);
        assert_eq!(w.store.calls(Op::Status), 0, "{spec:?}");
        first.gate.send(Ok(n * 10)).expect("gate");
        assert_eq!(answer(first.call).await.result.ok(), Some(n * 10));
        assert_eq!(w.effects.load(Ordering::SeqCst), 1);
    }
    b.finish().await;
}

/// A first call that gives its claim back (a retryable error) while three repeats wait: exactly
/// one of them claims and runs the body; the other two get its answer as a replay.
async fn a_released_call_lets_one_waiter_run(b: Backend) {
    let w = World::new(&b, |e| e);
    w.store
        .script(Op::Status, [Act::Report, Act::Report, Act::Report]);
    let mut first = w.held(WAITING, 7).await;
    started(&mut first).await;
    let repeats: Vec<_> = (0..3).map(|_| w.call(WAITING, 7)).collect();
    for _ in 0..3 {
        w.a_repeat_waits().await;
    }
    first.gate.send(Err(ToolError::Busy)).expect("gate");
    let first = answer(first.call).await;
    assert!(
        matches!(first.result, Err(Failure::Handler(ToolError::Busy))),
        "{:?}",
        first.result
    );
    let mut ran = 0;
    for repeat in repeats {
        let repeat = answer(repeat).await;
        assert_eq!(
            repeat.result.as_ref().ok(),
            Some(&70),
            "{:?}",
            repeat.result
        );
        if !repeat.replayed {
            ran += 1;
        }
    }
    assert_eq!(ran, 1, "exactly one waiter runs the released call");
    assert_eq!(
        w.effects.load(Ordering::SeqCst),
        2,
        "the first call and one waiter"
    );
    b.finish().await;
}

/// A first call whose outcome is lost (its body panics after the side effect) while a repeat
/// waits: the repeat is told "outcome unknown", as a repeat would be then; nothing ran twice.
async fn a_lost_outcome_answers_the_waiter_unknown(b: Backend) {
    let w = World::new(&b, |e| e);
    w.store.script(Op::Status, [Act::Report]);
    let mut first = w.held(WAITING, 7).await;
    started(&mut first).await;
    let repeat = w.call(WAITING, 7);
    w.a_repeat_waits().await;
    drop(first.gate);
    let repeat = answer(repeat).await;
    assert!(
        matches!(
            repeat.result,
            Err(Failure::Wrapper(Error::OutcomeUnknown { .. }))
        ),
        "{:?}",
        repeat.result
    );
    assert_eq!(w.effects.load(Ordering::SeqCst), 1);
    let _ = answer(first.call).await;
    b.finish().await;
}

/// A wait that runs out (300 ms, the first call still held) answers "in progress".
async fn a_wait_that_runs_out_answers_in_flight(b: Backend) {
    let w = World::new(&b, |e| e);
    let spec = SPEC.with_wait(Duration::from_millis(300));
    let mut first = w.held(spec, 7).await;
    started(&mut first).await;
    let repeat = answer(w.call(spec, 7)).await;
    assert!(in_flight(&repeat), "{:?}", repeat.result);
    assert!(w.store.calls(Op::Status) >= 1, "the repeat waited");
    first.gate.send(Ok(70)).expect("gate");
    assert_eq!(answer(first.call).await.result.ok(), Some(70));
    assert_eq!(w.effects.load(Ordering::SeqCst), 1);
    b.finish().await;
}

/// A repeat's wait is capped by the tool's timeout: with `wait` an hour and `timeout` 1 s, a
/// repeat during a held first call is told "in progress" after the timeout, not an hour later
/// (the test's own bound is 20 s). (With 300 ms, under the load of 16 tests at once, the
/// repeat's claim sometimes took the whole timeout and it never polled.)
async fn the_timeout_caps_the_wait(b: Backend) {
    let w = World::new(&b, |e| e);
    let mut first = w.held(SPEC, 8).await;
    started(&mut first).await;
    let capped = SPEC
        .with_wait(Duration::from_secs(3600))
        .with_timeout(Duration::from_secs(1));
    let repeat = answer(w.call(capped, 8)).await;
    assert!(in_flight(&repeat), "{:?}", repeat.result);
    assert!(w.store.calls(Op::Status) >= 1, "the repeat waited");
    first.gate.send(Ok(80)).expect("gate");
    assert_eq!(answer(first.call).await.result.ok(), Some(80));
    assert_eq!(w.effects.load(Ordering::SeqCst), 1);
    b.finish().await;
}

/// With room for one waiter: a second repeat is told "in progress" at once while the first
/// waits; once the waiting repeat's caller is gone (its task aborted mid-wait), its place is
/// free and the next repeat waits, and gets the answer.
async fn the_cap_on_waiters_and_a_cancelled_waiter(b: Backend) {
    let w = World::new(&b, |e| e.max_waiters(1));
    // The first waiter's status read parks (it is waiting); the next one's reports.
    w.store.script(Op::Status, [Act::Park, Act::Report]);
    let mut first = w.held(WAITING, 7).await;
    started(&mut first).await;
    let waiting = w.call(WAITING, 7);
    w.a_repeat_waits().await;
    let beyond = answer(w.call(WAITING, 7)).await;
    assert!(in_flight(&beyond), "{:?}", beyond.result);
    waiting.abort();
    assert!(
        tokio::time::timeout(BOUND, waiting)
            .await
            .expect("aborted")
            .is_err_and(|e| e.is_cancelled()),
        "the waiter was cancelled"
    );
    let next = w.call(WAITING, 7);
    w.a_repeat_waits().await;
    first.gate.send(Ok(70)).expect("gate");
    assert_eq!(answer(first.call).await.result.ok(), Some(70));
    let next = answer(next).await;
    assert!(next.replayed, "{:?}", next.result);
    assert_eq!(next.result.ok(), Some(70));
    assert_eq!(w.effects.load(Ordering::SeqCst), 1);
    b.finish().await;
}

/// A waiter on this engine is woken by the engine's own completion, not by reading the store:
/// after its first status read, every read it makes hangs, and it still gets the answer.
async fn this_engines_completion_wakes_its_waiter(b: Backend) {
    let w = World::new(&b, |e| e);
    w.store.script(
        Op::Status,
        std::iter::once(Act::Report).chain(std::iter::repeat_n(Act::Hang, 100)),
    );
    let mut first = w.held(WAITING, 7).await;
    started(&mut first).await;
    let repeat = w.call(WAITING, 7);
    w.a_repeat_waits().await;
    first.gate.send(Ok(70)).expect("gate");
    assert_eq!(answer(first.call).await.result.ok(), Some(70));
    let repeat = answer(repeat).await;
    assert!(repeat.replayed, "{:?}", repeat.result);
    assert_eq!(repeat.result.ok(), Some(70));
    assert_eq!(w.effects.load(Ordering::SeqCst), 1);
    b.finish().await;
}

/// A waiter on one replica sees the answer another replica recorded: two engines, each with a
/// store of its own over the same records, the first call on one, the repeat on the other.
async fn a_waiter_sees_another_replicas_answer(b: Backend) {
    let here = World::new(&b, |e| e);
    let there = World::replica(&b).await;
    there.store.script(Op::Status, [Act::Report]);
    let mut first = here.held(WAITING, 7).await;
    started(&mut first).await;
    let repeat = there.call(WAITING, 7);
    there.a_repeat_waits().await;
    first.gate.send(Ok(70)).expect("gate");
    assert_eq!(answer(first.call).await.result.ok(), Some(70));
    let repeat = answer(repeat).await;
    assert!(repeat.replayed, "{:?}", repeat.result);
    assert_eq!(repeat.result.ok(), Some(70));
    assert_eq!(here.effects.load(Ordering::SeqCst), 1);
    assert_eq!(there.effects.load(Ordering::SeqCst), 0);
    b.finish().await;
}

/// Two repeats wait on one replica for a call on another; once one of them reads the answer, the
/// other is woken by it (every read it makes after its first hangs), and the store is asked for
/// the answer once for both.
async fn the_first_waiter_to_see_the_answer_wakes_the_others(b: Backend) {
    let here = World::new(&b, |e| e);
    let there = World::replica(&b).await;
    there.store.script(
        Op::Status,
        [Act::Report, Act::Report, Act::Park]
            .into_iter()
            .chain(std::iter::repeat_n(Act::Hang, 100)),
    );
    let mut first = here.held(WAITING, 7).await;
    started(&mut first).await;
    let repeats: Vec<_> = (0..2).map(|_| there.call(WAITING, 7)).collect();
    for _ in 0..3 {
        // Both waiting, then one of them in its second read, held until the answer is recorded.
        there.a_repeat_waits().await;
    }
    first.gate.send(Ok(70)).expect("gate");
    assert_eq!(answer(first.call).await.result.ok(), Some(70));
    there.store.unpark();
    for repeat in repeats {
        let repeat = answer(repeat).await;
        assert!(repeat.replayed, "{:?}", repeat.result);
        assert_eq!(repeat.result.ok(), Some(70));
    }
    assert_eq!(here.effects.load(Ordering::SeqCst), 1);
    // One claim each on arrival, then one for both once woken: the answer one of them read is
    // the other's too.
    assert_eq!(there.store.calls(Op::Claim), 3);
    b.finish().await;
}

fn secret(s: &str) -> idempotency::key::Secret {
    idempotency::key::Secret::new(s).expect("16 bytes or more")
}

/// While the secret is rotated, a repeat on an engine with the new secret that finds the call in
/// progress under the previous secret's key waits for it like any other (it holds no claim of
/// its own meanwhile: none of its looks wakes its own waiters for nothing), and gets its answer;
/// the body ran once.
async fn a_call_under_the_previous_secret_is_waited_on(b: Backend) {
    let old = World::on(b.store.clone(), |e| {
        e.secret(secret("the old secret, 16+ bytes"))
    });
    let new = World::on(b.replica().await, |e| {
        e.secret(secret("the new secret, 16+ bytes"))
            .previous_secrets([secret("the old secret, 16+ bytes")])
    });
    new.store.script(Op::Status, [Act::Report]);
    let mut first = old.held(WAITING, 7).await;
    started(&mut first).await;
    let repeat = new.call(SPEC.with_wait(BOUND), 7);
    new.a_repeat_waits().await;
    first.gate.send(Ok(70)).expect("gate");
    assert_eq!(answer(first.call).await.result.ok(), Some(70));
    let repeat = answer(repeat).await;
    assert!(repeat.replayed, "{:?}", repeat.result);
    assert_eq!(repeat.result.ok(), Some(70));
    let again = answer(new.call(WAITING, 7)).await;
    assert!(again.replayed, "{:?}", again.result);
    assert_eq!(again.result.ok(), Some(70));
    assert_eq!(old.effects.load(Ordering::SeqCst), 1);
    assert_eq!(new.effects.load(Ordering::SeqCst), 0);
    b.finish().await;
}

/// A `recover = "rerun"` tool with a wait, longer than all the steps a test takes before the
/// repeat should still be waiting (each bounded by `BOUND`): with a wait of `BOUND`, a loaded
/// machine's set-up sometimes used it up, and the repeat rightly answered "in progress".
const RERUN: ToolSpec = SPEC
    .with_wait(BOUND.saturating_mul(6))
    .with_recover(idempotency::tool::Recover::Rerun);

impl World {
    /// Calls `spec` with `n` and loses its outcome after the side effect (the body panics);
    /// returns once the record says "outcome unknown".
    async fn lose(&self, spec: ToolSpec, n: u64) {
        let mut first = self.held(spec, n).await;
        started(&mut first).await;
        drop(first.gate);
        let first = answer(first.call).await;
        assert!(
            matches!(
                first.result,
                Err(Failure::Wrapper(Error::OutcomeUnknown { .. }))
            ),
            "{:?}",
            first.result
        );
        let reference = Prepared::call(&self.caller, &spec, &n)
            .expect("key")
            .key
            .key(&idempotency::key::Secret::demo())
            .reference(1);
        let deadline = tokio::time::Instant::now() + BOUND;
        while self
            .engine
            .status(&self.caller, reference)
            .await
            .expect("status")
            .map(|s| s.state)
            != Some(idempotency::store::RecordState::Unknown)
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "never marked unknown"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// `recover = "rerun"` with a wait: of two repeats of a call whose outcome was lost, the one
/// that loses the race to take it over (its takeover is held until the other's body runs) does
/// not answer "in progress" with its wait left: it waits for the rerun and gets its answer. The
/// body ran twice in all: the lost call, and the rerun.
async fn a_repeat_that_loses_the_takeover_waits_for_the_rerun(b: Backend) {
    let w = World::new(&b, |e| e);
    w.lose(RERUN, 7).await;
    w.store.script(Op::TakeOver, [Act::Park]);
    let mut loser = w.call(RERUN, 7);
    w.a_repeat_did(Op::TakeOver).await;
    let mut winner = w.held(RERUN, 7).await;
    started(&mut winner).await;
    w.store.script(Op::Status, [Act::Report]);
    w.store.unpark();
    // The loser's answer, should it come instead of a wait, says what happened.
    tokio::select! {
        () = w.a_repeat_waits() => {}
        answered = &mut loser => panic!(
            "the loser answered instead of waiting: {:?}",
            answered.map(|a| (a.replayed, a.result))
        ),
    }
    winner.gate.send(Ok(71)).expect("gate");
    let winner = answer(winner.call).await;
    assert_eq!(winner.result.ok(), Some(71));
    assert!(!winner.replayed);
    let loser = answer(loser).await;
    assert!(loser.replayed, "{:?}", loser.result);
    assert_eq!(loser.result.ok(), Some(71));
    assert_eq!(
        w.effects.load(Ordering::SeqCst),
        2,
        "the lost call and the rerun"
    );
    b.finish().await;
}

/// `recover = "rerun"` with a wait: 20 repeats at once of a call whose outcome was lost all
/// answer with the rerun's answer (one ran it, the others waited for it or replayed it); none
/// is told "in progress" with its wait left. The body ran twice in all: the lost call, and the
/// rerun.
async fn repeats_at_once_of_a_lost_call_all_get_the_reruns_answer(b: Backend) {
    let w = World::new(&b, |e| e);
    w.lose(RERUN, 7).await;
    let repeats: Vec<_> = (0..20).map(|_| w.call(RERUN, 7)).collect();
    let mut ran = 0;
    let mut other = Vec::new();
    for repeat in repeats {
        let repeat = answer(repeat).await;
        match repeat.result {
            Ok(70) if !repeat.replayed => ran += 1,
            Ok(70) => {}
            result => other.push(result),
        }
    }
    assert!(
        other.is_empty(),
        "answers other than the rerun's: {other:?}"
    );
    assert_eq!(ran, 1, "one repeat ran it again");
    assert_eq!(
        w.effects.load(Ordering::SeqCst),
        2,
        "the lost call and the rerun"
    );
    b.finish().await;
}

/// On a store that sends word of settlements (PostgreSQL's notices, Redis's channels), a waiter on one replica is
/// woken by that word when another replica records the answer: every read of the record it
/// makes hangs, and it still gets the answer. Without the word (asking for it fails), the same
/// waiter, its reads hanging after the first, is told "in progress" when its wait runs out.
async fn the_stores_word_wakes_a_waiter_on_another_replica(b: Backend) {
    let here = World::new(&b, |e| e);
    let there = World::replica(&b).await;
    there.store.script(Op::Watch, [Act::Report]);
    there
        .store
        .script(Op::Status, std::iter::repeat_n(Act::Hang, 100));
    let mut first = here.held(WAITING, 7).await;
    started(&mut first).await;
    let repeat = there.call(WAITING, 7);
    there.a_repeat_did(Op::Watch).await;
    first.gate.send(Ok(70)).expect("gate");
    assert_eq!(answer(first.call).await.result.ok(), Some(70));
    let repeat = answer(repeat).await;
    assert!(repeat.replayed, "{:?}", repeat.result);
    assert_eq!(repeat.result.ok(), Some(70));

    let there = World::replica(&b).await;
    there.store.script(Op::Watch, [Act::Fail]);
    there.store.script(
        Op::Status,
        std::iter::once(Act::Report).chain(std::iter::repeat_n(Act::Hang, 100)),
    );
    let mut first = here.held(WAITING, 8).await;
    started(&mut first).await;
    let repeat = there.call(SPEC.with_wait(Duration::from_millis(500)), 8);
    there.a_repeat_waits().await;
    first.gate.send(Ok(80)).expect("gate");
    assert_eq!(answer(first.call).await.result.ok(), Some(80));
    assert!(in_flight(&answer(repeat).await));
    assert_eq!(here.effects.load(Ordering::SeqCst), 2);
    assert_eq!(there.effects.load(Ordering::SeqCst), 0);
    b.finish().await;
}

mod with_word {
    use super::*;

    #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        let Some(b) = Backend::postgres("wait").await else {
            return;
        };
        the_stores_word_wakes_a_waiter_on_another_replica(b).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        the_stores_word_wakes_a_waiter_on_another_replica(Backend::redis("wait", false).await)
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_cluster() {
        the_stores_word_wakes_a_waiter_on_another_replica(Backend::redis_cluster("wait").await)
            .await;
    }

    /// Completions by `SET … IFEQ` there: a watched record goes to the fenced script too.
    #[cfg_attr(no_valkey, ignore = "needs valkey-server (see tests/build.rs)")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn valkey() {
        the_stores_word_wakes_a_waiter_on_another_replica(Backend::valkey("wait").await).await;
    }
}

idempotency_tests::on_every_store!(
    "wait", redis;
    a_waiting_repeat_gets_the_first_answer,
    without_a_wait_a_repeat_is_told_in_flight_at_once,
    a_released_call_lets_one_waiter_run,
    a_lost_outcome_answers_the_waiter_unknown,
    a_wait_that_runs_out_answers_in_flight,
    the_timeout_caps_the_wait,
    the_cap_on_waiters_and_a_cancelled_waiter,
    this_engines_completion_wakes_its_waiter,
    a_waiter_sees_another_replicas_answer,
    the_first_waiter_to_see_the_answer_wakes_the_others,
    a_call_under_the_previous_secret_is_waited_on,
    a_repeat_that_loses_the_takeover_waits_for_the_rerun,
    repeats_at_once_of_a_lost_call_all_get_the_reruns_answer,
);
