//! The Redis store against raw Redis and against Powertools for AWS Lambda (Python) on the same
//! server. Starts its own servers: Redis 7.0 and Valkey 9.1 (when the build found a
//! `valkey-server`), each with one replica attached (the store's default then waits for it:
//! `WAIT 1` after each claim and completion; raw does not wait) and again without a replica
//! (`server=<name>/no-replica`). Prints two lines per server that scripts can read:
//!
//! ```text
//! redis server=redis-7.0 fresh_p50_ratio_raw=1.04 fresh_tps32_ratio_raw=0.95 floor_tps32_ratio_raw=0.72 repeat_round_trips=1 cached_repeat_p50_us=2.6 vs_powertools_first=6.1 vs_powertools_replay=7.4
//! redis_bounds server=redis-7.0 vs_powertools_first_max=1.6 vs_powertools_replay_max=4.3 fenced_fresh_p50_ratio_raw=1.03 fenced_tps32_ratio_raw=0.72 fenced_nowait_tps32_ratio_raw=0.72 indexed_fresh_p50_ratio_raw=1.10 indexed_tps32_ratio_raw=0.55
//! ```
//!
//! - `floor_tps32_ratio_raw`: the `fenced_tps32_ratio_raw` of the second line (the cheapest
//!   scripted fence's throughput over raw's); `cached_repeat_p50_us`: p50 of a whole replay
//!   through an engine with its answer cache (the default), which sends nothing to Redis;
//!   `repeat_round_trips` and `vs_powertools_*` are measured with the cache off (`cache(0)`),
//!   the store's own repeat;
//! - `fresh_p50_ratio_raw`: p50 of a fresh call through the store (claim, then complete) over
//!   p50 of the naive two commands (`SET key in_flight NX`, then `SET key answer`) through the
//!   SAME client connection (the store's), samples alternated, one client;
//! - `fresh_tps32_ratio_raw`: fresh calls per second, 32 concurrent clients, store over raw
//!   (the median of paired one-second slices);
//! - `repeat_round_trips`: commands a repeat sends (counted with `MONITOR`, script-internal
//!   commands excluded);
//! - `vs_powertools_first` / `vs_powertools_replay`: Powertools' p50 over ours, whole call
//!   through each library (key derivation, claim, body, completion / the replay): how many times
//!   faster this crate is. `NA` when Powertools cannot be installed from PyPI.
//! - `redis_bounds`, what this Redis and machine allow, measured in the same run:
//!   `vs_powertools_first_max` is Powertools' first call over raw's fresh call (no store can
//!   make a fresh call in less than two single-key commands: a claim before the side effect,
//!   a completion after it), `vs_powertools_replay_max` Powertools' replay over one `GET` round
//!   trip (no replay can be cheaper): the most any store could be faster than Powertools here;
//!   `fenced_*` are the two ratios to raw of the cheapest fresh call with a scripted fence (see
//!   `Bench::floor_fresh`: the raw claim, then a script that only compares the token and sets
//!   the answer, each followed by `WAIT 1 250` when a replica is attached, as the contract then
//!   requires), the floor of any design whose completion is fenced by a script, as every
//!   design on Redis 7 is that keeps the record's state in one place;
//!   `fenced_nowait_tps32_ratio_raw` is that floor without the waits (the same figure without a
//!   replica), what the waits cost; `indexed_fresh_p50_ratio_raw` and
//!   `indexed_tps32_ratio_raw` are that floor with what this
//!   crate's guarantees add at the least: the claim's index entry in the claim's transaction
//!   (crash recovery finds it), the record's expiry and the entry's move in the completion's
//!   script (retention, purge) — the store's commands, without its clock, checks and engine.
//!
//! ```text
//! cargo bench -p idempotency-tests --bench redis
//! ```
//!
//! Environment: `REDIS_URL` (measure that server only, `server=env`), `BENCH_SAMPLES` (latency
//! samples per figure, 2000), `BENCH_SECS` (seconds per side for throughput, 5). Details go to
//! stderr; the Powertools virtualenv is made once under the target directory.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotency::clock::{Clock, SystemClock};
use idempotency::outcome::{ErrorPolicy, Outcome};
use idempotency::store::{
    Claim, ClaimRequest, Completion, Fenced, RecordStore, RedisConnection, RedisStore,
    StoredResponse, Token,
};
use idempotency::tool::Prepared;
use idempotency::{key::Key, Caller, Error, Idempotency};
use idempotency_tests::redis_servers::{valkey_server, wait_until, Flavor, RedisServer};

const RESPONSE: &str = r#"{"charge_id":"ch_3PqR8sT2uV4wX5yZ6a7b","amount":4200,"currency":"EUR"}"#;
const WINDOW: Duration = Duration::from_secs(900);
const CLIENTS: usize = 32;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Bench {
    store: RedisStore,
    conn: RedisConnection,
    namespace: String,
    next: AtomicU64,
    fence: redis::Script,
    fence_indexed: redis::Script,
    /// A replica is attached: the store waits for it, and so does the floor.
    waits: bool,
    /// The floor's connections for writes that wait, as many as the store's (a `WAIT` holds
    /// its connection until the replica answers, so the store spreads them over 8).
    waiting: Vec<redis::aio::MultiplexedConnection>,
    next_waiting: AtomicU64,
}

impl Bench {
    fn key(&self) -> (Key, u64) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        (
            Key::for_call(
                &idempotency::key::Secret::demo(),
                &Caller::new("acme", "bench"),
                "charge_card",
                &n,
            )
            .expect("key"),
            n,
        )
    }

    async fn store_fresh(&self) {
        let (key, n) = self.key();
        let now = SystemClock.now();
        let req = ClaimRequest {
            key,
            tenant: "acme",
            subject: None,
            tool: "charge_card",
            fingerprint: None,
            now,
            lease: Duration::from_secs(30),
            window: WINDOW,
            token: Token(now.as_millis() << 20 | (n as i64 & 0xfffff)),
        };
        let Claim::New { token, .. } = self.store.claim(&req).await.expect("claim") else {
            panic!("not fresh")
        };
        let response = StoredResponse {
            ok: true,
            body: RESPONSE.into(),
        };
        let c = Completion {
            key,
            token,
            response: &response,
            now: SystemClock.now(),
            outbox: &[],
        };
        self.store.complete(&c).await.expect("complete");
    }

    async fn raw_fresh(&self) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let key = format!("{}:raw:{n}", self.namespace);
        let mut conn = self.conn.clone();
        let won: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg("in_flight")
            .arg("NX")
            .query_async(&mut conn)
            .await
            .expect("raw claim");
        assert!(won.is_some(), "not fresh");
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(RESPONSE)
            .query_async(&mut conn)
            .await
            .expect("raw complete");
    }

    /// The floor of any store meeting the contract on this Redis: the raw claim (`SET NX`, here
    /// with the claimant's token as its value), then the smallest completion fenced by that
    /// token. Redis 7 has no conditional `SET` (`IFEQ` came with Redis 8.4 and Valkey 8.1), so a
    /// fence is a script; this one is `GET`, compare, `SET`, nothing else (no server clock, no
    /// index, no expiry, no outbox). With a replica attached (`waits`), each of the two writes
    /// is followed by `WAIT 1 250` on its connection (one of 8, in turn, as the store's), as the
    /// contract then requires of any store (a claim a failover can lose lets a repeat run the body twice); `nowait` leaves
    /// that out, for the line that shows what the wait costs.
    ///
    /// `indexed` adds what this crate's guarantees need beyond the fence, as cheaply as Redis
    /// allows: the claim's entry in a sorted set (one of 256, as the store's shards), written
    /// with the claim in one `MULTI` … `EXEC` (a crashed call is found by it, never by a
    /// `SCAN`), and in the completion's script the record's expiry (`PXAT`, retention) and the
    /// entry's move to its window end (what purge reads). No server clock, no outbox.
    async fn floor_fresh(&self, nowait: bool, indexed: bool) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let key = format!("{}:{{{:02x}}}:floor:{n}", self.namespace, n % 256);
        let index = format!("{}:{{{:02x}}}:floor-index", self.namespace, n % 256);
        let member = &key[key.len().saturating_sub(16)..];
        let token = n.to_be_bytes();
        let waits = self.waits && !nowait;
        let n_waiting = self.next_waiting.fetch_add(1, Ordering::Relaxed) as usize;
        let mut conn = match self.waiting.get(n_waiting % self.waiting.len().max(1)) {
            Some(c) if waits => Conn::Waiting(c.clone()),
            _ => Conn::Shared(self.conn.clone()),
        };
        let mut claim = redis::pipe();
        if indexed {
            claim
                .cmd("MULTI")
                .ignore()
                .cmd("SET")
                .arg(&key)
                .arg(&token[..])
                .arg("NX")
                .ignore()
                .cmd("ZADD")
                .arg(&index)
                .arg("NX")
                .arg(n)
                .arg(member)
                .ignore()
                .cmd("EXEC");
        } else {
            claim.cmd("SET").arg(&key).arg(&token[..]).arg("NX");
        }
        if waits {
            claim.cmd("WAIT").arg(1).arg(250).ignore();
        }
        // The one reply kept: `EXEC`'s (the SET's answer, the ZADD's) or the SET's.
        let won = if indexed {
            let (exec,): ((Option<String>, i64),) =
                claim.query_async(&mut conn).await.expect("floor claim");
            exec.0
        } else {
            let (won,): (Option<String>,) =
                claim.query_async(&mut conn).await.expect("floor claim");
            won
        };
        assert!(won.is_some(), "not fresh");
        let mut complete = redis::pipe();
        if indexed {
            complete
                .cmd("EVALSHA")
                .arg(self.fence_indexed.get_hash())
                .arg(2)
                .arg(&key)
                .arg(&index)
                .arg(&token[..])
                .arg(RESPONSE)
                .arg(4_000_000_000_000u64)
                .arg(n as i64 - (1 << 50))
                .arg(member);
        } else {
            complete
                .cmd("EVALSHA")
                .arg(self.fence.get_hash())
                .arg(1)
                .arg(&key)
                .arg(&token[..])
                .arg(RESPONSE);
        }
        if waits {
            complete.cmd("WAIT").arg(1).arg(250).ignore();
        }
        let (done,): (Option<String>,) = complete
            .query_async(&mut conn)
            .await
            .expect("floor complete");
        assert!(done.is_some(), "fence refused its own token");
    }
}

/// The connection a floor call uses.
enum Conn {
    Shared(RedisConnection),
    Waiting(redis::aio::MultiplexedConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Shared(c) => c.req_packed_command(cmd),
            Conn::Waiting(c) => c.req_packed_command(cmd),
        }
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Shared(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Waiting(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            Conn::Shared(c) => c.get_db(),
            Conn::Waiting(c) => c.get_db(),
        }
    }
}

/// The smallest fenced completion: the record is replaced only if it still holds the token.
const FENCE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                     return redis.call('SET', KEYS[1], ARGV[2]) end return false";

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// [`FENCE`] with the record's expiry and its index entry's move (see [`Bench::floor_fresh`]).
const FENCE_INDEXED: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                             redis.call('SET', KEYS[1], ARGV[2], 'PXAT', ARGV[3]) \
                             redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5]) \
                             return 'OK' end return false";

/// p50s of a fresh call, one client, samples alternated: the store, raw, the floor and the
/// indexed floor (see [`Bench::floor_fresh`]), and one `GET` round trip.
struct Latencies {
    ours: Duration,
    raw: Duration,
    floor: Duration,
    indexed: Duration,
    get: Duration,
}

async fn latencies(b: &Bench, samples: usize) -> Latencies {
    for _ in 0..200 {
        b.store_fresh().await;
        b.raw_fresh().await;
        b.floor_fresh(false, false).await;
        b.floor_fresh(false, true).await;
    }
    let (mut ours, mut raw, mut floor, mut indexed, mut get) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut conn = b.conn.clone();
    let missing = format!("{}:missing", b.namespace);
    for _ in 0..samples {
        let t = Instant::now();
        b.store_fresh().await;
        ours.push(t.elapsed());
        let t = Instant::now();
        b.raw_fresh().await;
        raw.push(t.elapsed());
        let t = Instant::now();
        b.floor_fresh(false, false).await;
        floor.push(t.elapsed());
        let t = Instant::now();
        b.floor_fresh(false, true).await;
        indexed.push(t.elapsed());
        // The round trip's floor: one GET of a missing key on the same connection.
        let t = Instant::now();
        let _: Option<String> = redis::cmd("GET")
            .arg(&missing)
            .query_async(&mut conn)
            .await
            .expect("floor");
        get.push(t.elapsed());
    }
    Latencies {
        ours: p50(ours),
        raw: p50(raw),
        floor: p50(floor),
        indexed: p50(indexed),
        get: p50(get),
    }
}

/// Redis' own time per call of `evalsha` and `set` (`INFO commandstats`) and its main
/// thread's CPU time, to diff around a phase (other clients of the same Redis count too).
async fn server_stats(conn: &RedisConnection) -> [(f64, f64); 3] {
    let mut conn = conn.clone();
    let info: String = redis::cmd("INFO")
        .arg("everything")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let stat = |name: &str| -> (f64, f64) {
        let Some(line) = info
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
        else {
            return (0.0, 0.0);
        };
        let field = |f: &str| {
            line.split([':', ','])
                .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('=')?.parse().ok())
                .unwrap_or(0.0)
        };
        (field("calls"), field("usec"))
    };
    let cpu = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    [
        stat("evalsha"),
        stat("set"),
        (
            0.0,
            (cpu("used_cpu_user_main_thread") + cpu("used_cpu_sys_main_thread")) * 1e6,
        ),
    ]
}

/// This process's CPU time (user + system, all threads) in µs, from `/proc/self/stat`.
fn client_cpu_us() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // utime and stime are fields 14 and 15 (11 and 12 after the name), in ticks of 10 ms.
    (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) * 10_000.0
}

/// Every command's (calls, usec) from `INFO commandstats`.
async fn command_stats(conn: &RedisConnection) -> Vec<(String, f64, f64)> {
    let mut conn = conn.clone();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |f: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('=')?.parse().ok())
                    .unwrap_or(0.0)
            };
            Some((name.to_owned(), field("calls"), field("usec")))
        })
        .collect()
}

/// Per call of a phase of `n` calls: each command's calls and usec between two readings.
fn per_call_commands(
    before: &[(String, f64, f64)],
    after: &[(String, f64, f64)],
    n: f64,
) -> Vec<(String, f64, f64)> {
    after
        .iter()
        .filter(|(name, _, _)| name != "info")
        .map(|(name, calls, usec)| {
            let (c0, u0) = before
                .iter()
                .find(|(b, _, _)| b == name)
                .map_or((0.0, 0.0), |(_, c, u)| (*c, *u));
            (name.clone(), (calls - c0) / n, (usec - u0) / n)
        })
        .filter(|(_, calls, _)| *calls > 0.01)
        .collect()
}

fn mean_commands(slices: &[Vec<(String, f64, f64)>]) -> String {
    let mut names: Vec<&String> = slices.iter().flatten().map(|(n, _, _)| n).collect();
    names.sort();
    names.dedup();
    let k = slices.len().max(1) as f64;
    names
        .iter()
        .map(|name| {
            let (c, u) = slices
                .iter()
                .flatten()
                .filter(|(n, _, _)| n == *name)
                .fold((0.0, 0.0), |(c, u), (_, c1, u1)| (c + c1, u + u1));
            format!("{name} {:.2} {:.2}", c / k, u / k)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

#[derive(Clone, Copy)]
enum Side {
    Store,
    Raw,
    Floor,
    FloorNoWait,
    FloorIndexed,
}

/// Calls per second of one side over `secs`, 32 clients.
async fn rate(b: &Arc<Bench>, side: Side, secs: f64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (b, done) = (b.clone(), done.clone());
        tasks.spawn(async move {
            while Instant::now() < end {
                match side {
                    Side::Store => b.store_fresh().await,
                    Side::Raw => b.raw_fresh().await,
                    Side::Floor => b.floor_fresh(false, false).await,
                    Side::FloorNoWait => b.floor_fresh(true, false).await,
                    Side::FloorIndexed => b.floor_fresh(false, true).await,
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    done.load(Ordering::Relaxed) as f64 / secs
}

/// Throughput ratios to raw (medians of paired one-second slices): the store's, the floor's,
/// the floor's without `WAIT` (the floor's own without a replica); then the store's and raw's
/// mean calls per second.
async fn throughput_ratio(b: &Arc<Bench>, secs: u64) -> ([f64; 4], f64, f64) {
    let (mut ratios, mut floor_ratios, mut nowait_ratios, mut ra, mut rb) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut indexed_ratios = Vec::new();
    let (mut cpu_store, mut cpu_raw, mut cpu_floor) = (0.0, 0.0, 0.0);
    let (mut client_store, mut client_raw, mut client_floor) = (0.0, 0.0, 0.0);
    let (mut cmds_store, mut cmds_floor) = (Vec::new(), Vec::new());
    for _ in 0..secs.max(1) {
        let (c0, s0) = (client_cpu_us(), command_stats(&b.conn).await);
        let t0 = server_stats(&b.conn).await[2].1;
        let a = rate(b, Side::Store, 1.0).await;
        let t1 = server_stats(&b.conn).await[2].1;
        let (c1, s1) = (client_cpu_us(), command_stats(&b.conn).await);
        let r = rate(b, Side::Raw, 1.0).await;
        let t2 = server_stats(&b.conn).await[2].1;
        let (c2, s2) = (client_cpu_us(), command_stats(&b.conn).await);
        let f = rate(b, Side::Floor, 1.0).await;
        let t3 = server_stats(&b.conn).await[2].1;
        let (c3, s3) = (client_cpu_us(), command_stats(&b.conn).await);
        client_store += (c1 - c0) / a;
        client_raw += (c2 - c1) / r;
        client_floor += (c3 - c2) / f;
        cmds_store.push(per_call_commands(&s0, &s1, a));
        cmds_floor.push(per_call_commands(&s2, &s3, f));
        let nowait = if b.waits {
            rate(b, Side::FloorNoWait, 1.0).await
        } else {
            f
        };
        indexed_ratios.push(rate(b, Side::FloorIndexed, 1.0).await / r);
        cpu_store += (t1 - t0) / a;
        cpu_raw += (t2 - t1) / r;
        cpu_floor += (t3 - t2) / f;
        ratios.push(a / r);
        floor_ratios.push(f / r);
        nowait_ratios.push(nowait / r);
        ra.push(a);
        rb.push(r);
    }
    let n = secs.max(1) as f64;
    eprintln!(
        "Redis main thread CPU per fresh call, {CLIENTS} clients: store {:.1} us, raw {:.1} us, floor {:.1} us",
        cpu_store / n,
        cpu_raw / n,
        cpu_floor / n
    );
    eprintln!(
        "this process's CPU per fresh call, {CLIENTS} clients: store {:.1} us, raw {:.1} us, floor {:.1} us",
        client_store / n,
        client_raw / n,
        client_floor / n
    );
    eprintln!(
        "Redis commands per store call (calls, us): {}",
        mean_commands(&cmds_store)
    );
    eprintln!(
        "Redis commands per floor call (calls, us): {}",
        mean_commands(&cmds_floor)
    );
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    (
        [
            median(ratios),
            median(floor_ratios),
            median(nowait_ratios),
            median(indexed_ratios),
        ],
        mean(&ra),
        mean(&rb),
    )
}

/// Round trips a repeat takes, from `MONITOR`: each command of the store's (lines of
/// script-internal commands say `lua]`), a transaction once.
async fn repeat_round_trips(b: &Bench, engine: &Idempotency, url: &str) -> f64 {
    let caller = Caller::new("acme", "bench");
    call(engine, &caller, u64::MAX).await;
    let (host, port) = host_port(url);
    let mut monitor = Command::new("redis-cli")
        .args(["-h", &host, "-p", &port.to_string(), "MONITOR"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-cli MONITOR");
    let mut lines = BufReader::new(monitor.stdout.take().expect("stdout")).lines();
    // MONITOR answers OK once it is on.
    let ok = lines.next();
    assert!(matches!(ok, Some(Ok(ref l)) if l.contains("OK")), "{ok:?}");
    const N: u64 = 200;
    for _ in 0..N {
        let out = call(engine, &caller, u64::MAX).await;
        assert!(out.replayed);
    }
    // A marker command ends the count.
    let mut conn = b.conn.clone();
    let marker = format!("{}:end-of-count", b.namespace);
    let _: Option<String> = redis::cmd("GET")
        .arg(&marker)
        .query_async(&mut conn)
        .await
        .expect("marker");
    // A transaction is sent in one write and answered in one (MONITOR shows `MULTI`, its
    // commands, `EXEC`): one round trip.
    let (mut count, mut in_transaction) = (0u64, false);
    for line in lines {
        let line = line.expect("monitor line");
        if line.contains(&marker) {
            break;
        }
        if line.ends_with("\"MULTI\"") {
            count += 1;
            in_transaction = true;
        } else if line.ends_with("\"EXEC\"") {
            in_transaction = false;
        } else if line.contains(&b.namespace) && !line.contains("lua]") && !in_transaction {
            count += 1;
        }
    }
    monitor.kill().ok();
    monitor.wait().ok();
    count as f64 / N as f64
}

fn host_port(url: &str) -> (String, u16) {
    let rest = url.trim_start_matches("redis://");
    let rest = rest.split('/').next().unwrap_or(rest);
    let rest = rest.rsplit('@').next().unwrap_or(rest);
    match rest.rsplit_once(':') {
        Some((h, p)) => (h.to_owned(), p.parse().unwrap_or(6379)),
        None => (rest.to_owned(), 6379),
    }
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct Wrapper(#[from] Error);

#[derive(serde::Serialize)]
struct Order {
    id: u64,
    amount: u64,
}

async fn call(engine: &Idempotency, caller: &Caller, id: u64) -> Outcome<String, Wrapper> {
    let prepared = Prepared::call(
        caller,
        &idempotency_tests::CHARGE_CARD,
        &Order { id, amount: 4200 },
    )
    .expect("key");
    engine
        .execute(prepared, ErrorPolicy::retryable(), async move {
            Ok(RESPONSE.to_owned())
        })
        .await
}

/// p50 of a whole first call and of its replay through the engine (as Powertools measures its
/// decorated function).
async fn engine_p50(engine: &Idempotency, samples: usize, who: &str) -> (Duration, Duration) {
    let caller = Caller::new("acme", who);
    for i in 0..200 {
        call(engine, &caller, 1_000_000_000 + i).await;
    }
    let mut first = Vec::new();
    for i in 0..samples as u64 {
        let t = Instant::now();
        let out = call(engine, &caller, i).await;
        first.push(t.elapsed());
        assert!(!out.replayed && out.result.is_ok());
    }
    let mut replay = Vec::new();
    for i in 0..samples as u64 {
        let t = Instant::now();
        let out = call(engine, &caller, i).await;
        replay.push(t.elapsed());
        assert!(out.replayed);
    }
    (p50(first), p50(replay))
}

/// Powertools' p50s in µs, from `powertools_redis.py` in a virtualenv under the target
/// directory (made and filled from PyPI on first use); `None` when that fails.
fn powertools(url: &str, samples: usize) -> Option<(f64, f64)> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/powertools_redis.py");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let venv = target.join("powertools-venv");
    let python = venv.join("bin/python");
    let ready = || {
        Command::new(&python)
            .args(["-c", "import aws_lambda_powertools, redis, boto3"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ready() {
        eprintln!(
            "(installing aws-lambda-powertools, redis and boto3 from PyPI into {})",
            venv.display()
        );
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
        let installed = made
            && Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "aws-lambda-powertools",
                    "redis",
                    "boto3",
                ])
                .status()
                .is_ok_and(|s| s.success());
        if !installed || !ready() {
            eprintln!("(Powertools could not be installed from PyPI: vs_powertools_* = NA)");
            return None;
        }
    }
    let out = Command::new(&python)
        .args(["-W", "ignore"])
        .arg(&script)
        .env("REDIS_URL", url)
        .env("BENCH_SAMPLES", samples.to_string())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("powertools "))?;
    eprintln!("{line}");
    let field = |name: &str| -> Option<f64> {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
    };
    Some((field("first_p50_us")?, field("replay_p50_us")?))
}

async fn cleanup(conn: &RedisConnection, namespace: &str) {
    let mut conn = conn.clone();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{namespace}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("scan");
        if !keys.is_empty() {
            let _: i64 = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(&mut conn)
                .await
                .expect("unlink");
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

/// One server's two lines (see the top of this file).
async fn measure(url: &str, (label, waits): (&str, bool), samples: usize, secs: u64) -> String {
    let namespace = format!("bench-{}", std::process::id());
    let store = RedisStore::builder()
        .namespace(&namespace)
        .connect(url)
        .await
        .expect("connect to the server");
    let conn = store.connection();
    let b = Arc::new(Bench {
        store: store.clone(),
        conn: conn.clone(),
        namespace: namespace.clone(),
        next: AtomicU64::new(0),
        fence: redis::Script::new(FENCE),
        fence_indexed: redis::Script::new(FENCE_INDEXED),
        waits,
        waiting: if waits {
            let client = redis::Client::open(url).expect("the server's URL");
            let mut conns = Vec::new();
            for _ in 0..8 {
                conns.push(
                    client
                        .get_multiplexed_async_connection()
                        .await
                        .expect("a connection"),
                );
            }
            conns
        } else {
            Vec::new()
        },
        next_waiting: AtomicU64::new(0),
    });
    // The floor sends its fence by hash in a pipeline (beside WAIT): load it first.
    for script in [FENCE, FENCE_INDEXED] {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query_async(&mut conn.clone())
            .await
            .expect("SCRIPT LOAD");
    }
    eprintln!("load average at start: {}", load());
    // For a profiler (`perf record`): only the store's fresh calls, 32 clients, this long.
    if let Some(only) = std::env::var("BENCH_STORE_ONLY_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        let (c0, t0) = (client_cpu_us(), server_stats(&conn).await[2].1);
        let calls = rate(&b, Side::Store, only).await * only;
        let (c1, t1) = (client_cpu_us(), server_stats(&conn).await[2].1);
        eprintln!(
            "store only: {:.0} fresh calls/s, this process {:.1} us and Redis' main thread {:.1} us per call",
            calls / only,
            (c1 - c0) / calls,
            (t1 - t0) / calls
        );
        cleanup(&conn, &namespace).await;
        return String::new();
    }
    let before = server_stats(&conn).await;
    let lat = latencies(&b, samples).await;
    let after = server_stats(&conn).await;
    let Latencies {
        ours,
        raw,
        floor,
        indexed,
        get,
    } = lat;
    eprintln!("fresh p50, 1 client: store {ours:?}, raw SET NX + SET {raw:?}, floor SET NX + fence script {floor:?}; one GET round trip {get:?}");
    let per_call = |i: usize| (after[i].1 - before[i].1) / (after[i].0 - before[i].0).max(1.0);
    eprintln!(
        "Redis time per call (commandstats, this phase): evalsha {:.2} us, set {:.2} us (set includes the scripts' own); Redis main thread CPU {:.0} us per store+raw+floor+GET round",
        per_call(0),
        per_call(1),
        (after[2].1 - before[2].1) / samples as f64,
    );
    // Memory of one completed record, and of one raw key with the same answer.
    let reference = Key::for_call(
        &idempotency::key::Secret::demo(),
        &Caller::new("acme", "bench"),
        "charge_card",
        &0u64,
    )
    .expect("key")
    .reference(1)
    .to_string();
    let record = format!("{namespace}:{{{}}}:r:{}", &reference[..2], &reference[..16]);
    let mut c = conn.clone();
    let bytes: Option<i64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&record)
        .query_async(&mut c)
        .await
        .expect("memory usage");
    let raw_bytes: Option<i64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(format!("{namespace}:raw:1"))
        .query_async(&mut c)
        .await
        .expect("memory usage");
    eprintln!("bytes of one completed record: store {bytes:?}, raw key {raw_bytes:?}");
    let ([tps_ratio, floor_tps_ratio, nowait_tps_ratio, indexed_tps_ratio], tps_ours, tps_raw) =
        throughput_ratio(&b, secs).await;
    eprintln!(
        "fresh calls/s, {CLIENTS} clients: store {tps_ours:.0}, raw {tps_raw:.0}; load average {}",
        load()
    );
    // The store's own repeat (no answer cache), then the engine as it ships (with it).
    let engine = Idempotency::builder(store.clone())
        .without_reconciler()
        .cache(0)
        .build();
    let trips = repeat_round_trips(&b, &engine, url).await;
    let (first, replay) = engine_p50(&engine, samples, "bench-engine").await;
    let cached = Idempotency::builder(store.clone())
        .without_reconciler()
        .build();
    let (_, cached_replay) = engine_p50(&cached, samples, "bench-cached").await;
    eprintln!(
        "engine p50: first call {first:?}, replay {replay:?}, replay from the cache {cached_replay:?}; load average {}",
        load()
    );
    cleanup(&conn, &namespace).await;
    let pt = tokio::task::spawn_blocking({
        let url = url.to_owned();
        move || powertools(&url, samples)
    })
    .await
    .ok()
    .flatten();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (vs_first, vs_replay, max_first, max_replay, vs_cached) = match pt {
        Some((f, r)) => (
            format!("{:.1}", f / us(first)),
            format!("{:.1}", r / us(replay)),
            format!("{:.1}", f / us(raw)),
            format!("{:.1}", r / us(get)),
            format!("{:.0}", r / us(cached_replay)),
        ),
        None => (
            "NA".into(),
            "NA".into(),
            "NA".into(),
            "NA".into(),
            "NA".into(),
        ),
    };
    eprintln!("Powertools' replay over the cached replay: {vs_cached}");
    [
        format!(
            "redis server={label} fresh_p50_ratio_raw={:.2} fresh_tps32_ratio_raw={:.2} floor_tps32_ratio_raw={:.2} repeat_round_trips={} cached_repeat_p50_us={:.2} vs_powertools_first={vs_first} vs_powertools_replay={vs_replay}",
            ours.as_secs_f64() / raw.as_secs_f64(),
            tps_ratio,
            floor_tps_ratio,
            if trips.fract() == 0.0 { format!("{trips:.0}") } else { format!("{trips:.2}") },
            us(cached_replay),
        ),
        format!(
            "redis_bounds server={label} vs_powertools_first_max={max_first} vs_powertools_replay_max={max_replay} fenced_fresh_p50_ratio_raw={:.2} fenced_tps32_ratio_raw={:.2} fenced_nowait_tps32_ratio_raw={:.2} indexed_fresh_p50_ratio_raw={:.2} indexed_tps32_ratio_raw={:.2}",
            floor.as_secs_f64() / raw.as_secs_f64(),
            floor_tps_ratio,
            nowait_tps_ratio,
            indexed.as_secs_f64() / raw.as_secs_f64(),
            indexed_tps_ratio,
        ),
    ]
    .join("\n")
}

/// A Redis or Valkey of the bench's own, with one replica attached or none.
fn servers(flavor: Flavor, replica: bool) -> (RedisServer, Option<RedisServer>) {
    let primary = RedisServer::start_flavor(flavor);
    let replica = replica.then(|| {
        let r = RedisServer::start_flavor(flavor);
        r.node
            .cmd(&["REPLICAOF", "127.0.0.1", &primary.node.port.to_string()])
            .expect("REPLICAOF");
        wait_until("the replica to be online", Duration::from_secs(30), || {
            let info = primary.node.text(&["INFO", "replication"]);
            info.contains("connected_slaves:1") && info.contains("state=online")
        });
        // And acknowledges a write: once, its first acknowledgement came later than the store's
        // 250 ms after the link was reported online, and the bench's first claim was refused.
        let mut conn = redis::Client::open(primary.node.url())
            .and_then(|c| c.get_connection())
            .expect("primary");
        let ((), acked): ((), i64) = redis::pipe()
            .cmd("SET")
            .arg("bench:replicated")
            .arg(1)
            .cmd("WAIT")
            .arg(1)
            .arg(10_000)
            .query(&mut conn)
            .expect("SET, WAIT");
        assert_eq!(acked, 1, "the replica never acknowledged a write");
        r
    });
    (primary, replica)
}

fn main() {
    let samples = env("BENCH_SAMPLES", 2_000) as usize;
    let secs = env("BENCH_SECS", 5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if let Ok(url) = std::env::var("REDIS_URL") {
        println!(
            "{}",
            rt.block_on(measure(&url, ("env", false), samples, secs))
        );
        return;
    }
    let mut flavors = vec![(Flavor::Redis, "redis-7.0")];
    if valkey_server().is_some() {
        flavors.push((Flavor::Valkey, "valkey-9.1"));
    } else {
        eprintln!("(no valkey-server found at build time: the Valkey lines are left out)");
    }
    for (flavor, name) in flavors {
        // The default: a replica attached, so claims and completions wait for it.
        for replica in [true, false] {
            let (primary, _replica) = servers(flavor, replica);
            let label = if replica {
                name.to_owned()
            } else {
                format!("{name}/no-replica")
            };
            println!(
                "{}",
                rt.block_on(measure(&primary.url(), (&label, replica), samples, secs))
            );
        }
    }
}
