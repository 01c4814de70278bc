//! How close to the raw SQL a fresh call on PostgreSQL can come, and what each part of the store
//! costs: four sides, each against the `stores` bench's raw pair, in one process, one pool and
//! one schema, so that all see the same machine.
//!
//! * `store`: a fresh call through the `Store` trait (the claim that also answers a repeat in
//!   the same round trip, then the completion);
//! * `bare`: the claim's insert alone, with the parameters the claim binds, which cannot answer a
//!   repeat, then the store's completion;
//! * `row`: the store's row inserted with two parameters (ref and key_rest; the rest written into
//!   the statement) and updated as the raw SQL updates its own (`SET response = $2 WHERE ref =
//!   $1`): the floor of the table itself, with none of the store's logic.
//!
//! One client: median latency of calls alternating in blocks of 25. 32 clients (the pool's
//! size): calls per second in one-second slices, the sides in rotating order, the median of each
//! round's ratio to raw. Prints, for scripts:
//!
//! ```text
//! pg_floor clients=1 store_p50_ratio=1.07 bare_p50_ratio=1.03 row_p50_ratio=1.01
//! pg_floor clients=32 store_tput_ratio=0.88 bare_tput_ratio=0.93 row_tput_ratio=0.95
//! ```
//!
//! ```text
//! DATABASE_URL=postgres://root@127.0.0.1:5432/test cargo bench -p idempotency-tests --bench pg_floor
//! ```
//!
//! Environment: `FLOOR_SECS` (rounds of one-second slices, 30), `FLOOR_SAMPLES` (latency samples
//! per side, 2000), `FLOOR_SERVER_LOG` (see below).
//!
//! With `FLOOR_SERVER_LOG` set to the server's log file (readable by this process; the role must
//! be allowed to set `log_min_duration_statement`, as a superuser is), it also times each
//! statement as the server does: one connection with `log_min_duration_statement = 0`, the
//! sides' calls alternating in blocks, and the median of each statement's `bind` and `execute`
//! durations from the log (µs, the log's resolution; the commit, at the protocol's `Sync`, is in
//! neither). The server's time is what the store adds beyond the raw SQL's that no client change
//! can take back. Prints:
//!
//! ```text
//! pg_floor server_us raw_insert=55 raw_update=49 store_claim=78 store_complete=58 bare_insert=65 row_insert=62 row_update=49
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotency::key::Key;
use idempotency::store::{Claim, Fenced, PostgresStore, Store, StoredResponse, Token};
use idempotency_tests::pg::TestSchema;
use idempotency_tests::raw::{self, key, now, RESPONSE};
use sqlx::PgPool;

/// The claim's insert as a store with no clock offset binds it (`$1` ref, `$2` key_rest, `$3`
/// tenant, `$4` tool, `$5` fingerprint, `$6` lease length, `$7` token, `$8` subject, `$9`
/// window), without the part that answers a repeat.
const BARE_INSERT: &str = "INSERT INTO idempotency_records \
     (ref, token, claimed_at, window_s, lease_or_settled_at, generation, state, key_rest, tenant, subject, tool, fingerprint) \
     VALUES ($1, $7, (date_part('epoch', statement_timestamp()) * 1000)::BIGINT, $9, \
     (date_part('epoch', statement_timestamp()) * 1000)::BIGINT + $6, 1, 0, $2, $3, $8, $4, $5) \
     ON CONFLICT (ref) DO NOTHING RETURNING 1";
/// The store's row with two parameters, and the raw SQL's update of it.
const ROW_INSERT: &str = "INSERT INTO idempotency_records \
     (ref, token, claimed_at, window_s, lease_or_settled_at, generation, state, key_rest, tenant, subject, tool, fingerprint) \
     VALUES ($1, 1, 1796000000000, 900, 1796000030000, 1, 0, $2, 'acme', '', 'charge_card', ''::BYTEA) \
     ON CONFLICT (ref) DO NOTHING RETURNING 1";
const ROW_UPDATE: &str = "UPDATE idempotency_records SET response = $2 WHERE ref = $1";

const SIDES: [Side; 4] = [Side::Raw, Side::Store, Side::Bare, Side::Row];
const BLOCK: usize = 25;

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Raw,
    Store,
    Bare,
    Row,
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ref_of(k: &Key) -> i64 {
    i64::from_be_bytes(k.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// What every side's calls share.
struct Bench {
    pool: PgPool,
    store: Arc<dyn Store>,
    next: AtomicU64,
    response: StoredResponse,
}

impl Bench {
    /// One fresh call of `side`, on a key no side has used.
    async fn call(&self, side: Side) {
        let k = key(self.next.fetch_add(1, Ordering::Relaxed));
        match side {
            Side::Raw => {
                let won: Option<Vec<u8>> = sqlx::query_scalar(raw::CLAIM)
                    .bind(&k.as_bytes()[..])
                    .bind("acme")
                    .bind("charge_card")
                    .bind(now().as_millis())
                    .fetch_optional(&self.pool)
                    .await
                    .expect("raw insert");
                assert!(won.is_some(), "raw key was not fresh");
                sqlx::query(raw::COMPLETE)
                    .bind(&k.as_bytes()[..])
                    .bind(RESPONSE)
                    .execute(&self.pool)
                    .await
                    .expect("raw update");
            }
            Side::Store => {
                let req = raw::claim_request(k);
                let claim = self.store.claim(&req).await;
                let Ok(Claim::New { token, .. }) = claim else {
                    panic!("not a fresh claim: {claim:?}")
                };
                self.complete(k, token).await;
            }
            Side::Bare => {
                let row = sqlx::query(BARE_INSERT)
                    .bind(ref_of(&k))
                    .bind(&k.as_bytes()[8..])
                    .bind("acme")
                    .bind("charge_card")
                    .bind(&[][..] as &[u8])
                    .bind(30_000i64)
                    .bind(1i64)
                    .bind("")
                    .bind(900i32)
                    .fetch_optional(&self.pool)
                    .await
                    .expect("bare insert");
                assert!(row.is_some(), "bare key was not fresh");
                self.complete(k, Token(1)).await;
            }
            Side::Row => {
                let row = sqlx::query(ROW_INSERT)
                    .bind(ref_of(&k))
                    .bind(&k.as_bytes()[8..])
                    .fetch_optional(&self.pool)
                    .await
                    .expect("row insert");
                assert!(row.is_some(), "row key was not fresh");
                let done = sqlx::query(ROW_UPDATE)
                    .bind(ref_of(&k))
                    .bind(RESPONSE)
                    .execute(&self.pool)
                    .await
                    .expect("row update");
                assert_eq!(done.rows_affected(), 1);
            }
        }
    }

    async fn complete(&self, key: Key, token: Token) {
        let c = raw::completion(key, token, &self.response);
        self.store.complete(&c).await.expect("complete");
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Calls per second of `side` with `clients` clients for one second.
async fn rate(bench: &Arc<Bench>, side: Side, clients: usize) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(1);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (bench, done) = (bench.clone(), done.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                bench.call(side).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("a client");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    if idempotency_tests::pg::database_url().is_none() {
        eprintln!("pg_floor: DATABASE_URL is not set; nothing measured");
        return;
    }
    let (rounds, samples, clients) = (env("FLOOR_SECS", 30), env("FLOOR_SAMPLES", 2000), 32);
    let schema = TestSchema::create("floor").await.expect("a schema");
    let (pool, store) = raw::pg_pool_and_store(&schema, clients as u32).await;
    let bench = Arc::new(Bench {
        pool,
        store: Arc::new(store),
        next: AtomicU64::new(0),
        response: StoredResponse {
            ok: true,
            body: RESPONSE.into(),
        },
    });

    // One client: latency, in blocks.
    let mut lat: Vec<Vec<f64>> = vec![Vec::new(); SIDES.len()];
    for &side in &SIDES {
        for _ in 0..BLOCK {
            bench.call(side).await;
        }
    }
    while lat[0].len() < samples {
        for (i, &side) in SIDES.iter().enumerate() {
            for _ in 0..BLOCK {
                let t = Instant::now();
                bench.call(side).await;
                lat[i].push(t.elapsed().as_secs_f64());
            }
        }
    }
    let p50: Vec<f64> = lat.into_iter().map(median).collect();
    println!(
        "pg_floor clients=1 store_p50_ratio={:.3} bare_p50_ratio={:.3} row_p50_ratio={:.3}",
        p50[1] / p50[0],
        p50[2] / p50[0],
        p50[3] / p50[0]
    );

    // 32 clients: throughput, one-second slices in rotating order.
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); SIDES.len()];
    for round in 0..rounds {
        let mut r = [0.0; SIDES.len()];
        for j in 0..SIDES.len() {
            let i = (j + round) % SIDES.len();
            r[i] = rate(&bench, SIDES[i], clients).await;
        }
        for i in 1..SIDES.len() {
            ratios[i].push(r[i] / r[0]);
        }
    }
    println!(
        "pg_floor clients={clients} store_tput_ratio={:.3} bare_tput_ratio={:.3} row_tput_ratio={:.3}",
        median(ratios[1].clone()),
        median(ratios[2].clone()),
        median(ratios[3].clone())
    );
    if let Ok(log) = std::env::var("FLOOR_SERVER_LOG") {
        server_times(&schema, &log, bench.response.clone(), samples).await;
    }
    schema.drop_schema().await;
}

/// The statements of a fresh call on each side, as the server's log names them: the start of
/// each statement's text. This bench's own statements are one line each, logged whole; the
/// store's are private to it, so they are named by how they begin (if that changes, the phase
/// fails rather than print nothing).
const STATEMENTS: [(&str, &str); 7] = [
    ("raw_insert", raw::CLAIM),
    ("raw_update", raw::COMPLETE),
    ("store_claim", "WITH ins AS ("),
    (
        "store_complete",
        "UPDATE idempotency_records SET state = $4",
    ),
    ("bare_insert", BARE_INSERT),
    ("row_insert", ROW_INSERT),
    ("row_update", ROW_UPDATE),
];

/// Times every side's statements as the server does (see the module's documentation).
async fn server_times(schema: &TestSchema, log: &str, response: StoredResponse, calls: usize) {
    let options =
        PostgresStore::tune(schema.options()).options([("log_min_duration_statement", "0")]);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("a logged connection");
    let store = PostgresStore::from_pool(pool.clone()).await.expect("store");
    let bench = Bench {
        pool,
        store: Arc::new(store),
        // Keys no earlier phase used.
        next: AtomicU64::new(1 << 40),
        response,
    };
    let start = std::fs::metadata(log)
        .unwrap_or_else(|e| panic!("FLOOR_SERVER_LOG {log}: {e}"))
        .len();
    let mut done = 0;
    while done < calls {
        for &side in &SIDES {
            for _ in 0..BLOCK {
                bench.call(side).await;
            }
        }
        done += BLOCK;
    }
    bench.pool.close().await;
    let mut file = std::fs::File::open(log).expect("the server log");
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(start)).expect("seek");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut file, &mut text).expect("the server log, as text");
    // [bind, execute] durations of each statement, in µs.
    let mut times: Vec<[Vec<f64>; 2]> = STATEMENTS
        .iter()
        .map(|_| [Vec::new(), Vec::new()])
        .collect();
    for line in text.lines() {
        let Some((_, rest)) = line.split_once("duration: ") else {
            continue;
        };
        let Some((ms, rest)) = rest.split_once(" ms  ") else {
            continue;
        };
        let Some((step, rest)) = rest.split_once(' ') else {
            continue;
        };
        let Some((_, sql)) = rest.split_once(": ") else {
            continue;
        };
        let step = match step {
            "bind" => 0,
            "execute" => 1,
            _ => continue,
        };
        if let (Some(i), Ok(ms)) = (
            STATEMENTS
                .iter()
                .position(|(_, head)| sql.starts_with(head)),
            ms.parse::<f64>(),
        ) {
            times[i][step].push(ms * 1000.0);
        }
    }
    let mut line = String::from("pg_floor server_us");
    for ((name, _), [bind, execute]) in STATEMENTS.iter().zip(times) {
        assert!(
            bind.len() >= calls && execute.len() >= calls,
            "the server log {log} timed {} binds and {} executions of {name}, not {calls}: is it \
             the server's log, and may this role set log_min_duration_statement?",
            bind.len(),
            execute.len()
        );
        line += &format!(" {name}={:.0}", median(bind) + median(execute));
    }
    println!("{line}");
}
