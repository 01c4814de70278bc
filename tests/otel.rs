//! A client's trace context parents the call's span (feature `opentelemetry`): an rmcp client
//! sends `_meta.traceparent` and `tracestate` with a `tools/call`, and the span the wrapper
//! exports through `tracing-opentelemetry` (to the OpenTelemetry SDK's in-memory exporter) is
//! in the client's trace, a child of the client's span. Without a `traceparent`, or with a
//! malformed one, the span is in a trace of the server's own. A session id given with the call is its
//! `mcp.session.id`.

use std::time::Duration;

use idempotency::mcp::Identity;
use idempotency::outcome::{ErrorPolicy, Outcome};
use idempotency::store::MemoryStore;
use idempotency::tool::{Prepared, ToolSpec};
use idempotency::{idempotent, idempotent_tools, Caller, Error, Idempotency, IdempotencyContext};
use idempotency_tests::charge::ChargeError;
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolRequestParams, RequestMetaObject, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_handler, tool_router, RoleServer, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct NoteArgs {
    text: String,
}

#[derive(Clone)]
struct Notes {
    engine: Idempotency,
    identity: Identity,
    tool_router: ToolRouter<Self>,
}

impl IdempotencyContext<RequestContext<RoleServer>> for Notes {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

#[idempotent_tools]
#[tool_router]
impl Notes {
    #[idempotent(window = "15m")]
    #[tool(description = "Keep a note")]
    async fn keep_note(
        &self,
        Parameters(args): Parameters<NoteArgs>,
    ) -> Result<String, ChargeError> {
        Ok(format!("kept {}", args.text.len()))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Notes {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// Spans exported by the SDK while `f` runs, under a subscriber with tracing-opentelemetry's
/// layer (for this thread: the tests run on current-thread runtimes).
async fn exported<F: std::future::Future<Output = ()>>(calls: usize, f: F) -> Vec<SpanData> {
    // One test at a time sets a subscriber in this binary (see `observability.rs`).
    let _one = super::ONE_AT_A_TIME.lock().await;
    let spans = InMemorySpanExporter::default();
    let exporter = spans.clone();
    // The README's two lines ("Metrics"), as written there (see the test below).
    #[rustfmt::skip]
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).build(); // opentelemetry_sdk 0.33
    #[rustfmt::skip]
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("my-server")); // 0.34 (tests/otel.rs)
    let (closed, mut closes) = tokio::sync::watch::channel(0usize);
    let subscriber = tracing_subscriber::registry()
        .with(layer)
        .with(CallsClosed(closed));
    {
        let _guard = tracing::subscriber::set_default(subscriber);
        f.await;
    }
    // A call's span closes when the server's task for it ends, which may be after its client
    // has the answer: flushing before then would export it without that span.
    tokio::time::timeout(Duration::from_secs(30), closes.wait_for(|n| *n >= calls))
        .await
        .expect("every call's span closes")
        .expect("the subscriber is alive");
    let _ = provider.force_flush();
    spans.get_finished_spans().expect("exported spans")
}

/// Counts the call spans ([`calls`]) that have closed, so [`exported`] flushes after the last.
struct CallsClosed(tokio::sync::watch::Sender<usize>);

impl<S> tracing_subscriber::Layer<S> for CallsClosed
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_close(&self, id: tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        // The engine's span is named `tools/call`; `otel.name` adds the tool for the export.
        if ctx.span(&id).is_some_and(|s| s.name() == "tools/call") {
            self.0.send_modify(|n| *n += 1);
        }
    }
}

fn is_call(name: &str) -> bool {
    name == "tools/call keep_note" || name == "tools/call charge_card"
}

/// The guide's export lines are the ones [`exported`] runs, character for character.
#[test]
fn the_guides_export_lines_are_these() {
    let guide = include_str!("../docs/guide.md");
    let start = guide
        .find("```rust,ignore\nlet provider = SdkTracerProvider")
        .expect("the guide's export block");
    let block = &guide[start..];
    let block = &block[..block[3..].find("```").expect("the block ends") + 3];
    let here = include_str!("otel.rs");
    for line in block.lines().filter(|l| !l.starts_with("```")) {
        assert!(
            here.lines().any(|h| h.trim() == line),
            "guide line not run by this test: {line}"
        );
    }
}

fn calls(spans: &[SpanData]) -> Vec<&SpanData> {
    spans.iter().filter(|s| is_call(&s.name)).collect()
}

#[tokio::test]
async fn a_clients_traceparent_parents_the_call_span() {
    let server = Notes {
        engine: Idempotency::new(MemoryStore::new()),
        identity: Identity::stdio(Caller::new("acme", "alice")),
        tool_router: Notes::tool_router(),
    };
    let spans = exported(3, async {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            if let Ok(s) = server.serve(server_io).await {
                let _ = s.waiting().await;
            }
        });
        let client = ().serve(client_io).await.expect("client connects");
        for (text, traceparent) in [
            ("with", Some(format!("00-{TRACE}-{PARENT}-01"))),
            ("without", None),
            ("malformed", Some(format!("00-{TRACE}-{PARENT}"))),
        ] {
            let mut params = CallToolRequestParams::new("keep_note").with_arguments(
                json!({ "text": text })
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            );
            if let Some(tp) = traceparent {
                let mut meta = RequestMetaObject::default();
                meta.insert("traceparent".into(), json!(tp));
                meta.insert("tracestate".into(), json!("vendor=1"));
                params.meta = Some(meta);
            }
            let r = client.call_tool(params).await.expect("tools/call");
            assert_eq!(r.is_error, Some(false), "{r:?}");
        }
        client.cancel().await.ok();
    })
    .await;
    let calls = calls(&spans);
    assert_eq!(calls.len(), 3, "{spans:#?}");
    let trace = TraceId::from_hex(TRACE).expect("hex");
    let parent = SpanId::from_hex(PARENT).expect("hex");
    // The three spans are exported in the order they closed, which need not be the calls'
    // order: exactly one is in the client's trace (the malformed traceparent names the same
    // trace id, so a lenient parse would put a second one there).
    let (with, others): (Vec<&SpanData>, Vec<&SpanData>) = calls
        .iter()
        .partition(|s| s.span_context.trace_id() == trace);
    let [with] = with.as_slice() else {
        panic!("one call span in the client's trace: {calls:#?}")
    };
    assert_eq!(with.parent_span_id, parent);
    assert!(with.parent_span_is_remote);
    assert_eq!(with.span_context.trace_state().get("vendor"), Some("1"));
    for other in &others {
        // In a trace of the server's own (under rmcp's request span, if any), never the client's.
        assert!(!other.parent_span_is_remote, "{other:#?}");
    }
}

#[tokio::test]
async fn a_session_is_the_spans_mcp_session_id() {
    let engine = Idempotency::new(MemoryStore::new());
    let spans = exported(1, async {
        let spec = ToolSpec::new("charge_card", Duration::from_secs(900));
        let mut prepared = Prepared::call(&Caller::new("acme", "alice"), &spec, &1u8).expect("key");
        prepared.origin.session = Some("session-7".into());
        let out: Outcome<u8, ChargeError> = engine
            .execute(prepared, ErrorPolicy::classified(), async { Ok(1) })
            .await;
        assert!(out.result.is_ok());
    })
    .await;
    let calls = calls(&spans);
    assert_eq!(calls.len(), 1, "{spans:#?}");
    let session = calls[0]
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == "mcp.session.id")
        .map(|kv| kv.value.to_string());
    assert_eq!(session.as_deref(), Some("session-7"));
}
