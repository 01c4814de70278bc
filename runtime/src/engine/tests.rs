//! What one call costs the engine: its key and fingerprint are derived once (one HMAC each),
//! whichever stage reads them (the cache, the claim, the answer kept).

use std::time::Duration;

use super::Idempotency;
use crate::key::{Caller, HMACS};
use crate::outcome::ErrorPolicy;
use crate::store::MemoryStore;
use crate::tool::{BusinessKey, Prepared, ToolSpec};

const SHIP: ToolSpec = ToolSpec::new("create_shipment", Duration::from_secs(900));

fn hmacs() -> usize {
    HMACS.with(std::cell::Cell::get)
}

/// Calls `create_shipment` for `order` (a business key, so the call has a fingerprint too):
/// whether it was replayed, and how many HMACs the engine derived for it.
async fn ship(engine: &Idempotency, order: &str, runs: &mut u32) -> (bool, usize) {
    let caller = Caller::new("acme", "alice");
    let args = serde_json::json!({ "order_id": order, "items": 2 });
    let key = BusinessKey {
        field: "order_id",
        value: &order,
    };
    let prepared = Prepared::business(&caller, &SHIP, key, &args).expect("keyed");
    let before = hmacs();
    let out = engine
        .execute::<u32, crate::Error, _>(prepared, ErrorPolicy::retryable(), async {
            *runs += 1;
            Ok(7)
        })
        .await;
    assert_eq!(out.result.expect("answered"), 7);
    (out.replayed, hmacs() - before)
}

#[tokio::test]
async fn a_call_derives_its_key_and_fingerprint_once() {
    for cache in [Idempotency::DEFAULT_CACHE_ENTRIES, 0] {
        let engine = Idempotency::builder(MemoryStore::new())
            .cache(cache)
            .build();
        let mut runs = 0;
        // A fresh call: the cache looked up, the key claimed, the answer kept.
        assert_eq!(
            ship(&engine, "o-1", &mut runs).await,
            (false, 2),
            "cache {cache}"
        );
        // A repeat: from the cache, or replayed from the store.
        assert_eq!(
            ship(&engine, "o-1", &mut runs).await,
            (true, 2),
            "cache {cache}"
        );
        assert_eq!(runs, 1);
    }
}
