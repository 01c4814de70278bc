//! Observability: events carry the reference and the tool, never the raw arguments.
//!
//! A test binary of its own: a subscriber set for one thread (`set_default`) misses an event
//! whose callsite another test's thread registered at the same moment (tracing caches each
//! callsite's interest process-wide), so it must not share a process with other tests.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency::{
    outcome::{ErrorPolicy, Outcome},
    store::MemoryStore,
    tool::{Prepared, ToolSpec},
    Caller, Idempotency,
};
use idempotency_tests::charge::ChargeError;

fn spec() -> ToolSpec {
    ToolSpec::new("charge_card", Duration::from_secs(900))
}

fn caller() -> Caller {
    Caller::new("acme", "alice")
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn tracing_names_ref_and_tool_but_not_arguments() {
    let buf = Captured::default();
    let b2 = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || b2.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let engine = Idempotency::new(MemoryStore::new());
    let secret = serde_json::json!({"card_token": "tok_SECRET_4242", "amount": 5});
    let mut reference = None;
    for _ in 0..2 {
        let prepared =
            Prepared::call(&caller(), &idempotency_tests::CHARGE_CARD, &secret).expect("key");
        let out: Outcome<u8, ChargeError> = engine
            .execute(prepared, ErrorPolicy::classified(), async { Ok(1) })
            .await;
        reference = out.reference;
    }
    // A tool that says its lost calls are reconciled, on an engine with no Reconcile: said once.
    let reconciled = spec().with_recover(idempotency::tool::Recover::Reconcile);
    for n in 0..2u8 {
        let prepared = Prepared::call(&caller(), &reconciled, &n).expect("key");
        let out: Outcome<u8, ChargeError> = engine
            .execute(prepared, ErrorPolicy::classified(), async { Ok(1) })
            .await;
        assert!(out.result.is_ok());
    }
    let log = String::from_utf8_lossy(&buf.0.lock().unwrap_or_else(|e| e.into_inner())).to_string();
    let r = reference.expect("ref").to_string();
    for needle in [
        "idempotency claim",
        "idempotency complete",
        "idempotency replay",
        "charge_card",
        r.as_str(),
    ] {
        assert!(log.contains(needle), "missing {needle:?} in:\n{log}");
    }
    assert_eq!(
        log.matches("says recover = \"reconcile\", but this engine has no Reconcile")
            .count(),
        1,
        "{log}"
    );
    assert!(
        !log.contains("tok_SECRET_4242"),
        "raw arguments leaked into the logs:\n{log}"
    );
}
