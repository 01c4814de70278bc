//! A repeat that waits for the call in progress (`wait`) tells an MCP client that sent a progress
//! token how long it has waited: a `notifications/progress` as the wait begins (and one a second
//! after), naming the reference, then the first call's answer as a replay; a repeat that does
//! not wait sends none. Driven through rmcp's client, in process (which puts a progress token of
//! its own numbering on each request).

use std::sync::Arc;
use std::time::Duration;

use idempotency::mcp::{Identity, META_REPLAYED};
use idempotency::{
    idempotent, idempotent_tools, store::MemoryStore, Caller, Error, Idempotency,
    IdempotencyContext,
};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, NumberOrString, ProgressNotificationParam,
    ProgressToken, RequestMetaObject, RequestParamsMeta,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService};
use rmcp::{schemars, tool, tool_router, ClientHandler, RoleClient, RoleServer, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};

/// How long a test waits for something that must happen at once before it fails.
const BOUND: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct Args {
    n: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Report {
    rows: u64,
}

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
#[error("{0}")]
struct ToolError(String);

impl From<Error> for ToolError {
    fn from(e: Error) -> Self {
        ToolError(e.advice())
    }
}

impl idempotency::Classify for ToolError {
    fn disposition(&self) -> idempotency::Disposition {
        idempotency::Disposition::Retryable
    }
}

/// The server: its slow tool's body says it started, then waits for the gate.
#[derive(Clone)]
struct Slow {
    engine: Idempotency,
    started: Arc<Notify>,
    gate: Arc<Notify>,
}

impl IdempotencyContext<RequestContext<RoleServer>> for Slow {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        Identity::stdio(Caller::new("acme", "alice")).resolve(request)
    }
}

#[idempotent_tools]
#[tool_router(server_handler)]
impl Slow {
    /// Export a report.
    #[idempotent(window = "15m", wait = "30s")]
    #[tool]
    async fn export(&self, Parameters(args): Parameters<Args>) -> Result<Report, ToolError> {
        self.started.notify_one();
        self.gate.notified().await;
        Ok(Report { rows: args.n * 10 })
    }
}

/// A client that passes on the progress notifications it gets.
struct Listener(mpsc::UnboundedSender<ProgressNotificationParam>);

impl ClientHandler for Listener {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.0.send(params);
    }
}

async fn connect(
    server: Slow,
) -> (
    RunningService<RoleClient, Listener>,
    mpsc::UnboundedReceiver<ProgressNotificationParam>,
) {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(s) = server.serve(server_io).await {
            let _ = s.waiting().await;
        }
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let client = Listener(tx)
        .serve(client_io)
        .await
        .expect("client connects");
    (client, rx)
}

fn params(n: u64, token: Option<i64>) -> CallToolRequestParams {
    let args = json!({ "n": n }).as_object().cloned().unwrap_or_default();
    let mut p = CallToolRequestParams::new("export").with_arguments(args);
    if let Some(t) = token {
        let mut meta = RequestMetaObject::default();
        meta.set_progress_token(ProgressToken(NumberOrString::Number(t)));
        p.set_meta(meta);
    }
    p
}

fn replayed(r: &CallToolResult) -> Option<Value> {
    r.meta.as_ref()?.0.get(META_REPLAYED).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_repeat_sends_progress_to_a_client_with_a_token() {
    let server = Slow {
        engine: Idempotency::new(MemoryStore::new()),
        started: Arc::default(),
        gate: Arc::default(),
    };
    let (started, gate) = (server.started.clone(), server.gate.clone());
    let (client, mut progress) = connect(server).await;
    let client = Arc::new(client);

    let c = client.clone();
    let first = tokio::spawn(async move { c.call_tool(params(7, None)).await });
    tokio::time::timeout(BOUND, started.notified())
        .await
        .expect("the first call's body never started");
    let c = client.clone();
    let repeat = tokio::spawn(async move { c.call_tool(params(7, Some(41))).await });

    let note = tokio::time::timeout(BOUND, progress.recv())
        .await
        .expect("no progress notification while the repeat waited")
        .expect("the client is alive");
    // rmcp's client numbers the tokens itself: the one of the first request that waited.
    assert!(
        matches!(
            note.progress_token,
            ProgressToken(NumberOrString::Number(_))
        ),
        "{note:?}"
    );
    assert_eq!(note.total, Some(30_000.0));
    assert!(
        note.progress >= 0.0 && note.progress <= 30_000.0,
        "{note:?}"
    );
    let message = note.message.unwrap_or_default();
    assert!(message.contains("already in progress (ref "), "{message}");

    gate.notify_one();
    let first = first.await.expect("task").expect("first call");
    let repeat = repeat.await.expect("task").expect("repeat");
    assert_eq!(first.structured_content, Some(json!({ "rows": 70 })));
    assert_eq!(repeat.structured_content, Some(json!({ "rows": 70 })));
    assert_eq!(replayed(&repeat), Some(json!(true)));

    // A repeat once the answer is recorded does not wait: no notification.
    while progress.try_recv().is_ok() {}
    let again = client.call_tool(params(7, Some(42))).await.expect("again");
    assert_eq!(again.structured_content, Some(json!({ "rows": 70 })));
    assert!(
        progress.try_recv().is_err(),
        "a notification for a repeat that did not wait"
    );
}
