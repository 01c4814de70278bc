use std::fmt::Display;

use rmcp::model::{CallToolResult, ContentBlock, MetaObject};
use rmcp::ErrorData;
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::outcome::{ErrorPolicy, Failure, Outcome};
use crate::Error;

/// `_meta` key: the operation's reference.
pub const META_REF: &str = "idempotency/ref";
/// `_meta` key: `true` when the result is a stored answer replayed (content unchanged).
pub const META_REPLAYED: &str = "idempotency/replayed";
/// `_meta` key on the wrapper's own answers: one of [`STATUSES`].
pub const META_STATUS: &str = "idempotency/status";

/// Every value [`META_STATUS`] takes, one word per meaning:
///
/// | status | meaning |
/// |---|---|
/// | `in_flight` | an identical call is running; nothing was done by this one |
/// | `outcome_unknown` | the call ran (or may have) and its outcome is not known; do not retry |
/// | `payload_mismatch` | the business key was used with other arguments; nothing was done |
/// | `reference_taken` | another call's record holds this call's reference; nothing was done |
/// | `not_done` | the call could not be recorded, so it did not run; nothing was done |
/// | `replay_failed` | the stored answer cannot be read as this tool's answer; the call is not run again |
/// | `invalid` | the caller or the arguments cannot be keyed; nothing was done |
pub const STATUSES: &[&str] = &[
    "in_flight",
    "outcome_unknown",
    "payload_mismatch",
    "reference_taken",
    "not_done",
    "replay_failed",
    "invalid",
];

/// Renders an idempotent call's outcome as an MCP tool result.
///
/// - `Ok(T)`: structured content (the JSON of `T`) and the same JSON as text;
/// - the handler's error: an `isError` result with its message (a replayed definitive error
///   reads the same);
/// - the wrapper's answer (in flight, outcome unknown, mismatch, store down): an `isError`
///   result whose text says what happened, the ref and what to do next.
///
/// A replay has the same content as the first answer; only `_meta` says `replayed: true`.
pub(crate) fn answer<T: Serialize, E: Display>(
    outcome: Outcome<T, Failure<E>>,
) -> Result<CallToolResult, ErrorData> {
    let mut meta = Map::new();
    if let Some(r) = outcome.reference {
        meta.insert(META_REF.into(), Value::String(r.to_string()));
    }
    meta.insert(META_REPLAYED.into(), Value::Bool(outcome.replayed));
    let result = match outcome.result {
        Ok(value) => {
            let value = serde_json::to_value(&value).map_err(|e| {
                ErrorData::internal_error(
                    "the tool's answer could not be serialised",
                    Some(json!({"reason": e.to_string()})),
                )
            })?;
            CallToolResult::structured(value)
        }
        Err(Failure::Handler(e)) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
        Err(Failure::Wrapper(e)) => {
            meta.insert(META_STATUS.into(), Value::String(status_of(&e).into()));
            CallToolResult::error(vec![ContentBlock::text(e.advice())])
        }
    };
    Ok(result.with_meta(Some(MetaObject(meta))))
}

/// Like [`answer`], for a tool whose answer is itself a [`CallToolResult`]: stored and replayed
/// verbatim — every content block (images, resources, text), `structuredContent` and `isError` —
/// with the reference and the replay marker merged into its `_meta` (its own `_meta` keys kept).
/// `#[idempotent]` uses it for tools returning `CallToolResult`.
pub(crate) fn answer_verbatim<E: Display>(
    outcome: Outcome<CallToolResult, Failure<E>>,
) -> Result<CallToolResult, ErrorData> {
    match outcome.result {
        Ok(mut result) => {
            let mut meta = result.meta.take().map(|m| m.0).unwrap_or_default();
            if let Some(r) = outcome.reference {
                meta.insert(META_REF.into(), Value::String(r.to_string()));
            }
            meta.insert(META_REPLAYED.into(), Value::Bool(outcome.replayed));
            Ok(result.with_meta(Some(MetaObject(meta))))
        }
        Err(e) => answer::<(), E>(Outcome {
            result: Err(e),
            replayed: outcome.replayed,
            reference: outcome.reference,
        }),
    }
}

/// `outcome` with the handler's error as its text, as `policy` describes it: what the answers
/// render, with no bound on the error type beyond its policy's.
pub(crate) fn described<T, E>(
    outcome: Outcome<T, Failure<E>>,
    policy: ErrorPolicy<E>,
) -> Outcome<T, Failure<String>> {
    Outcome {
        result: outcome.result.map_err(|f| match f {
            Failure::Handler(e) => Failure::Handler((policy.describe)(&e)),
            Failure::Wrapper(e) => Failure::Wrapper(e),
        }),
        replayed: outcome.replayed,
        reference: outcome.reference,
    }
}

pub(crate) fn status_of(e: &Error) -> &'static str {
    match e {
        Error::InFlight { .. } => "in_flight",
        Error::OutcomeUnknown { .. } | Error::Unstorable { .. } => "outcome_unknown",
        Error::PayloadMismatch { .. } => "payload_mismatch",
        Error::ReferenceTaken { .. } => "reference_taken",
        Error::Store { .. }
        | Error::Unreadable { .. }
        | Error::NotReleased { .. }
        | Error::RolledBack { .. } => "not_done",
        Error::Replay { .. } => "replay_failed",
        Error::Arguments { .. } | Error::ClientKey { .. } | Error::InvalidCaller { .. } => {
            "invalid"
        }
    }
}

/// The wrapper's answer when it cannot even key the call (no caller identity, unkeyable
/// arguments): an `isError` result saying so; nothing was done.
pub fn refuse(e: Error) -> Result<CallToolResult, ErrorData> {
    crate::metrics::refused(&e);
    let mut meta = Map::new();
    meta.insert(META_STATUS.into(), Value::String(status_of(&e).into()));
    Ok(CallToolResult::error(vec![ContentBlock::text(e.advice())])
        .with_meta(Some(MetaObject(meta))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MCP reserves `_meta` prefixes whose second label is `modelcontextprotocol` or `mcp`
    /// (`io.modelcontextprotocol/`, `dev.mcp/`...): ours must not be one.
    #[test]
    fn meta_keys_use_no_reserved_prefix() {
        for key in [META_REF, META_REPLAYED, META_STATUS] {
            let (prefix, name) = key.split_once('/').expect("a prefixed key");
            assert!(!name.is_empty());
            let labels: Vec<&str> = prefix.split('.').collect();
            assert!(
                !matches!(labels.get(1), Some(&"modelcontextprotocol") | Some(&"mcp")),
                "{key}"
            );
            assert_eq!(prefix, "idempotency");
        }
    }
}
