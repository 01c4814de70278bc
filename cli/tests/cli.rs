//! `idempotency-admin` against a SQLite file, a PostgreSQL schema, one Redis and a Redis Cluster
//! (servers the test starts, a namespace of its own): records made through the library, then
//! inspected, listed, settled (fenced), purged and counted through the binary.

use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use idempotency::clock::{Clock, SystemClock};
use idempotency::key::{Key, Secret};
use idempotency::store::{
    Claim, ClaimRequest, Completion, Fenced, PostgresStore, RedisStore, SqliteStore, Store,
    StoredResponse, Token,
};
use idempotency::Caller;
use idempotency_tests::redis_servers::{shared_cluster, shared_server};
use serde_json::Value;

/// The store the binary is pointed at: `--store` and, for Redis, the namespace.
#[derive(Clone, Copy)]
struct Target<'a> {
    url: &'a str,
    namespace: Option<&'a str>,
}

fn admin(store: Target<'_>, args: &[&str]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_idempotency-admin"));
    cmd.arg("--store").arg(store.url);
    if let Some(ns) = store.namespace {
        cmd.arg("--namespace").arg(ns);
    }
    cmd.args(args).output().expect("run idempotency-admin")
}

fn json(store: Target<'_>, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = admin(store, &all);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn key(n: u64) -> Key {
    Key::for_call(
        &Secret::demo(),
        &Caller::new("acme", "alice"),
        "charge_card",
        &n,
    )
    .expect("key")
}

/// The stuck claim's tool's window.
const DAY: Duration = Duration::from_secs(24 * 3600);

/// One claim of a 24 h tool whose lease ended a minute ago (unsettled) and one of a 15 m tool
/// completed an hour ago, whose window ended 45 m ago (purgeable after a 30 m retention). Returns
/// their references.
async fn seed(store: &Arc<dyn Store>) -> (String, String) {
    let now = SystemClock.now();
    let claim = |k: Key, at: idempotency::clock::Timestamp, window: Duration| {
        let store = store.clone();
        async move {
            let req = ClaimRequest {
                key: k,
                tenant: "acme",
                subject: Some("alice"),
                tool: "charge_card",
                fingerprint: None,
                now: at,
                lease: Duration::from_secs(30),
                window,
                token: Token(at.as_millis()),
            };
            match store.claim(&req).await.expect("claim") {
                Claim::New { reference, token } => (reference, token),
                other => panic!("{other:?}"),
            }
        }
    };
    let hour_ago = now - Duration::from_secs(3600);
    let (stuck, _) = claim(key(1), now - Duration::from_secs(90), DAY).await;
    let (done, token) = claim(key(2), hour_ago, Duration::from_secs(900)).await;
    let answer = StoredResponse {
        ok: true,
        body: "{\"charge\":2}".into(),
    };
    store
        .complete(&Completion {
            key: key(2),
            token,
            response: &answer,
            now: hour_ago,
            outbox: &[],
        })
        .await
        .expect("complete");
    (stuck.to_string(), done.to_string())
}

async fn scenario(url: Target<'_>, store: Arc<dyn Store>) {
    let (stuck, done) = seed(&store).await;

    let stats = json(url, &["stats"]);
    assert_eq!(stats["records"], 2, "{stats}");
    assert!(stats["oldest_in_flight"].is_string(), "{stats}");

    let record = json(url, &["inspect", &done]);
    assert_eq!(record["state"], "completed", "{record}");
    // Its window ended 45 m ago: what a repeat would find, in the library's own words.
    assert_eq!(record["standing"], "expired", "{record}");
    assert_eq!(
        json(url, &["inspect", &stuck])["standing"],
        "lease_passed",
        "a claim whose lease passed unrenewed"
    );
    let groups = stats["by_tool_and_state"].clone();
    assert_eq!(
        groups,
        serde_json::json!([
            {"tool": "charge_card", "state": "expired", "records": 1},
            {"tool": "charge_card", "state": "lease_passed", "records": 1},
        ]),
        "{stats}"
    );
    // Judged by the store's clock where it has one, and said which.
    let source = record["clock"]["source"].as_str().unwrap_or_default();
    let expected = match url.url.split(':').next() {
        Some("sqlite") => "this machine (SQLite has no server clock)",
        Some("postgres" | "postgresql") => "PostgreSQL server (now())",
        _ => "Redis server (TIME)",
    };
    assert_eq!(source, expected, "{record}");
    // The stored answer as a JSON value, not a string of it.
    assert_eq!(record["answer"], serde_json::json!({"charge": 2}));
    assert_eq!(record["subject"], "alice");
    // Not found: said, on stdout as JSON, with exit status 3.
    let foreign = admin(url, &["--json", "inspect", &done, "--tenant", "globex"]);
    assert_eq!(foreign.status.code(), Some(3));
    let foreign: Value = serde_json::from_slice(&foreign.stdout).expect("JSON");
    assert_eq!(foreign["found"], false, "{foreign}");
    let nowhere = admin(url, &["inspect", "0000000000000000-1"]);
    assert_eq!(nowhere.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&nowhere.stdout).contains("not found"));
    let nowhere = admin(url, &["settle", "0000000000000000-1", "--released"]);
    assert_eq!(nowhere.status.code(), Some(3), "settle of no record");
    // A reference that does not parse is a usage error (2), said before the store is touched.
    let garbled = admin(url, &["inspect", "nonsense"]);
    assert_eq!(garbled.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&garbled.stderr).contains("is not a reference like"));

    let unsettled = json(url, &["unsettled"]);
    let refs: Vec<&str> = unsettled
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["reference"].as_str())
        .collect();
    assert_eq!(refs, [stuck.as_str()], "{unsettled}");
    assert_eq!(
        json(url, &["unsettled", "--older-than", "2m"]),
        Value::Array(vec![])
    );

    // Settled by hand, fenced: a second settlement of the same claim is refused.
    let answer = std::env::temp_dir().join(format!("idem-admin-{}.json", std::process::id()));
    std::fs::write(&answer, "{\"charge\":1}").unwrap();
    let mut settle = vec!["settle", &stuck, "--completed", answer.to_str().unwrap()];
    if url.url.starts_with("sqlite:") {
        // Its lease ended a minute ago by this machine's clock, and SQLite has no other.
        let refused = admin(url, &settle);
        let err = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{err}");
        assert!(
            err.contains("10 min margin") && err.contains("--force"),
            "{err}"
        );
        assert_eq!(json(url, &["inspect", &stuck])["state"], "in_flight");
        settle.push("--force");
    }
    let settled = json(url, &settle);
    assert_eq!(settled["settled"], "completed");
    let again = admin(url, &["settle", &stuck, "--released"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("is not an unsettled claim"));
    std::fs::remove_file(&answer).ok();
    assert_eq!(
        json(url, &["inspect", &stuck])["answer"],
        serde_json::json!({"charge": 1})
    );
    assert_eq!(json(url, &["inspect", &stuck])["standing"], "completed");
    // Replayed for its tool's own window (24 h, from its claim), not a window given here.
    let status = store
        .status("acme", "alice", stuck.parse().expect("a reference"))
        .await
        .expect("status")
        .expect("found");
    let (Some(completed), Some(ends)) = (status.completed_at, status.expires_at) else {
        panic!("settled without times: {status:?}")
    };
    assert_eq!(ends.since(completed), DAY, "{status:?}");

    // Purge: the record whose window ended an hour ago, past a 30 m retention.
    assert_eq!(
        json(url, &["purge", "--retention", "30m", "--dry-run"])["records"],
        1
    );
    assert_eq!(
        json(url, &["stats"])["records"],
        2,
        "a dry run deletes nothing"
    );
    let dry = admin(url, &["purge", "--retention", "30m", "--dry-run"]);
    assert_eq!(
        String::from_utf8_lossy(&dry.stdout).trim(),
        "would purge 1 record"
    );
    assert_eq!(json(url, &["purge", "--retention", "30m"])["records"], 1);
    let none = admin(url, &["purge", "--retention", "30m"]);
    assert_eq!(
        String::from_utf8_lossy(&none.stdout).trim(),
        "purged 0 records"
    );
    assert_eq!(json(url, &["stats"])["records"], 1);
    assert_eq!(json(url, &["migrate"])["migrated"], true);

    // Text for people, and a clear refusal of a store it cannot open.
    let text = admin(url, &["inspect", &stuck]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("state      completed"));
    let bad = admin(
        Target {
            url: "mysql://x",
            namespace: None,
        },
        &["stats"],
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains(
        "use sqlite:PATH, postgres://…, redis://HOST:PORT or redis+cluster://HOST:PORT,HOST:PORT"
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_sqlite() {
    let path = std::env::temp_dir().join(format!("idem-admin-{}.db", std::process::id()));
    let store = SqliteStore::open(&path).await.expect("open");
    let url = format!("sqlite:{}", path.display());
    scenario(
        Target {
            url: &url,
            namespace: None,
        },
        Arc::new(store.clone()),
    )
    .await;
    store.pool().close().await;
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        std::fs::remove_file(p).ok();
    }
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_postgres() {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let schema = format!("idem_admin_{}", std::process::id());
    let pool = sqlx::PgPool::connect(&base).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&pool)
        .await
        .expect("schema");
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
    // Seeded with times in the past, as the engine's: the store takes them as given (the CLI's
    // own store judges by the database's clock, which is this machine's).
    let store = PostgresStore::connect(&url)
        .await
        .expect("store")
        .trusting_engine_clock();
    scenario(
        Target {
            url: &url,
            namespace: None,
        },
        Arc::new(store),
    )
    .await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await
        .expect("drop");
}

/// A namespace of this test's own on a shared Redis.
fn namespace(what: &str) -> String {
    format!("admin-{what}-{}", std::process::id())
}

/// One Redis the test starts: `redis://HOST:PORT`. Purge there deletes before the native expiry
/// (the record seeded an hour ago expires 48 h after its window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_redis() {
    let url = shared_server().url();
    let ns = namespace("single");
    // Seeded with times in the past, as the engine's: the store takes them as given (the CLI's
    // own store judges by the Redis server's clock, which is this machine's).
    let store = RedisStore::builder()
        .namespace(&ns)
        .trust_engine_clock()
        .connect(&url)
        .await
        .expect("connect to Redis");
    scenario(
        Target {
            url: &url,
            namespace: Some(&ns),
        },
        Arc::new(store),
    )
    .await;
}

/// A 3-master + 3-replica cluster the test starts, by seed nodes:
/// `redis+cluster://HOST:PORT,HOST:PORT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_redis_cluster() {
    let seeds = shared_cluster().seeds();
    let seed_refs: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let url = format!(
        "redis+cluster://{}",
        seeds
            .iter()
            .take(2)
            .map(|s| s.trim_start_matches("redis://"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let ns = namespace("cluster");
    let store = RedisStore::builder()
        .namespace(&ns)
        .trust_engine_clock()
        // A loaded machine's replica may take longer than the default 250 ms.
        .replica_ack_timeout(std::time::Duration::from_secs(2))
        .connect_cluster(&seed_refs)
        .await
        .expect("connect to the cluster");
    scenario(
        Target {
            url: &url,
            namespace: Some(&ns),
        },
        Arc::new(store),
    )
    .await;
    // Another namespace on the same cluster holds no store.
    let other = admin(
        Target {
            url: &url,
            namespace: Some("admin-nobody"),
        },
        &["stats"],
    );
    assert_eq!(other.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&other.stderr).contains("no idempotency store here"));
}

/// A read-only command on a SQLite path with no file says so and creates nothing.
#[test]
fn read_only_commands_never_create_a_sqlite_file() {
    let path = std::env::temp_dir().join(format!("idem-admin-missing-{}.db", std::process::id()));
    let url = format!("sqlite:{}", path.display());
    let target = Target {
        url: &url,
        namespace: None,
    };
    for args in [
        &["stats"][..],
        &["unsettled"],
        &["inspect", "3f9a0c1b2d4e5f60-1"],
        &["purge", "--dry-run"],
    ] {
        let out = admin(target, args);
        assert_eq!(out.status.code(), Some(3), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("no idempotency store here") && err.contains("does not exist"),
            "{err}"
        );
        assert!(!path.exists(), "{args:?} created {}", path.display());
    }
}

/// Connection failures name the target (never its password) and the driver's reason, at once.
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[test]
fn postgres_connection_failures_say_where_and_why() {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let options: sqlx::postgres::PgConnectOptions = base.parse().expect("a URL");
    let (host, port) = (options.get_host().to_owned(), options.get_port());
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let refused_port = closed.local_addr().expect("addr").port();
    drop(closed);
    let cases = [
        (
            format!("postgres://root:hunter2@127.0.0.1:{refused_port}/test"),
            "Connection refused",
        ),
        (
            format!("postgres://root@{host}:{port}/no_such_database_here"),
            "database \"no_such_database_here\" does not exist",
        ),
        (
            format!("postgres://no_such_role_here@{host}:{port}/test"),
            "role \"no_such_role_here\" does not exist",
        ),
    ];
    for (url, why) in cases {
        let started = std::time::Instant::now();
        let out = admin(
            Target {
                url: &url,
                namespace: None,
            },
            &["stats"],
        );
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{url}: {err}");
        assert!(err.contains(why), "{url}: {err}");
        assert!(
            err.contains("cannot connect to postgres://"),
            "{url}: {err}"
        );
        assert!(!err.contains("hunter2"), "the password is printed: {err}");
        assert!(!err.contains("at line"), "{err}");
        assert!(took < Duration::from_secs(2), "{url}: {took:?}");
    }
}

/// A Redis that refuses the connection: said, with the target, at once.
#[test]
fn redis_connection_failures_say_where_and_why() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let url = format!("redis://127.0.0.1:{port}");
    let out = admin(
        Target {
            url: &url,
            namespace: None,
        },
        &["stats"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("Connection refused") && err.contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}
