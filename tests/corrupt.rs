//! Corrupt records on every store that keeps bytes (a SQLite file, PostgreSQL, one Redis, a Redis
//! Cluster): garbage in each stored field of one completed record. A repeat of that call and the
//! status lookup say the record cannot be read, that retrying will not help, and name the
//! reference; nothing runs (side effects are counted at the far side); other records keep
//! working. The memory store keeps typed values, so it has no bytes to damage.
//!
//! A field whose garbage is indistinguishable from a value (a token, a tenant that reads as
//! another tenant, a key_rest of 24 bytes that reads as another key's) is not listed: the stores
//! cannot tell, and answer as for that value.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::clock::{ManualClock, Timestamp};
use idempotency::outcome::{ErrorPolicy, Failure, Outcome};
use idempotency::store::{RedisConnection, RedisStore, SqliteStore, Store, StoreError};
use idempotency::tool::{Prepared, ToolSpec};
use idempotency::{Caller, Error, Idempotency, Reference};
use idempotency_tests::pg::{unique_name, TestSchema};
use idempotency_tests::redis_servers::{shared_cluster, shared_server};

const T0: i64 = 1_796_000_000_000;
/// A tool whose name is 11 bytes long (the Redis offsets below count on it).
const SPEC: ToolSpec = ToolSpec::new("charge_card", Duration::from_secs(24 * 3600));

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
enum ToolError {
    #[error("{0}")]
    Wrapper(String),
}

impl From<Error> for ToolError {
    fn from(e: Error) -> Self {
        ToolError::Wrapper(e.advice())
    }
}

/// What a repeat of the damaged call answers.
#[derive(Clone, Copy, Debug)]
enum Repeat {
    /// The record cannot be read: do not retry, ask the operator.
    Unreadable,
    /// The stored answer is not the handler's type (`Error::Replay`): not run again.
    ReplayFails,
    /// The claim does not read the field: the stored answer is replayed.
    Replays,
}

/// What the status lookup answers.
#[derive(Clone, Copy, Debug)]
enum Lookup {
    Corrupt,
    Shown,
}

/// One damage to the record of one call and what it must lead to.
struct Case<D> {
    what: &'static str,
    damage: D,
    repeat: Repeat,
    lookup: Lookup,
}

fn case<D>(what: &'static str, damage: D, repeat: Repeat, lookup: Lookup) -> Case<D> {
    Case {
        what,
        damage,
        repeat,
        lookup,
    }
}

/// An engine on a `ManualClock` and the far side's count of side effects.
struct World {
    engine: Idempotency,
    effects: Arc<AtomicUsize>,
    caller: Caller,
}

impl World {
    fn new(store: Arc<dyn Store>) -> World {
        World {
            // No cache of completed answers: every repeat must read the (damaged) record.
            engine: Idempotency::builder_shared(store)
                .clock(ManualClock::new(Timestamp::from_millis(T0)))
                .without_reconciler()
                .cache(0)
                .build(),
            effects: Arc::default(),
            caller: Caller::new("acme", "alice"),
        }
    }

    /// The reference of the call with argument `n` (the engine's demo secret, generation 1).
    fn reference(&self, n: u64) -> Reference {
        Prepared::call(&self.caller, &SPEC, &n)
            .expect("key")
            .key
            .key(&idempotency::key::Secret::demo())
            .reference(1)
    }

    /// Calls the tool with `n`: the body counts a side effect and answers `n`.
    async fn call(&self, n: u64) -> Outcome<u64, Failure<ToolError>> {
        let effects = self.effects.clone();
        self.engine
            .execute_raw(
                Prepared::call(&self.caller, &SPEC, &n).expect("key"),
                ErrorPolicy::<ToolError>::retryable(),
                async move {
                    effects.fetch_add(1, Ordering::SeqCst);
                    Ok(n)
                },
            )
            .await
    }

    fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }

    /// A call that runs once, then is replayed without running.
    async fn works(&self, n: u64) {
        let before = self.effects();
        let first = self.call(n).await;
        assert!(
            matches!(first.result, Ok(v) if v == n) && !first.replayed,
            "{first:?}"
        );
        let again = self.call(n).await;
        assert!(
            matches!(again.result, Ok(v) if v == n) && again.replayed,
            "{again:?}"
        );
        assert_eq!(self.effects(), before + 1, "the call ran once");
    }

    /// Damages the record of a fresh completed call with `damage` and checks what a repeat and
    /// the status lookup answer.
    async fn check<D>(&self, n: u64, c: &Case<D>, damage: impl AsyncFnOnce(Reference, &D)) {
        let what = c.what;
        let reference = self.reference(n);
        self.works(n).await;
        damage(reference, &c.damage).await;
        let before = self.effects();
        // Twice: every repeat gets the same answer.
        for _ in 0..2 {
            let out = self.call(n).await;
            match c.repeat {
                Repeat::Unreadable => unreadable(what, reference, &out),
                Repeat::ReplayFails => match &out.result {
                    Err(Failure::Wrapper(e @ Error::Replay { .. })) => {
                        assert!(!e.safe_to_retry(), "{what}: {e:?}");
                        assert_eq!(e.reference(), Some(reference), "{what}");
                    }
                    other => panic!("{what}: a repeat answered {other:?}, not a replay failure"),
                },
                Repeat::Replays => assert!(
                    matches!(out.result, Ok(v) if v == n) && out.replayed,
                    "{what}: {out:?}"
                ),
            }
        }
        assert_eq!(self.effects(), before, "{what}: a repeat ran the body");
        let status = self.engine.status(&self.caller, reference).await;
        match c.lookup {
            Lookup::Corrupt => match &status {
                Err(e @ StoreError::Corrupt { .. }) => {
                    assert!(!e.is_transient(), "{what}: {e:?}")
                }
                other => panic!("{what}: the status lookup answered {other:?}, not corrupt"),
            },
            Lookup::Shown => assert!(matches!(status, Ok(Some(_))), "{what}: {status:?}"),
        }
    }

    /// Every case on its own record, then a record nobody damaged still claims, completes and
    /// replays.
    async fn run<D>(&self, cases: &[Case<D>], damage: impl AsyncFn(Reference, &D)) {
        for (i, c) in cases.iter().enumerate() {
            self.check(1000 + i as u64, c, &damage).await;
        }
        self.works(1).await;
    }
}

/// A repeat's answer about a record it cannot read: nothing done, not safe to retry, the
/// reference named, the operator told; the store's error is `Corrupt`, not transient.
fn unreadable(what: &str, reference: Reference, out: &Outcome<u64, Failure<ToolError>>) {
    let Err(Failure::Wrapper(e)) = &out.result else {
        panic!("{what}: a repeat answered {out:?}, not the wrapper's refusal");
    };
    let advice = e.advice();
    assert!(!e.safe_to_retry(), "{what}: {advice}");
    assert!(e.nothing_done(), "{what}: {advice}");
    assert_eq!(e.reference(), Some(reference), "{what}: {advice}");
    assert_eq!(out.reference, Some(reference), "{what}");
    for words in [
        "cannot be read",
        "Do not retry",
        "operator",
        "idempotency-admin",
    ] {
        assert!(
            advice.contains(words),
            "{what}: {words:?} missing in {advice}"
        );
    }
    assert!(
        advice.contains(&reference.to_string()),
        "{what}: the reference is missing in {advice}"
    );
    assert!(!advice.contains("try again shortly"), "{what}: {advice}");
    let source = std::error::Error::source(e).and_then(|s| s.downcast_ref::<StoreError>());
    assert!(
        matches!(source, Some(StoreError::Corrupt { .. })),
        "{what}: {source:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// SQL: each column of `idempotency_records`, by UPDATE.

/// The SQLite columns: wrong-typed values (SQLite keeps whatever it is given) and out-of-range
/// ones. Not listed: `ref` (the record's identity), `token` and `window_ms` (a claim and the
/// status lookup do not read them; the fenced updates and the reconciler do), `tenant` and
/// `subject` (any text is some caller's).
fn sqlite_cases() -> Vec<Case<&'static str>> {
    use Lookup::*;
    use Repeat::*;
    vec![
        case("state 9", "state = 9", Unreadable, Corrupt),
        case("state as text", "state = 'done'", Unreadable, Corrupt),
        case("generation 0", "generation = 0", Unreadable, Corrupt),
        case("generation -3", "generation = -3", Unreadable, Corrupt),
        case(
            "generation past 32 bits",
            "generation = 1 << 40",
            Unreadable,
            Corrupt,
        ),
        case(
            "a 3-byte key_rest",
            "key_rest = x'010203'",
            Unreadable,
            Corrupt,
        ),
        case("key_rest as text", "key_rest = 'abc'", Unreadable, Corrupt),
        case(
            "a 5-byte fingerprint",
            "fingerprint = x'0102030405'",
            Unreadable,
            Corrupt,
        ),
        case(
            "claimed_at as text",
            "claimed_at = 'noon'",
            Unreadable,
            Corrupt,
        ),
        case("ends_at as text", "ends_at = 'later'", Unreadable, Corrupt),
        case(
            "completed_at as text",
            "completed_at = 'then'",
            Unreadable,
            Corrupt,
        ),
        case(
            "completed without completed_at",
            "completed_at = NULL",
            Unreadable,
            Corrupt,
        ),
        case(
            "completed without a response",
            "response = NULL",
            Unreadable,
            Corrupt,
        ),
        case(
            "a response as bytes",
            "response = x'ff00fe'",
            Unreadable,
            Corrupt,
        ),
        case(
            "a response that is not JSON",
            "response = 'not json'",
            ReplayFails,
            Shown,
        ),
        case("tool as bytes", "tool = x'ff00'", Replays, Corrupt),
    ]
}

/// The PostgreSQL columns: the types are enforced, so out-of-range values. Not listed, besides
/// SQLite's: `claimed_at` (any time is a time).
fn postgres_cases() -> Vec<Case<&'static str>> {
    use Lookup::*;
    use Repeat::*;
    vec![
        case("state 9", "state = 9", Unreadable, Corrupt),
        case("generation 0", "generation = 0", Unreadable, Corrupt),
        case("generation -3", "generation = -3", Unreadable, Corrupt),
        case(
            "a 3-byte key_rest",
            "key_rest = '\\x010203'",
            Unreadable,
            Corrupt,
        ),
        case(
            "a 5-byte fingerprint",
            "fingerprint = '\\x0102030405'",
            Unreadable,
            Corrupt,
        ),
        // The claim compares it without adding the window (and replays); the status lookup
        // adds the window in SQL, which overflows: a data exception, not a passing failure.
        case(
            "a settlement time that overflows with the window",
            "lease_or_settled_at = 9223372036854775000",
            Replays,
            Corrupt,
        ),
        case(
            "completed without a response",
            "response = NULL",
            Unreadable,
            Corrupt,
        ),
        case(
            "a response that is not JSON",
            "response = 'not json'",
            ReplayFails,
            Shown,
        ),
    ]
}

fn sql_ref(reference: Reference) -> i64 {
    i64::from_be_bytes(*reference.prefix())
}

#[tokio::test]
async fn sqlite_garbage_in_each_column_is_corrupt() {
    let path = std::env::temp_dir().join(format!("{}.db", unique_name("corrupt")));
    let store = SqliteStore::open(&path).await.expect("open sqlite");
    let pool = store.pool().clone();
    let world = World::new(Arc::new(store));
    world
        .run(&sqlite_cases(), async |reference, set: &&str| {
            let sql = format!("UPDATE idempotency_records SET {set} WHERE ref = $1");
            let done = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(sql_ref(reference))
                .execute(&pool)
                .await
                .expect("damage");
            assert_eq!(done.rows_affected(), 1, "{set}");
        })
        .await;
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        std::fs::remove_file(p).ok();
    }
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn postgres_garbage_in_each_column_is_corrupt() {
    let Some(schema) = TestSchema::create("corrupt").await else {
        return;
    };
    let store = schema.store().await;
    let pool = store.pool().clone();
    let world = World::new(Arc::new(store));
    world
        .run(&postgres_cases(), async |reference, set: &&str| {
            let sql = format!("UPDATE idempotency_records SET {set} WHERE ref = $1");
            let done = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(sql_ref(reference))
                .execute(&pool)
                .await
                .expect("damage");
            assert_eq!(done.rows_affected(), 1, "{set}");
        })
        .await;
    pool.close().await;
    schema.drop_schema().await;
}

// ---------------------------------------------------------------------------------------------
// Redis: the record is one string (`RedisStore`'s `Record`): a 37-byte head `>BI4dddd` (state,
// generation, claimed, ends, completed, window), key_rest (24), token (8), the fingerprint
// (1-byte length), tenant, subject, tool (2-byte lengths), the answer (4-byte length). For a
// call by acme/alice to `charge_card` without a fingerprint the offsets are:
//   0 state, 1 generation, 5 claimed, 13 ends, 21 completed, 29 window, 37 key_rest, 61 token,
//   69 fingerprint length, 70 tenant length, 72 "acme", 76 subject length, 78 "alice",
//   83 tool length, 85 "charge_card", 96 answer length, 100 the answer.

enum Damage {
    /// `SETRANGE` at this offset.
    Overwrite(usize, &'static [u8]),
    /// Keeps only the first bytes.
    Truncate(usize),
    /// Bytes past the last field.
    Append(&'static [u8]),
    /// The key holds a hash instead.
    WrongType,
}

const NAN: &[u8] = &[0xff; 8];
const INFINITY: &[u8] = &[0x7f, 0xf0, 0, 0, 0, 0, 0, 0];

/// Not listed: key_rest (other bytes are another key's record: "reference taken") and the
/// token (any 8 bytes are a token).
fn redis_cases() -> Vec<Case<Damage>> {
    use Damage::*;
    use Lookup::*;
    use Repeat::*;
    vec![
        case("state 9", Overwrite(0, &[9]), Unreadable, Corrupt),
        case("generation 0", Overwrite(1, &[0; 4]), Unreadable, Corrupt),
        case(
            "claimed not a number",
            Overwrite(5, NAN),
            Unreadable,
            Corrupt,
        ),
        case(
            "ends infinite",
            Overwrite(13, INFINITY),
            Unreadable,
            Corrupt,
        ),
        case(
            "completed not a number",
            Overwrite(21, NAN),
            Unreadable,
            Corrupt,
        ),
        case(
            "window not a number",
            Overwrite(29, NAN),
            Unreadable,
            Corrupt,
        ),
        case(
            "a 5-byte fingerprint",
            Overwrite(69, &[5]),
            Unreadable,
            Corrupt,
        ),
        case(
            "a tenant longer than the record",
            Overwrite(70, &[0xff, 0xff]),
            Unreadable,
            Corrupt,
        ),
        case(
            "an empty subject",
            Overwrite(76, &[0, 0]),
            Unreadable,
            Corrupt,
        ),
        case(
            "a tool longer than the record",
            Overwrite(83, &[0xff, 0xff]),
            Unreadable,
            Corrupt,
        ),
        case(
            "an answer longer than the record",
            Overwrite(96, &[0, 0, 0, 9]),
            Unreadable,
            Corrupt,
        ),
        case(
            "an answer that is not UTF-8",
            Overwrite(100, &[0xff]),
            Unreadable,
            Corrupt,
        ),
        case(
            "an answer that is not JSON",
            Overwrite(100, b"x"),
            ReplayFails,
            Shown,
        ),
        case("cut inside the head", Truncate(20), Unreadable, Corrupt),
        case("cut inside the tail", Truncate(90), Unreadable, Corrupt),
        case("bytes past the answer", Append(b"zz"), Unreadable, Corrupt),
        case("a hash instead of a string", WrongType, Unreadable, Corrupt),
    ]
}

/// The record key of `reference` in `namespace` (`{ns}:{XX}:r:<ref prefix in hex>`).
fn record_key(namespace: &str, reference: Reference) -> String {
    let text = reference.to_string();
    format!("{namespace}:{{{}}}:r:{}", &text[..2], &text[..16])
}

async fn damage_redis(mut conn: RedisConnection, key: String, damage: &Damage) {
    let mut run = async |cmd: &redis::Cmd| -> redis::Value {
        cmd.query_async(&mut conn).await.expect("damage")
    };
    match damage {
        Damage::Overwrite(at, bytes) => {
            run(redis::cmd("SETRANGE").arg(&key).arg(*at).arg(*bytes)).await;
        }
        Damage::Truncate(n) => {
            let head = run(redis::cmd("GETRANGE").arg(&key).arg(0).arg(*n - 1)).await;
            let redis::Value::BulkString(head) = head else {
                panic!("GETRANGE answered {head:?}");
            };
            run(redis::cmd("SET").arg(&key).arg(head)).await;
        }
        Damage::Append(bytes) => {
            run(redis::cmd("APPEND").arg(&key).arg(*bytes)).await;
        }
        Damage::WrongType => {
            run(redis::cmd("DEL").arg(&key)).await;
            run(redis::cmd("HSET").arg(&key).arg("state").arg("1")).await;
        }
    }
}

async fn redis_garbage(store: RedisStore, namespace: &str) {
    let conn = store.connection();
    let world = World::new(Arc::new(store));
    world
        .run(&redis_cases(), async |reference, damage: &Damage| {
            let key = record_key(namespace, reference);
            damage_redis(conn.clone(), key, damage).await;
        })
        .await;
}

#[tokio::test]
async fn redis_garbage_in_each_field_is_corrupt() {
    let namespace = unique_name("corrupt");
    let store = RedisStore::builder()
        .namespace(namespace.clone())
        .trust_engine_clock()
        .connect(&shared_server().url())
        .await
        .expect("redis");
    redis_garbage(store, &namespace).await;
}

#[tokio::test]
async fn redis_cluster_garbage_in_each_field_is_corrupt() {
    let namespace = unique_name("corrupt");
    let seeds = shared_cluster().seeds();
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let store = RedisStore::builder()
        .namespace(namespace.clone())
        .trust_engine_clock()
        // A loaded machine's replica may take longer than the default 250 ms to acknowledge.
        .replica_ack_timeout(std::time::Duration::from_secs(2))
        .connect_cluster(&seeds)
        .await
        .expect("redis cluster");
    redis_garbage(store, &namespace).await;
}
