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
use idempotency::{
    idempotent, idempotent_tools, Call, Caller, Error, Idempotency, IdempotencyContext,
};
use idempotency_tests::pg::TestSchema;
use idempotency_tests::processes::{say, Victim};
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

    /// The same export, keyed by the client's own idempotency key.
    #[idempotent(window = "1h", on_error = "retryable", task, client_key = "require")]
    #[tool]
    async fn export_keyed(
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
    let args = json!({ "rows": rows });
    let params = CallToolRequestParams::new("export_rows")
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
    assert_eq!(data["ref"], json!(id));
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
/// task id, replica B's client and when A was killed.
async fn kill_replica_a_mid_task(schema: &TestSchema, tool: &str) -> (String, Client, Instant) {
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
    assert_eq!(posted, id, "the task id is the body's reference");

    // Replica B: while A is alive the task is working, also once A's first lease has passed (A
    // renews it), and a repeat there is the same task.
    let b = ledger(schema, "B", false).await;
    let clock = b.engine.clock().clone();
    let first_lease = b
        .engine
        .status(
            &Caller::new("acme", "alice"),
            id.parse().expect("a reference"),
        )
        .await
        .expect("the status")
        .expect("the record")
        .lease_expires_at;
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
    (id, b, Instant::now())
}

/// Polls `tasks/get` on `client` every 100 ms (a client's poll, sooner than the 1 s it is told)
/// until the task is no longer `working`; fails the test if it still is `AFTER_LEASE` after the
/// lease. Returns the answer and how many `working` answers came first.
async fn until_not_working(client: &Client, id: &str) -> (GetTaskResult, usize) {
    let deadline = Instant::now() + LEASE + AFTER_LEASE;
    let mut working = 0;
    loop {
        let r = get(client, id).await;
        if r.task.status() != TaskStatus::Working {
            return (r, working);
        }
        working += 1;
        assert!(
            Instant::now() < deadline,
            "the task of a killed worker is still working {:?} after the kill",
            LEASE + AFTER_LEASE
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Replica A, a process of its own, is killed (`kill -9`) in the middle of a task (default
/// recovery). Once A's lease has passed, replica B's `tasks/get` reports the task failed with
/// its outcome unknown, naming the reference — terminal, not `working` forever — and a retried
/// `tools/call` on B returns that task (same id), not an inline error. The body started once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn a_killed_replicas_task_fails_with_its_outcome_unknown() {
    let Some(schema) = TestSchema::create("killedtask").await else {
        return;
    };
    let (id, b, killed) = kill_replica_a_mid_task(&schema, "post_entry").await;

    let (seen, working) = until_not_working(&b, &id).await;
    let after = killed.elapsed();
    assert_eq!(seen.task.status(), TaskStatus::Failed, "{seen:?}");
    let message = seen.task.task.status_message.clone().unwrap_or_default();
    assert!(message.contains("unknown"), "{message}");
    assert!(message.contains(&format!("ref {id}")), "{message}");
    match &seen.task.payload {
        TaskPayload::Failed { error } => assert_eq!(error["message"], json!(message)),
        other => panic!("expected a failed task, got {other:?}"),
    }
    // It stays so (nothing runs it again), and a retried tools/call is that task.
    let (again, status) = task_of(post(&b, "post_entry").await);
    assert_eq!((again.as_str(), status), (id.as_str(), TaskStatus::Failed));
    assert_eq!(get(&b, &id).await.task.status(), TaskStatus::Failed);

    let far = schema.pool(1).await;
    let (starts, entries) = far_side(&far).await;
    assert_eq!(
        starts,
        ["A"],
        "the body started once, on the killed replica"
    );
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].0, id);
    println!("failed {after:?} after the kill ({working} working answers first)");
    far.close().await;
    b.cancel().await.ok();
    schema.drop_schema().await;
}

/// As above with `recover = "rerun"` (the ledger deduplicates on the reference): after the kill,
/// once A's lease has passed, `tasks/get` tells a polling client to send the call again; then
/// replica B's client retries `tools/call` (each answer the same task) and polls `tasks/get`;
/// once A's lease has passed a retry runs the body again under the same reference, and the task
/// ends `completed` with the entry A posted. Two body starts (A, then B), one entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn a_killed_replicas_task_is_rerun_once_and_completes() {
    let Some(schema) = TestSchema::create("reruntask").await else {
        return;
    };
    let tool = "post_entry_rerun";
    let (id, b, killed) = kill_replica_a_mid_task(&schema, tool).await;

    // A client that only polls is told, once A's lease has passed, to send the call again (not
    // "do not submit it again": this tool reruns it under the same reference).
    let (stopped, _) = until_not_working(&b, &id).await;
    assert_eq!(stopped.task.status(), TaskStatus::Failed, "{stopped:?}");
    let message = stopped.task.task.status_message.clone().unwrap_or_default();
    assert!(message.contains("Send the same call again"), "{message}");
    assert!(!message.contains("Do not submit"), "{message}");
    assert!(message.contains(&format!("ref {id}")), "{message}");

    let deadline = Instant::now() + LEASE + AFTER_LEASE;
    // What the retries were answered, and what tasks/get said after each (in order, repeats
    // folded).
    let mut seen: Vec<String> = Vec::new();
    let done = loop {
        let (again, status) = task_of(post(&b, tool).await);
        assert_eq!(again, id, "a retry is the same task");
        let r = get(&b, &id).await;
        let step = format!("call {status:?} / get {:?}", r.task.status());
        if seen.last() != Some(&step) {
            seen.push(step);
        }
        if r.task.status() == TaskStatus::Completed {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the task never completed after the kill: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let after = killed.elapsed();
    let far = schema.pool(1).await;
    let (starts, entries) = far_side(&far).await;
    assert_eq!(starts, ["A", "B"], "the body ran again once, on B");
    assert_eq!(entries.len(), 1, "the ledger posted once: {entries:?}");
    let (reference, entry) = entries[0].clone();
    assert_eq!(reference, id);
    let result = completed_result(&done);
    assert_eq!(
        result["structuredContent"],
        json!({ "entry": entry, "reference": id })
    );
    assert_eq!(result["_meta"][META_REF], json!(id));
    // A repeat now is the completed task.
    let (again, status) = task_of(post(&b, tool).await);
    assert_eq!(
        (again.as_str(), status),
        (id.as_str(), TaskStatus::Completed)
    );
    println!("completed {after:?} after the kill: {seen:?}");
    far.close().await;
    b.cancel().await.ok();
    schema.drop_schema().await;
}
