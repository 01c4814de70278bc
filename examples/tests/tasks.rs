//! The example's task tool, `payout` (`#[idempotent(window = "1h", task)]`), through a real rmcp
//! client that declares the tasks extension, and through one that does not.
//!
//! No test waits by the clock: the client polls `tasks/get` as a client does, with a guard
//! against a task that never ends.

use std::sync::Arc;
use std::time::Duration;

use idempotency::mcp::{Identity, META_REF};
use idempotency::{store::MemoryStore, Caller, Idempotency};
use idempotency_examples::charge::Payments;
use idempotency_examples::processor::Processor;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, GetTaskParams,
    GetTaskResult, Implementation, ProtocolVersion, TaskPayload, TaskStatus,
};
use rmcp::service::RunningService;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt};
use serde_json::{json, Value};

type Client = RunningService<RoleClient, ClientConfig>;

/// A client of `server` on protocol 2026-07-28, declaring the tasks extension or not.
async fn connect(server: Payments, tasks: bool) -> Client {
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
    let config = ClientConfig::new(capabilities, Implementation::new("payout-test", "1"));
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    config
        .serve_with_lifecycle(client_io, lifecycle)
        .await
        .expect("client connects")
}

async fn payout(client: &Client) -> CallToolResponse {
    let args = json!({"amount_cents": 125_000, "currency": "EUR"});
    let params = CallToolRequestParams::new("payout")
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    client.call_tool_once(params).await.expect("tools/call")
}

fn task_of(r: CallToolResponse) -> (String, TaskStatus) {
    match r {
        CallToolResponse::Task(t) => (t.task.task_id, t.task.status),
        other => panic!("expected a task handle, got {other:?}"),
    }
}

/// Polls `tasks/get` (as a client does) until the task is terminal; fails the test instead of
/// hanging it.
async fn until_terminal(client: &Client, id: &str) -> GetTaskResult {
    let poll = async {
        loop {
            let r = client
                .get_task(GetTaskParams::new(id))
                .await
                .expect("tasks/get");
            if r.task.status().is_terminal() {
                return r;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), poll)
        .await
        .expect("the task to finish")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payout_is_a_task_and_its_repeat_is_the_same_task() {
    let engine = Idempotency::new(MemoryStore::new());
    let processor = Arc::new(Processor::default());
    let alice = || Identity::stdio(Caller::new("acme", "alice"));
    let client = connect(
        Payments::new(engine.clone(), alice(), processor.clone()),
        true,
    )
    .await;

    let (id, _) = task_of(payout(&client).await);
    let done = until_terminal(&client, &id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed, "{done:?}");
    let TaskPayload::Completed { result } = &done.task.payload else {
        panic!("expected a completed task, got {done:?}");
    };
    let payout_answer = &result["structuredContent"];
    assert_eq!(payout_answer["payout_id"], json!("po_000001"));
    // The task id names the claim: `{reference}@{claim time}`.
    let reference = id.split_once('@').map(|(r, _)| r);
    assert_eq!(payout_answer["reference"], json!(reference));
    assert_eq!(result["_meta"][META_REF], json!(reference));

    // The same call again: the same task, completed; nothing paid twice.
    let (again, status) = task_of(payout(&client).await);
    assert_eq!(
        (again.as_str(), status),
        (id.as_str(), TaskStatus::Completed)
    );

    // A client without the tasks extension gets the stored payout inline.
    let plain = connect(Payments::new(engine, alice(), processor.clone()), false).await;
    match payout(&plain).await {
        CallToolResponse::Complete(r) => {
            let content: Value = r.structured_content.clone().unwrap_or_default();
            assert_eq!(content["payout_id"], json!("po_000001"), "{r:?}");
        }
        other => panic!("expected an inline answer, got {other:?}"),
    }
    assert_eq!(processor.payouts(), 1);
}
