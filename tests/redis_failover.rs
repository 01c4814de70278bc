//! A Redis master with one replica, its replication stream through a proxy that can hold it
//! back; 16 clients repeat calls over a fixed set of keys; the stream falls 500 ms behind, the
//! link is cut (what it held back is lost) and the master `kill -9`ed; the replica is promoted
//! (`REPLICAOF NO ONE`) and the clients go on against it through a store connected to it; then
//! every key is called once more. Each call's side effect is counted at the far side (a
//! counting stub the store knows nothing of).
//!
//! With the store's default (the master has a replica, so claims and completions wait for
//! it): no key's side effect ran twice, and no call answered with its result before the
//! failover is run again or left in doubt after it. Refusals and unknowns are counted and
//! printed. `IDEMPOTENCY_REPLICA_ACKS=off` runs the same with the wait turned off (by hand:
//! the test then fails, which shows what the wait is for).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use idempotency::outcome::{ErrorPolicy, Outcome};
use idempotency::store::RedisStore;
use idempotency::tool::{Prepared, ToolSpec};
use idempotency::{Caller, Error, Idempotency};
use idempotency_tests::pg::unique_name;
use idempotency_tests::proxy::Proxy;
use idempotency_tests::redis_servers::{wait_until, Flavor, RedisServer};

const WINDOW: Duration = Duration::from_secs(900);
const CLIENTS: u64 = 16;
const KEYS: u64 = 6_000;
/// How far the replication stream falls behind before the master dies.
const LAG: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error(transparent)]
    Wrapper(#[from] Error),
}

/// What the calls answered, and what ran.
#[derive(Default)]
struct Tally {
    /// Side effects per key, counted where they happen.
    runs: Mutex<HashMap<u64, u64>>,
    /// Keys answered with their result (fresh or replayed) before the master was killed.
    answered_before: Mutex<HashSet<u64>>,
    calls: AtomicU64,
    fresh: AtomicU64,
    replayed: AtomicU64,
    /// Not run: the claim could not be recorded (or not on a replica in time).
    refused: AtomicU64,
    /// The outcome is unknown (a completion not acknowledged by the replica).
    unknown: AtomicU64,
    in_flight: AtomicU64,
    other: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Tally {
    /// Counts one call's answer; true for a result (fresh or replayed).
    fn count(&self, out: &Outcome<u64, ChargeError>) -> bool {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let which = match &out.result {
            Ok(_) if out.replayed => &self.replayed,
            Ok(_) => &self.fresh,
            Err(ChargeError::Wrapper(Error::Store { .. })) => &self.refused,
            Err(ChargeError::Wrapper(Error::OutcomeUnknown { .. })) => &self.unknown,
            Err(ChargeError::Wrapper(Error::InFlight { .. })) => &self.in_flight,
            Err(_) => &self.other,
        };
        which.fetch_add(1, Ordering::Relaxed);
        out.result.is_ok()
    }

    fn line(&self) -> String {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "calls={} fresh={} replayed={} refused={} unknown={} in_flight={} other={}",
            n(&self.calls),
            n(&self.fresh),
            n(&self.replayed),
            n(&self.refused),
            n(&self.unknown),
            n(&self.in_flight),
            n(&self.other)
        )
    }
}

async fn call(engine: &Idempotency, tally: &Arc<Tally>, id: u64) -> Outcome<u64, ChargeError> {
    let caller = Caller::new("acme", "alice");
    let spec = ToolSpec::new("charge_card", WINDOW).with_timeout(Duration::from_secs(10));
    let prepared = Prepared::call(&caller, &spec, &id).expect("key");
    let t = tally.clone();
    let out = engine
        .execute(prepared, ErrorPolicy::retryable(), async move {
            *lock(&t.runs).entry(id).or_default() += 1;
            Ok(id)
        })
        .await;
    tally.count(&out);
    out
}

async fn store_on(url: &str, namespace: &str, acks: bool) -> RedisStore {
    let mut builder = RedisStore::builder().namespace(namespace);
    if !acks {
        builder = builder.without_replica_acks_may_lose_claims_on_failover();
    }
    builder.connect(url).await.expect("connect")
}

/// The replication offset the master reached and the one its replica acknowledged.
fn offsets(master: &RedisServer) -> (u64, u64) {
    let info = master.node.text(&["INFO", "replication"]);
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let acked = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("slave0:"))
        .and_then(|l| {
            l.split(',')
                .find_map(|kv| kv.strip_prefix("offset="))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0);
    (field("master_repl_offset:"), acked)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

async fn failover(flavor: Flavor) {
    let acks = std::env::var("IDEMPOTENCY_REPLICA_ACKS").map_or(true, |v| v != "off");
    let namespace = unique_name("failover");
    let master = Arc::new(RedisServer::start_flavor(flavor));
    let replica = RedisServer::start_flavor(flavor);
    let proxy = Proxy::start(([127, 0, 0, 1], master.node.port).into())
        .await
        .expect("proxy");
    replica
        .node
        .cmd(&["REPLICAOF", "127.0.0.1", &proxy.addr().port().to_string()])
        .expect("REPLICAOF");
    let m = master.clone();
    blocking(move || {
        wait_until("the replica to be online", Duration::from_secs(30), || {
            let info = m.node.text(&["INFO", "replication"]);
            info.contains("connected_slaves:1") && info.contains("state=online")
        })
    })
    .await;

    let engine = Idempotency::builder(store_on(&master.url(), &namespace, acks).await)
        .without_reconciler()
        .build();
    let current = Arc::new(RwLock::new(engine));
    let tally = Arc::new(Tally::default());
    let killed = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let mut load = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (current, tally, killed, stop, next) = (
            current.clone(),
            tally.clone(),
            killed.clone(),
            stop.clone(),
            next.clone(),
        );
        load.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let id = next.fetch_add(1, Ordering::Relaxed) % KEYS;
                let engine = current
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                // A key and its immediate repeat.
                for _ in 0..2 {
                    let before = !killed.load(Ordering::SeqCst);
                    if call(&engine, &tally, id).await.result.is_ok() && before {
                        lock(&tally.answered_before).insert(id);
                    }
                }
            }
        });
    }
    let calls = |t: &Arc<Tally>| t.calls.load(Ordering::Relaxed);
    let t = tally.clone();
    blocking(move || {
        wait_until("load before the lag", Duration::from_secs(60), || {
            calls(&t) >= 2_000
        })
    })
    .await;

    // The replication stream falls behind; calls go on until it is behind by writes.
    proxy.delay(LAG);
    let (t, m, at) = (tally.clone(), master.clone(), calls(&tally));
    blocking(move || {
        wait_until(
            "calls while the replica lags",
            Duration::from_secs(60),
            || {
                let (reached, acked) = offsets(&m);
                calls(&t) >= at + 200 && reached > acked
            },
        )
    })
    .await;
    // The link fails with what it held back, then the master dies.
    proxy.cut();
    killed.store(true, Ordering::SeqCst);
    let mut master = Arc::try_unwrap(master).expect("no other owner of the master");
    master.node.kill();
    replica
        .node
        .cmd(&["REPLICAOF", "NO", "ONE"])
        .expect("promote the replica");
    let promoted = Idempotency::builder(store_on(&replica.url(), &namespace, acks).await)
        .without_reconciler()
        .build();
    *current.write().unwrap_or_else(PoisonError::into_inner) = promoted.clone();

    // Load on the promoted replica, then stop.
    let (t, at) = (tally.clone(), calls(&tally));
    blocking(move || {
        wait_until("load after the failover", Duration::from_secs(60), || {
            calls(&t) >= at + 2_000
        })
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    while load.join_next().await.is_some() {}
    let during = tally.line();

    // Every key once more: those answered before the failover must replay.
    let answered: Vec<u64> = lock(&tally.answered_before).iter().copied().collect();
    let lost = Arc::new(AtomicU64::new(0));
    let mut again = tokio::task::JoinSet::new();
    let used = next.load(Ordering::Relaxed).min(KEYS);
    let answered = Arc::new(answered.into_iter().collect::<HashSet<u64>>());
    for c in 0..CLIENTS {
        let (engine, tally, lost, answered) = (
            promoted.clone(),
            tally.clone(),
            lost.clone(),
            answered.clone(),
        );
        again.spawn(async move {
            for id in (c..used).step_by(CLIENTS as usize) {
                let out = call(&engine, &tally, id).await;
                if answered.contains(&id) && !(out.result.is_ok() && out.replayed) {
                    lost.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while again.join_next().await.is_some() {}
    drop(master);

    let runs = lock(&tally.runs);
    let duplicates: u64 = runs.values().map(|n| n.saturating_sub(1)).sum();
    let lost = lost.load(Ordering::Relaxed);
    println!(
        "FAILOVER server={flavor:?} acks={} keys={used} answered_before_kill={} duplicates={duplicates} lost_completions={lost} (during: {during}; all: {})",
        if acks { "on" } else { "off" },
        answered.len(),
        tally.line()
    );
    assert_eq!(duplicates, 0, "no key's side effect ran twice");
    assert_eq!(
        lost, 0,
        "every call answered before the failover replays after it"
    );
    assert!(
        tally.fresh.load(Ordering::Relaxed) > 0 && !answered.is_empty(),
        "calls went through"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_promoted_loses_no_claim_redis() {
    failover(Flavor::Redis).await;
}

#[cfg_attr(no_valkey, ignore = "needs valkey-server (see tests/build.rs)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_promoted_loses_no_claim_valkey() {
    failover(Flavor::Valkey).await;
}

/// A store connected to a master without replicas does not wait (its claims go through while
/// nothing replicates); a replica attached later is noticed (the store looks again at most once
/// a second as it writes) and from then on every claim waits for it: with the replication link
/// held back, claims are refused ("not done"), and still after the link is cut (the replica
/// gone: the store keeps waiting for one). A store built with
/// `without_replica_acks_may_lose_claims_on_failover` on the same master never waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_attached_later_is_waited_for() {
    use idempotency::clock::{Clock, SystemClock};
    use idempotency::key::Key;
    use idempotency::store::{Claim, ClaimRequest, RecordStore, StoreError, Token};
    let master = RedisServer::start_flavor(Flavor::Redis);
    let namespace = unique_name("attach");
    let waits = store_on(&master.url(), &namespace, true).await;
    let never = store_on(&master.url(), &namespace, false).await;
    let next = AtomicU64::new(0);
    let claim = |store: &RedisStore| {
        let n = next.fetch_add(1, Ordering::Relaxed);
        let store = store.clone();
        async move {
            let key = Key::for_call(
                &idempotency::key::Secret::demo(),
                &Caller::new("acme", "alice"),
                "charge_card",
                &n,
            )
            .expect("key");
            store
                .claim(&ClaimRequest {
                    key,
                    tenant: "acme",
                    subject: None,
                    tool: "charge_card",
                    fingerprint: None,
                    now: SystemClock.now(),
                    lease: Duration::from_secs(60),
                    window: WINDOW,
                    token: Token(1),
                })
                .await
        }
    };
    let refused = |r: &Result<Claim, StoreError>| matches!(r, Err(StoreError::Unavailable(_)));
    assert!(matches!(claim(&waits).await, Ok(Claim::New { .. })));

    let replica = RedisServer::start_flavor(Flavor::Redis);
    let proxy = Proxy::start(([127, 0, 0, 1], master.node.port).into())
        .await
        .expect("proxy");
    replica
        .node
        .cmd(&["REPLICAOF", "127.0.0.1", &proxy.addr().port().to_string()])
        .expect("REPLICAOF");
    let m = Arc::new(master);
    let m2 = m.clone();
    blocking(move || {
        wait_until("the replica to be online", Duration::from_secs(30), || {
            let info = m2.node.text(&["INFO", "replication"]);
            info.contains("connected_slaves:1") && info.contains("state=online")
        })
    })
    .await;
    proxy.delay(Duration::from_secs(2));
    // Claims until the store has noticed the replica (deadline: many times its 1 s re-check).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut went_through = 0;
    loop {
        let r = claim(&waits).await;
        if refused(&r) {
            break;
        }
        assert!(matches!(r, Ok(Claim::New { .. })), "{r:?}");
        went_through += 1;
        assert!(
            tokio::time::Instant::now() < deadline,
            "the store never waited for the replica ({went_through} claims went through)"
        );
        tokio::task::yield_now().await;
    }
    let r = claim(&never).await;
    assert!(
        matches!(r, Ok(Claim::New { .. })),
        "without acks: no wait: {r:?}"
    );
    proxy.cut();
    let m3 = m.clone();
    blocking(move || {
        wait_until("the replica to be gone", Duration::from_secs(30), || {
            m3.node
                .text(&["INFO", "replication"])
                .contains("connected_slaves:0")
        })
    })
    .await;
    let r = claim(&waits).await;
    assert!(
        refused(&r),
        "the replica gone: still waiting for one: {r:?}"
    );
    println!("ATTACH claims before the store noticed the replica: {went_through}");
}
