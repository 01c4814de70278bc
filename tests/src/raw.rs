//! The baseline the store benches measure against: the naive two statements a hand-written
//! handler would run on a table of its own (insert the key, then store the answer); and what
//! the benches share on the store's side: the calls they key, their claims and completions, and
//! the PostgreSQL pool with the store and the raw table beside it, and the raw SQLite pool.

use std::time::Duration;

use idempotency::store::{
    Claim, ClaimRequest, Completion, Fenced, PostgresStore, SqliteStore, Store, StoredResponse,
    Token,
};
use idempotency::{clock::Timestamp, key::Key, Caller};
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{PgPool, SqlitePool};

use crate::pg::TestSchema;

/// A 70-byte JSON answer, like a charge receipt.
pub const RESPONSE: &str =
    r#"{"charge_id":"ch_3PqR8sT2uV4wX5yZ6a7b","amount":4200,"currency":"EUR"}"#;
/// The tenant and tool of every benched call.
pub const TENANT: &str = "acme";
/// See [`TENANT`].
pub const TOOL: &str = "charge_card";
/// The benched tool's window.
pub const WINDOW: Duration = Duration::from_secs(900);

/// The raw table on PostgreSQL.
pub const TABLE_PG: &str =
    "CREATE TABLE raw_records (key BYTEA PRIMARY KEY, tenant TEXT NOT NULL, tool TEXT NOT NULL, \
     created_at BIGINT NOT NULL, response TEXT)";
/// The raw table on SQLite.
pub const TABLE_SQLITE: &str =
    "CREATE TABLE raw_records (key BLOB PRIMARY KEY, tenant TEXT NOT NULL, tool TEXT NOT NULL, \
     created_at INTEGER NOT NULL, response TEXT) WITHOUT ROWID";
/// The raw claim: `$1` key, `$2` tenant, `$3` tool, `$4` time; a row back when it won.
pub const CLAIM: &str =
    "INSERT INTO raw_records (key, tenant, tool, created_at) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (key) DO NOTHING RETURNING key";
/// The raw completion: `$1` key, `$2` answer.
pub const COMPLETE: &str = "UPDATE raw_records SET response = $2 WHERE key = $1";
/// The raw repeat's second statement: `$1` key.
pub const READ: &str = "SELECT response FROM raw_records WHERE key = $1";

/// The key of benched call `n`.
pub fn key(n: u64) -> Key {
    Key::for_call(
        &idempotency::key::Secret::demo(),
        &Caller::new(TENANT, "bench"),
        TOOL,
        &n,
    )
    .expect("a number always has a key")
}

/// The time every benched call is made at (the PostgreSQL store reads the server's clock).
pub fn now() -> Timestamp {
    Timestamp::from_millis(1_796_000_000_000)
}

/// The claim of benched call `key`: a 30 s lease, the tool's [`WINDOW`].
pub fn claim_request(key: Key) -> ClaimRequest<'static> {
    ClaimRequest {
        key,
        tenant: TENANT,
        subject: None,
        tool: TOOL,
        fingerprint: None,
        now: now(),
        lease: Duration::from_secs(30),
        window: WINDOW,
        token: Token(now().as_millis()),
    }
}

/// The completion of a benched call's claim, answering `response` for the tool's [`WINDOW`].
pub fn completion(key: Key, token: Token, response: &StoredResponse) -> Completion<'_> {
    Completion {
        key,
        token,
        response,
        now: now(),
        outbox: &[],
    }
}

/// A pool of `connections` (all opened at once) to `schema`, tuned for the store, the store on
/// it, and the raw table beside the store's.
///
/// # Panics
/// If the database cannot be reached or the migrations fail.
pub async fn pg_pool_and_store(schema: &TestSchema, connections: u32) -> (PgPool, PostgresStore) {
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .min_connections(connections)
        .connect_with(PostgresStore::tune(schema.options()))
        .await
        .expect("pool");
    let store = PostgresStore::from_pool(pool.clone()).await.expect("store");
    sqlx::query(TABLE_PG)
        .execute(&pool)
        .await
        .expect("raw table");
    (pool, store)
}

/// Raw SQL's SQLite pool: 4 connections to `file` with the store's own connection options
/// (WAL, `synchronous=NORMAL`, its busy timeout), and the raw table (made unless it is there).
pub async fn sqlite_pool(file: &std::path::Path) -> SqlitePool {
    sqlite_pool_with(file, &[TABLE_SQLITE]).await
}

/// [`sqlite_pool`] with [`INDEX_SQLITE`] beside the raw table: the raw side with the one index
/// the store's guarantees add (its lost calls and expired records are found by it, never by a
/// scan), so that a comparison with it shows what is left beyond that index.
pub async fn sqlite_indexed_pool(file: &std::path::Path) -> SqlitePool {
    sqlite_pool_with(file, &[TABLE_SQLITE, INDEX_SQLITE]).await
}

/// An index on the raw table's claim time, as the store's on the claim's window and time (each
/// claim adds an entry, a completion changes none).
pub const INDEX_SQLITE: &str = "CREATE INDEX raw_records_created ON raw_records (created_at)";

async fn sqlite_pool_with(file: &std::path::Path, ddl: &[&str]) -> SqlitePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(SqliteStore::connect_options(file))
        .await
        .expect("raw pool");
    for statement in ddl {
        // Audited: constants of this crate.
        let statement = statement
            .replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS")
            .replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS");
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&pool)
            .await
            .expect("raw table or index");
    }
    pool
}

/// A benched fresh call through the store: `n`'s claim, which must win, then its completion
/// with [`RESPONSE`].
pub async fn store_fresh(store: &dyn Store, n: u64) {
    let req = claim_request(key(n));
    let Claim::New { token, .. } = store.claim(&req).await.expect("claim") else {
        panic!("key {n} was not fresh")
    };
    let response = StoredResponse {
        ok: true,
        body: RESPONSE.into(),
    };
    store
        .complete(&completion(req.key, token, &response))
        .await
        .expect("complete");
}

macro_rules! fresh {
    ($name:ident, $pool:ty) => {
        /// A benched fresh call in raw SQL: [`CLAIM`] of `n`'s key, which must win, then
        /// [`COMPLETE`] with [`RESPONSE`].
        pub async fn $name(pool: &$pool, n: u64) {
            let k = key(n);
            let won: Option<Vec<u8>> = sqlx::query_scalar(CLAIM)
                .bind(&k.as_bytes()[..])
                .bind(TENANT)
                .bind(TOOL)
                .bind(now().as_millis())
                .fetch_optional(pool)
                .await
                .expect("raw claim");
            assert!(won.is_some(), "key {n} was not fresh");
            sqlx::query(COMPLETE)
                .bind(&k.as_bytes()[..])
                .bind(RESPONSE)
                .execute(pool)
                .await
                .expect("raw complete");
        }
    };
}

fresh!(pg_fresh, PgPool);
fresh!(sqlite_fresh, SqlitePool);
