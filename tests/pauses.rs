//! Workers that are paused or cut off rather than dead. A worker claims a call, then its process
//! is paused (`kill -STOP`, as a VM pause) or its traffic to the store is frozen by a proxy while
//! its processor stays reachable, past its lease. Another replica's lease-expiry rounds ask the
//! processor (the README's `Reconcile`): no charge under the reference, so the call is released,
//! and that replica's repeat runs it. When the first worker resumes, its body must not act: it
//! stopped before the store's lease could end. Side effects are counted at the far side (a
//! processor in a SQLite file that keeps every charge it is asked for), and the first worker's
//! caller gets the answer that stands or "outcome unknown", never a second receipt.
//!
//! On a SQLite file (pause only: no network to cut), PostgreSQL (skipped without `DATABASE_URL`)
//! and Redis (a server this test starts).

use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotency::outcome::{ErrorPolicy, Failure, Outcome};
use idempotency::store::{
    BoxError, PostgresStore, RecordState, RedisStore, Settlement, SqliteStore, Store,
    StoredResponse, Unsettled,
};
use idempotency::tool::{Prepared, ToolSpec};
use idempotency::{Caller, Error, Idempotency, Reference};
use idempotency_tests::far::FarSide;
use idempotency_tests::pg::{unique_name, TestSchema};
use idempotency_tests::processes::{heard, say, Victim};
use idempotency_tests::proxy::Proxy;
use idempotency_tests::redis_servers::shared_server;
use idempotency_tests::sqlite_file::SqliteFile;
use tokio::sync::{oneshot, Notify};

const LEASE: Duration = Duration::from_secs(2);
const CHARGE: ToolSpec = ToolSpec::new("charge_card", Duration::from_secs(900));
const VICTIM_TEST: &str = "pause_victim";
const STORE_ENV: &str = "IDEMPOTENCY_PAUSE_STORE";
const FAR_ENV: &str = "IDEMPOTENCY_PAUSE_PROCESSOR";
/// What the victim prints once its claim is made, and with its caller's answer.
const CLAIMED: &str = "PAUSE CLAIMED";
const ANSWER: &str = "PAUSE ANSWER";

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
enum ChargeError {
    #[error("{0}")]
    Wrapper(String),
}

impl From<Error> for ChargeError {
    fn from(e: Error) -> Self {
        ChargeError::Wrapper(e.advice())
    }
}

/// The store a process opens from `spec`: `sqlite:<path>`, `postgres:<url>`, `redis:<ns>:<url>`.
async fn open_store(spec: &str) -> Arc<dyn Store> {
    if let Some(path) = spec.strip_prefix("sqlite:") {
        Arc::new(SqliteStore::open(path).await.expect("sqlite store"))
    } else if let Some(url) = spec.strip_prefix("postgres:") {
        Arc::new(PostgresStore::connect(url).await.expect("postgres store"))
    } else if let Some(rest) = spec.strip_prefix("redis:") {
        let (namespace, url) = rest.split_once(':').expect("namespace:url");
        Arc::new(
            RedisStore::builder()
                .namespace(namespace)
                .connect(url)
                .await
                .expect("redis store"),
        )
    } else {
        panic!("unknown store {spec}")
    }
}

/// The README's processor-asking `Reconcile`: a charge under the reference settles the call as
/// completed with it; none, as released (it did not happen: a repeat may run it).
fn ask(far: FarSide) -> impl Fn(Unsettled) -> BoxedSettlement + Send + Sync + 'static {
    move |claim: Unsettled| {
        let far = far.clone();
        Box::pin(async move {
            Ok(match far.charged(&claim.reference.to_string()).await {
                Some(id) => Settlement::Completed(StoredResponse {
                    ok: true,
                    body: id.to_string(),
                }),
                None => Settlement::Released,
            })
        })
    }
}

type BoxedSettlement =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Settlement, BoxError>> + Send>>;

/// A replica that settles lost calls by asking the processor.
fn asking_replica(store: Arc<dyn Store>, far: &FarSide) -> Idempotency {
    Idempotency::builder_shared(store)
        .lease(LEASE)
        .reconcile(ask(far.clone()))
        .build()
}

fn caller() -> Caller {
    Caller::new("acme", "alice")
}

/// One `charge_card` call whose body, once its claim is made, runs `before` (the worker's
/// pause point), then charges.
async fn call<F>(
    engine: &Idempotency,
    far: &FarSide,
    before: impl FnOnce(Reference) -> F + Send + 'static,
) -> Outcome<i64, Failure<ChargeError>>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let args = serde_json::json!({"amount_cents": 4200, "currency": "EUR"});
    let far = far.clone();
    engine
        .execute_raw(
            Prepared::call(&caller(), &CHARGE, &args).expect("key"),
            ErrorPolicy::<ChargeError>::retryable(),
            async move {
                let reference = idempotency::Call::current().expect("a call").reference();
                before(reference).await;
                Ok(far.charge(&reference.to_string()).await)
            },
        )
        .await
}

/// A replica's caller repeating "in progress" and "outcome unknown" answers (every 50 ms, a
/// client retrying) until it has its charge; bounded.
async fn repeat_until_charged(engine: &Idempotency, far: &FarSide) -> i64 {
    let deadline = Instant::now() + LEASE * 10;
    loop {
        let out = call(engine, far, |_| async {}).await;
        match out.result {
            Ok(id) => return id,
            Err(Failure::Wrapper(Error::InFlight { .. } | Error::OutcomeUnknown { .. })) => {}
            Err(other) => panic!("a repeat got {other:?}"),
        }
        assert!(Instant::now() < deadline, "the call never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a caller was told, in a line.
fn told(out: &Outcome<i64, Failure<ChargeError>>) -> String {
    match &out.result {
        Ok(id) => format!("ok {id}"),
        Err(Failure::Wrapper(Error::OutcomeUnknown { .. })) => "unknown".into(),
        Err(Failure::Wrapper(Error::InFlight { .. })) => "in_flight".into(),
        Err(other) => format!("other {other:?}"),
    }
}

/// Runs only as the worker process `a_paused_worker` starts; otherwise passes at once. Claims,
/// says so, waits for the parent's word (it comes while this process is paused), then charges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_victim() {
    let (Ok(store), Ok(far)) = (std::env::var(STORE_ENV), std::env::var(FAR_ENV)) else {
        return;
    };
    let far = FarSide::open(&far).await;
    let engine = Idempotency::builder_shared(open_store(&store).await)
        .lease(LEASE)
        .without_reconciler()
        .build();
    let out = call(&engine, &far, |reference| async move {
        say(CLAIMED, reference);
        heard().await;
    })
    .await;
    say(ANSWER, told(&out));
}

/// A worker paused (SIGSTOP) after its claim, past its lease; resumed once another replica has
/// run the call, with its processor's go-ahead waiting for it.
async fn a_paused_worker(store: String) {
    let far_path = SqliteFile::new("pause-processor");
    let far_path = far_path.0.to_str().expect("a UTF-8 path").to_owned();
    let far = FarSide::open(&far_path).await;
    let other = asking_replica(open_store(&store).await, &far);

    let mut victim = Victim::spawn(VICTIM_TEST, &[(STORE_ENV, &store), (FAR_ENV, &far_path)]);
    let reference = victim.said(CLAIMED).await;
    victim.signal("STOP");
    let paused = Instant::now();
    let id = repeat_until_charged(&other, &far).await;
    println!(
        "the other replica ran {reference} {:?} into the pause",
        paused.elapsed()
    );
    // The processor is reachable, and says go, the moment the worker resumes.
    victim.tell("go").await;
    victim.signal("CONT");
    let answer = victim.said(ANSWER).await;
    victim.kill().await;

    assert_eq!(far.effects().await, 1, "one charge at the processor");
    assert_eq!(
        answer,
        format!("ok {id}"),
        "the resumed worker's caller gets the answer that stands"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_does_not_act_after_its_lease_sqlite() {
    let file = SqliteFile::new("pause-store");
    let path = file.0.to_str().expect("a UTF-8 path").to_owned();
    // Created (and migrated) here, so the two processes do not race to make it.
    drop(SqliteStore::open(&path).await.expect("sqlite store"));
    a_paused_worker(format!("sqlite:{path}")).await;
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_does_not_act_after_its_lease_postgres() {
    let Some(schema) = TestSchema::create("pause").await else {
        return;
    };
    schema.server_clock_store().await;
    a_paused_worker(format!("postgres:{}", scoped_url(&schema))).await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_does_not_act_after_its_lease_redis() {
    let url = shared_server().url();
    a_paused_worker(format!("redis:{}:{url}", unique_name("pause"))).await;
}

/// The schema's URL with its search path, for another process.
fn scoped_url(schema: &TestSchema) -> String {
    let url = schema.url();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20search_path%3D{}", schema.name())
}

/// A worker cut off from its store by a proxy that freezes its traffic (its processor still
/// reachable) past its lease, while another replica, reaching the store directly, settles the
/// call from the processor and runs it.
async fn a_partitioned_worker(cut_off: Arc<dyn Store>, direct: Arc<dyn Store>, proxy: &Proxy) {
    let far_file = SqliteFile::new("partition-processor");
    let far = FarSide::open(far_file.0.to_str().expect("a UTF-8 path")).await;
    let worker = Idempotency::builder_shared(cut_off)
        .lease(LEASE)
        .without_reconciler()
        .build();
    let other = asking_replica(direct, &far);

    let go = Arc::new(Notify::new());
    let (claimed, made) = oneshot::channel();
    let first = {
        let (worker, far, go) = (worker.clone(), far.clone(), go.clone());
        tokio::spawn(async move {
            call(&worker, &far, move |reference| async move {
                let _ = claimed.send(reference);
                go.notified().await;
            })
            .await
        })
    };
    let reference = made.await.expect("the worker's claim");
    proxy.freeze();
    let id = repeat_until_charged(&other, &far).await;
    // The processor answers the cut-off worker: its body may go on, if it still runs.
    go.notify_one();
    let answer = match tokio::time::timeout(LEASE * 3, first).await {
        Ok(done) => done.expect("the worker's call"),
        Err(_) => {
            proxy.thaw();
            panic!(
                "the cut-off worker's caller had no answer {:?} after the other replica's",
                LEASE * 3
            );
        }
    };
    proxy.thaw();

    assert_eq!(far.effects().await, 1, "one charge at the processor");
    let told = told(&answer);
    assert!(
        told == "unknown" || told == format!("ok {id}"),
        "the cut-off worker's caller: {told} (the answer that stands is ok {id})"
    );
    // Once the link is back, its repeats and the status tool agree on the answer that stands.
    let again = call(&worker, &far, |_| async {}).await;
    assert_eq!(self::told(&again), format!("ok {id}"));
    let status = other
        .status(&caller(), reference)
        .await
        .expect("status")
        .expect("the record");
    assert_eq!(status.state, RecordState::Completed);
    assert_eq!(far.effects().await, 1, "still one charge");
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_worker_does_not_act_after_its_lease_postgres() {
    let Some(schema) = TestSchema::create("partition").await else {
        return;
    };
    let direct: Arc<dyn Store> = Arc::new(schema.server_clock_store().await);
    let proxy = Proxy::start("127.0.0.1:5432".parse().expect("addr"))
        .await
        .expect("proxy");
    let through = scoped_url(&schema).replacen("127.0.0.1:5432", &proxy.addr().to_string(), 1);
    let cut_off: Arc<dyn Store> = Arc::new(
        PostgresStore::connect(&through)
            .await
            .expect("the store through the proxy"),
    );
    a_partitioned_worker(cut_off, direct, &proxy).await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_worker_does_not_act_after_its_lease_redis() {
    let url = shared_server().url();
    let namespace = unique_name("partition");
    let addr = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .parse()
        .expect("the server's address");
    let proxy = Proxy::start(addr).await.expect("proxy");
    let store = |url: String| {
        let namespace = namespace.clone();
        async move {
            let store: Arc<dyn Store> = Arc::new(
                RedisStore::builder()
                    .namespace(&namespace)
                    .connect(&url)
                    .await
                    .expect("redis store"),
            );
            store
        }
    };
    let cut_off = store(format!("redis://{}", proxy.addr())).await;
    let direct = store(url.clone()).await;
    a_partitioned_worker(cut_off, direct, &proxy).await;
}

// ---------------------------------------------------------------------------------------------
// In one process, on paused time: the worker's side of the same faults, step by step.
// ---------------------------------------------------------------------------------------------

mod steps {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use idempotency::clock::{Clock, ManualClock, Timestamp};
    use idempotency::error::UnknownReason;
    use idempotency::outcome::{ErrorPolicy, Failure, Outcome};
    use idempotency::store::{Fenced, MemoryStore, RecordState, Settlement, Store, StoredResponse};
    use idempotency::tool::{Prepared, ToolSpec};
    use idempotency::{Caller, Error, Idempotency};
    use idempotency_tests::scripted::{Act, Op, Scripted};
    use tokio::sync::Notify;

    use super::ChargeError;

    const LEASE: Duration = Duration::from_secs(30);
    const SPEC: ToolSpec = ToolSpec::new("charge_card", Duration::from_secs(900));

    struct World {
        engine: Idempotency,
        store: Arc<Scripted>,
        clock: ManualClock,
        charges: Arc<AtomicUsize>,
    }

    fn world() -> World {
        let clock = ManualClock::new(Timestamp::from_millis(1_796_000_000_000));
        let store = Scripted::new(Arc::new(MemoryStore::new()));
        let shared: Arc<dyn Store> = store.clone();
        let engine = Idempotency::builder_shared(shared)
            .clock(clock.clone())
            .lease(LEASE)
            .without_reconciler()
            .build();
        World {
            engine,
            store,
            clock,
            charges: Arc::default(),
        }
    }

    fn caller() -> Caller {
        Caller::new("acme", "alice")
    }

    /// A charge of `amount` whose body waits for `go` (if any) and then counts at the far side.
    async fn charge(
        w: &World,
        amount: u64,
        go: Option<Arc<Notify>>,
    ) -> Outcome<u64, Failure<ChargeError>> {
        let charges = w.charges.clone();
        w.engine
            .execute_raw(
                Prepared::call(&caller(), &SPEC, &amount).expect("key"),
                ErrorPolicy::<ChargeError>::retryable(),
                async move {
                    if let Some(go) = go {
                        go.notified().await;
                    }
                    charges.fetch_add(1, Ordering::SeqCst);
                    Ok(amount)
                },
            )
            .await
    }

    /// Plays a lease-expiry round that cannot tell (no `Reconcile`): the claim becomes unknown.
    async fn round_marks_unknown(w: &World) {
        w.clock.advance(LEASE + Duration::from_secs(1));
        let store: &dyn Store = &*w.store;
        let due = store.unsettled(w.clock.now(), 10).await.expect("unsettled");
        assert_eq!(due.len(), 1);
        store
            .settle(
                due[0].key,
                due[0].token,
                &Settlement::Unknown,
                w.clock.now(),
            )
            .await
            .expect("marked unknown");
    }

    /// Renewals that never answer (the store cut off, or this process paused): the body is not
    /// polled again once the worker's own lease ends, a tenth of the lease before the store's
    /// can; it never acts, and its caller is told "outcome unknown" (it had started).
    #[tokio::test(start_paused = true)]
    async fn unanswered_renewals_stop_the_body_before_the_stores_lease_ends() {
        let w = world();
        w.store.script(Op::Renew, [Act::Hang; 8]);
        let go = Arc::new(Notify::new());
        let begun = tokio::time::Instant::now();
        let call = charge(&w, 1, Some(go.clone()));
        tokio::pin!(call);
        // The processor would answer just before the store's lease ends: too late.
        let late = async {
            tokio::time::sleep(LEASE - Duration::from_millis(100)).await;
            go.notify_one();
            std::future::pending::<()>().await;
        };
        let out = tokio::select! {
            out = &mut call => out,
            () = late => unreachable!(),
        };
        let stopped = begun.elapsed();
        assert!(
            stopped >= LEASE - LEASE / 10 && stopped < LEASE - Duration::from_millis(100),
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
        go.notify_one();
        tokio::task::yield_now().await;
        assert_eq!(w.charges.load(Ordering::SeqCst), 0, "the body never acted");
        let r = out.reference.expect("a reference");
        let status = w.engine.status(&caller(), r).await.expect("status");
        assert_eq!(status.map(|s| s.state), Some(RecordState::Unknown));
    }

    /// Renewals the store accepts keep a long body running past many leases.
    #[tokio::test(start_paused = true)]
    async fn accepted_renewals_keep_a_long_body_running() {
        let w = world();
        let charges = w.charges.clone();
        let out = w
            .engine
            .execute_raw(
                Prepared::call(&caller(), &SPEC, &2u64).expect("key"),
                ErrorPolicy::<ChargeError>::retryable(),
                async move {
                    tokio::time::sleep(LEASE * 5).await;
                    charges.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, ChargeError>(2)
                },
            )
            .await;
        assert_eq!(out.result.ok(), Some(2));
        assert_eq!(w.charges.load(Ordering::SeqCst), 1);
        assert!(
            w.store.calls(Op::Renew) >= 14,
            "{}",
            w.store.calls(Op::Renew)
        );
    }

    /// A worker whose completion was held (a paused process, a slow link) while a round marked
    /// its call unknown: its answer lands, and repeats replay it instead of "outcome unknown".
    #[tokio::test(start_paused = true)]
    async fn a_late_answer_settles_a_call_a_round_marked_unknown() {
        let w = world();
        w.store.script(Op::Complete, [Act::Park]);
        let call = charge(&w, 3, None);
        tokio::pin!(call);
        tokio::select! {
            _ = &mut call => panic!("the completion was to park"),
            op = w.store.parked() => assert_eq!(op, Op::Complete),
        }
        round_marks_unknown(&w).await;
        w.store.unpark();
        let out = call.await;
        assert_eq!(out.result.ok(), Some(3), "its caller gets its answer");
        let again = charge(&w, 3, None).await;
        assert_eq!(again.result.ok(), Some(3));
        assert!(again.replayed);
        assert_eq!(w.charges.load(Ordering::SeqCst), 1);
    }

    /// A completion fenced because the record was settled from the processor meanwhile answers
    /// its caller with the settled answer, which every repeat gets too.
    #[tokio::test(start_paused = true)]
    async fn a_fenced_completion_answers_with_the_record_that_stands() {
        let w = world();
        w.store.script(Op::Complete, [Act::Park]);
        let call = charge(&w, 4, None);
        tokio::pin!(call);
        tokio::select! {
            _ = &mut call => panic!("the completion was to park"),
            op = w.store.parked() => assert_eq!(op, Op::Complete),
        }
        w.clock.advance(LEASE + Duration::from_secs(1));
        let store: &dyn Store = &*w.store;
        let due = store.unsettled(w.clock.now(), 10).await.expect("unsettled");
        let settled = StoredResponse {
            ok: true,
            body: "44".into(),
        };
        store
            .settle(
                due[0].key,
                due[0].token,
                &Settlement::Completed(settled),
                w.clock.now(),
            )
            .await
            .expect("settled from the processor");
        w.store.unpark();
        let out = call.await;
        assert_eq!(out.result.ok(), Some(44), "the answer that stands");
        let again = charge(&w, 4, None).await;
        assert_eq!(again.result.ok(), Some(44));
    }
}
