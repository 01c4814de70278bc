//! A Redis master with one replica, its replication stream through a proxy that can hold it
//! back; 16 clients repeat calls over a fixed set of keys; the stream falls 500 ms behind, the
//! link is cut (what it held back is lost) and the master `kill -9`ed; the replica is promoted
//! and the clients go on; then every key is called once more. Each call's side effect is
//! counted at the far side (a counting stub the store knows nothing of). Played twice per
//! server (Redis 7.0, Valkey 9.1):
//!
//! - one master: the replica is promoted by `REPLICAOF NO ONE`, the clients move to a store
//!   connected to it;
//! - a 3+3 cluster: one master announces the proxy's port, so its replica (and the clients)
//!   reach it through the proxy, which delays the replication stream only; the cluster
//!   promotes the replica itself, the dead node is restarted and rejoins as its replica, and
//!   the clients stay on one store throughout.
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
use idempotency_tests::redis_servers::{wait_until, Flavor, RedisCluster, RedisNode, RedisServer};

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
fn offsets(master: &RedisNode) -> (u64, u64) {
    let info = master.text(&["INFO", "replication"]);
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

/// The servers of a scene, kept until the end of the test.
type Servers = Box<dyn std::any::Any + Send>;

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// One failover's cast: the engine the clients start on, the proxy that carries the master's
/// replication stream, the master, and how the failover is played.
struct Scene {
    engine: Idempotency,
    proxy: Proxy,
    /// The replication offsets of the master that will die.
    offsets: Box<dyn Fn() -> (u64, u64) + Send + Sync>,
    /// Kills the master (`kill -9`, after the link is cut) and promotes its replica; returns
    /// the engine the clients go on with, and the servers (stopped when dropped).
    fail: Box<dyn FnOnce() -> BoxFuture<(Idempotency, Servers)> + Send>,
}

/// A master with one replica; the replica follows it through the proxy. The replica is
/// promoted by `REPLICAOF NO ONE` and the clients move to a store connected to it.
async fn single(flavor: Flavor, namespace: &str, acks: bool) -> Scene {
    let master = RedisServer::start_flavor(flavor);
    let replica = RedisServer::start_flavor(flavor);
    let proxy = Proxy::start(([127, 0, 0, 1], master.node.port).into())
        .await
        .expect("proxy");
    replica
        .node
        .cmd(&["REPLICAOF", "127.0.0.1", &proxy.addr().port().to_string()])
        .expect("REPLICAOF");
    let master = Arc::new(Mutex::new(master));
    let m = master.clone();
    blocking(move || {
        wait_until("the replica to be online", Duration::from_secs(30), || {
            let info = lock(&m).node.text(&["INFO", "replication"]);
            info.contains("connected_slaves:1") && info.contains("state=online")
        })
    })
    .await;
    let url = lock(&master).url();
    let engine = Idempotency::builder(store_on(&url, namespace, acks).await)
        .without_reconciler()
        .build();
    let m = master.clone();
    let namespace = namespace.to_owned();
    Scene {
        engine,
        proxy,
        offsets: Box::new(move || offsets(&lock(&m).node)),
        fail: Box::new(move || {
            Box::pin(async move {
                lock(&master).node.kill();
                replica
                    .node
                    .cmd(&["REPLICAOF", "NO", "ONE"])
                    .expect("promote the replica");
                let promoted =
                    Idempotency::builder(store_on(&replica.url(), &namespace, acks).await)
                        .without_reconciler()
                        .build();
                (promoted, Box::new((master, replica)) as Servers)
            })
        }),
    }
}

/// A 3-master + 3-replica cluster; one master announces the proxy's port (`CONFIG SET
/// cluster-announce-port`), so its replica follows it through the proxy, and so do the clients
/// (the proxy delays the replication stream only). The cluster promotes the replica itself
/// once the master is dead (node timeout 1 s), and the dead node, restarted, rejoins as its
/// replica; the clients stay on the same store, whose cluster client finds the new master.
async fn cluster(flavor: Flavor, namespace: &str, acks: bool) -> Scene {
    let cluster = blocking(move || RedisCluster::start_flavor(3, flavor)).await;
    let dead = cluster.masters()[0];
    let port = cluster.nodes[dead].port;
    let proxy = Proxy::start(([127, 0, 0, 1], port).into())
        .await
        .expect("proxy");
    proxy.delay_replication_only();
    let via = proxy.addr().port().to_string();
    let master = &cluster.nodes[dead];
    master
        .cmd(&[
            "CONFIG",
            "SET",
            "cluster-announce-bus-port",
            &(u32::from(port) + 10_000).to_string(),
        ])
        .expect("bus port");
    master
        .cmd(&["CONFIG", "SET", "cluster-announce-port", &via])
        .expect("announce the proxy");
    let cluster = Arc::new(Mutex::new(cluster));
    let c = cluster.clone();
    let announced = format!("127.0.0.1:{via}@");
    blocking(move || {
        let c = lock(&c);
        wait_until(
            "the replica to follow its master through the proxy",
            Duration::from_secs(30),
            || {
                let replica_follows = c.nodes.iter().any(|n| {
                    let info = n.text(&["INFO", "replication"]);
                    info.contains(&format!("master_port:{via}"))
                        && info.contains("master_link_status:up")
                });
                replica_follows
                    && c.nodes
                        .iter()
                        .all(|n| n.text(&["CLUSTER", "NODES"]).contains(&announced))
            },
        );
    })
    .await;
    let seeds = lock(&cluster).seeds();
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let mut builder = RedisStore::builder().namespace(namespace);
    if !acks {
        builder = builder.without_replica_acks_may_lose_claims_on_failover();
    }
    let store = builder.connect_cluster(&seeds).await.expect("connect");
    let engine = Idempotency::builder(store).without_reconciler().build();
    let c = cluster.clone();
    Scene {
        engine: engine.clone(),
        proxy,
        offsets: Box::new(move || offsets(&lock(&c).nodes[dead])),
        fail: Box::new(move || {
            Box::pin(async move {
                let c = cluster.clone();
                blocking(move || {
                    let mut c = lock(&c);
                    c.nodes[dead].kill();
                    c.wait_failover(dead, 3, Duration::from_secs(60));
                    // Until the dead node is back (as the new master's replica), the new
                    // master has no replica, and the store refuses its claims rather than
                    // take writes a second failover would lose.
                    c.nodes[dead].restart();
                    c.wait_healthy(3, Duration::from_secs(60));
                })
                .await;
                (engine, Box::new(cluster) as Servers)
            })
        }),
    }
}

async fn failover(flavor: Flavor, on_cluster: bool) {
    let acks = std::env::var("IDEMPOTENCY_REPLICA_ACKS").map_or(true, |v| v != "off");
    let namespace = unique_name("failover");
    let scene = if on_cluster {
        cluster(flavor, &namespace, acks).await
    } else {
        single(flavor, &namespace, acks).await
    };
    let Scene {
        engine,
        proxy,
        offsets,
        fail,
    } = scene;
    let offsets = Arc::new(offsets);
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
    let (t, o, at) = (tally.clone(), offsets.clone(), calls(&tally));
    blocking(move || {
        wait_until(
            "calls while the replica lags",
            Duration::from_secs(60),
            || {
                let (reached, acked) = o();
                calls(&t) >= at + 200 && reached > acked
            },
        )
    })
    .await;
    // The link fails with what it held back, then the master dies.
    proxy.cut();
    killed.store(true, Ordering::SeqCst);
    let (promoted, servers) = fail().await;
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
    drop(servers);

    let runs = lock(&tally.runs);
    let duplicates: u64 = runs.values().map(|n| n.saturating_sub(1)).sum();
    let lost = lost.load(Ordering::Relaxed);
    println!(
        "FAILOVER server={flavor:?} cluster={on_cluster} acks={} keys={used} answered_before_kill={} duplicates={duplicates} lost_completions={lost} (during: {during}; all: {})",
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
    failover(Flavor::Redis, false).await;
}

#[cfg_attr(no_valkey, ignore = "needs valkey-server (see tests/build.rs)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_promoted_loses_no_claim_valkey() {
    failover(Flavor::Valkey, false).await;
}

/// The same on a 3+3 cluster: one shard's replication lags, its master dies, the cluster
/// promotes the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_cluster_replica_promoted_loses_no_claim_redis() {
    failover(Flavor::Redis, true).await;
}

#[cfg_attr(no_valkey, ignore = "needs valkey-server (see tests/build.rs)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_cluster_replica_promoted_loses_no_claim_valkey() {
    failover(Flavor::Valkey, true).await;
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
                    now: SystemClock.now(),
                    lease: Duration::from_secs(60),
                    token: Token(1),
                    ..idempotency_tests::raw::claim_request(key)
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
