//! The store conformance suite (`idempotency::store::conformance`, feature `conformance`), run
//! against every store: `MemoryStore` (the reference), `SqliteStore` (a temporary file),
//! `PostgresStore` (a schema of its own per test; skipped with a printed line without
//! `DATABASE_URL`) and `RedisStore`, on one Redis 7 and on a 3-master + 3-replica Redis Cluster
//! (completions and releases by the compare-and-set script `settle.lua`), and the same on Valkey
//! (by `SET … IFEQ` there; ignored without a `valkey-server`, see `tests/build.rs`), servers of
//! this test process's own, a namespace per test.
//!
//! The cases live in the runtime; this file makes one test per case and store, each on a fresh
//! store, and checks that it lists every case the suite has.
//!
//! What only the SQL stores have (migrations, undecodable rows, plans) is in
//! `sql_conformance.rs`, in this binary too; its fixtures are in `idempotency_tests::conformance`.

use std::future::ready;

use idempotency::store::conformance::{self, Options};
use idempotency::store::{MemoryStore, RedisStore, SqliteStore};
use idempotency_tests::conformance::SqliteFile;
use idempotency_tests::pg::{unique_name, TestSchema};
use idempotency_tests::redis_servers::{
    shared_cluster, shared_server, shared_valkey, shared_valkey_cluster,
};

// What only the SQL stores have: its own cases, in this binary too.
#[path = "../sql_conformance.rs"]
mod sql_conformance;

async fn memory(case: &str) {
    conformance::run_case(case, || async { MemoryStore::new() }).await;
}

/// SQLite takes one writer at a time: its contention cases make 200 concurrent claims.
async fn sqlite(case: &str) {
    let file = SqliteFile::new(case);
    let store = SqliteStore::open(&file.0)
        .await
        .expect("open the SQLite store");
    let options = Options::default().crowd(200);
    conformance::run_case_with(case, || ready(store.clone()), options).await;
    store.pool().close().await;
}

async fn postgres(case: &str) {
    let Some(schema) = TestSchema::create("conf").await else {
        return;
    };
    let store = schema.store().await;
    conformance::run_case(case, || ready(store.clone())).await;
    store.pool().close().await;
    schema.drop_schema().await;
}

async fn redis(case: &str) {
    let url = shared_server().url();
    let store = redis_store().connect(&url).await.expect("connect to Redis");
    conformance::run_case(case, || ready(store.clone())).await;
}

async fn valkey(case: &str) {
    let url = shared_valkey().url();
    let store = redis_store()
        .connect(&url)
        .await
        .expect("connect to Valkey");
    conformance::run_case(case, || ready(store.clone())).await;
}

async fn redis_cluster(case: &str) {
    let seeds = shared_cluster().seeds();
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let store = redis_store()
        .connect_cluster(&seeds)
        .await
        .expect("connect to the cluster");
    conformance::run_case(case, || ready(store.clone())).await;
}

async fn valkey_cluster(case: &str) {
    let seeds = shared_valkey_cluster().seeds();
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let store = redis_store()
        .connect_cluster(&seeds)
        .await
        .expect("connect to the Valkey cluster");
    conformance::run_case(case, || ready(store.clone())).await;
}

/// A Redis store of a namespace of its own (tests share one server), deciding by the times the
/// cases pass (`trust_engine_clock`), as the other stores do. On a cluster its writes wait for
/// a replica (the default: the masters have one), here up to 2 s: under nextest every test
/// process starts a cluster of its own, and six clusters forming at once on two cores can keep
/// a replica from answering within the default 250 ms.
fn redis_store() -> idempotency::store::RedisStoreBuilder {
    RedisStore::builder()
        .namespace(unique_name("conf"))
        .trust_engine_clock()
        .replica_ack_timeout(std::time::Duration::from_secs(2))
}

/// One module per store (`memory::window_edges`, `redis_cluster::window_edges`, …), one test per
/// case in each, and `CASES`, the names it was given.
macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        /// The cases this file makes a test of, for each store.
        const CASES: &[&str] = &[$(stringify!($case)),*];
        suite!(@store memory, []; $($case),*);
        suite!(@store sqlite, []; $($case),*);
        suite!(@store postgres, [cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]; $($case),*);
        suite!(@store redis, []; $($case),*);
        suite!(@store redis_cluster, []; $($case),*);
        suite!(@store valkey, [cfg_attr(no_valkey, ignore = "needs valkey-server (see tests/build.rs)")]; $($case),*);
        suite!(@store valkey_cluster, [cfg_attr(no_valkey, ignore = "needs valkey-server (see tests/build.rs)")]; $($case),*);
    };
    // `$attrs` is one token tree (`[…]`), so that it can be repeated for each case.
    (@store $store:ident, $attrs:tt; $($case:ident),*) => {
        mod $store {
            $(suite!(@case $store, $attrs, $case);)*
        }
    };
    (@case $store:ident, [$($attr:meta)?], $case:ident) => {
        $(#[$attr])?
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            super::$store(stringify!($case)).await;
        }
    };
}

suite!(
    no_row_is_new_then_in_flight,
    in_flight_stays_in_flight_after_its_lease,
    completed_replays_within_its_window,
    window_edges,
    slow_completion_counts_the_window_from_completion,
    fingerprint_mismatch,
    each_claim_of_a_record_has_a_later_claim_time,
    released_is_taken_over_under_the_same_reference,
    unknown_answers_unknown_until_settled,
    stale_tokens_are_fenced,
    tokens_are_not_reused_after_a_purge,
    late_completion_after_settle_is_fenced,
    renew_extends_the_lease,
    status_is_tenant_scoped_and_generation_exact,
    purge_deletes_only_settled_records_past_the_cutoff,
    unsettled_lists_expired_leases_and_unknowns,
    settle_completed_answers_repeats_for_the_window,
    settle_released_lets_a_repeat_run_under_the_same_reference,
    settle_unknown_keeps_it_unknown_until_its_worker_reports,
    a_settlement_after_unknown_fences_the_worker,
    outbox_is_written_with_the_completion,
    concurrent_claims_have_one_winner,
    concurrent_takeovers_have_one_winner,
    a_gone_call_is_taken_over_once_under_its_reference,
);

/// A case added to the suite gets a test on every store here, or this fails.
#[test]
fn every_case_of_the_suite_has_a_test_per_store() {
    let mut listed = CASES.to_vec();
    let mut suite: Vec<&str> = conformance::cases().collect();
    listed.sort_unstable();
    suite.sort_unstable();
    assert_eq!(listed, suite, "suite!(…) must list conformance::cases()");
}
