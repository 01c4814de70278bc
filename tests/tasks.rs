//! Idempotent MCP tasks (the tasks extension, SEP-2663) across two server replicas on one
//! PostgreSQL schema, driven by rmcp's client: `tools/call` → task handle → `tasks/get` on the
//! other replica → completion → repeats get the same task → a restarted replica still answers.
//! The downstream stub counts the exports it really makes and holds each at its door until the
//! test lets it through, so nothing here waits by the clock.
//!
//! Ignored without `DATABASE_URL` at build time (see `build.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::key::Secret;
use idempotency::mcp::{status_router, task, Identity, META_REF};
use idempotency::{
    idempotent, idempotent_tools, Call, Caller, Error, Idempotency, IdempotencyContext,
};
use idempotency_tests::pg::TestSchema;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig,
    GetTaskParams, GetTaskResult, Implementation, ProtocolVersion, ServerCapabilities,
    ServerConfig, TaskPayload, TaskStatus,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::{
    schemars, tool, tool_handler, tool_router, ClientLifecycleMode, ClientServiceExt, ErrorData,
    RoleClient, RoleServer, ServerHandler, ServiceExt,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};

/// The downstream system: counts the exports it makes; each waits for a permit.
struct Warehouse {
    exports: AtomicUsize,
    entered: watch::Sender<usize>,
    gate: Semaphore,
}

impl Warehouse {
    fn new() -> Arc<Self> {
        Arc::new(Warehouse {
            exports: AtomicUsize::new(0),
            entered: watch::channel(0).0,
            gate: Semaphore::new(0),
        })
    }

    async fn export(&self, reference: &str, rows: u64) -> Report {
        self.exports.fetch_add(1, Ordering::SeqCst);
        self.entered.send_modify(|n| *n += 1);
        if let Ok(permit) = self.gate.acquire().await {
            permit.forget();
        }
        Report {
            rows,
            url: format!("https://files.example/{reference}.csv"),
        }
    }

    async fn entered(&self, n: usize) {
        let mut seen = self.entered.subscribe();
        let _ = seen.wait_for(|v| *v >= n).await;
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct ExportArgs {
    rows: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
struct Report {
    rows: u64,
    url: String,
}

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
#[error("the warehouse is unavailable")]
struct Unavailable;

/// One replica of the reports server.
#[derive(Clone)]
struct Reports {
    engine: Idempotency,
    identity: Identity,
    warehouse: Arc<Warehouse>,
    /// Whether this replica declares the tasks extension.
    serves_tasks: bool,
    tool_router: ToolRouter<Self>,
}

impl IdempotencyContext<RequestContext<RoleServer>> for Reports {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

#[idempotent_tools]
#[tool_router]
impl Reports {
    /// Export the rows as a file (a long job: answered with a task).
    #[idempotent(window = "1h", on_error = "retryable", task)]
    #[tool]
    async fn export_rows(
        &self,
        Parameters(args): Parameters<ExportArgs>,
    ) -> Result<Json<Report>, Unavailable> {
        let reference = Call::current().ok_or(Unavailable)?.reference().to_string();
        Ok(Json(self.warehouse.export(&reference, args.rows).await))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Reports {
    fn get_info(&self) -> ServerConfig {
        let capabilities = if self.serves_tasks {
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build()
        } else {
            ServerCapabilities::builder().enable_tools().build()
        };
        ServerConfig::new(capabilities)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        task::get_task(self, request, &context).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        task::cancel_task(self, request, &context).await
    }
}

type Client = RunningService<RoleClient, ClientConfig>;

async fn server(schema: &TestSchema, warehouse: &Arc<Warehouse>, caller: Caller) -> Reports {
    let engine = Idempotency::builder(schema.server_clock_store().await)
        .secret(Secret::demo())
        .build();
    Reports {
        engine,
        identity: Identity::stdio(caller),
        warehouse: warehouse.clone(),
        serves_tasks: true,
        tool_router: Reports::tool_router() + status_router::<Reports>(),
    }
}

async fn replica(schema: &TestSchema, warehouse: &Arc<Warehouse>, caller: Caller) -> Client {
    connect(server(schema, warehouse, caller).await, true).await
}

/// A client of `server` on protocol 2026-07-28, declaring the tasks extension or not.
async fn connect(server: Reports, tasks: bool) -> Client {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(s) = server.serve(server_io).await {
            let _ = s.waiting().await;
        }
    });
    let capabilities = if tasks {
        ClientCapabilities::builder().enable_tasks().build()
    } else {
        ClientCapabilities::default()
    };
    let config = ClientConfig::new(capabilities, Implementation::new("tasks-test", "1"));
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    config
        .serve_with_lifecycle(client_io, lifecycle)
        .await
        .expect("client connects")
}

async fn export(client: &Client, rows: u64) -> CallToolResponse {
    let args = json!({ "rows": rows });
    let params = CallToolRequestParams::new("export_rows")
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    client.call_tool_once(params).await.expect("tools/call")
}

fn task_of(r: CallToolResponse) -> (String, TaskStatus) {
    match r {
        CallToolResponse::Task(t) => (t.task.task_id, t.task.status),
        other => panic!("expected a task handle, got {other:?}"),
    }
}

async fn get(client: &Client, id: &str) -> GetTaskResult {
    client
        .get_task(GetTaskParams::new(id))
        .await
        .expect("tasks/get")
}

/// Fails the test instead of hanging it (a guard, not a wait).
async fn soon<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Polls `tasks/get` (as a client does) until the task is terminal.
async fn until_terminal(client: &Client, id: &str) -> GetTaskResult {
    soon("the task to finish", async {
        loop {
            let r = get(client, id).await;
            if r.task.status().is_terminal() {
                return r;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
}

fn completed_result(r: &GetTaskResult) -> serde_json::Map<String, Value> {
    match &r.task.payload {
        TaskPayload::Completed { result } => result.clone(),
        other => panic!("expected a completed task, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn a_task_is_created_once_across_replicas_and_survives_a_restart() {
    let Some(schema) = TestSchema::create("tasks").await else {
        return;
    };
    let warehouse = Warehouse::new();
    let alice = Caller::new("acme", "alice");
    let a = replica(&schema, &warehouse, alice.clone()).await;
    let b = replica(&schema, &warehouse, alice.clone()).await;

    // Replica A: the call becomes a task; its claim is stored before the handle comes back.
    let (id, status) = task_of(export(&a, 500).await);
    assert_eq!(status, TaskStatus::Working);
    soon("the export to start", warehouse.entered(1)).await;

    // Replica B, while it runs: the same call is the same task, not a second export nor an
    // "in flight" error; tasks/get and tasks/cancel find it there.
    let (again, status) = task_of(export(&b, 500).await);
    assert_eq!((again.as_str(), status), (id.as_str(), TaskStatus::Working));
    assert_eq!(get(&b, &id).await.task.status(), TaskStatus::Working);
    b.cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .expect("tasks/cancel is acknowledged");

    warehouse.gate.add_permits(1);
    let done = until_terminal(&b, &id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed, "{done:?}");
    let result = completed_result(&done);
    let report = &result["structuredContent"];
    assert_eq!(report["rows"], json!(500));
    assert_eq!(
        report["url"],
        json!(format!("https://files.example/{id}.csv"))
    );
    assert_eq!(result["_meta"][META_REF], json!(id));

    // After completion, a repeat on either replica is the same (completed) task.
    for client in [&a, &b] {
        let (again, status) = task_of(export(client, 500).await);
        assert_eq!(
            (again.as_str(), status),
            (id.as_str(), TaskStatus::Completed)
        );
    }

    // Replica A restarts (a new engine and connection pool on the same database): the task is
    // still there.
    a.cancel().await.ok();
    let c = replica(&schema, &warehouse, alice.clone()).await;
    let later = get(&c, &id).await;
    assert_eq!(completed_result(&later), result);

    // A client without the tasks extension, or a replica that does not declare it, gets the
    // stored answer inline.
    let plain = connect(server(&schema, &warehouse, alice.clone()).await, false).await;
    let mut no_tasks = server(&schema, &warehouse, alice.clone()).await;
    no_tasks.serves_tasks = false;
    let no_tasks = connect(no_tasks, true).await;
    for (who, client) in [
        ("a plain client", &plain),
        ("a replica without tasks", &no_tasks),
    ] {
        match export(client, 500).await {
            CallToolResponse::Complete(r) => {
                assert_eq!(r.structured_content.as_ref(), Some(report), "{who}");
            }
            other => panic!("{who}: expected the stored answer inline, got {other:?}"),
        }
    }

    // The status tool's answer is the stored CallToolResult.
    let status = CallToolRequestParams::new("idempotency_status").with_arguments(
        json!({ "ref": id })
            .as_object()
            .cloned()
            .unwrap_or_default(),
    );
    match c.call_tool_once(status).await.expect("idempotency_status") {
        CallToolResponse::Complete(r) => {
            let s = r.structured_content.expect("a structured status");
            assert_eq!(s["state"], json!("completed"), "{s}");
            assert_eq!(&s["answer"]["structuredContent"], report, "{s}");
        }
        other => panic!("{other:?}"),
    }

    // Another tenant does not see the task.
    let bob = replica(&schema, &warehouse, Caller::new("globex", "bob")).await;
    assert!(bob.get_task(GetTaskParams::new(id.clone())).await.is_err());

    // One export at the far side, whatever was asked of whom.
    assert_eq!(warehouse.exports.load(Ordering::SeqCst), 1);
    schema.drop_schema().await;
}

/// Replica A's worker is gone mid-task (here: replica B's clock reads 31 s later, past A's 30 s
/// lease, and A's renewals do not reach B's view in time; with a killed process it is the same
/// record). B's `tasks/get` reports the task as failed with the outcome unknown — terminal, never
/// "working" forever with nobody working — and a retried `tools/call` on B returns that task, not
/// an inline error. Nothing runs a second export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn a_task_whose_worker_is_gone_is_failed_and_a_retry_returns_it() {
    let Some(schema) = TestSchema::create("gonetask").await else {
        return;
    };
    let warehouse = Warehouse::new();
    let alice = Caller::new("acme", "alice");
    let a = replica(&schema, &warehouse, alice.clone()).await;
    let (id, status) = task_of(export(&a, 700).await);
    assert_eq!(status, TaskStatus::Working);
    soon("the export to start", warehouse.entered(1)).await;

    let mut later = server(&schema, &warehouse, alice.clone()).await;
    later.engine = Idempotency::builder(
        schema
            .server_clock_store()
            .await
            .with_server_clock_offset(31_000),
    )
    .clock(idempotency::clock::ManualClock::new(
        idempotency::clock::Clock::now(&idempotency::clock::SystemClock) + Duration::from_secs(31),
    ))
    .secret(Secret::demo())
    .without_reconciler()
    .build();
    let b = connect(later, true).await;
    let seen = get(&b, &id).await;
    assert_eq!(seen.task.status(), TaskStatus::Failed, "{seen:?}");
    let message = seen.task.task.status_message.clone().unwrap_or_default();
    assert!(message.contains("unknown"), "{message}");
    let (again, status) = task_of(export(&b, 700).await);
    assert_eq!((again.as_str(), status), (id.as_str(), TaskStatus::Failed));

    warehouse.gate.add_permits(1);
    assert_eq!(warehouse.exports.load(Ordering::SeqCst), 1);
    a.cancel().await.ok();
    b.cancel().await.ok();
    schema.drop_schema().await;
}
