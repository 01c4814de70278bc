//! Wrapped tools as MCP tasks: what a task tool's call runs ([`TaskCall`], [`render`]), behind
//! [`crate::mcp::task`], the public face ([`get_task`], [`cancel_task`]).

use std::future::Future;

use rmcp::model::{
    CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock, CreateTaskResult,
    DetailedTask, GetTaskParams, GetTaskResult, JsonObject, MetaObject, Task, TaskPayload,
    TaskStatus,
};
use rmcp::ErrorData;
use serde::Serialize;
use serde_json::{json, Value};

use crate::clock::Timestamp;
use crate::engine::Hooks;
use crate::error::STATUS_TOOL;
use crate::key::{Caller, Reference};
use crate::outcome::{Disposition, ErrorPolicy, Failure, Outcome};
use crate::record::{RecordStatus, Standing};
use crate::tool::Prepared;
use crate::{Error, Idempotency, IdempotencyContext};

use super::answer::{described, META_REF};
use super::task_id::{Attempt, TaskId};

type Request = rmcp::service::RequestContext<rmcp::RoleServer>;

/// How often a client should poll `tasks/get` for a task being worked on, in milliseconds.
pub const POLL_INTERVAL_MS: u64 = 1_000;

/// How often a client should poll `tasks/get` for a task whose outcome is not known yet (its
/// worker stopped reporting, or lost the outcome), in milliseconds: it stays `working` until it
/// is settled (by a reconciler asking the downstream system, an operator, or its own worker
/// reporting late), which takes longer than a running call.
pub const UNSETTLED_POLL_INTERVAL_MS: u64 = 10_000;

/// What a task tool's body gives, rendered as the `CallToolResult` that is stored: `T` as
/// structured content, a definitive error as an `isError` result (its text as `policy`
/// describes it); other errors (retryable, unknown) are left to the engine.
pub(crate) fn render<T: Serialize, E>(
    result: Result<T, E>,
    policy: ErrorPolicy<E>,
) -> Result<CallToolResult, E> {
    match result {
        Ok(value) => Ok(match serde_json::to_value(&value) {
            Ok(v) => CallToolResult::structured(v),
            Err(e) => CallToolResult::error(vec![ContentBlock::text(format!(
                "the tool's answer could not be serialised: {e}"
            ))]),
        }),
        Err(e) => render_verbatim(Err(e), policy),
    }
}

/// [`render`] for a tool answering a `CallToolResult`: kept as it is.
pub(crate) fn render_verbatim<E>(
    result: Result<CallToolResult, E>,
    policy: ErrorPolicy<E>,
) -> Result<CallToolResult, E> {
    match result {
        Err(e) if (policy.classify)(&e) == Disposition::Definitive => {
            Ok(CallToolResult::error(vec![ContentBlock::text((policy
                .describe)(
                &e
            ))]))
        }
        other => other,
    }
}

/// A task tool's keyed call: [`TaskCall::run`].
#[derive(Debug)]
pub(crate) struct TaskCall {
    /// The server's engine.
    pub(crate) engine: Idempotency,
    /// The call's key and caller.
    pub(crate) prepared: Prepared,
    /// Whether to answer with a task: the server and the request's client both declare the
    /// tasks extension.
    pub(crate) as_task: bool,
}

impl TaskCall {
    /// The whole call: as a task when `as_task`, else inline. `body` gives the rendered result
    /// ([`render`]): definitive errors are already results, so the engine sees only retryable
    /// or unknown ones.
    pub(crate) async fn run<E, Fut>(
        self,
        policy: ErrorPolicy<E>,
        body: Fut,
    ) -> Result<CallToolResponse, ErrorData>
    where
        E: Send + 'static,
        Fut: Future<Output = Result<CallToolResult, E>> + Send + 'static,
    {
        let TaskCall {
            engine,
            prepared,
            as_task,
        } = self;
        if !as_task {
            let outcome = engine
                .execute_raw::<CallToolResult, E, _>(prepared, policy, body)
                .await;
            return super::answer_verbatim(described(outcome, policy))
                .map(CallToolResponse::Complete);
        }
        let caller = prepared.caller.clone();
        let (started, claimed) = tokio::sync::oneshot::channel::<RecordStatus>();
        let reader = engine.clone();
        let hook = TaskHook {
            engine: engine.clone(),
            caller: caller.clone(),
            started,
        };
        let run = tokio::spawn(async move {
            engine
                .execute_hooked::<CallToolResult, E, _, _>(prepared, policy, body, hook)
                .await
        });
        // The body starts only once the claim is stored: the claim is the task.
        if let Ok(status) = claimed.await {
            let now = reader.clock().now();
            let state = detailed(&status, Attempt::Current, now);
            return Ok(handle(TaskId::of(&status), &state.task));
        }
        // The body did not run: a repeat (the same task), or the wrapper's own answer.
        let outcome: Outcome<CallToolResult, Failure<E>> = match run.await {
            Ok(o) => o,
            Err(e) => {
                return Err(ErrorData::internal_error(
                    "the task could not be started",
                    Some(json!({"reason": e.to_string()})),
                ))
            }
        };
        // A repeat of a task is that task (the record's current claim), in the state `tasks/get`
        // reports for it: completed (its stored answer, Ok or a final error), or working (running,
        // or its outcome not known yet) — never an inline error in place of the task.
        let repeat = match (&outcome.result, outcome.reference) {
            (_, Some(r)) if outcome.replayed => Some(r),
            (Err(Failure::Wrapper(Error::InFlight { reference, .. })), _)
            | (Err(Failure::Wrapper(Error::OutcomeUnknown { reference, .. })), _) => {
                Some(*reference)
            }
            _ => None,
        };
        if let Some(reference) = repeat
            && let Ok(Some(status)) = reader.status(&caller, reference).await
            && status.reference == reference
        {
            let state = detailed(&status, Attempt::Current, reader.clock().now());
            return Ok(handle(TaskId::of(&status), &state.task));
        }
        super::answer_verbatim(described(outcome, policy)).map(CallToolResponse::Complete)
    }
}

/// A task's hook into the pipeline: once its claim is known, the record it made names the task,
/// read before the body acts (the record is this attempt's meanwhile: nobody else claims a call
/// in flight, and a rerun keeps the claim's time). Unread, the call is answered inline once it
/// is done.
struct TaskHook {
    engine: Idempotency,
    caller: Caller,
    started: tokio::sync::oneshot::Sender<RecordStatus>,
}

impl Hooks for TaskHook {
    async fn on_claimed<F>(self, reference: Reference, body: F) -> F::Output
    where
        F: Future + Send,
    {
        match self.engine.status(&self.caller, reference).await {
            Ok(Some(status)) if status.reference == reference => {
                let _ = self.started.send(status);
            }
            Ok(_) => {
                tracing::warn!(%reference, "idempotency: the task's claim was not found; answering inline");
            }
            Err(e) => {
                tracing::warn!(%reference, error = %e, "idempotency: the task's claim time could not be read; answering inline");
            }
        }
        body.await
    }
}

/// The task handle of the claim `id`, as `tasks/get` shows it now (`task`).
fn handle(id: TaskId, task: &Task) -> CallToolResponse {
    let mut created = task.clone();
    created.task_id = id.to_string();
    let mut meta = serde_json::Map::new();
    meta.insert(META_REF.into(), Value::String(id.reference.to_string()));
    CallToolResponse::Task(CreateTaskResult::new(created).with_meta(MetaObject(meta)))
}

/// The record behind task `task_id`, for the caller of `request`, and what became of the claim
/// the id names (another tenant's task is not found, like one that never existed, and so is a
/// task of an operation the key has moved on from: its answer is no longer kept).
async fn find<S>(
    server: &S,
    task_id: &str,
    request: &Request,
) -> Result<(RecordStatus, Attempt), ErrorData>
where
    S: IdempotencyContext<Request>,
{
    let caller = server
        .caller(request)
        .map_err(|e| ErrorData::invalid_request(e.advice(), None))?;
    let not_found = || {
        ErrorData::invalid_params(
            format!("no task {task_id} exists for you (or its answer is no longer kept)"),
            None,
        )
    };
    let id = TaskId::parse(task_id).ok_or_else(not_found)?;
    match server.idempotency().status(&caller, id.reference).await {
        Ok(Some(status)) => match id.attempt(&status) {
            Some(attempt) => Ok((status, attempt)),
            None => Err(not_found()),
        },
        Ok(None) => Err(not_found()),
        Err(e) => Err(ErrorData::internal_error(
            format!(
                "the state of task {task_id} could not be read right now ({e}); ask again shortly"
            ),
            None,
        )),
    }
}

/// `tasks/get`: the state of the claim the task id names, from the store.
pub async fn get_task<S>(
    server: &S,
    params: GetTaskParams,
    request: &Request,
) -> Result<GetTaskResult, ErrorData>
where
    S: IdempotencyContext<Request>,
{
    let (status, attempt) = find(server, &params.task_id, request).await?;
    let now = server.idempotency().clock().now();
    let mut task = detailed(&status, attempt, now);
    task.task.task_id = params.task_id;
    Ok(GetTaskResult::new(task))
}

/// `tasks/cancel`: acknowledged for a task the caller owns; the work is not interrupted (see the
/// module documentation), and `tasks/get` keeps reporting its real state.
pub async fn cancel_task<S>(
    server: &S,
    params: CancelTaskParams,
    request: &Request,
) -> Result<(), ErrorData>
where
    S: IdempotencyContext<Request>,
{
    find(server, &params.task_id, request).await.map(|_| ())
}

/// The task of `attempt`, a claim of the record `s` (the caller sets its id). A task never leaves
/// a terminal state: `completed` (the answer stands) and `failed` (nothing was done under this
/// claim: it was released) are final for the claim; a claim whose outcome is not known yet stays
/// `working` until it is settled, polled less often.
fn detailed(s: &RecordStatus, attempt: Attempt, now: Timestamp) -> DetailedTask {
    let r = s.reference;
    let tool = &s.tool;
    let updated = s.completed_at.unwrap_or(s.claimed_at);
    let failed = |message: String| {
        let mut error = JsonObject::new();
        error.insert("code".into(), json!(-32603));
        error.insert("message".into(), Value::String(message.clone()));
        (TaskPayload::Failed { error }, message, POLL_INTERVAL_MS)
    };
    let working = |message: String, poll: u64| (TaskPayload::Working, message, poll);
    // A tool that reruns a call whose worker is gone (`recover = "rerun"`) runs it again when the
    // call is sent again, under the same claim: say so, instead of "do not submit it again".
    let reruns = crate::tool::task_recovery(tool) == Some(crate::tool::Recover::Rerun);
    let standing = match attempt {
        Attempt::Current => s.standing(r, now),
        Attempt::Superseded => Standing::Superseded,
    };
    let (payload, message, poll) = match standing {
        Standing::LeasePassed | Standing::Unknown if reruns => working(format!(
            "{tool} (ref {r}) stopped before it reported: its worker is gone. Send the same call again: it runs again under the same reference, which the downstream system deduplicates on, and this task then completes with its answer."
        ), UNSETTLED_POLL_INTERVAL_MS),
        Standing::InFlight => working(
            format!("{tool} (ref {r}) is in progress. Do not submit it again."),
            POLL_INTERVAL_MS,
        ),
        Standing::LeasePassed => working(format!(
            "The outcome of {tool} (ref {r}) is not known yet: its worker has not reported since its lease ended at {}, so it may or may not have taken effect. Do not submit it again: this task stays working until the call is settled (reconciled by its reference), then ends with the outcome that stands; {STATUS_TOOL} tells the same about ref {r}.",
            s.lease_expires_at
        ), UNSETTLED_POLL_INTERVAL_MS),
        Standing::Unknown => working(format!(
            "The outcome of {tool} (ref {r}) is not known yet: it may or may not have taken effect. Do not submit it again: this task stays working until the call is settled (reconciled by its reference), then ends with the outcome that stands; {STATUS_TOOL} tells the same about ref {r}."
        ), UNSETTLED_POLL_INTERVAL_MS),
        Standing::Completed | Standing::Failed | Standing::Expired => {
            let result = stored_result(s);
            (
                TaskPayload::Completed { result },
                format!("{tool} (ref {r}) completed."),
                POLL_INTERVAL_MS,
            )
        }
        Standing::Released => failed(format!(
            "{tool} (ref {r}) did not take effect. It is safe to call {tool} again with the same arguments (a new task)."
        )),
        // Claimed again since: this attempt was given back, and a new task holds the call.
        Standing::Superseded => failed(format!(
            "This attempt at {tool} (ref {r}) did not take effect, and the call was sent again since: that is a new task (the same call returns its id)."
        )),
    };
    let mut task = Task::new(
        r.to_string(),
        TaskStatus::Working,
        s.claimed_at.to_string(),
        updated.to_string(),
    )
    .with_status_message(message)
    .with_poll_interval_ms(poll);
    if let (Attempt::Current, Some(until)) = (attempt, s.expires_at) {
        let ttl = until.as_millis().saturating_sub(s.claimed_at.as_millis());
        task = task.with_ttl_ms(u64::try_from(ttl).unwrap_or(0));
    }
    DetailedTask::new(task, payload)
}

/// The stored answer as the `CallToolResult` object it was (a task tool stores exactly that), the
/// reference in its `_meta`. An answer stored otherwise (by a settlement) is shown as
/// structured content, or as an error result when it was an error.
fn stored_result(s: &RecordStatus) -> JsonObject {
    let (ok, body) = match &s.response {
        Some(r) => (r.ok, r.body.as_str()),
        None => (true, "null"),
    };
    let value: Value = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.into()));
    let mut result = match serde_json::from_value::<CallToolResult>(value.clone()) {
        Ok(r) if value.get("content").is_some() => r,
        _ if ok => CallToolResult::structured(value),
        _ => CallToolResult::error(vec![ContentBlock::text(value.to_string())]),
    };
    let mut meta = result.meta.take().map(|m| m.0).unwrap_or_default();
    meta.insert(META_REF.into(), Value::String(s.reference.to_string()));
    result.meta = Some(MetaObject(meta));
    match serde_json::to_value(result) {
        Ok(Value::Object(o)) => o,
        _ => JsonObject::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{RecordState, StoredResponse};

    fn record(state: RecordState, response: Option<StoredResponse>) -> RecordStatus {
        RecordStatus {
            reference: "3f9a0c1b2d4e5f60-1".parse().expect("a reference"),
            tool: "export_rows".into(),
            state,
            claimed_at: Timestamp::from_millis(1_000_000),
            lease_expires_at: Timestamp::from_millis(1_060_000),
            completed_at: None,
            expires_at: None,
            response,
            read_at: None,
        }
    }

    #[derive(Debug)]
    struct Declined;

    impl std::fmt::Display for Declined {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("declined")
        }
    }

    #[test]
    fn a_definitive_error_is_a_completed_error_result_and_others_go_to_the_engine() {
        let definitive = ErrorPolicy::<Declined> {
            classify: |_| Disposition::Definitive,
            ..ErrorPolicy::retryable()
        };
        let r = render::<u8, _>(Err(Declined), definitive).expect("stored as a result");
        assert_eq!(r.is_error, Some(true));
        assert!(render::<u8, _>(Err(Declined), ErrorPolicy::retryable()).is_err());
        let ok = render::<u8, Declined>(Ok(5), ErrorPolicy::retryable()).expect("a result");
        assert_eq!(ok.structured_content, Some(json!(5)));
    }

    const NOW: Timestamp = Timestamp::from_millis(1_001_000);

    #[test]
    fn every_record_state_is_a_truthful_task_state() {
        let current = Attempt::Current;
        let working = detailed(&record(RecordState::InFlight, None), current, NOW);
        assert_eq!(working.status(), TaskStatus::Working);
        assert_eq!(working.task.poll_interval_ms, Some(POLL_INTERVAL_MS));
        let stale = detailed(
            &record(RecordState::InFlight, None),
            current,
            Timestamp::from_millis(2_000_000),
        );
        // Its lease passed unrenewed: the outcome is not known yet, and the task stays working
        // (polled less often) until it is settled, then ends with the outcome that stands.
        assert_eq!(stale.status(), TaskStatus::Working);
        assert_eq!(
            stale.task.poll_interval_ms,
            Some(UNSETTLED_POLL_INTERVAL_MS)
        );
        assert!(stale.task.status_message.unwrap().contains("not known yet"));

        let unknown = detailed(&record(RecordState::Unknown, None), current, NOW);
        assert_eq!(unknown.status(), TaskStatus::Working);
        assert_eq!(
            unknown.task.poll_interval_ms,
            Some(UNSETTLED_POLL_INTERVAL_MS)
        );
        assert!(unknown
            .task
            .status_message
            .unwrap()
            .contains("not known yet"));

        // A claim of the record made since this one: this attempt was released, for good.
        for state in [
            RecordState::InFlight,
            RecordState::Completed,
            RecordState::Unknown,
            RecordState::Released,
        ] {
            let later = detailed(&record(state, None), Attempt::Superseded, NOW);
            assert_eq!(later.status(), TaskStatus::Failed, "{state:?}");
            assert!(later.task.status_message.unwrap().contains("a new task"));
        }

        // Released: nothing was done, and the task says it is safe to call again.
        let released = detailed(&record(RecordState::Released, None), current, NOW);
        assert_eq!(released.status(), TaskStatus::Failed);
        match released.payload {
            TaskPayload::Failed { error } => {
                assert!(error["message"].as_str().unwrap().contains("safe to call"))
            }
            other => panic!("{other:?}"),
        }

        // Completed: the stored CallToolResult, with the reference in its `_meta`.
        let stored = CallToolResult::structured(json!({"rows": 5}));
        let mut done = record(
            RecordState::Completed,
            Some(StoredResponse {
                ok: true,
                body: serde_json::to_string(&stored).unwrap(),
            }),
        );
        done.completed_at = Some(Timestamp::from_millis(1_002_000));
        done.expires_at = Some(Timestamp::from_millis(4_602_000));
        let completed = detailed(&done, current, NOW);
        assert_eq!(completed.status(), TaskStatus::Completed);
        assert_eq!(completed.task.ttl_ms, Some(3_602_000));
        match completed.payload {
            TaskPayload::Completed { result } => {
                assert_eq!(result["structuredContent"], json!({"rows": 5}));
                assert_eq!(result["_meta"][META_REF], json!("3f9a0c1b2d4e5f60-1"));
            }
            other => panic!("{other:?}"),
        }
    }
}
