//! Idempotent MCP tasks (the tasks extension, SEP-2663) across two server replicas on one
//! PostgreSQL schema, driven by rmcp's client: `tools/call` → task handle → `tasks/get` on the
//! other replica → completion → repeats get the same task → a restarted replica still answers.
//! The downstream stub counts the exports it really makes and holds each at its door until the
//! test lets it through, so nothing here waits by the clock.
//!
//! Then a replica really dies: replica A is a process of its own, killed (`kill -9`) while its
//! task runs, and replica B answers for the task once A's (2 s) lease has passed; B polls
//! `tasks/get` for that, with a bound, as a client would.
//!
//! Ignored without `DATABASE_URL` at build time (see `build.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotency::key::Secret;
use idempotency::mcp::{status_router, task, Identity, META_REF};
use idempotency::store::{
    BoxError, MemoryStore, Settlement, SqliteStore, StoredResponse, Unsettled,
};
use idempotency::tasks::Reconciler;
use idempotency::{
    idempotent, idempotent_tools, Call, Caller, Error, Idempotency, IdempotencyContext,
};
use idempotency_tests::pg::TestSchema;
use idempotency_tests::processes::{say, Victim};
use idempotency_tests::sqlite_file::SqliteFile;
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

/// The downstream system: counts the exports it is asked for and those it makes; each waits for
/// a permit, and the first `failing` of them fail (nothing is exported).
struct Warehouse {
    exports: AtomicUsize,
    made: AtomicUsize,
    failing: AtomicUsize,
    entered: watch::Sender<usize>,
    gate: Semaphore,
}

impl Warehouse {
    fn new() -> Arc<Self> {
        Arc::new(Warehouse {
            exports: AtomicUsize::new(0),
            made: AtomicUsize::new(0),
            failing: AtomicUsize::new(0),
            entered: watch::channel(0).0,
            gate: Semaphore::new(0),
        })
    }

    async fn export(&self, reference: &str, rows: u64) -> Result<Report, Unavailable> {
        self.exports.fetch_add(1, Ordering::SeqCst);
        self.entered.send_modify(|n| *n += 1);
        if let Ok(permit) = self.gate.acquire().await {
            permit.forget();
        }
        let fail = self
            .failing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if fail.is_ok() {
            return Err(Unavailable);
        }
        self.made.fetch_add(1, Ordering::SeqCst);
        Ok(Report {
            rows,
            url: format!("https://files.example/{reference}.csv"),
        })
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
        Ok(Json(self.warehouse.export(&reference, args.rows).await?))
    }

    /// The same export; the warehouse files it under the reference, so a call whose worker is
    /// gone is run again (`recover = "rerun"`).
    #[idempotent(window = "1h", on_error = "retryable", task, recover = "rerun")]
    #[tool]
    async fn export_rerun(
        &self,
        Parameters(args): Parameters<ExportArgs>,
    ) -> Result<Json<Report>, Unavailable> {
        let reference = Call::current().ok_or(Unavailable)?.reference().to_string();
        Ok(Json(self.warehouse.export(&reference, args.rows).await?))
    }

    /// The same export, keyed by the client's own idempotency key.
    #[idempotent(window = "1h", on_error = "retryable", task, client_key = "require")]
    #[tool]
    async fn export_keyed(
        &self,
        Parameters(args): Parameters<ExportArgs>,
    ) -> Result<Json<Report>, Unavailable> {
        let reference = Call::current().ok_or(Unavailable)?.reference().to_string();
        Ok(Json(self.warehouse.export(&reference, args.rows).await?))
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
    reports(engine, warehouse, caller)
}

/// A replica of the reports server on `engine`.
fn reports(engine: Idempotency, warehouse: &Arc<Warehouse>, caller: Caller) -> Reports {
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
async fn connect<S: ServerHandler>(server: S, tasks: bool) -> Client {
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
    export_tool(client, "export_rows", rows).await
}

/// The export tool `tool` of `rows`.
async fn export_tool(client: &Client, tool: &'static str, rows: u64) -> CallToolResponse {
    let args = json!({ "rows": rows });
    let params = CallToolRequestParams::new(tool)
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    client.call_tool_once(params).await.expect("tools/call")
}

/// `export_keyed` with the client key `key` in `_meta` (none: no `_meta` key).
async fn export_keyed(
    client: &Client,
    rows: u64,
    key: Option<&str>,
) -> Result<CallToolResponse, ErrorData> {
    let args = json!({ "rows": rows });
    let mut params = CallToolRequestParams::new("export_keyed")
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    if let Some(key) = key {
        let mut meta = rmcp::model::RequestMetaObject::default();
        meta.insert(idempotency::mcp::META_KEY.into(), json!(key));
        params.meta = Some(meta);
    }
    match client.call_tool_once(params).await {
        Ok(r) => Ok(r),
        Err(rmcp::ServiceError::McpError(e)) => Err(e),
        Err(e) => panic!("tools/call: {e}"),
    }
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

/// The reference of task `id` (`{reference}@{claim time}`: one claim of the operation).
fn reference_of(id: &str) -> &str {
    id.split_once('@')
        .map_or_else(|| panic!("a task id: {id}"), |(r, _)| r)
}

/// What a client polling `tasks/get` for `id` sees, repeats folded: the state now, then, after
/// `then` (which lets the work go on), every answer until a terminal one, and a few more after
/// it, which must be the same (a task never leaves a terminal state).
async fn polled(client: &Client, id: &str, then: impl FnOnce()) -> Vec<TaskStatus> {
    let mut seen = vec![get(client, id).await.task.status()];
    then();
    soon("the task to finish", async {
        while !seen.last().is_some_and(|s| s.is_terminal()) {
            seen.push(get(client, id).await.task.status());
            tokio::task::yield_now().await;
        }
    })
    .await;
    let last = seen[seen.len() - 1];
    for _ in 0..3 {
        assert_eq!(
            get(client, id).await.task.status(),
            last,
            "{id} left {last:?}"
        );
    }
    seen.dedup();
    seen
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
    let reference = reference_of(&id);
    assert_eq!(
        report["url"],
        json!(format!("https://files.example/{reference}.csv"))
    );
    assert_eq!(result["_meta"][META_REF], json!(reference));

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
        json!({ "ref": reference })
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

/// A task tool with `client_key`: the key's repeat on another replica, while the task runs, is
/// the same task; the key with other arguments is the JSON-RPC conflict error SEP-3182 proposed;
/// no key is refused. One export at the far side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn a_keyed_task_is_one_task_and_other_arguments_conflict() {
    let Some(schema) = TestSchema::create("keyedtask").await else {
        return;
    };
    let warehouse = Warehouse::new();
    let alice = Caller::new("acme", "alice");
    let a = replica(&schema, &warehouse, alice.clone()).await;
    let b = replica(&schema, &warehouse, alice.clone()).await;
    const KEY: &str = "export-2026-12-04-0001";
    let (id, status) = task_of(export_keyed(&a, 500, Some(KEY)).await.unwrap());
    assert_eq!(status, TaskStatus::Working);
    soon("the export to start", warehouse.entered(1)).await;

    let (again, status) = task_of(export_keyed(&b, 500, Some(KEY)).await.unwrap());
    assert_eq!((again.as_str(), status), (id.as_str(), TaskStatus::Working));
    let conflict = export_keyed(&b, 501, Some(KEY)).await.unwrap_err();
    let data = conflict.data.clone().unwrap_or_default();
    assert_eq!(
        data["type"],
        json!("idempotency_key_conflict"),
        "{conflict:?}"
    );
    assert_eq!(data["ref"], json!(reference_of(&id)));
    let missing = export_keyed(&b, 500, None).await.unwrap_err();
    assert_eq!(
        missing.data.unwrap_or_default()["type"],
        json!("idempotency_key_missing")
    );

    warehouse.gate.add_permits(1);
    let done = until_terminal(&b, &id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed, "{done:?}");
    let (after, status) = task_of(export_keyed(&a, 500, Some(KEY)).await.unwrap());
    assert_eq!(
        (after.as_str(), status),
        (id.as_str(), TaskStatus::Completed)
    );
    assert_eq!(warehouse.exports.load(Ordering::SeqCst), 1);
    schema.drop_schema().await;
}

/// The first export fails with a retryable error (nothing was done): its task ends `failed` and
/// stays so. The call sent again is a new claim, so a new task (same reference, later claim
/// time), which completes; the old id keeps reporting `failed`. One export made.
async fn a_retry_after_a_retryable_error_is_a_new_task(engine: Idempotency) {
    let warehouse = Warehouse::new();
    let a = connect(
        reports(engine, &warehouse, Caller::new("acme", "alice")),
        true,
    )
    .await;
    warehouse.failing.store(1, Ordering::SeqCst);
    let (first, status) = task_of(export(&a, 7).await);
    assert_eq!(status, TaskStatus::Working);
    soon("the first export to start", warehouse.entered(1)).await;
    let seen = polled(&a, &first, || warehouse.gate.add_permits(1)).await;
    assert_eq!(seen, [TaskStatus::Working, TaskStatus::Failed], "{first}");
    let failed = get(&a, &first).await;
    let message = failed.task.task.status_message.unwrap_or_default();
    assert!(message.contains("safe to call"), "{message}");

    let (second, status) = task_of(export(&a, 7).await);
    assert_eq!(status, TaskStatus::Working);
    assert_ne!(second, first, "the call sent again is a new task");
    assert_eq!(reference_of(&second), reference_of(&first));
    assert_eq!(get(&a, &first).await.task.status(), TaskStatus::Failed);
    soon("the second export to start", warehouse.entered(2)).await;
    let seen = polled(&a, &second, || warehouse.gate.add_permits(1)).await;
    assert_eq!(
        seen,
        [TaskStatus::Working, TaskStatus::Completed],
        "{second}"
    );

    // The first attempt's task is still failed, the second's completed; a repeat is the second.
    assert_eq!(get(&a, &first).await.task.status(), TaskStatus::Failed);
    let done = get(&a, &second).await;
    assert_eq!(
        completed_result(&done)["structuredContent"]["rows"],
        json!(7)
    );
    let (again, status) = task_of(export(&a, 7).await);
    assert_eq!(
        (again.as_str(), status),
        (second.as_str(), TaskStatus::Completed)
    );
    assert_eq!(warehouse.exports.load(Ordering::SeqCst), 2);
    assert_eq!(warehouse.made.load(Ordering::SeqCst), 1);
    a.cancel().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_retry_after_a_retryable_error_is_a_new_task() {
    let engine = Idempotency::builder(MemoryStore::new())
        .secret(Secret::demo())
        .build();
    a_retry_after_a_retryable_error_is_a_new_task(engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_retry_after_a_retryable_error_is_a_new_task() {
    let file = SqliteFile::new("retrytask");
    let store = SqliteStore::open(&file.0).await.expect("open SQLite");
    let engine = Idempotency::builder(store.clone())
        .secret(Secret::demo())
        .build();
    a_retry_after_a_retryable_error_is_a_new_task(engine).await;
    store.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn postgres_a_retry_after_a_retryable_error_is_a_new_task() {
    let Some(schema) = TestSchema::create("retrytask").await else {
        return;
    };
    let engine = Idempotency::builder(schema.server_clock_store().await)
        .secret(Secret::demo())
        .build();
    a_retry_after_a_retryable_error_is_a_new_task(engine).await;
    schema.drop_schema().await;
}

/// `recover = "rerun"` on one memory store: replica A's task is running when replica B, whose
/// clock reads 31 s later (past A's 30 s lease), gets the same call: B takes the call over and
/// runs it again under the same reference, continuing the same claim, so B's handle is the same
/// task id. A client polling it sees `working`, then `completed` (B's answer), nothing between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_rerun_completes_the_same_task() {
    let store: Arc<dyn idempotency::store::Store> = Arc::new(MemoryStore::new());
    let start = idempotency::clock::Clock::now(&idempotency::clock::SystemClock);
    let engine = |ahead: Duration| {
        Idempotency::builder_shared(store.clone())
            .clock(idempotency::clock::ManualClock::new(start + ahead))
            .secret(Secret::demo())
            .without_reconciler()
            .build()
    };
    let warehouse = Warehouse::new();
    let alice = Caller::new("acme", "alice");
    let a = connect(
        reports(engine(Duration::ZERO), &warehouse, alice.clone()),
        true,
    )
    .await;
    let b = connect(
        reports(engine(Duration::from_secs(31)), &warehouse, alice),
        true,
    )
    .await;
    let (id, status) = task_of(export_tool(&a, "export_rerun", 9).await);
    assert_eq!(status, TaskStatus::Working);
    soon("A's export to start", warehouse.entered(1)).await;
    let mut seen = vec![get(&a, &id).await.task.status()];

    // B: A's lease has passed by B's clock; B runs it again, as the same task.
    let (again, status) = task_of(export_tool(&b, "export_rerun", 9).await);
    assert_eq!((again.as_str(), status), (id.as_str(), TaskStatus::Working));
    soon("B's export to start", warehouse.entered(2)).await;
    seen.extend(polled(&b, &id, || warehouse.gate.add_permits(2)).await);
    seen.dedup();
    assert_eq!(seen, [TaskStatus::Working, TaskStatus::Completed]);
    let done = get(&a, &id).await;
    let result = completed_result(&done);
    assert_eq!(result["structuredContent"]["rows"], json!(9));
    assert_eq!(result["_meta"][META_REF], json!(reference_of(&id)));
    assert_eq!(warehouse.exports.load(Ordering::SeqCst), 2, "A's, then B's");
}

/// Replica A's worker looks gone mid-task (here: replica B's clock reads 31 s later, past A's 30 s
/// lease, and A's renewals do not reach B's view in time; with a killed process it is the same
/// record). B's `tasks/get` reports the task `working` with its outcome not known yet (polled
/// every 10 s), never `failed` for work that may still complete, and a retried `tools/call` on B
/// returns that task, not an inline error. A then reports: the same task completes. Nothing runs
/// a second export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn a_task_whose_worker_looks_gone_stays_working_until_it_reports() {
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
    assert_eq!(seen.task.status(), TaskStatus::Working, "{seen:?}");
    assert_eq!(
        seen.task.task.poll_interval_ms,
        Some(task::UNSETTLED_POLL_INTERVAL_MS)
    );
    let message = seen.task.task.status_message.clone().unwrap_or_default();
    assert!(message.contains("not known yet"), "{message}");
    let (again, status) = task_of(export(&b, 700).await);
    assert_eq!((again.as_str(), status), (id.as_str(), TaskStatus::Working));

    let seen = polled(&b, &id, || warehouse.gate.add_permits(1)).await;
    assert_eq!(seen, [TaskStatus::Working, TaskStatus::Completed]);
    let done = get(&b, &id).await;
    assert_eq!(
        completed_result(&done)["structuredContent"]["rows"],
        json!(700)
    );
    assert_eq!(warehouse.exports.load(Ordering::SeqCst), 1);
    a.cancel().await.ok();
    b.cancel().await.ok();
    schema.drop_schema().await;
}

// ---------------------------------------------------------------------------------------------
// A replica killed mid-task: replica A is a process of its own (this test binary run again as
// `task_victim`), serving the ledger and calling it through an rmcp client of its own; it is
// killed (`kill -9`) while the task's body is running, and replica B (in the test process)
// answers for the task once A's lease has passed.

/// The lease of both replicas: short, so the dead worker's lease passes soon.
const LEASE: Duration = Duration::from_secs(2);
/// How long after the kill the task may take to leave `working` (a bound, not a pause).
const AFTER_LEASE: Duration = Duration::from_secs(20);
const VICTIM_TEST: &str = "task_victim";
const VICTIM_URL: &str = "IDEMPOTENCY_TASK_VICTIM_URL";
const VICTIM_SCHEMA: &str = "IDEMPOTENCY_TASK_VICTIM_SCHEMA";
const VICTIM_TOOL: &str = "IDEMPOTENCY_TASK_VICTIM_TOOL";
/// What the victim's body says once it has acted (then it blocks until it is killed).
const POSTED: &str = "TASK BODY POSTED";
/// What the victim says once its client holds the task handle.
const HANDLE: &str = "TASK HANDLE";

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct EntryArgs {
    account: String,
    cents: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
struct Posted {
    entry: i64,
    reference: String,
}

/// One replica of the ledger server. Its far side is two tables in the test schema, which every
/// process sees: `far_starts` (a row each time a body starts, and on which replica) and
/// `far_entries` (the ledger: one entry per reference, whoever asks again).
#[derive(Clone)]
struct Ledger {
    engine: Idempotency,
    identity: Identity,
    far: sqlx::PgPool,
    /// `A` or `B`, recorded with each body start.
    replica: &'static str,
    /// A victim's body says it has posted, then never returns.
    victim: bool,
    tool_router: ToolRouter<Self>,
}

impl IdempotencyContext<RequestContext<RoleServer>> for Ledger {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

#[idempotent_tools]
#[tool_router]
impl Ledger {
    /// Post an entry (a task). A worker that dies leaves its outcome unknown.
    #[idempotent(window = "1h", on_error = "retryable", task)]
    #[tool]
    async fn post_entry(
        &self,
        Parameters(args): Parameters<EntryArgs>,
    ) -> Result<Json<Posted>, Unavailable> {
        self.post(args).await
    }

    /// Post an entry (a task); the ledger deduplicates on the reference, so a repeat after its
    /// worker died runs it again.
    #[idempotent(window = "1h", on_error = "retryable", task, recover = "rerun")]
    #[tool]
    async fn post_entry_rerun(
        &self,
        Parameters(args): Parameters<EntryArgs>,
    ) -> Result<Json<Posted>, Unavailable> {
        self.post(args).await
    }
}

impl Ledger {
    async fn post(&self, args: EntryArgs) -> Result<Json<Posted>, Unavailable> {
        let reference = Call::current().ok_or(Unavailable)?.reference().to_string();
        sqlx::query("INSERT INTO far_starts (reference, replica) VALUES ($1, $2)")
            .bind(&reference)
            .bind(self.replica)
            .execute(&self.far)
            .await
            .expect("record the start");
        sqlx::query(
            "INSERT INTO far_entries (reference, account, cents) VALUES ($1, $2, $3)
             ON CONFLICT (reference) DO NOTHING",
        )
        .bind(&reference)
        .bind(&args.account)
        .bind(args.cents)
        .execute(&self.far)
        .await
        .expect("post the entry");
        let entry: i64 = sqlx::query_scalar("SELECT entry FROM far_entries WHERE reference = $1")
            .bind(&reference)
            .fetch_one(&self.far)
            .await
            .expect("the entry");
        if self.victim {
            say(POSTED, &reference);
            std::future::pending::<()>().await;
        }
        Ok(Json(Posted { entry, reference }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Ledger {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
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

/// A replica of the ledger on `schema` (already migrated), with the short lease.
async fn ledger(schema: &TestSchema, replica: &'static str, victim: bool) -> Ledger {
    let engine = Idempotency::builder(schema.server_clock_store().await)
        .secret(Secret::demo())
        .lease(LEASE)
        .build();
    Ledger {
        engine,
        identity: Identity::stdio(Caller::new("acme", "alice")),
        far: schema.pool(2).await,
        replica,
        victim,
        tool_router: Ledger::tool_router(),
    }
}

/// The one call every replica makes of `tool`.
async fn post(client: &Client, tool: &str) -> CallToolResponse {
    let args = json!({ "account": "acme-operating", "cents": 4200 });
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    client.call_tool_once(params).await.expect("tools/call")
}

/// Runs only as the process a killed-replica test starts (replica A): calls the tool through its
/// own client, says when the body has posted and when it holds the handle, and never returns.
/// Otherwise passes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_victim() {
    let (Ok(url), Ok(name), Ok(tool)) = (
        std::env::var(VICTIM_URL),
        std::env::var(VICTIM_SCHEMA),
        std::env::var(VICTIM_TOOL),
    ) else {
        return;
    };
    let schema = TestSchema::attach(&url, &name);
    let a = connect(ledger(&schema, "A", true).await, true).await;
    let (id, status) = task_of(post(&a, &tool).await);
    assert_eq!(status, TaskStatus::Working);
    say(HANDLE, &id);
    std::future::pending::<()>().await;
}

/// What the far side saw: the replicas whose bodies started, and the entries posted (reference,
/// entry).
async fn far_side(far: &sqlx::PgPool) -> (Vec<String>, Vec<(String, i64)>) {
    let starts = sqlx::query_scalar("SELECT replica FROM far_starts ORDER BY at")
        .fetch_all(far)
        .await
        .expect("the starts");
    let entries = sqlx::query_as("SELECT reference, entry FROM far_entries")
        .fetch_all(far)
        .await
        .expect("the entries");
    (starts, entries)
}

/// Sets up the schema (store and far side), starts replica A as a process of its own calling
/// `tool`, and kills it (`kill -9`) once its body has posted, its client holds the task, and its
/// first lease has passed (A renews it: replica B sees the task `working` all along). Returns the
/// task id, replica B's client and engine, and when A was killed.
async fn kill_replica_a_mid_task(
    schema: &TestSchema,
    tool: &str,
) -> (String, Client, Idempotency, Instant) {
    // Migrated once here, so the processes do not race to create the store's tables.
    schema.server_clock_store().await;
    let far = schema.pool(1).await;
    sqlx::raw_sql(
        "CREATE TABLE far_starts (reference TEXT NOT NULL, replica TEXT NOT NULL,
                                  at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());
         CREATE TABLE far_entries (reference TEXT PRIMARY KEY, account TEXT NOT NULL,
                                   cents BIGINT NOT NULL,
                                   entry BIGINT GENERATED ALWAYS AS IDENTITY (START WITH 1000))",
    )
    .execute(&far)
    .await
    .expect("the far side's tables");
    far.close().await;

    let mut a = Victim::spawn(
        VICTIM_TEST,
        &[
            (VICTIM_URL, schema.url()),
            (VICTIM_SCHEMA, schema.name()),
            (VICTIM_TOOL, tool),
        ],
    );
    let posted = a.said(POSTED).await;
    let id = a.said(HANDLE).await;
    assert_eq!(
        posted,
        reference_of(&id),
        "the task names the body's reference"
    );

    // Replica B: while A is alive the task is working, also once A's first lease has passed (A
    // renews it), and a repeat there is the same task.
    let b = ledger(schema, "B", false).await;
    let clock = b.engine.clock().clone();
    let first_lease = b
        .engine
        .status(
            &Caller::new("acme", "alice"),
            reference_of(&id).parse().expect("a reference"),
        )
        .await
        .expect("the status")
        .expect("the record")
        .lease_expires_at;
    let engine = b.engine.clone();
    let b = connect(b, true).await;
    let (again, status) = task_of(post(&b, tool).await);
    assert_eq!((again.as_str(), status), (id.as_str(), TaskStatus::Working));
    soon("A's first lease to pass", async {
        loop {
            let now = clock.now();
            assert_eq!(get(&b, &id).await.task.status(), TaskStatus::Working);
            if now > first_lease {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;

    a.kill().await;
    (id, b, engine, Instant::now())
}

/// Polls `tasks/get` on `client` every 100 ms (a client's poll, sooner than it is told) until
/// the task's message says `needle` (its worker's lease has passed); every answer meanwhile is
/// `working`. Fails the test if that takes more than `AFTER_LEASE` after the lease. Returns the
/// answer and how many answers came first.
async fn until_said(client: &Client, id: &str, needle: &str) -> (GetTaskResult, usize) {
    let deadline = Instant::now() + LEASE + AFTER_LEASE;
    let mut before = 0;
    loop {
        let r = get(client, id).await;
        assert_eq!(r.task.status(), TaskStatus::Working, "{r:?}");
        if r.task
            .task
            .status_message
            .as_deref()
            .unwrap_or_default()
            .contains(needle)
        {
            return (r, before);
        }
        before += 1;
        assert!(
            Instant::now() < deadline,
            "the task of a killed worker does not say {needle:?} {:?} after the kill",
            LEASE + AFTER_LEASE
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Replica A, a process of its own, is killed (`kill -9`) in the middle of a task (default
/// recovery). Once A's lease has passed, replica B's `tasks/get` reports the task still
/// `working`, its outcome not known yet (polled every 10 s), naming the reference — never
/// `failed` for work that may have taken effect — and a retried `tools/call` on B returns that
/// task (same id), not an inline error. A reconciler asking the ledger by the reference settles
/// it: the task completes with the entry A posted. The body started once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn a_killed_replicas_task_stays_working_until_it_is_settled() {
    let Some(schema) = TestSchema::create("killedtask").await else {
        return;
    };
    let (id, b, engine, killed) = kill_replica_a_mid_task(&schema, "post_entry").await;
    let reference = reference_of(&id).to_owned();

    let (seen, before) = until_said(&b, &id, "not known yet").await;
    let after = killed.elapsed();
    let message = seen.task.task.status_message.clone().unwrap_or_default();
    assert!(message.contains(&format!("ref {reference}")), "{message}");
    assert!(message.contains("Do not submit"), "{message}");
    assert_eq!(
        seen.task.task.poll_interval_ms,
        Some(task::UNSETTLED_POLL_INTERVAL_MS)
    );
    // It stays so (nothing runs it again), and a retried tools/call is that task.
    let (again, status) = task_of(post(&b, "post_entry").await);
    assert_eq!((again.as_str(), status), (id.as_str(), TaskStatus::Working));
    assert_eq!(get(&b, &id).await.task.status(), TaskStatus::Working);

    // Settled by asking the ledger: the entry was posted, so the call completed with it.
    let far = schema.pool(1).await;
    let ledger = far.clone();
    let reconciler = Reconciler::new(&engine, move |claim: Unsettled| {
        let ledger = ledger.clone();
        async move {
            let entry: Option<i64> =
                sqlx::query_scalar("SELECT entry FROM far_entries WHERE reference = $1")
                    .bind(claim.reference.to_string())
                    .fetch_optional(&ledger)
                    .await?;
            let posted = |entry| Posted {
                entry,
                reference: claim.reference.to_string(),
            };
            Ok::<_, BoxError>(match entry {
                Some(entry) => Settlement::Completed(StoredResponse {
                    ok: true,
                    body: serde_json::to_string(&posted(entry))?,
                }),
                None => Settlement::Released,
            })
        }
    });
    let report = reconciler.run_once().await.expect("a reconcile round");
    let seen_after = polled(&b, &id, || ()).await;
    assert_eq!(seen_after, [TaskStatus::Completed], "{report:?}");

    let (starts, entries) = far_side(&far).await;
    assert_eq!(
        starts,
        ["A"],
        "the body started once, on the killed replica"
    );
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].0, reference);
    let done = get(&b, &id).await;
    assert_eq!(
        completed_result(&done)["structuredContent"],
        json!({ "entry": entries[0].1, "reference": reference })
    );
    println!("not known yet {after:?} after the kill ({before} working answers first); settled: {report:?}");
    far.close().await;
    b.cancel().await.ok();
    schema.drop_schema().await;
}

/// As above with `recover = "rerun"` (the ledger deduplicates on the reference): after the kill,
/// once A's lease has passed, `tasks/get` keeps the task `working` and tells a polling client to
/// send the call again; then replica B's client retries `tools/call` (each answer the same task)
/// and polls `tasks/get`; a retry runs the body again under the same reference, continuing the
/// same claim, and the same task id ends `completed` with the entry A posted: the whole sequence
/// B's client saw is `working`, then `completed`. Two body starts (A, then B), one entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn a_killed_replicas_task_is_rerun_once_and_completes() {
    let Some(schema) = TestSchema::create("reruntask").await else {
        return;
    };
    let tool = "post_entry_rerun";
    let (id, b, _engine, killed) = kill_replica_a_mid_task(&schema, tool).await;
    let reference = reference_of(&id).to_owned();

    // A client that only polls is told, once A's lease has passed, to send the call again (not
    // "do not submit it again": this tool reruns it under the same reference); still working.
    let (stopped, _) = until_said(&b, &id, "Send the same call again").await;
    let message = stopped.task.task.status_message.clone().unwrap_or_default();
    assert!(!message.contains("Do not submit"), "{message}");
    assert!(message.contains(&format!("ref {reference}")), "{message}");

    let deadline = Instant::now() + LEASE + AFTER_LEASE;
    // What the retries were answered, and what tasks/get said after each (in order, repeats
    // folded), and every state tasks/get gave (folded).
    let mut seen: Vec<String> = Vec::new();
    let mut states = vec![TaskStatus::Working];
    let done = loop {
        let (again, status) = task_of(post(&b, tool).await);
        assert_eq!(again, id, "a retry is the same task");
        let r = get(&b, &id).await;
        let step = format!("call {status:?} / get {:?}", r.task.status());
        if seen.last() != Some(&step) {
            seen.push(step);
        }
        states.push(r.task.status());
        if r.task.status() == TaskStatus::Completed {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the task never completed after the kill: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    states.dedup();
    assert_eq!(
        states,
        [TaskStatus::Working, TaskStatus::Completed],
        "{seen:?}"
    );
    let after = killed.elapsed();
    let far = schema.pool(1).await;
    let (starts, entries) = far_side(&far).await;
    assert_eq!(starts, ["A", "B"], "the body ran again once, on B");
    assert_eq!(entries.len(), 1, "the ledger posted once: {entries:?}");
    let (posted, entry) = entries[0].clone();
    assert_eq!(posted, reference);
    let result = completed_result(&done);
    assert_eq!(
        result["structuredContent"],
        json!({ "entry": entry, "reference": reference })
    );
    assert_eq!(result["_meta"][META_REF], json!(reference));
    // A repeat now is the completed task, and it stays completed.
    let (again, status) = task_of(post(&b, tool).await);
    assert_eq!(
        (again.as_str(), status),
        (id.as_str(), TaskStatus::Completed)
    );
    assert_eq!(polled(&b, &id, || ()).await, [TaskStatus::Completed]);
    println!("completed {after:?} after the kill: {seen:?}");
    far.close().await;
    b.cancel().await.ok();
    schema.drop_schema().await;
}
