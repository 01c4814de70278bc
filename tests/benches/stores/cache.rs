//! What a repeat costs with the engine's cache of completed answers and without it, per SQL
//! store: `cache store=<postgres|sqlite> repeat_p50_us=.. cached_repeat_p50_us=..
//! cached_repeat_ratio_store=..`.
//!
//! Two engines over one store (PostgreSQL on the server's clock, as in production; SQLite on a
//! file): one with the default cache, which makes `KEYS` first calls (and so keeps their
//! answers), and one with `cache(0)`. Then, alternating in blocks of 50, the uncached engine
//! repeats those calls (each one claim round trip that finds the completed record) and the
//! cached one repeats them (no round trip), one at a time. Both are whole calls through
//! `execute_raw`: key derivation, the lookup or the claim, and decoding the replayed answer.
//! `cached_repeat_ratio_store` is the cached p50 over the uncached p50.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotency::key::Secret;
use idempotency::outcome::ErrorPolicy;
use idempotency::store::{SqliteStore, Store};
use idempotency::tool::{Prepared, ToolSpec};
use idempotency::{Caller, Idempotency};
use idempotency_tests::pg::{unique_name, TestSchema};

use super::{p50, Config};

const SPEC: ToolSpec = ToolSpec::new("charge_card", Duration::from_secs(900));
/// Distinct completed calls the repeats cycle through.
const KEYS: u64 = 200;

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

fn engine(store: Arc<dyn Store>, cache: usize) -> Idempotency {
    Idempotency::builder_shared(store)
        .secret(Secret::demo())
        .without_reconciler()
        .cache(cache)
        .build()
}

/// One call of `n` through `engine`; whether it was replayed.
async fn call(engine: &Idempotency, caller: &Caller, n: u64) -> bool {
    let prepared = Prepared::call(caller, &SPEC, &n).expect("key");
    let out = engine
        .execute_raw(prepared, ErrorPolicy::<Never>::retryable(), async move {
            Ok::<_, Never>(serde_json::json!({"charge_id": format!("ch_{n:020}"), "amount": n, "currency": "EUR"}))
        })
        .await;
    assert!(out.result.is_ok(), "the call failed");
    out.replayed
}

/// The line for `store` (named `name`).
async fn line(name: &str, store: Arc<dyn Store>, samples: usize) -> String {
    let caller = Caller::new("acme", "alice");
    let cached = engine(store.clone(), Idempotency::DEFAULT_CACHE_ENTRIES);
    let uncached = engine(store, 0);
    for n in 0..KEYS {
        assert!(!call(&cached, &caller, n).await, "a first call");
    }
    let (mut plain, mut kept) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    let mut n = 0;
    while plain.len() < samples {
        for _ in 0..50 {
            n = (n + 1) % KEYS;
            let t = Instant::now();
            assert!(call(&uncached, &caller, n).await, "replayed by the store");
            plain.push(t.elapsed());
        }
        for _ in 0..50 {
            n = (n + 1) % KEYS;
            let t = Instant::now();
            assert!(call(&cached, &caller, n).await, "replayed from the cache");
            kept.push(t.elapsed());
        }
    }
    let (plain, kept) = (p50(plain), p50(kept));
    eprintln!("cache, {name}: repeat p50 {plain:?} through the store, {kept:?} from the cache");
    format!(
        "cache store={name} repeat_p50_us={:.1} cached_repeat_p50_us={:.2} cached_repeat_ratio_store={:.3}",
        plain.as_secs_f64() * 1e6,
        kept.as_secs_f64() * 1e6,
        kept.as_secs_f64() / plain.as_secs_f64()
    )
}

/// The lines: PostgreSQL (with `DATABASE_URL`), then SQLite.
pub(super) async fn lines(cfg: &Config) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(schema) = TestSchema::create("bench_cache").await {
        let store: Arc<dyn Store> = Arc::new(schema.server_clock_store().await);
        lines.push(line("postgres", store, cfg.samples).await);
        schema.drop_schema().await;
    }
    let file =
        super::TempFile(std::env::temp_dir().join(format!("{}.db", unique_name("bench_cache"))));
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&file.0).await.expect("sqlite"));
    lines.push(line("sqlite", store, cfg.samples).await);
    lines
}
