//! Observability: events carry the reference and the tool, never the raw arguments.
//!
//! In the `observability` binary, one test at a time: a subscriber set for one thread
//! (`set_default`) misses an event whose callsite another test's thread registered at the same
//! moment (tracing caches each callsite's interest process-wide).

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
    let _one = super::ONE_AT_A_TIME.lock().await;
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

/// The spans, as a layer sees them: name and every field recorded (at creation and later).
/// A span's name and fields.
type Span = (String, std::collections::BTreeMap<String, String>);

#[derive(Clone, Default)]
struct Spans(
    Arc<Mutex<Vec<Span>>>,
    Arc<Mutex<std::collections::HashMap<u64, usize>>>,
);

struct Fields<'a>(&'a mut std::collections::BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S> tracing_subscriber::Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = std::collections::BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().unwrap_or_else(|e| e.into_inner());
        spans.push((attrs.metadata().name().to_owned(), fields));
        let mut index = self.1.lock().unwrap_or_else(|e| e.into_inner());
        index.insert(id.into_u64(), spans.len() - 1);
    }
    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let at = self
            .1
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id.into_u64())
            .copied();
        let mut spans = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, fields)) = at.and_then(|i| spans.get_mut(i)) {
            values.record(&mut Fields(fields));
        }
    }
}

/// The wrapper's span speaks OpenTelemetry's GenAI/MCP vocabulary, and the library's own
/// attributes say the reference, the outcome and whether it was replayed.
#[tokio::test]
async fn the_call_span_follows_the_mcp_semantic_conventions() {
    let _one = super::ONE_AT_A_TIME.lock().await;
    use tracing_subscriber::layer::SubscriberExt;
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let engine = Idempotency::new(MemoryStore::new());
    let mut references = Vec::new();
    for (n, fail) in [(1u8, false), (1, false), (2, true)] {
        let prepared = Prepared::call(&caller(), &spec(), &n).expect("key");
        let out: Outcome<u8, ChargeError> = engine
            .execute(prepared, ErrorPolicy::classified(), async move {
                if fail {
                    Err(ChargeError::Declined)
                } else {
                    Ok(1)
                }
            })
            .await;
        references.push(out.reference.expect("a reference").to_string());
    }
    let spans = spans.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let calls: Vec<_> = spans
        .iter()
        .filter(|(name, _)| name == "tools/call")
        .collect();
    assert_eq!(calls.len(), 3, "{spans:?}");
    for (_, f) in &calls {
        assert_eq!(f["otel.name"], "tools/call charge_card");
        assert_eq!(f["gen_ai.operation.name"], "execute_tool");
        assert_eq!(f["gen_ai.tool.name"], "charge_card");
        assert_eq!(f["mcp.method.name"], "tools/call");
    }
    let get = |i: usize, k: &str| calls[i].1.get(k).cloned();
    assert_eq!(get(0, "idempotency.outcome").as_deref(), Some("fresh"));
    assert_eq!(get(0, "idempotency.replayed").as_deref(), Some("false"));
    assert_eq!(get(0, "idempotency.ref"), Some(references[0].clone()));
    assert_eq!(get(0, "error.type"), None);
    assert_eq!(get(1, "idempotency.outcome").as_deref(), Some("replayed"));
    assert_eq!(get(1, "idempotency.replayed").as_deref(), Some("true"));
    assert_eq!(get(2, "error.type").as_deref(), Some("tool_error"));
    assert_eq!(get(2, "idempotency.ref"), Some(references[2].clone()));
}
