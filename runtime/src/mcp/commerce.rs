//! Answers in the shape of a commerce protocol's MCP binding (`#[idempotent(answers = "acp" |
//! "ucp")]`): every answer of the wrapper that is not the tool's own result is a JSON-RPC error
//! with code [`SERVER_ERROR`] (`-32000`), as both bindings answer protocol errors.
//!
//! With `answers = "acp"`, `data` is ACP's `Error` object (`type`, `code`, `message`, `param`),
//! with the codes ACP's REST side (SEP #120) gives the same cases:
//!
//! | case | `data.type` | `data.code` |
//! |---|---|---|
//! | a required key is missing | `invalid_request` | `idempotency_key_required` |
//! | the key is unusable (length, characters) | `invalid_request` | `idempotency_key_invalid` |
//! | the key's first request is still running | `invalid_request` | `idempotency_in_flight` |
//! | the key was used with another payload | `invalid_request` | `idempotency_conflict` |
//! | the call ran and its outcome is not known | `processing_error` | `idempotency_outcome_unknown` |
//! | nothing could be recorded, so nothing ran | `service_unavailable` | `idempotency_unavailable` |
//! | the stored answer cannot be read | `processing_error` | `idempotency_replay_failed` |
//! | another call's record holds the reference | `processing_error` | `idempotency_reference_taken` |
//! | the caller or the arguments cannot be keyed | `invalid_request` | `invalid` |
//!
//! With `answers = "ucp"`, `data` is one of UCP's messages (`type: "error"`, `code`, `content`,
//! `severity`, `path`): the same codes, `content` for the message, `path` for ACP's `param`, and
//! `severity` `recoverable` where the same request may succeed later (in flight, unavailable),
//! else `unrecoverable`.
//!
//! Beside those members, `data` carries `ref` (the operation's reference, for the status tool)
//! where there is one, and `retry_after` (whole seconds, what REST says in `Retry-After`) where
//! waiting and sending the same request again is the answer: in flight, and unavailable. The
//! tool's own answers — its results, and its errors as `isError` results — pass unchanged.

use rmcp::model::ErrorCode;
use rmcp::ErrorData;
use serde_json::{json, Map, Value};

use super::answer::{META_REF, META_STATUS};
use super::client_key::{KeyedAnswer, KEY_CONFLICT, KEY_INVALID, KEY_IN_PROGRESS, KEY_MISSING};

/// Which protocol's shape the wrapper's answers take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Commerce {
    /// The Agentic Commerce Protocol's `Error` object.
    Acp,
    /// The Universal Commerce Protocol's error message.
    Ucp,
}

/// The JSON-RPC error code of every ACP or UCP error (JSON-RPC's "server error").
pub const SERVER_ERROR: i32 = -32000;

/// How long, in seconds, a request that found its key in flight (or the store unavailable) is
/// told to wait before it is sent again: `retry_after` in the error's `data`.
pub const RETRY_AFTER_SECS: u64 = 1;

/// ACP's `type` and `code`, and whether a retry after [`RETRY_AFTER_SECS`] is the answer, for
/// one of the wrapper's statuses (`idempotency/status`) or client-key refusals.
fn classify(status: &str) -> Option<(&'static str, &'static str, bool)> {
    Some(match status {
        KEY_MISSING => ("invalid_request", "idempotency_key_required", false),
        KEY_INVALID => ("invalid_request", "idempotency_key_invalid", false),
        "in_flight" | KEY_IN_PROGRESS => ("invalid_request", "idempotency_in_flight", true),
        "payload_mismatch" | KEY_CONFLICT => ("invalid_request", "idempotency_conflict", false),
        "outcome_unknown" => ("processing_error", "idempotency_outcome_unknown", false),
        "not_done" => ("service_unavailable", "idempotency_unavailable", true),
        "replay_failed" => ("processing_error", "idempotency_replay_failed", false),
        "reference_taken" => ("processing_error", "idempotency_reference_taken", false),
        "invalid" => ("invalid_request", "invalid", false),
        _ => return None,
    })
}

/// `field` (a dotted path in the arguments) as the RFC 9535 JSONPath ACP's `param` holds:
/// `meta.idempotency_key` → `$.meta.idempotency_key`, `meta.idempotency-key` →
/// `$.meta['idempotency-key']`.
fn json_path(field: &str) -> String {
    let mut path = String::from("$");
    for name in field.split('.') {
        if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            path.push('.');
            path.push_str(name);
        } else {
            path.push_str("['");
            path.push_str(&name.replace('\\', "\\\\").replace('\'', "\\'"));
            path.push_str("']");
        }
    }
    path
}

/// One of the wrapper's own answers (the call not run now, or its key refused), as it was said:
/// its status or client-key word, its message, and the operation's reference (if known).
struct Refusal<'a> {
    status: &'a str,
    message: String,
    reference: Option<&'a str>,
}

/// What `refusal` is in `shape`; the key's field named where the key is what is wrong.
fn error(shape: Commerce, refusal: Refusal<'_>, key_field: Option<&str>) -> Option<ErrorData> {
    let Refusal {
        status,
        message,
        reference,
    } = refusal;
    let (kind, code, retry) = classify(status)?;
    let about_key = code.starts_with("idempotency_key") || code == "idempotency_conflict";
    let param = key_field.filter(|_| about_key).map(json_path);
    let mut data = Map::new();
    match shape {
        Commerce::Acp => {
            data.insert("type".into(), Value::String(kind.into()));
            data.insert("code".into(), Value::String(code.into()));
            data.insert("message".into(), Value::String(message.clone()));
            if let Some(p) = param {
                data.insert("param".into(), Value::String(p));
            }
        }
        Commerce::Ucp => {
            let severity = if retry {
                "recoverable"
            } else {
                "unrecoverable"
            };
            data.insert("type".into(), Value::String("error".into()));
            data.insert("code".into(), Value::String(code.into()));
            data.insert("content".into(), Value::String(message.clone()));
            data.insert("severity".into(), Value::String(severity.into()));
            if let Some(p) = param {
                data.insert("path".into(), Value::String(p));
            }
        }
    }
    if let Some(r) = reference.filter(|r| !r.is_empty()) {
        data.insert("ref".into(), Value::String(r.into()));
    }
    if retry {
        data.insert("retry_after".into(), json!(RETRY_AFTER_SECS));
    }
    Some(ErrorData::new(
        ErrorCode(SERVER_ERROR),
        message,
        Some(Value::Object(data)),
    ))
}

/// A wrapped tool's `answer` in `shape` (see the module's table): the wrapper's own answers and
/// refusals become the protocol's errors; `key_field` is the argument path of the client key,
/// named (`param`, `path`) when the key is what is wrong.
pub(crate) fn commerce<R: KeyedAnswer>(
    shape: Commerce,
    key_field: Option<&'static str>,
    answer: Result<R, ErrorData>,
) -> Result<R, ErrorData> {
    match answer {
        Err(e) => {
            let data = e.data.as_ref();
            let status = data
                .and_then(|d| d.get("type"))
                .and_then(Value::as_str)
                .or_else(|| {
                    data.and_then(|d| d.get(META_STATUS))
                        .and_then(Value::as_str)
                });
            let reference = data.and_then(|d| d.get("ref")).and_then(Value::as_str);
            let refusal = status.map(|status| Refusal {
                status,
                message: e.message.to_string(),
                reference,
            });
            match refusal.and_then(|r| error(shape, r, key_field)) {
                Some(acp) => Err(acp),
                None => Err(e),
            }
        }
        Ok(done) => {
            let Some(result) = done.completed().filter(|r| r.is_error == Some(true)) else {
                return Ok(done);
            };
            let meta = result.meta.as_ref().map(|m| &m.0);
            // The tool's own errors carry no status: they are its answer, and pass unchanged.
            let Some(status) = meta
                .and_then(|m| m.get(META_STATUS))
                .and_then(Value::as_str)
            else {
                return Ok(done);
            };
            let reference = meta.and_then(|m| m.get(META_REF)).and_then(Value::as_str);
            let message = result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
                .collect::<Vec<_>>()
                .join("\n");
            let refusal = Refusal {
                status,
                message,
                reference,
            };
            match error(shape, refusal, key_field) {
                Some(acp) => Err(acp),
                None => Ok(done),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{CallToolResult, ContentBlock, MetaObject};

    use super::*;

    fn wrapper_answer(status: &str, text: &str) -> Result<CallToolResult, ErrorData> {
        let mut meta = Map::new();
        meta.insert(META_STATUS.into(), json!(status));
        meta.insert(META_REF.into(), json!("3f9a0c1b2d4e5f60-1"));
        Ok(CallToolResult::error(vec![ContentBlock::text(text)]).with_meta(Some(MetaObject(meta))))
    }

    fn acp<R: KeyedAnswer>(
        key_field: Option<&'static str>,
        answer: Result<R, ErrorData>,
    ) -> Result<R, ErrorData> {
        commerce(Commerce::Acp, key_field, answer)
    }

    fn data(r: Result<CallToolResult, ErrorData>) -> (i32, Value) {
        let e = r.expect_err("an ACP error");
        (e.code.0, e.data.expect("ACP's Error object"))
    }

    #[test]
    fn in_flight_is_a_server_error_with_acps_code_and_a_retry_after() {
        let (code, d) = data(acp(
            Some("meta.idempotency_key"),
            wrapper_answer("in_flight", "still running, ref 3f9a0c1b2d4e5f60-1"),
        ));
        assert_eq!(code, -32000);
        assert_eq!(
            d,
            json!({
                "type": "invalid_request",
                "code": "idempotency_in_flight",
                "message": "still running, ref 3f9a0c1b2d4e5f60-1",
                "ref": "3f9a0c1b2d4e5f60-1",
                "retry_after": 1
            })
        );
    }

    #[test]
    fn a_conflict_names_the_keys_field_as_a_json_path() {
        let (_, d) = data(acp(
            Some("meta.idempotency-key"),
            wrapper_answer("payload_mismatch", "other payload"),
        ));
        assert_eq!(d["code"], "idempotency_conflict");
        assert_eq!(d["param"], "$.meta['idempotency-key']");
        assert!(d.get("retry_after").is_none());
    }

    #[test]
    fn a_missing_key_refusal_becomes_idempotency_key_required() {
        let refused = ErrorData::invalid_params(
            "needs a key",
            Some(json!({"type": KEY_MISSING, META_STATUS: "invalid"})),
        );
        let (code, d) = data(acp::<CallToolResult>(
            Some("meta.idempotency_key"),
            Err(refused),
        ));
        assert_eq!(code, -32000);
        assert_eq!(
            d,
            json!({
                "type": "invalid_request",
                "code": "idempotency_key_required",
                "message": "needs a key",
                "param": "$.meta.idempotency_key"
            })
        );
    }

    #[test]
    fn outcome_unknown_and_unavailable_are_not_invalid_requests() {
        let (_, d) = data(acp(None, wrapper_answer("outcome_unknown", "lost")));
        assert_eq!(
            (d["type"].as_str(), d["code"].as_str()),
            (
                Some("processing_error"),
                Some("idempotency_outcome_unknown")
            )
        );
        let (_, d) = data(acp(None, wrapper_answer("not_done", "store down")));
        assert_eq!(d["type"], "service_unavailable");
        assert_eq!(d["retry_after"], 1);
    }

    #[test]
    fn the_tools_own_answers_pass_unchanged() {
        let ok = CallToolResult::structured(json!({"id": "cs_1", "status": "completed"}));
        assert_eq!(acp(None, Ok(ok.clone())), Ok(ok));
        let declined = CallToolResult::error(vec![ContentBlock::text("card declined")]);
        assert_eq!(acp(None, Ok(declined.clone())), Ok(declined));
        let other = ErrorData::internal_error("boom", None);
        assert_eq!(acp::<CallToolResult>(None, Err(other.clone())), Err(other));
    }

    #[test]
    fn ucp_says_it_as_an_error_message_with_a_severity() {
        let (code, d) = data(commerce(
            Commerce::Ucp,
            Some("meta.idempotency-key"),
            wrapper_answer("payload_mismatch", "other payload"),
        ));
        assert_eq!(code, -32000);
        assert_eq!(
            d,
            json!({
                "type": "error",
                "code": "idempotency_conflict",
                "content": "other payload",
                "severity": "unrecoverable",
                "path": "$.meta['idempotency-key']",
                "ref": "3f9a0c1b2d4e5f60-1"
            })
        );
        let (_, d) = data(commerce(
            Commerce::Ucp,
            None,
            wrapper_answer("in_flight", "running"),
        ));
        assert_eq!(
            (d["severity"].as_str(), d["retry_after"].as_u64()),
            (Some("recoverable"), Some(1))
        );
    }

    #[test]
    fn every_status_has_a_code() {
        for status in crate::mcp::STATUSES {
            assert!(classify(status).is_some(), "{status}");
        }
    }
}
