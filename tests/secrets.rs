//! One secret per store: replicas sharing a store must key their calls with one secret, or each
//! runs every call once more (its keys never meet the others' records). The store keeps the
//! secret's fingerprint; an engine with another secret is refused at `start()`, and an engine
//! made with `build()` refuses its calls. A rotation through `previous_secrets` still works.
//!
//! Every case runs on each backend, each replica on a store handle of its own (its own pool or
//! connection) over the same data: memory (one store shared by two engines), a SQLite file,
//! a PostgreSQL schema (ignored without `DATABASE_URL`) and a Redis namespace (a `redis-server`
//! of the test's own).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idempotency::key::{Secret, SecretFingerprint};
use idempotency::outcome::ErrorPolicy;
use idempotency::store::{MemoryStore, RedisStore, SqliteStore, Store, StoreError};
use idempotency::tool::Prepared;
use idempotency::{Caller, Error, Idempotency, IdempotencyBuilder};
use idempotency_tests::far::FarSide;
use idempotency_tests::pg::{unique_name, TestSchema};
use idempotency_tests::redis_servers::{shared_cluster, shared_server};
use idempotency_tests::scripted::{Act, Op, Scripted};
use idempotency_tests::sqlite_file::{remove_sqlite_files, SqliteFile};
use idempotency_tests::CHARGE_CARD;
use serde_json::json;

type Opening = Pin<Box<dyn Future<Output = Arc<dyn Store>>>>;

/// Opens one more handle on the store under test, as another replica would.
type Open<'a> = &'a dyn Fn() -> Opening;

fn secret(s: &str) -> Secret {
    Secret::new(s).expect("16 bytes or more")
}

fn old() -> Secret {
    secret("the secret of 2025, from the vault")
}

fn new() -> Secret {
    secret("the secret of 2026, from the vault")
}

fn replica(store: Arc<dyn Store>, secret: Secret, previous: &[Secret]) -> IdempotencyBuilder {
    Idempotency::builder_shared(store)
        .secret(secret)
        .previous_secrets(previous.iter().cloned())
        .without_reconciler()
        // This binary holds transactional tools too; these replicas serve none of them.
        .without_transactional_tools()
}

fn mismatch(r: Result<Idempotency, StoreError>) -> (SecretFingerprint, SecretFingerprint) {
    match r {
        Err(StoreError::SecretMismatch { stored, engine }) => (stored, engine),
        Err(e) => panic!("expected a secret mismatch, got {e:?}"),
        Ok(_) => panic!("expected a secret mismatch, the engine started"),
    }
}

/// `charge_card` for `amount`: the body counts its runs in `runs`.
async fn charge(engine: &Idempotency, runs: &AtomicUsize, amount: u64) -> Result<usize, Error> {
    let caller = Caller::new("acme", "alice");
    let prepared = Prepared::call(&caller, &CHARGE_CARD, &json!({ "amount": amount }))?;
    engine
        .execute(prepared, ErrorPolicy::retryable(), async {
            Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) + 1)
        })
        .await
        .result
}

/// Two replicas with different secrets: the second refuses to start, and built without the
/// check it refuses the call instead of charging a second time. The demo secret (no secret
/// configured) is refused the same way, and the message says it is the demo secret.
async fn a_second_secret_is_refused(open: Open<'_>) {
    let runs = AtomicUsize::new(0);
    let first = replica(open().await, old(), &[])
        .start()
        .await
        .expect("the first replica starts and stores its fingerprint");
    assert_eq!(charge(&first, &runs, 42).await.unwrap(), 1);

    let store = open().await;
    let (stored, engine) = mismatch(replica(store.clone(), new(), &[]).start().await);
    assert_eq!((stored, engine), (old().fingerprint(), new().fingerprint()));

    // Built without the check: the same call is refused (nothing run), not charged again.
    let unchecked = replica(store.clone(), new(), &[]).build();
    let refused = charge(&unchecked, &runs, 42).await.unwrap_err();
    assert!(
        matches!(
            &refused,
            Error::Store {
                source: StoreError::SecretMismatch { .. },
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(refused.nothing_done() && !refused.safe_to_retry());
    let advice = refused.advice();
    assert!(
        advice.contains("previous_secrets") && advice.contains(&old().fingerprint().to_string()),
        "{advice}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "charged once");

    // The replica: no IDEMPOTENCY_SECRET, so the demo secret.
    let demo = Idempotency::builder_shared(store)
        .without_transactional_tools()
        .start()
        .await;
    let message = demo.as_ref().err().map(ToString::to_string);
    let (_, engine) = mismatch(demo);
    assert!(engine.is_demo());
    assert!(
        message.is_some_and(|m| m.contains("demo secret")),
        "the message names the demo secret"
    );

    // The first replica's own secret still starts, and replays.
    let again = replica(open().await, old(), &[]).start().await.unwrap();
    assert_eq!(charge(&again, &runs, 42).await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Rotation: the new secret with the stored one listed as previous starts, replays the old
/// records and moves the store to the new secret, so the old secret alone is refused from then
/// on. Rolling back (the old secret with the new one listed) starts too.
async fn a_rotation_moves_the_store_to_the_new_secret(open: Open<'_>) {
    let runs = AtomicUsize::new(0);
    let before = replica(open().await, old(), &[]).start().await.unwrap();
    assert_eq!(charge(&before, &runs, 7).await.unwrap(), 1);

    // Step 1 of a rolling rotation: the old secret, the new one listed. Nothing changes.
    replica(open().await, old(), &[new()])
        .start()
        .await
        .expect("step 1 starts");
    // The new secret alone is still refused.
    mismatch(replica(open().await, new(), &[]).start().await);

    // Step 2: the new secret, the old one listed: starts and replays the old record.
    let rotated = replica(open().await, new(), &[old()])
        .start()
        .await
        .expect("step 2 starts");
    assert_eq!(charge(&rotated, &runs, 7).await.unwrap(), 1, "replayed");
    assert_eq!(charge(&rotated, &runs, 8).await.unwrap(), 2, "a fresh call");

    // The store now keeps the new secret: the old one alone is refused...
    let (stored, engine) = mismatch(replica(open().await, old(), &[]).start().await);
    assert_eq!((stored, engine), (new().fingerprint(), old().fingerprint()));
    // ...the new one alone starts (once the old records are past their window and retention,
    // the list can be dropped) and replays what step 2 recorded.
    let after = replica(open().await, new(), &[]).start().await.unwrap();
    assert_eq!(charge(&after, &runs, 8).await.unwrap(), 2);

    // A replica of step 1 restarting (a rollback) still starts: it recognises both secrets.
    let back = replica(open().await, old(), &[new()])
        .start()
        .await
        .unwrap();
    assert_eq!(charge(&back, &runs, 8).await.unwrap(), 2, "replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Replicas with eight different secrets starting at once on an empty store: exactly one
/// starts (the swap is atomic), and the store keeps its fingerprint.
async fn of_replicas_starting_together_one_secret_wins(open: Open<'_>) {
    let mut starting = tokio::task::JoinSet::new();
    for i in 0..8 {
        let store = open().await;
        let s = secret(&format!("replica {i}'s own secret, different"));
        starting.spawn(async move { (s.fingerprint(), replica(store, s, &[]).start().await) });
    }
    let results = starting.join_all().await;
    let started: Vec<SecretFingerprint> = results
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(f, _)| f.clone())
        .collect();
    assert_eq!(started.len(), 1, "exactly one secret wins");
    for (_, r) in &results {
        if let Err(e) = r {
            assert!(
                matches!(e, StoreError::SecretMismatch { stored, .. } if *stored == started[0]),
                "{e:?}"
            );
        }
    }
}

/// The store's compare-and-set, as the trait documents it.
async fn the_swap_is_a_compare_and_set(open: Open<'_>) {
    let store = open().await;
    let (a, b, c) = (
        || Some(old().fingerprint()),
        || Some(new().fingerprint()),
        || Some(Secret::demo().fingerprint()),
    );
    let swap = |store: &Arc<dyn Store>, expected, new: Option<SecretFingerprint>| {
        let store = store.clone();
        async move {
            store
                .swap_secret(expected, new.expect("some"))
                .await
                .unwrap()
        }
    };
    assert_eq!(swap(&store, a(), b()).await, None);
    assert_eq!(swap(&store, None, a()).await, a());
    assert_eq!(swap(&store, None, b()).await, a());
    assert_eq!(swap(&store, b(), c()).await, a());
    assert_eq!(swap(&store, a(), a()).await, a());
    assert_eq!(swap(&open().await, a(), b()).await, b());
    assert_eq!(swap(&store, None, c()).await, b());
}

/// What one call of the rotation race ended with at each replica.
#[derive(Debug, Default)]
struct Race {
    /// Calls no replica ran: each was told "in progress" (or another error) for nothing.
    stranded: usize,
    /// Calls whose side effect landed more than once at the far side.
    twice: usize,
    /// Answers other than the run's (an error, or another value).
    not_the_runs_answer: usize,
}

/// The same call arriving at once at a replica of each step of a rolling rotation (step 1:
/// `secret(old).previous_secrets([new])`, step 2: `secret(new).previous_secrets([old])`), both
/// with a wait, 300 times: each call runs exactly once (one charge at the far side), and both
/// replicas answer with that run's answer, the loser having waited for it. Before the keys were
/// claimed in one shared order, each replica claimed its own key, found the other's claim under
/// its previous key, gave its own back and answered "in progress": nobody ran the call. The
/// same with a replica of step 2 and one past the rotation (`secret(new)` alone), whose one key
/// is one of the ordered set.
async fn a_call_at_both_steps_of_a_rotation_runs_once(open: Open<'_>) {
    let wait = std::time::Duration::from_secs(20);
    let step1 = replica(open().await, old(), &[new()])
        .wait(wait)
        .start()
        .await
        .expect("step 1 starts");
    let step2 = replica(open().await, new(), &[old()])
        .wait(wait)
        .start()
        .await
        .expect("step 2 starts");
    let after = replica(open().await, new(), &[])
        .wait(wait)
        .start()
        .await
        .expect("the new secret alone starts");
    race(&step1, &step2, "steps 1 and 2").await;
    race(&after, &step2, "step 2 and after").await;
}

/// 300 calls, each at `one` and `two` at once: each ran once, and both answered its answer.
/// The calls race in rounds of [`AT_ONCE`], so a loser's wait overlaps the others'.
async fn race(one: &Idempotency, two: &Idempotency, what: &'static str) {
    const CALLS: u64 = 300;
    const AT_ONCE: u64 = 10;
    let far_file = std::env::temp_dir().join(format!("{}.db", unique_name("rotation-far")));
    let far = FarSide::open(&far_file.to_string_lossy()).await;
    let mut race = Race::default();
    for round in (0..CALLS).step_by(usize::try_from(AT_ONCE).expect("small")) {
        let mut calls = tokio::task::JoinSet::new();
        for call in round..(round + AT_ONCE).min(CALLS) {
            let (one, two, far) = (one.clone(), two.clone(), far.clone());
            calls.spawn(async move { race_once(call, [one, two], far, what).await });
        }
        while let Some(once) = calls.join_next().await {
            let once = once.expect("the call's task");
            race.stranded += once.stranded;
            race.twice += once.twice;
            race.not_the_runs_answer += once.not_the_runs_answer;
        }
    }
    let effects = far.effects().await;
    eprintln!("rotation race ({what}), {CALLS} calls: {race:?}, {effects} charges at the far side");
    drop(far);
    remove_sqlite_files(&far_file);
    assert_eq!(
        (race.stranded, race.twice, race.not_the_runs_answer),
        (0, 0, 0),
        "{what}: {race:?}"
    );
    assert_eq!(effects, i64::try_from(CALLS).expect("small"));
}

/// Call `call` at both replicas at once (a barrier between them): what it ended with.
async fn race_once(call: u64, at: [Idempotency; 2], far: FarSide, what: &str) -> Race {
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let tasks = at.map(|engine| {
        let (barrier, far) = (barrier.clone(), far.clone());
        let args = json!({ "amount": call, "race": what });
        tokio::spawn(async move {
            let caller = Caller::new("acme", "alice");
            let prepared = Prepared::call(&caller, &CHARGE_CARD, &args).expect("key");
            barrier.wait().await;
            engine
                .execute(prepared, ErrorPolicy::retryable(), async move {
                    Ok::<_, Error>(far.charge(&format!("call {call}")).await)
                })
                .await
                .result
        })
    });
    let mut answers = Vec::with_capacity(2);
    for task in tasks {
        answers.push(task.await.expect("the call's task"));
    }
    let charges = far.charges(&format!("call {call}")).await;
    let mut race = Race::default();
    match charges.as_slice() {
        [] => race.stranded += 1,
        [_] => {}
        _ => race.twice += 1,
    }
    race.not_the_runs_answer += answers
        .iter()
        .filter(|a| !matches!(a, Ok(id) if charges.first() == Some(id)))
        .count();
    if let Some(e) = answers.iter().find_map(|a| a.as_ref().err()) {
        tracing::info!(call, error = %e, "an answer other than the run's");
    }
    race
}

// ---------------------------------------------------------------------------------------------
// The backends
// ---------------------------------------------------------------------------------------------

/// Opens the SQLite store in `file`.
fn open_sqlite(file: &SqliteFile) -> Opening {
    let path = file.0.clone();
    Box::pin(async move {
        Arc::new(SqliteStore::open(&path).await.expect("open the file")) as Arc<dyn Store>
    })
}

/// Runs `case` on a fresh store of each kind.
macro_rules! on_every_backend {
    ($case:ident) => {
        mod $case {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
                let open = move || {
                    let store = store.clone();
                    Box::pin(async move { store }) as Opening
                };
                super::$case(&open).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite_file() {
                let file = SqliteFile::new("secrets");
                super::$case(&|| super::open_sqlite(&file)).await;
            }

            #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let Some(schema) = TestSchema::create("secrets").await else {
                    return;
                };
                let options = schema.options();
                let open = move || {
                    let options = options.clone();
                    Box::pin(async move {
                        let pool = sqlx::postgres::PgPoolOptions::new()
                            .max_connections(2)
                            .connect_with(idempotency::store::PostgresStore::tune(options))
                            .await
                            .expect("connect");
                        Arc::new(
                            idempotency::store::PostgresStore::from_pool(pool)
                                .await
                                .expect("open the store"),
                        ) as Arc<dyn Store>
                    }) as Opening
                };
                super::$case(&open).await;
                schema.drop_schema().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                let url = shared_server().url();
                let namespace = unique_name("secrets");
                let open = move || {
                    let (url, namespace) = (url.clone(), namespace.clone());
                    Box::pin(async move {
                        Arc::new(
                            RedisStore::builder()
                                .namespace(namespace)
                                .connect(&url)
                                .await
                                .expect("connect"),
                        ) as Arc<dyn Store>
                    }) as Opening
                };
                super::$case(&open).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis_cluster() {
                let seeds = shared_cluster().seeds();
                let namespace = unique_name("secrets");
                let open = move || {
                    let (seeds, namespace) = (seeds.clone(), namespace.clone());
                    Box::pin(async move {
                        let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
                        Arc::new(
                            // Waits for a replica (the default on a cluster) up to 2 s:
                            // clusters of other test processes start on the same 2 cores.
                            RedisStore::builder()
                                .namespace(namespace)
                                .replica_ack_timeout(std::time::Duration::from_secs(2))
                                .connect_cluster(&seeds)
                                .await
                                .expect("connect"),
                        ) as Arc<dyn Store>
                    }) as Opening
                };
                super::$case(&open).await;
            }
        }
    };
}

on_every_backend!(a_second_secret_is_refused);
on_every_backend!(a_rotation_moves_the_store_to_the_new_secret);
on_every_backend!(of_replicas_starting_together_one_secret_wins);
on_every_backend!(the_swap_is_a_compare_and_set);
on_every_backend!(a_call_at_both_steps_of_a_rotation_runs_once);

/// A check the store could not answer is not a verdict: the call is refused as safe to retry
/// (nothing ran), and the next call checks again and runs.
#[tokio::test]
async fn a_failed_check_is_made_again_at_the_next_call() {
    let store = Scripted::new(Arc::new(MemoryStore::new()));
    store.script(Op::SwapSecret, [Act::Fail]);
    let engine = replica(store.clone(), old(), &[]).build();
    let runs = AtomicUsize::new(0);
    let refused = charge(&engine, &runs, 1).await.unwrap_err();
    assert!(refused.safe_to_retry(), "{refused:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(charge(&engine, &runs, 1).await.unwrap(), 1);
    assert_eq!(charge(&engine, &runs, 1).await.unwrap(), 1, "replayed");
    // Passed once, the check costs nothing more.
    assert_eq!(store.calls(Op::SwapSecret), 2);
}

/// The interleaving that stranded calls, scripted: replicas of both steps of a rotation each
/// make their first claim of the same call, and both claims are made before either replica
/// hears its answer. Claimed each in its own order, those were two different keys, both new;
/// each then probed the other's key, found its claim, gave its own back and answered "in
/// progress" (at least one of them, whatever came next). In the shared order both first claims
/// are of the same key: exactly one is new, its replica runs, the other waits for it and gets
/// its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_claims_at_both_steps_at_once_meet_on_one_key() {
    let shared: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (one, two) = (Scripted::new(shared.clone()), Scripted::new(shared));
    let wait = std::time::Duration::from_secs(20);
    let step1 = replica(one.clone(), old(), &[new()]).wait(wait).build();
    let step2 = replica(two.clone(), new(), &[old()]).wait(wait).build();
    // The secret checks first, so that the scripted claims are the call's.
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(charge(&step1, &runs, 1).await.unwrap(), 1);
    assert_eq!(charge(&step2, &runs, 1).await.unwrap(), 1, "replayed");
    one.script(Op::Claim, [Act::CommitThenPark]);
    two.script(Op::Claim, [Act::CommitThenPark]);
    let at = |engine: &Idempotency| {
        let (engine, runs) = (engine.clone(), runs.clone());
        tokio::spawn(async move { charge(&engine, &runs, 2).await })
    };
    let (a, b) = (at(&step1), at(&step2));
    let bound = std::time::Duration::from_secs(20);
    for store in [&one, &two] {
        let parked = tokio::time::timeout(bound, store.parked()).await;
        assert_eq!(parked.expect("each made its first claim"), Op::Claim);
    }
    one.unpark();
    two.unpark();
    let a = tokio::time::timeout(bound, a).await.expect("answered");
    let b = tokio::time::timeout(bound, b).await.expect("answered");
    let answers = [a.expect("task"), b.expect("task")];
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the call ran once: {answers:?}"
    );
    for answer in answers {
        assert_eq!(answer.ok(), Some(2), "the run's answer at both");
    }
}
