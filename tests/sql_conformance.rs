//! What only the SQL stores have, beyond the conformance suite every store passes
//! (`conformance.rs`): SQLite's refusal of in-memory databases, migrations recorded once in the
//! library's own table, undecodable rows reported as corrupt, and the query plans and statements
//! of purge, the reconciler and claims on SQLite and PostgreSQL (a schema of its own per test;
//! ignored without `DATABASE_URL`).

use std::time::Duration;

use idempotency::key::Key;
use idempotency::store::{
    Claim, ClaimRequest, Completion, Fenced, Maintenance, PostgresStore, RecordStore, Settlement,
    SqliteStore, StoreError,
};
use idempotency_tests::conformance::*;
use idempotency_tests::pg::TestSchema;
use sqlx::postgres::PgPoolOptions;
use sqlx::Row;

#[tokio::test]
async fn sqlite_in_memory_databases_are_refused() {
    for path in [":memory:", ""] {
        let err = SqliteStore::open(path)
            .await
            .expect_err("an in-memory database forgets its records");
        assert!(
            matches!(&err, StoreError::Config { problem, .. } if problem.contains("needs a database file")),
            "{path:?}: {err}"
        );
    }
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .connect("sqlite::memory:")
        .await
        .expect("pool");
    let err = SqliteStore::from_pool(pool)
        .await
        .expect_err("refused on a pool too");
    assert!(err.to_string().contains("MemoryStore"), "{err}");

    // A file, even one opened without WAL, is accepted (with a warning in the log).
    let file = SqliteFile::new("no-wal");
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .connect_with(
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&file.0)
                .create_if_missing(true),
        )
        .await
        .expect("pool");
    let store = SqliteStore::from_pool(pool)
        .await
        .expect("a file is accepted");
    store.pool().close().await;
}

#[tokio::test]
async fn sqlite_migrations_are_recorded_once_in_their_own_table() {
    let file = SqliteFile::new("migrate");
    let store = SqliteStore::open(&file.0).await.expect("open");
    store.migrate().await.expect("a second run changes nothing");
    let again = SqliteStore::open(&file.0).await.expect("reopen");
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM idempotency_migrations ORDER BY version")
            .fetch_all(again.pool())
            .await
            .expect("versions");
    assert_eq!(versions, vec![1]);
    let sqlx_table: Option<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE name = '_sqlx_migrations'")
            .fetch_optional(again.pool())
            .await
            .expect("sqlite_master");
    assert_eq!(sqlx_table, None, "never the application's _sqlx_migrations");

    sqlx::query("INSERT INTO idempotency_migrations (version, description, checksum) VALUES (99, 'future', x'00')")
        .execute(again.pool())
        .await
        .expect("insert");
    store.pool().close().await;
    again.pool().close().await;
    let err = SqliteStore::open(&file.0)
        .await
        .expect_err("a newer file is refused");
    assert!(
        matches!(&err, StoreError::Migration { problem: m, .. } if m.contains("99") && m.contains("newer build")),
        "{err}"
    );
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations_run_once_under_a_lock() {
    let Some(schema) = TestSchema::create("migrate").await else {
        return;
    };
    // Eight replicas starting at once on an empty schema.
    let mut starts = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let options = PostgresStore::tune(schema.options());
        starts.spawn(async move {
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await
                .expect("pool");
            PostgresStore::from_pool(pool).await
        });
    }
    let mut stores = Vec::new();
    while let Some(r) = starts.join_next().await {
        stores.push(r.expect("task").expect("every replica starts"));
    }
    let pool = stores[0].pool().clone();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM idempotency_migrations")
        .fetch_all(&pool)
        .await
        .expect("versions");
    assert_eq!(versions, vec![1]);
    let sqlx_table: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::TEXT")
            .fetch_one(&pool)
            .await
            .expect("regclass");
    assert_eq!(sqlx_table, None);

    sqlx::query("INSERT INTO idempotency_migrations (version, description, checksum) VALUES (99, 'future', '\\x00')")
        .execute(&pool)
        .await
        .expect("insert");
    let err = PostgresStore::from_pool(pool.clone())
        .await
        .expect_err("a newer schema is refused");
    assert!(
        matches!(&err, StoreError::Migration { problem: m, .. } if m.contains("99") && m.contains("newer build")),
        "{err}"
    );
    for s in stores {
        s.pool().close().await;
    }
    schema.drop_schema().await;
}

/// A claim of `k` and the unsettled listing both report the rows as corrupt.
async fn assert_reads_are_corrupt(store: &(impl RecordStore + Maintenance), k: Key) {
    let claim = store.claim(&req(k, None, 0)).await;
    assert!(
        matches!(claim, Err(StoreError::Corrupt { .. })),
        "{claim:?}"
    );
    let unsettled = store.unsettled(at(0), 10).await;
    assert!(
        matches!(unsettled, Err(StoreError::Corrupt { .. })),
        "{unsettled:?}"
    );
}

#[tokio::test]
async fn sqlite_undecodable_rows_are_corrupt() {
    let file = SqliteFile::new("corrupt");
    let store = SqliteStore::open(&file.0).await.expect("open");
    let k = key("odd");
    // State 9 on the key's own row; a key_rest of 2 bytes on an unknown one.
    sqlx::query(
        "INSERT INTO idempotency_records (ref, key_rest, tenant, subject, tool, generation, state, token, claimed_at, ends_at, window_ms, fingerprint) \
         VALUES ($1, $2, 'acme', '', 'charge_card', 1, 9, 1, 0, 0, 0, x''), (7, x'0102', 'acme', '', 'charge_card', 1, 2, 1, 0, 0, 0, x'')",
    )
    .bind(i64::from_be_bytes(k.reference(1).prefix().to_owned()))
    .bind(&k.as_bytes()[8..])
    .execute(store.pool())
    .await
    .expect("insert");
    assert_reads_are_corrupt(&store, k).await;
    store.pool().close().await;
}

#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn postgres_undecodable_rows_are_corrupt() {
    let Some(schema) = TestSchema::create("corrupt").await else {
        return;
    };
    let store = schema.store().await;
    let k = key("odd");
    // State 9 on the key's own row; a key_rest of 2 bytes on an unknown one.
    sqlx::query(
        "INSERT INTO idempotency_records (ref, key_rest, tenant, subject, tool, generation, state, token, claimed_at, window_s, lease_or_settled_at, fingerprint) \
         VALUES ($1, $2, 'acme', '', 'charge_card', 1, 9, 1, 0, 0, 0, ''), (7, '\\x0102', 'acme', '', 'charge_card', 1, 2, 1, 0, 0, 0, '')",
    )
    .bind(i64::from_be_bytes(k.reference(1).prefix().to_owned()))
    .bind(&k.as_bytes()[8..])
    .execute(store.pool())
    .await
    .expect("insert");
    assert_reads_are_corrupt(&store, k).await;
    store.pool().close().await;
    schema.drop_schema().await;
}

fn literal(ty: &str) -> &'static str {
    match ty {
        "bytea" => "'\\x00'::bytea",
        "text" => "'x'::text",
        "bigint" => "0::bigint",
        "integer" => "0::integer",
        "smallint" => "0::smallint",
        "boolean" => "true",
        "text[]" => "'{}'::text[]",
        other => panic!("no literal for parameter type {other}"),
    }
}

/// The store in `schema` on one connection (so every statement it prepares is on it) with
/// generic plans forced from the first execution, its table analysed while EMPTY.
async fn generic_plan_store(schema: &TestSchema) -> (PostgresStore, sqlx::PgPool) {
    let options =
        PostgresStore::tune(schema.options()).options([("plan_cache_mode", "force_generic_plan")]);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("pool");
    let store = PostgresStore::from_pool(pool.clone()).await.expect("store");
    sqlx::raw_sql("ANALYZE idempotency_records")
        .execute(&pool)
        .await
        .expect("analyze");
    (store, pool)
}

/// Every statement the store runs on its records, prepared on an analysed EMPTY table with
/// generic plans forced from the first execution, still uses the primary key once the table
/// is full (purge and the reconciler's query: `postgres_background_work_reads_its_indexes`).
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn postgres_generic_plans_use_the_primary_key() {
    let Some(schema) = TestSchema::create("plans").await else {
        return;
    };
    let (store, pool) = generic_plan_store(&schema).await;

    // Exercise every lookup.
    let (a, b, c) = (key("a"), key("b"), key("c"));
    let ta = match store.claim(&req(a, None, 0)).await.expect("claim") {
        Claim::New { token, .. } => token,
        other => panic!("{other:?}"),
    };
    store
        .claim(&req(a, None, S))
        .await
        .expect("claim in flight");
    store.renew(a, ta, at(0), dur(LEASE)).await.expect("renew");
    let done = answer("done");
    let outbox = [message("receipt_email", "{}")];
    let with_outbox = Completion {
        key: a,
        token: ta,
        response: &done,
        now: at(S),
        outbox: &outbox,
    };
    store
        .complete(&with_outbox)
        .await
        .expect("complete with outbox");
    store.claim(&req(a, None, 2 * S)).await.expect("replay");
    store
        .status(TENANT, "alice", a.reference(1))
        .await
        .expect("status");
    let tb = match store.claim(&req(b, None, 0)).await.expect("claim") {
        Claim::New { token, .. } => token,
        other => panic!("{other:?}"),
    };
    let plain = Completion {
        key: b,
        token: tb,
        response: &done,
        now: at(S),
        outbox: &[],
    };
    store.complete(&plain).await.expect("complete");
    assert!(
        store.release(b, tb, at(S)).await.is_err(),
        "a refused update reads the row"
    );
    let tc = match store.claim(&req(c, None, 0)).await.expect("claim") {
        Claim::New { token, .. } => token,
        other => panic!("{other:?}"),
    };
    store.mark_unknown(c, tc).await.expect("mark unknown");
    store
        .settle(c, tc, &Settlement::Released, at(S))
        .await
        .expect("settle");
    assert!(
        matches!(
            store.claim(&req(c, None, 2 * S)).await,
            Ok(Claim::New { .. })
        ),
        "a released record is taken over"
    );

    // Fill the table behind the cached plans' back.
    sqlx::raw_sql(
        "INSERT INTO idempotency_records (ref, token, claimed_at, window_s, lease_or_settled_at, generation, \
         state, key_rest, tenant, subject, tool, fingerprint, response) \
         SELECT i, 1, 0, 0, 0, 1, 1, substring(sha256(i::text::bytea) FROM 9), 'acme', '', 'charge_card', '', \
         repeat('x', 70) FROM generate_series(1, 20000) i",
    )
    .execute(&pool)
    .await
    .expect("fill");

    let statements = sqlx::query(
        "SELECT name, statement, array_to_string(parameter_types::text[], ','), generic_plans \
         FROM pg_prepared_statements WHERE statement LIKE '%idempotency_records%'",
    )
    .fetch_all(&pool)
    .await
    .expect("prepared statements");
    let mut checked = 0;
    for row in statements {
        let (name, sql, types, generic): (String, String, String, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let scan = sql.starts_with("WITH RECURSIVE");
        if scan || !sql.contains("ref = $1") {
            continue;
        }
        assert!(generic >= 1, "ran with a generic plan: {sql}");
        let args: Vec<&str> = types
            .split(',')
            .filter(|t| !t.is_empty())
            .map(literal)
            .collect();
        let explain = format!("EXPLAIN EXECUTE {name}({})", args.join(", "));
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
            .fetch_all(&pool)
            .await
            .expect("explain");
        let plan = plan.join("\n");
        assert!(
            !plan.contains("Seq Scan on idempotency_records"),
            "{sql}\n{plan}"
        );
        assert!(plan.contains("idempotency_records_pkey"), "{sql}\n{plan}");
        checked += 1;
    }
    assert!(checked >= 8, "checked {checked} statements");
    pool.close().await;
    schema.drop_schema().await;
}

/// A steady-state table in miniature: `rows` completed records claimed over the last 48 h
/// with a 15-minute window, one in 500 expired (past the retention), 100 unsettled (in
/// flight with the lease ended, or unknown) and 20 in flight with a live lease. Times are
/// `T0`-relative, as `at()`; the same rows on both backends (`$1` rows, `$2` T0).
const STEADY_STATE: &str = "\
    INSERT INTO idempotency_records (ref, token, claimed_at, ends_at, window_ms, completed_at, generation, \
        state, key_rest, tenant, subject, tool, fingerprint, response) \
    SELECT i * 7919, 1, c, CASE WHEN st IN (0, 2) THEN c + 30000 ELSE c + 900000 END, 900000, \
        CASE WHEN st IN (0, 2) THEN NULL ELSE c END, 1, st, zeroblob24, 'acme', '', 'charge_card', \
        zeroblob0, CASE WHEN st IN (0, 2) THEN NULL ELSE 'x' END \
    FROM (SELECT i, \
            CASE WHEN i % 500 = 0 THEN $2 - 260000000 + i \
                 WHEN i % 997 = 1 AND i < 99700 THEN $2 - 600000 + i \
                 WHEN i % 991 = 3 AND i < 19820 THEN $2 - 1000 + i \
                 ELSE $2 - 172000000 + (i * 1000) % 171000000 END AS c, \
            CASE WHEN i % 500 = 0 THEN 1 \
                 WHEN i % 997 = 1 AND i < 99700 THEN (i % 2) * 2 \
                 WHEN i % 991 = 3 AND i < 19820 THEN 0 \
                 ELSE 1 END AS st \
          FROM SERIES) s";

/// PostgreSQL's row keeps the window's length and one time, the lease's end while unsettled
/// or the completion's (see its migration): the same records in its columns.
fn pg_steady_state(series: &str, zeroblob24: &str, zeroblob0: &str) -> String {
    steady_state(series, zeroblob24, zeroblob0)
        .replace(
            "ends_at, window_ms, completed_at",
            "window_s, lease_or_settled_at",
        )
        .replace(
            "CASE WHEN st IN (0, 2) THEN c + 30000 ELSE c + 900000 END, 900000, \
        CASE WHEN st IN (0, 2) THEN NULL ELSE c END",
            "900, CASE WHEN st IN (0, 2) THEN c + 30000 ELSE c END",
        )
}

fn steady_state(series: &str, zeroblob24: &str, zeroblob0: &str) -> String {
    STEADY_STATE
        .replace("SERIES", series)
        .replace("zeroblob24", zeroblob24)
        .replace("zeroblob0", zeroblob0)
}

/// Purge and the reconciler's query read their partial indexes, never the whole table: with
/// the store's own sessions (generic plans forced from the first execution on an analysed
/// EMPTY table, as the per-call statements above), and with PostgreSQL's default settings
/// (`enable_seqscan` on, plans chosen with the values) on a full analysed table.
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn postgres_background_work_reads_its_indexes() {
    let Some(schema) = TestSchema::create("bgplans").await else {
        return;
    };
    let (store, pool) = generic_plan_store(&schema).await;
    store.purge(at(0), at(0), 1_000).await.expect("purge");
    store.unsettled(at(0), 100).await.expect("unsettled");

    let fill = pg_steady_state(
        "generate_series(1, $1::BIGINT) i",
        "'\\x000000000000000000000000000000000000000000000000'::BYTEA",
        "''::BYTEA",
    );
    sqlx::query(sqlx::AssertSqlSafe(fill))
        .bind(100_000i64)
        .bind(T0)
        .execute(&pool)
        .await
        .expect("fill");
    sqlx::raw_sql("ANALYZE idempotency_records")
        .execute(&pool)
        .await
        .expect("analyze");

    let background = |sql: &str| {
        if sql.starts_with("WITH RECURSIVE") && sql.contains("DELETE FROM idempotency_records") {
            Some("purge")
        } else if sql.starts_with("WITH RECURSIVE") {
            Some("unsettled")
        } else {
            None
        }
    };
    let index = "idempotency_records_window";
    let statements = sqlx::query(
        "SELECT name, statement, array_to_string(parameter_types::text[], ','), generic_plans \
         FROM pg_prepared_statements WHERE statement LIKE '%idempotency_records%'",
    )
    .fetch_all(&pool)
    .await
    .expect("prepared statements");
    let mut texts = Vec::new();
    for row in statements {
        let (name, sql, types, generic): (String, String, String, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let Some(which) = background(&sql) else {
            continue;
        };
        assert!(generic >= 1, "ran with a generic plan: {sql}");
        let args: Vec<&str> = types.split(',').map(literal).collect();
        let explain = format!("EXPLAIN EXECUTE {name}({})", args.join(", "));
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
            .fetch_all(&pool)
            .await
            .expect("explain");
        let plan = plan.join("\n");
        assert!(
            !plan.contains("Seq Scan on idempotency_records"),
            "{sql}\n{plan}"
        );
        assert!(plan.contains(index), "{sql}\n{plan}");
        texts.push((sql, which));
    }
    assert_eq!(texts.len(), 2, "purge and unsettled were prepared");

    // PostgreSQL's defaults, the values known: the planner picks the indexes on its own.
    let plain = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(schema.options())
        .await
        .expect("pool");
    for (i, (sql, which)) in texts.iter().enumerate() {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("PREPARE bg{i} AS {sql}")))
            .execute(&plain)
            .await
            .expect("prepare");
        // $1 now, $2 limit, then the cutoff (purge) or the clock offset (unsettled); a NULL
        // offset takes the engine's `now` as given.
        let args = if *which == "purge" {
            format!("{T0}, 1000, {}, NULL", T0 - 48 * 60 * M)
        } else {
            format!("{T0}, 100, NULL")
        };
        let explain = format!("EXPLAIN ANALYZE EXECUTE bg{i}({args})");
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
            .fetch_all(&plain)
            .await
            .expect("explain");
        let plan = plan.join("\n");
        assert!(
            !plan.contains("Seq Scan on idempotency_records"),
            "{sql}\n{plan}"
        );
        assert!(plan.contains(index), "{sql}\n{plan}");
    }
    plain.close().await;
    pool.close().await;
    schema.drop_schema().await;
}

/// A claim as the PostgreSQL store writes it (claim time: the statement's clock), in flight
/// with its lease ended at once.
const CLAIMED_NOW_LEASE_ENDED: &str = "\
    INSERT INTO idempotency_records (ref, token, claimed_at, window_s, lease_or_settled_at, \
        generation, state, key_rest, tenant, subject, tool, fingerprint) \
    SELECT 42, 1, t, 900, t, 1, 0, '\\x000000000000000000000000000000000000000000000000', \
        'acme', '', 'charge_card', '' \
    FROM (SELECT (date_part('epoch', statement_timestamp()) * 1000)::BIGINT AS t) s";

/// The database's clock stepping back past the reconciler's mark does not hide the claims
/// made after the step: the round that finds its clock behind the mark moves the mark back,
/// and the next round reads them.
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn postgres_reconciler_survives_the_clock_stepping_back() {
    let Some(schema) = TestSchema::create("stepback").await else {
        return;
    };
    let store = schema.server_clock_store().await;
    let pool = store.pool().clone();
    // A round while the clock read 10 minutes later than it will after the step.
    let before_the_step = store.clone().with_server_clock_offset(600_000);
    assert!(before_the_step
        .unsettled(at(0), 10)
        .await
        .expect("unsettled")
        .is_empty());
    // After the step: a claim.
    sqlx::query(CLAIMED_NOW_LEASE_ENDED)
        .execute(&pool)
        .await
        .expect("insert");
    let mut found = 0;
    for _ in 0..2 {
        found = found.max(store.unsettled(at(0), 10).await.expect("unsettled").len());
    }
    assert_eq!(found, 1, "the claim made after the step is reconciled");
    pool.close().await;
    schema.drop_schema().await;
}

/// PostgreSQL keeps a window to the second, rounded up (`window_s`): a 1.5 s window answers
/// repeats for 2 s. (Every other store keeps it to the millisecond.)
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn postgres_windows_are_whole_seconds_rounded_up() {
    let Some(schema) = TestSchema::create("seconds").await else {
        return;
    };
    let store = schema.store().await;
    let k = key("sub-second window");
    let claim = req_window(k, None, 0, 1_500);
    let Claim::New { token, .. } = store.claim(&claim).await.expect("claim") else {
        panic!("not new")
    };
    let done = answer("done");
    store
        .complete(&Completion {
            key: k,
            token,
            response: &done,
            now: at(0),
            outbox: &[],
        })
        .await
        .expect("complete");
    let within = store.claim(&req(k, None, 1_900)).await.expect("claim");
    assert!(matches!(within, Claim::Completed { .. }), "{within:?}");
    let after = store.claim(&req(k, None, 2_000)).await.expect("claim");
    assert!(matches!(after, Claim::New { .. }), "{after:?}");
    store.pool().close().await;
    schema.drop_schema().await;
}

/// A store as users get it runs its claim and completion on the server's clock alone (two
/// parameters fewer than the statements with a clock offset): the lease's length and the
/// completion's window still land in the row as given. Read back by stores whose clocks are
/// ahead: by 10 s (20 s of a 30 s lease left), then 1 s and 2.5 s after a completion with a
/// 2 s window (answered, then a new operation).
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn postgres_server_clock_statements_keep_the_lease_and_the_window() {
    let Some(schema) = TestSchema::create("serverclock").await else {
        return;
    };
    let store = schema.server_clock_store().await;
    let ahead = |ms| store.clone().with_server_clock_offset(ms);
    let k = key("on the server's clock");
    let claim = ClaimRequest {
        lease: dur(30_000),
        window: dur(2_000),
        ..req(k, None, 0)
    };
    let Claim::New { token, .. } = store.claim(&claim).await.expect("claim") else {
        panic!("not new")
    };
    match ahead(10_000).claim(&claim).await.expect("claim") {
        Claim::InFlight {
            lease_expires_at, ..
        } => assert!(
            (at(19_000)..=at(20_000)).contains(&lease_expires_at),
            "{lease_expires_at:?}"
        ),
        other => panic!("{other:?}"),
    }
    let done = answer("done");
    store
        .complete(&Completion {
            key: k,
            token,
            response: &done,
            now: at(0),
            outbox: &[],
        })
        .await
        .expect("complete");
    let within = ahead(1_000).claim(&claim).await.expect("claim");
    assert!(matches!(within, Claim::Completed { .. }), "{within:?}");
    let after = ahead(2_500).claim(&claim).await.expect("claim");
    assert!(matches!(after, Claim::New { .. }), "{after:?}");
    store.pool().close().await;
    schema.drop_schema().await;
}

/// Two replicas claim one key at once: the second's insert waits on the first's open
/// transaction, and when that commits, the second's statement finds the key taken but cannot
/// read the row (READ COMMITTED: its snapshot is older than the commit). It must not take
/// that for a win: it claims again and answers with the first replica's claim, in flight.
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn postgres_a_claim_that_waited_on_another_replicas_claim_does_not_win() {
    let Some(schema) = TestSchema::create("waited").await else {
        return;
    };
    let k = key("claimed by two replicas at once");
    let second_pool = schema.pool(1).await;
    let second = PostgresStore::from_pool(second_pool.clone())
        .await
        .expect("store");
    let first = schema.pool(1).await;
    let mut tx = first.begin().await.expect("begin");
    sqlx::query(
        "INSERT INTO idempotency_records (ref, token, claimed_at, window_s, lease_or_settled_at, \
             generation, state, key_rest, tenant, subject, tool, fingerprint) \
         SELECT $1, 7, t, 900, t + 60000, 1, 0, $2, $3, '', $4, '' \
         FROM (SELECT (date_part('epoch', statement_timestamp()) * 1000)::BIGINT AS t) s",
    )
    .bind(i64::from_be_bytes(
        k.as_bytes()[..8].try_into().expect("8 bytes"),
    ))
    .bind(&k.as_bytes()[8..])
    .bind(TENANT)
    .bind(TOOL)
    .execute(&mut *tx)
    .await
    .expect("the first replica's claim, uncommitted");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&second_pool)
        .await
        .expect("pid");
    let claiming = tokio::spawn(async move { second.claim(&req(k, None, 0)).await });
    // Until the second replica's statement waits on the first's transaction.
    let watch = schema.pool(1).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let blocked: bool = sqlx::query_scalar("SELECT cardinality(pg_blocking_pids($1)) > 0")
            .bind(pid)
            .fetch_one(&watch)
            .await
            .expect("blocking pids");
        if blocked {
            break;
        }
        assert!(
            !claiming.is_finished(),
            "the second claim ended without waiting on the first"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the second claim did not wait on the first within 30 s"
        );
    }
    tx.commit().await.expect("commit the first claim");
    let answer = claiming.await.expect("join").expect("claim");
    match answer {
        Claim::InFlight { reference, .. } => assert_eq!(reference, k.reference(1)),
        other => panic!("the second replica did not see the first's claim: {other:?}"),
    }
    let token: i64 = sqlx::query_scalar("SELECT token FROM idempotency_records")
        .fetch_one(&watch)
        .await
        .expect("the row");
    assert_eq!(token, 7, "the first replica's claim was replaced");
    schema.drop_schema().await;
}

/// A claim whose transaction is still open while a reconciler round runs is not lost: that
/// round cannot see it, and the mark it leaves trails the open transaction, so the next
/// round reads it.
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
#[tokio::test]
async fn postgres_reconciler_reads_a_claim_committed_during_a_round() {
    let Some(schema) = TestSchema::create("mark").await else {
        return;
    };
    let store = schema.server_clock_store().await;
    let pool = store.pool().clone();
    assert!(store
        .unsettled(at(0), 10)
        .await
        .expect("unsettled")
        .is_empty());
    // A claim, in a transaction left open.
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query(CLAIMED_NOW_LEASE_ENDED)
        .execute(&mut *tx)
        .await
        .expect("insert");
    let during = store.unsettled(at(0), 10).await.expect("unsettled");
    assert!(during.is_empty(), "{during:?}");
    tx.commit().await.expect("commit");
    let after = store.unsettled(at(0), 10).await.expect("unsettled");
    assert_eq!(after.len(), 1, "{after:?}");
    // Watched from now on: a round 10 minutes later (a store whose clock is that far ahead),
    // whose mark is past the claim, still lists it.
    let later = store.clone().with_server_clock_offset(600_000);
    let again = later.unsettled(at(0), 10).await.expect("unsettled");
    assert_eq!(again.len(), 1, "{again:?}");
    let mark: i64 = sqlx::query_scalar("SELECT mark FROM idempotency_reconciler")
        .fetch_one(&pool)
        .await
        .expect("mark");
    let claimed: i64 = sqlx::query_scalar("SELECT claimed_at FROM idempotency_records")
        .fetch_one(&pool)
        .await
        .expect("claim time");
    assert!(
        mark > claimed,
        "the round read it from the watch, not as a new claim"
    );
    pool.close().await;
    schema.drop_schema().await;
}

/// SQLite: purge and the reconciler round's read search the window index (`EXPLAIN QUERY
/// PLAN`), on an empty file and on a full analysed one; no statement of theirs or of the round's
/// write scans the records.
#[tokio::test]
async fn sqlite_background_work_reads_its_indexes() {
    let file = SqliteFile::new("bgplans");
    let store = SqliteStore::open(&file.0).await.expect("open");
    let pool = store.pool().clone();
    let check = |label: &'static str| {
        let pool = pool.clone();
        async move {
            let [purge, fresh, unsettled] = SqliteStore::background_statements();
            let mut searched = Vec::new();
            for (sql, args) in [
                (purge, (T0 - 48 * 60 * M, 1000i64)),
                (fresh, (T0, 100)),
                (unsettled, (T0, 100)),
            ] {
                let mut plans = Vec::new();
                // The round is several statements: each is explained on its own.
                for statement in sql.split(';') {
                    let explain = format!("EXPLAIN QUERY PLAN {statement}");
                    let rows = sqlx::query(sqlx::AssertSqlSafe(explain))
                        .bind(args.0)
                        .bind(args.1)
                        .fetch_all(&pool)
                        .await
                        .expect("explain");
                    let plan: Vec<String> = rows.iter().map(|r| r.get::<String, _>(3)).collect();
                    plans.push(plan.join("\n"));
                }
                let plan = plans.join("\n--\n");
                // The records table is `r` where the statements name it so.
                let scans_records = |l: &str| {
                    ["SCAN idempotency_records", "SCAN r"]
                        .iter()
                        .any(|s| l == *s || l.starts_with(&format!("{s} ")))
                        && !l.contains("USING")
                };
                assert!(!plan.lines().any(scans_records), "{label}: {sql}\n{plan}");
                searched
                    .push(plan.contains("idempotency_records_window (window_ms=? AND claimed_at"));
            }
            // Purge and the round's read search the window index; the round's write reads
            // the watch and the records by primary key.
            assert_eq!(searched, [true, true, false], "{label}");
        }
    };
    check("empty").await;
    let fill = steady_state(
        "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) SELECT i FROM n)",
        "zeroblob(24)",
        "X''",
    );
    sqlx::query(sqlx::AssertSqlSafe(fill))
        .bind(100_000i64)
        .bind(T0)
        .execute(&pool)
        .await
        .expect("fill");
    sqlx::raw_sql("ANALYZE")
        .execute(&pool)
        .await
        .expect("analyze");
    check("full").await;
    assert_eq!(
        store
            .unsettled(at(0), 1_000)
            .await
            .expect("unsettled")
            .len(),
        100
    );
    assert_eq!(
        store
            .purge(at(0), at(-48 * 60 * M), 1_000)
            .await
            .expect("purge"),
        200
    );
    pool.close().await;
}

/// SQLite's reconciler reads the claims made since a mark that trails its round's clock by the
/// busy timeout and 5 s (10 s here): a claim whose time is before a round's but which commits
/// after it (it waited for the write lock) is read by the next round, and listed by every later
/// round, from the watch, until it settles; after a round whose clock is behind the mark (the
/// clock stepped back), the claims made since the step are read too.
#[tokio::test]
async fn sqlite_reconciler_reads_late_commits_and_survives_a_step_back() {
    let file = SqliteFile::new("mark");
    let store = SqliteStore::open(&file.0).await.expect("open");
    let listed = |now: i64| {
        let store = store.clone();
        async move {
            let found = store.unsettled(at(now), 10).await.expect("unsettled");
            found.iter().map(|u| u.key).collect::<Vec<_>>()
        }
    };
    assert!(listed(10 * M).await.is_empty());
    // Claimed 5 s before that round's clock, committed after it.
    let late = key("late");
    let token = match store.claim(&req(late, None, 10 * M - 5 * S)).await {
        Ok(Claim::New { token, .. }) => token,
        other => panic!("{other:?}"),
    };
    assert_eq!(listed(11 * M).await, vec![late], "read since the mark");
    // Rounds whose marks are past its claim time still list it: it is watched.
    assert_eq!(listed(60 * M).await, vec![late], "listed from the watch");
    store
        .complete(&Completion {
            key: late,
            token,
            response: &answer("ok"),
            now: at(61 * M),
            outbox: &[],
        })
        .await
        .expect("complete");
    assert!(listed(62 * M).await.is_empty(), "settled: no longer listed");
    let watched: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_watch")
        .fetch_one(store.pool())
        .await
        .expect("watch");
    assert_eq!(watched, 0, "the settled claim left the watch");
    // The clock steps back an hour: a claim then, with its lease ended at the next round.
    let after_step = key("after the step");
    store
        .claim(&req(after_step, None, 2 * M))
        .await
        .expect("claim");
    let mut found = Vec::new();
    for _ in 0..2 {
        let round = listed(3 * M).await;
        if !round.is_empty() {
            found = round;
        }
    }
    assert_eq!(found, vec![after_step], "the claim made after the step");
    store.pool().close().await;
}

/// A SQLite claim that waited more than a second for a connection of the pool watches itself:
/// its time may be older than the reconciler's mark by the time it commits (here by 20
/// minutes), and it is still listed once its lease ends.
#[tokio::test]
async fn sqlite_a_claim_that_waited_for_a_connection_is_reconciled() {
    let file = SqliteFile::new("slowclaim");
    let store = SqliteStore::open(&file.0).await.expect("open");
    let pool = store.pool().clone();
    assert!(store
        .unsettled(at(20 * M), 10)
        .await
        .expect("unsettled")
        .is_empty());
    // Every connection of the pool (4) held: the claim waits for one.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(pool.acquire().await.expect("a connection"));
    }
    let slow = key("slow");
    let claiming = tokio::spawn({
        let store = store.clone();
        async move { store.claim(&req(slow, None, 0)).await }
    });
    // The wait under test, in real time (the store measures it so): not a synchronisation.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(!claiming.is_finished(), "the claim waited for a connection");
    drop(held);
    let claimed = claiming.await.expect("join").expect("claim");
    assert!(matches!(claimed, Claim::New { .. }), "{claimed:?}");
    let listed: Vec<Key> = store
        .unsettled(at(21 * M), 10)
        .await
        .expect("unsettled")
        .into_iter()
        .map(|u| u.key)
        .collect();
    assert_eq!(
        listed,
        vec![slow],
        "claimed before the mark, listed from the watch"
    );
    pool.close().await;
}
