use std::sync::Arc;

use rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations,
};
use serde_json::{json, Value};

use crate::error::STATUS_TOOL;
use crate::record::{RecordStatus, Standing};
use crate::store::StoreError;
use crate::{IdempotencyContext, Reference};

/// What a server implements to serve the status tool.
type Request = rmcp::service::RequestContext<rmcp::RoleServer>;

/// The status tool's descriptor: `idempotency_status(ref)`, read-only.
///
/// Its annotations are honest: it reads, changes nothing, and touches nothing outside this
/// server. It carries no `idempotentHint`: only `#[idempotent]` emits that.
pub fn status_tool() -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {
            "ref": {
                "type": "string",
                "description": "The reference an earlier tool answer named, e.g. 3f9a0c1b2d4e5f60-1"
            }
        },
        "required": ["ref"],
        "additionalProperties": false
    });
    let schema: JsonObject = match schema {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    };
    Tool::new(
        STATUS_TOOL,
        "Look up what happened to an earlier call by its reference (ref): in progress, completed \
         (with its stored answer), outcome unknown, not done, or not found. Use it instead of \
         repeating a call whose answer you did not get.",
        Arc::new(schema),
    )
    .with_annotations(
        ToolAnnotations::new()
            .read_only(true)
            .destructive(false)
            .open_world(false),
    )
}

/// A router holding only the status tool; add it to your server's router with one line:
/// `Self::tool_router() + idempotency::mcp::status_router::<Self>()`.
///
/// Lookups are scoped to the caller's tenant: another tenant's reference is "not found",
/// exactly like one that never existed.
pub fn status_router<S>() -> ToolRouter<S>
where
    S: IdempotencyContext<Request> + Send + Sync + 'static,
{
    let route = ToolRoute::new_dyn(status_tool(), |ctx: ToolCallContext<'_, S>| {
        Box::pin(async move {
            let result = run(ctx).await;
            Ok(CallToolResponse::from(result))
        })
    });
    ToolRouter::new().with_route(route)
}

async fn run<S>(ctx: ToolCallContext<'_, S>) -> CallToolResult
where
    S: IdempotencyContext<Request> + Send + Sync + 'static,
{
    let caller = match ctx.service.caller(&ctx.request_context) {
        Ok(c) => c,
        Err(e) => return text_error(e.advice()),
    };
    let Some(raw) = ctx
        .arguments
        .as_ref()
        .and_then(|a| a.get("ref"))
        .and_then(Value::as_str)
    else {
        return text_error(format!(
            "{STATUS_TOOL} needs a `ref` argument: the reference an earlier answer named."
        ));
    };
    let reference: Reference = match raw.parse() {
        Ok(r) => r,
        Err(e) => return text_error(e.to_string()),
    };
    let engine = ctx.service.idempotency();
    match look_up(engine, &caller, reference).await {
        Ok(Found::Record(status)) => match status.standing(reference, engine.clock().now()) {
            Standing::Superseded => superseded(reference, &status),
            standing => describe(&status, standing),
        },
        Ok(Found::Running) => CallToolResult::structured(json!({
            "ref": reference.to_string(),
            "state": "in_flight",
            "message": format!("ref {reference} is running now as one transaction: when it ends it has either taken effect as a whole (this tool then shows its answer) or not at all. Ask again shortly; do not repeat the call meanwhile."),
        })),
        Ok(Found::Nothing) => CallToolResult::structured(json!({
            "ref": reference.to_string(),
            "state": "not_found",
            "message": format!("No operation with ref {reference} exists for you. Check the reference; if the call was never answered, it may not have reached this server."),
        })),
        Err(e) => text_error(unreadable(reference, &e)),
    }
}

/// What the status tool found of a reference.
enum Found {
    /// Its record.
    Record(RecordStatus),
    /// No record: a transactional call of the caller's tenant runs under it now.
    Running,
    /// Nothing the caller may see.
    Nothing,
}

/// The record of `reference` the caller may see; without one, whether a transactional call of
/// the caller's tenant runs under it now. In that order, then the record once more: a call whose
/// transaction commits between the first read and the lock's check has its record by the second
/// read, so no order of events answers "not found" for a call that ran.
async fn look_up(
    engine: &crate::Idempotency,
    caller: &crate::Caller,
    reference: Reference,
) -> Result<Found, StoreError> {
    if let Some(status) = engine.status(caller, reference).await? {
        return Ok(Found::Record(status));
    }
    if engine.running_in_transaction(caller, reference).await? {
        return Ok(Found::Running);
    }
    Ok(match engine.status(caller, reference).await? {
        Some(status) => Found::Record(status),
        None => Found::Nothing,
    })
}

/// Why the status of `reference` could not be read, and what to do: ask again shortly only when
/// the store's failure was a passing one.
fn unreadable(reference: Reference, e: &StoreError) -> String {
    match e {
        e if e.is_transient() => format!("The status of ref {reference} could not be read right now ({e}). Ask again shortly; do not repeat the original call meanwhile."),
        StoreError::Corrupt { .. } => format!("The record of ref {reference} cannot be read ({e}); asking again gives the same answer. Do not repeat the original call: the server's operator must repair, settle or remove the record (idempotency-admin inspect {reference} shows it)."),
        e => format!("The status of ref {reference} cannot be read ({e}); asking again will not help. Do not repeat the original call; report this to the server's operator."),
    }
}

/// `asked` names an earlier operation on a key that has moved on to `now`: a key moves on only
/// after its operation completed and its window passed, so `asked` completed; its answer is no
/// longer kept.
fn superseded(asked: Reference, now: &RecordStatus) -> CallToolResult {
    let tool = &now.tool;
    CallToolResult::structured(json!({
        "ref": asked.to_string(),
        "tool": tool,
        "state": "completed",
        "superseded_by": now.reference.to_string(),
        "message": format!(
            "{tool} (ref {asked}) completed; its answer is no longer kept because its replay window passed. \
             The same call was made again later as ref {}: ask about that ref for its state.",
            now.reference
        ),
    }))
}

/// The status tool's answer for a record of `standing` (what a repeat is told, in the same
/// words: a claim whose lease passed is "outcome unknown" to both).
fn describe(s: &RecordStatus, standing: Standing) -> CallToolResult {
    let r = s.reference;
    let tool = &s.tool;
    let body = || s.response.as_ref().map(|r| crate::door::shown(&r.body));
    let when = s.completed_at.map(|t| t.to_string()).unwrap_or_default();
    let (state, message, answer): (&str, String, Option<Value>) = match standing {
        Standing::LeasePassed => (
            "outcome_unknown",
            format!("The outcome of {tool} (ref {r}, started {}) is unknown: its worker has not reported since its lease ended at {}, so it may or may not have taken effect. It will be reconciled with the downstream system; do not retry it. Ask again later.", s.claimed_at, s.lease_expires_at),
            None,
        ),
        Standing::InFlight => (
            "in_flight",
            format!("{tool} (ref {r}) is in progress since {}. Do not submit it again; ask again shortly.", s.claimed_at),
            None,
        ),
        Standing::Completed => (
            "completed",
            format!("{tool} (ref {r}) completed at {when}. Its answer is included; do not submit it again."),
            body(),
        ),
        Standing::Failed => (
            "failed",
            format!("{tool} (ref {r}) finished at {when} with a final error (included). Repeating it gives the same error."),
            body(),
        ),
        Standing::Expired => (
            "completed",
            format!("{tool} (ref {r}) completed at {when} (its answer is included), and its replay window has ended: calling {tool} again with the same arguments runs it again as a new operation."),
            body(),
        ),
        Standing::Unknown => (
            "outcome_unknown",
            format!("The outcome of {tool} (ref {r}, started {}) is unknown: it may or may not have taken effect. It is being reconciled with the downstream system; do not retry it. Ask again later.", s.claimed_at),
            None,
        ),
        // Superseded is answered before; a later standing of this version reads as not done.
        Standing::Released | Standing::Superseded => (
            "not_done",
            format!("{tool} (ref {r}) did not take effect. It is safe to call {tool} again with the same arguments."),
            None,
        ),
    };
    let mut v = json!({
        "ref": r.to_string(),
        "tool": tool,
        "state": state,
        "since": s.claimed_at.to_string(),
        "message": message,
    });
    if let (Some(obj), Some(answer)) = (v.as_object_mut(), answer) {
        obj.insert("answer".into(), answer);
    }
    if let (Some(obj), Some(t)) = (v.as_object_mut(), s.completed_at) {
        obj.insert("completed_at".into(), Value::String(t.to_string()));
    }
    CallToolResult::structured(v)
}

fn text_error(msg: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(msg)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ask again shortly only when the store's failure passes; a record that cannot be read
    /// sends the caller to the operator.
    #[test]
    fn an_unreadable_record_is_not_asked_again() {
        let r: Reference = "3f9a0c1b2d4e5f60-1".parse().expect("a reference");
        let passing = unreadable(r, &StoreError::Unavailable("connection reset".into()));
        assert!(passing.contains("Ask again shortly"), "{passing}");
        let corrupt = unreadable(r, &StoreError::corrupt("unknown record state 9"));
        assert!(
            corrupt.contains("cannot be read")
                && corrupt.contains("3f9a0c1b2d4e5f60-1")
                && corrupt.contains("operator")
                && corrupt.contains("idempotency-admin")
                && !corrupt.contains("shortly"),
            "{corrupt}"
        );
        let config = unreadable(r, &StoreError::migration("migration 2 failed"));
        assert!(
            config.contains("will not help") && !config.contains("shortly"),
            "{config}"
        );
    }
}
