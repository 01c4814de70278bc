//! One conformance suite, run against every store: `MemoryStore` (the reference), `SqliteStore`
//! (a temporary file), `PostgresStore` (a schema of its own per test; skipped with a printed
//! line without `DATABASE_URL`) and `RedisStore`, on one Redis 7 and on a 3-master + 3-replica
//! Redis Cluster (completions and releases by the compare-and-set script `settle.lua`), and the
//! same on Valkey (by `SET … IFEQ` there; ignored without a `valkey-server`, see
//! `tests/build.rs`), servers of this test process's own, a namespace per test. Every case
//! passes explicit times, so window edges are exact.
//!
//! The cases are split by topic (the files beside this one); this file runs each on every store.
//!
//! What only the SQL stores have (migrations, undecodable rows, plans) is in
//! `sql_conformance.rs`; the fixtures both use are in `idempotency_tests::conformance`.

use idempotency::key::Key;
use idempotency::store::{
    Claim, ClaimRequest, Fenced, MemoryStore, Receipt, RecordState, RecordStatus, RedisStore,
    Settlement, SqliteStore, StoreError, StoredResponse, Token, Unsettled,
};
use idempotency_tests::conformance::*;
use idempotency_tests::pg::{unique_name, TestSchema};
use idempotency_tests::redis_servers::{
    shared_cluster, shared_server, shared_valkey, shared_valkey_cluster,
};

mod background;
mod claims;
mod concurrency;
mod fencing;
mod outbox;
mod settle;
mod status;
// What only the SQL stores have: its own cases, in this binary too.
#[path = "../sql_conformance.rs"]
mod sql_conformance;

use background::*;
use claims::*;
use concurrency::{
    a_gone_call_is_taken_over_once_under_its_reference, concurrent_claims_have_one_winner,
    concurrent_takeovers_have_one_winner,
};
use fencing::*;
use outbox::*;
use settle::*;
use status::*;

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let b = super::Backend { store: std::sync::Arc::new(super::MemoryStore::new()), kind: super::Kind::Memory };
                    super::$case(&b).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let file = super::SqliteFile::new(stringify!($case));
                    let store = super::SqliteStore::open(&file.0).await.expect("open the SQLite store");
                    let b = super::Backend { store: std::sync::Arc::new(store.clone()), kind: super::Kind::Sqlite };
                    super::$case(&b).await;
                    store.pool().close().await;
                }
            )*
        }
        mod postgres {
            $(
                #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(schema) = super::TestSchema::create("conf").await else { return };
                    let store = schema.store().await;
                    let b = super::Backend { store: std::sync::Arc::new(store.clone()), kind: super::Kind::Postgres };
                    super::$case(&b).await;
                    store.pool().close().await;
                    schema.drop_schema().await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let url = super::shared_server().url();
                    let store = super::redis_store().connect(&url).await.expect("connect to Redis");
                    let b = super::Backend { store: std::sync::Arc::new(store), kind: super::Kind::Redis };
                    super::$case(&b).await;
                }
            )*
        }
        mod valkey {
            $(
                #[cfg_attr(no_valkey, ignore = "needs valkey-server (see tests/build.rs)")]
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let url = super::shared_valkey().url();
                    let store = super::redis_store().connect(&url).await.expect("connect to Valkey");
                    let b = super::Backend { store: std::sync::Arc::new(store), kind: super::Kind::Redis };
                    super::$case(&b).await;
                }
            )*
        }
        mod valkey_cluster {
            $(
                #[cfg_attr(no_valkey, ignore = "needs valkey-server (see tests/build.rs)")]
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let seeds = super::shared_valkey_cluster().seeds();
                    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
                    let store = super::redis_store().connect_cluster(&seeds).await.expect("connect to the Valkey cluster");
                    let b = super::Backend { store: std::sync::Arc::new(store), kind: super::Kind::Redis };
                    super::$case(&b).await;
                }
            )*
        }
        mod redis_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let seeds = super::shared_cluster().seeds();
                    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
                    let store = super::redis_store().connect_cluster(&seeds).await.expect("connect to the cluster");
                    let b = super::Backend { store: std::sync::Arc::new(store), kind: super::Kind::Redis };
                    super::$case(&b).await;
                }
            )*
        }
    };
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
