//! `idempotency-admin` pointed at a place with no idempotency store: a missing SQLite path, an
//! application's own SQLite file, a PostgreSQL schema without the library's tables, an empty
//! Redis namespace. Every command but `migrate` says "no idempotency store here" (naming the
//! place), exits 3, and leaves the place byte for byte as it was; read-only commands leave an
//! existing store's file as it was too.

use std::path::{Path, PathBuf};
use std::process::Output;

use idempotency::store::SqliteStore;
use idempotency_tests::redis_servers::shared_server;
use serde_json::Value;

/// Runs the binary with `--store url` and `args`.
fn admin(url: &str, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_idempotency-admin"))
        .arg("--store")
        .arg(url)
        .args(args)
        .output()
        .expect("run idempotency-admin")
}

/// Every command, reading and writing, except `migrate`.
const COMMANDS: &[&[&str]] = &[
    &["stats"],
    &["unsettled"],
    &["inspect", "3f9a0c1b2d4e5f60-1"],
    &["purge", "--dry-run"],
    &["purge"],
    &["settle", "3f9a0c1b2d4e5f60-1", "--released"],
];

/// Runs every command of [`COMMANDS`] against `url` and checks the refusal: exit 3, the words
/// and `place` on stderr, and with `--json` the error object on stdout.
fn refused_everywhere(url: &str, place: &str, extra: &[&str]) {
    for command in COMMANDS {
        let mut args = extra.to_vec();
        args.extend_from_slice(command);
        let out = admin(url, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{command:?}: {err}");
        assert!(
            err.contains("no idempotency store here") && err.contains(place),
            "{command:?}: {err}"
        );
        args.insert(0, "--json");
        let out = admin(url, &args);
        assert_eq!(out.status.code(), Some(3), "{command:?}");
        let json: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
        assert_eq!(json["error"]["kind"], "no_store", "{json}");
        assert_eq!(json["error"]["exit"], 3, "{json}");
        let message = json["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(place), "{json}");
    }
}

/// A temporary directory of this test's own.
fn dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-nostore-{what}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).expect("a directory");
    dir
}

/// The files of `dir` and each one's bytes: what "left as it was" compares.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let path = e.expect("entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).expect("read"))
        })
        .collect();
    files.sort();
    files
}

#[test]
fn a_missing_sqlite_file_is_no_store_and_is_not_created() {
    let dir = dir("missing");
    let path = dir.join("nothing.db");
    let url = format!("sqlite:{}", path.display());
    refused_everywhere(&url, &path.display().to_string(), &[]);
    assert!(
        snapshot(&dir).is_empty(),
        "created {:?}",
        snapshot(&dir).iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    // `migrate` is the one command that creates a store; then the others find it.
    assert_eq!(admin(&url, &["migrate"]).status.code(), Some(0));
    let stats = admin(&url, &["--json", "stats"]);
    assert_eq!(stats.status.code(), Some(0));
    let stats: Value = serde_json::from_slice(&stats.stdout).expect("JSON");
    assert_eq!(stats["records"], 0, "{stats}");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applications_sqlite_file_is_no_store_and_stays_byte_for_byte() {
    use sqlx::ConnectOptions;
    let dir = dir("app");
    let path = dir.join("app.db");
    // The application's own database: a table of its own, the default rollback journal.
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .connect()
        .await
        .expect("create the application's file");
    sqlx::raw_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER); INSERT INTO orders VALUES (1, 42);")
        .execute(&mut conn)
        .await
        .expect("the application's table");
    sqlx::Connection::close(conn).await.expect("close");
    let before = snapshot(&dir);
    assert_eq!(before.len(), 1, "one file, no journal left");
    let url = format!("sqlite:{}", path.display());
    refused_everywhere(&url, "has no idempotency tables", &[]);
    assert_eq!(
        snapshot(&dir),
        before,
        "the application's file changed (or a -wal/-shm appeared)"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_a_sqlite_store_leaves_its_file_as_it_was() {
    let dir = dir("store");
    let path = dir.join("idempotency.db");
    let store = SqliteStore::open(&path).await.expect("open");
    store.pool().close().await;
    let before = snapshot(&dir);
    assert_eq!(before.len(), 1, "the store's file alone");
    let url = format!("sqlite:{}", path.display());
    let file = |name: &str| std::fs::read(dir.join(name)).ok();
    for args in [
        &["stats"][..],
        &["unsettled"],
        &["purge", "--dry-run"],
        &["inspect", "3f9a0c1b2d4e5f60-1"],
    ] {
        let out = admin(&url, args);
        assert!(matches!(out.status.code(), Some(0 | 3)), "{args:?}");
        assert!(
            file("idempotency.db") == Some(before[0].1.clone()),
            "{args:?} changed the file"
        );
        // A reader of a WAL-mode file has SQLite make the shared-memory index beside it; the
        // log it may make stays empty: nothing was written.
        assert!(
            file("idempotency.db-wal").is_none_or(|wal| wal.is_empty()),
            "{args:?} wrote to the log"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_schema_without_the_tables_is_no_store_and_stays_empty() {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let schema = format!("idem_nostore_{}", std::process::id());
    let pool = sqlx::PgPool::connect(&base).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; \
         CREATE TABLE {schema}.orders (id INT PRIMARY KEY)"
    )))
    .execute(&pool)
    .await
    .expect("schema");
    let tables = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT table_name::TEXT FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1",
        )
        .bind(&schema)
        .fetch_all(&pool)
        .await
        .expect("tables")
    };
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
    refused_everywhere(&url, &format!("the schema {schema} of postgres://"), &[]);
    assert_eq!(tables().await, ["orders"], "a command created a table");
    // `migrate` creates the store, and the others then find it.
    assert_eq!(admin(&url, &["migrate"]).status.code(), Some(0));
    assert!(tables().await.contains(&"idempotency_records".to_owned()));
    assert_eq!(admin(&url, &["stats"]).status.code(), Some(0));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await
        .expect("drop");
}

#[test]
fn an_empty_redis_namespace_is_no_store() {
    let server = shared_server();
    let url = server.url();
    let ns = format!("nostore-{}", std::process::id());
    refused_everywhere(&url, &format!("{ns:?}"), &["--namespace", &ns]);
    let client = redis::Client::open(url.as_str()).expect("a URL");
    let mut conn = client.get_connection().expect("connect");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{ns}*"))
        .query(&mut conn)
        .expect("KEYS");
    assert!(keys.is_empty(), "created {keys:?}");
    // One record index in the namespace, and the commands find a store there.
    let _: () = redis::cmd("ZADD")
        .arg(format!("{ns}:{{00}}:i"))
        .arg(0)
        .arg("00")
        .query(&mut conn)
        .expect("ZADD");
    let out = admin(&url, &["--namespace", &ns, "unsettled"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _: () = redis::cmd("DEL")
        .arg(format!("{ns}:{{00}}:i"))
        .query(&mut conn)
        .expect("DEL");
}

#[test]
fn usage_errors_are_json_too() {
    let out = admin("sqlite:/nonexistent/x.db", &["--json", "inspect"]);
    assert_eq!(out.status.code(), Some(2));
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(json["error"]["kind"], "usage", "{json}");
    assert_eq!(json["error"]["exit"], 2, "{json}");
    let out = admin(
        "sqlite:/nonexistent/x.db",
        &["--json", "inspect", "nonsense"],
    );
    assert_eq!(out.status.code(), Some(2));
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("is not a reference like"), "{json}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a reference like"));
}
