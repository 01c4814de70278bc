//! The layer's own answers, as `application/problem+json` (RFC 9457): the members RFC 9457
//! defines (`type`, `title`, `status`, `detail`, `instance`), ACP's (`code`, `message`, `param`)
//! and the operation's reference (`ref`) when there is one. `detail` (and `message`, the same
//! text) says what happened and what to do next.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use serde_json::{Map, Value};

use crate::error::{Error, UnknownReason};
use crate::key::{ClientKeyError, Reference};

/// The media type of the layer's own answers (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// One answer of the layer.
#[derive(Debug)]
pub(super) struct Problem {
    status: StatusCode,
    code: &'static str,
    title: &'static str,
    detail: String,
    reference: Option<Reference>,
    param: Option<&'static str>,
    retry_after: Option<Duration>,
}

impl Problem {
    fn new(status: StatusCode, code: &'static str, title: &'static str, detail: String) -> Self {
        Problem {
            status,
            code,
            title,
            detail,
            reference: None,
            param: None,
            retry_after: None,
        }
    }

    fn about_the_key(mut self) -> Self {
        self.param = Some("Idempotency-Key");
        self
    }

    fn with_ref(mut self, reference: Option<Reference>) -> Self {
        self.reference = reference;
        self
    }

    fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// The route requires a key and the request has none (400, the draft's and ACP's).
    pub(super) fn key_required(operation: &str) -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "idempotency_key_required",
            "Idempotency-Key is missing",
            format!("{operation} requires an Idempotency-Key header: send a unique key (a UUID) with the request, and the same key with every retry of it. Nothing was done."),
        )
        .about_the_key()
    }

    /// The request's key is unusable (400).
    pub(super) fn key_invalid(e: &ClientKeyError) -> Self {
        let why = match e {
            ClientKeyError::Conflicting => {
                "the request carries more than one Idempotency-Key header and they differ: send one"
                    .to_owned()
            }
            other => other.to_string(),
        };
        Problem::new(
            StatusCode::BAD_REQUEST,
            "idempotency_key_invalid",
            "Idempotency-Key is invalid",
            format!("{why}. Nothing was done."),
        )
        .about_the_key()
    }

    /// The body is larger than the route's bound (413).
    pub(super) fn too_large(limit: usize) -> Self {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            "Request body too large",
            format!("The request body is larger than the {limit} bytes this route accepts. Nothing was done."),
        )
    }

    /// The body could not be read (the client went away, a broken stream) (400).
    pub(super) fn unreadable_body(why: &str) -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "Request body could not be read",
            format!("The request body could not be read ({why}). Nothing was done: send it again with the same Idempotency-Key."),
        )
    }

    /// The route's fingerprint function refused the request (400).
    pub(super) fn unfingerprinted(why: &str) -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "Request cannot be compared with its repeats",
            format!("{why}. Nothing was done."),
        )
    }

    /// No authenticated caller in the request's extensions: the server's layers are in the
    /// wrong order (500).
    pub(super) fn no_caller(operation: &str) -> Self {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "idempotency_caller_missing",
            "Caller not identified",
            format!("{operation} was not run: the server did not establish who is calling before the idempotency layer (its authentication must put an idempotency::Caller in the request's extensions). Nothing was done; report this to the server's operator."),
        )
    }

    /// A new key for a request identical to one sent with another key within the window (409).
    pub(super) fn fresh_key(operation: &str, earlier: Option<Reference>) -> Self {
        let at = earlier.map_or(String::new(), |r| format!(" (ref {r})"));
        Problem::new(
            StatusCode::CONFLICT,
            "idempotency_key_mismatch",
            "Same request under a new Idempotency-Key",
            format!("An identical {operation} request{at} was sent with another Idempotency-Key. Nothing was done: to retry a request, send it again with its first key (that key's answer is replayed); this route refuses a new key for an identical request within its window."),
        )
        .with_ref(earlier)
    }

    /// The fresh-key check could not be made, so the request did not run (503).
    pub(super) fn unchecked(operation: &str, e: &Error, retry_after: Duration) -> Self {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "idempotency_store_unavailable",
            "Idempotency store unavailable",
            format!("{operation} was not run: the check for an identical request under another Idempotency-Key failed ({e}). Nothing was done. It is safe to send it again shortly with the same key."),
        )
        .retry_after(retry_after)
    }

    /// The inner service may have acted, and its response cannot be recorded (409).
    pub(super) fn unknown(operation: &str, reference: Option<Reference>, why: &str) -> Self {
        let at = reference.map_or(String::new(), |r| format!(" (ref {r})"));
        Problem::new(
            StatusCode::CONFLICT,
            "idempotency_outcome_unknown",
            "Outcome unknown",
            format!("The outcome of {operation} is unknown{at}: {why}. It may or may not have taken effect: do not send it again, with this key or a new one."),
        )
        .with_ref(reference)
    }

    /// The recorded response cannot be replayed (500).
    pub(super) fn replay_failed(operation: &str, reference: Option<Reference>, why: &str) -> Self {
        let at = reference.map_or(String::new(), |r| format!(" (ref {r})"));
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "idempotency_replay_failed",
            "Stored answer cannot be replayed",
            format!("{operation}: the recorded response{at} cannot be replayed ({why}). The request is not run again; report this to the server's operator."),
        )
        .with_ref(reference)
    }

    /// The engine's answer `e` (the call did not run now, or its outcome could not be recorded).
    pub(super) fn from_error(e: &Error, retry_after: Duration) -> Self {
        use StatusCode as S;
        let p = match e {
            Error::InFlight { tool, reference, .. } => Problem::new(
                S::CONFLICT,
                "idempotency_in_flight",
                "A request with this Idempotency-Key is in progress",
                format!("The first {tool} request with this Idempotency-Key (ref {reference}) is still in progress. Nothing was done by this one: send it again with the same key after the Retry-After delay to get its answer; do not use a new key."),
            )
            .retry_after(retry_after),
            Error::PayloadMismatch { tool, reference } => Problem::new(
                S::UNPROCESSABLE_ENTITY,
                "idempotency_conflict",
                "Idempotency-Key reused with a different request",
                format!("This Idempotency-Key was already used for a different {tool} request (ref {reference}). Nothing was done: send the original request with it to get the original answer, or use a new key for a different request."),
            ),
            Error::OutcomeUnknown { reference, reason: UnknownReason::CommitUnanswered, .. } => Problem::new(
                S::CONFLICT,
                "idempotency_outcome_unknown",
                "Outcome unknown",
                format!("{e}. Send the same request with the same key again to learn it: its answer is replayed if it committed, and it runs once if it did not (ref {reference})."),
            ),
            Error::OutcomeUnknown { reference, .. } | Error::Unstorable { reference, .. } => Problem::new(
                S::CONFLICT,
                "idempotency_outcome_unknown",
                "Outcome unknown",
                format!("{e}. It may or may not have taken effect: do not send it again, with this key or a new one; ask the server's operator about ref {reference} (idempotency-admin inspect {reference}). Every repeat gets this answer until it is settled."),
            ),
            Error::Store { source, .. } if source.is_transient() => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "idempotency_store_unavailable",
                "Idempotency store unavailable",
                format!("{e}. Nothing was done. It is safe to send it again shortly with the same Idempotency-Key."),
            )
            .retry_after(retry_after),
            Error::RolledBack { .. } => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "idempotency_rolled_back",
                "Rolled back",
                e.advice(),
            )
            .retry_after(retry_after),
            Error::Store { .. } => Problem::new(
                S::INTERNAL_SERVER_ERROR,
                "idempotency_store_error",
                "Idempotency store error",
                e.advice(),
            ),
            Error::Unreadable { .. } => Problem::new(
                S::INTERNAL_SERVER_ERROR,
                "idempotency_record_unreadable",
                "Stored record cannot be read",
                e.advice(),
            ),
            Error::ReferenceTaken { .. } => Problem::new(
                S::INTERNAL_SERVER_ERROR,
                "idempotency_reference_taken",
                "Reference taken",
                e.advice(),
            ),
            Error::NotReleased { handler, .. } => Problem::new(
                S::INTERNAL_SERVER_ERROR,
                "idempotency_not_released",
                "Claim not released",
                format!("{e}. The handler said: {handler}. Nothing was done, but a repeat is answered 409 until the claim's lease passes, and then that its outcome is unknown until it is settled."),
            ),
            Error::Replay { reference, .. } => Problem::new(
                S::INTERNAL_SERVER_ERROR,
                "idempotency_replay_failed",
                "Stored answer cannot be replayed",
                format!("{e}. The request is not run again; ask the server's operator about ref {reference}."),
            ),
            Error::Arguments { .. } => Problem::new(
                S::BAD_REQUEST,
                "invalid_request",
                "Request cannot be keyed",
                e.advice(),
            ),
            Error::ClientKey { source, .. } => Problem::key_invalid(source),
            Error::InvalidCaller { .. } => Problem::new(
                S::INTERNAL_SERVER_ERROR,
                "idempotency_caller_missing",
                "Caller not identified",
                e.advice(),
            ),
        };
        p.with_ref(e.reference())
    }

    /// The answer: `type` is `base` followed by the code when the layer has a base, otherwise
    /// `about:blank` with the status's own phrase as `title` (RFC 9457 §4.2.1); `instance` is
    /// the request's path.
    pub(super) fn response<B: From<Bytes>>(
        &self,
        base: Option<&str>,
        instance: &str,
    ) -> Response<B> {
        let (kind, title) = match base {
            Some(base) => (format!("{base}{}", self.code), self.title),
            None => (
                "about:blank".to_owned(),
                self.status.canonical_reason().unwrap_or(self.title),
            ),
        };
        let mut m = Map::new();
        m.insert("type".into(), Value::String(kind));
        m.insert("title".into(), Value::String(title.into()));
        m.insert("status".into(), Value::from(self.status.as_u16()));
        m.insert("detail".into(), Value::String(self.detail.clone()));
        m.insert("instance".into(), Value::String(instance.into()));
        m.insert("code".into(), Value::String(self.code.into()));
        m.insert("message".into(), Value::String(self.detail.clone()));
        if let Some(param) = self.param {
            m.insert("param".into(), Value::String(param.into()));
        }
        if let Some(r) = self.reference {
            m.insert("ref".into(), Value::String(r.to_string()));
        }
        let body = serde_json::to_vec(&Value::Object(m)).unwrap_or_default();
        let mut response = Response::new(B::from(Bytes::from(body)));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(PROBLEM_JSON),
        );
        headers.insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        );
        if let Some(after) = self.retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Timestamp;
    use crate::store::StoreError;

    fn reference() -> Reference {
        "3f9a0c1b2d4e5f60-1".parse().expect("a reference")
    }

    fn answer(p: &Problem, base: Option<&str>) -> (Response<Bytes>, Value) {
        let r: Response<Bytes> = p.response(base, "/orders");
        let body = serde_json::from_slice(r.body()).expect("JSON");
        (r, body)
    }

    /// The draft's and ACP's statuses and codes, `Retry-After` only where waiting helps, and
    /// both sets of members.
    #[test]
    fn each_answer_has_its_status_code_and_members() {
        let tool = || "create_order".to_owned();
        let cases = [
            (
                Error::InFlight {
                    tool: tool(),
                    reference: reference(),
                    since: Timestamp::from_millis(0),
                },
                409,
                "idempotency_in_flight",
                Some("2"),
            ),
            (
                Error::PayloadMismatch {
                    tool: tool(),
                    reference: reference(),
                },
                422,
                "idempotency_conflict",
                None,
            ),
            (
                Error::OutcomeUnknown {
                    tool: tool(),
                    reference: reference(),
                    reason: UnknownReason::Earlier,
                    source: None,
                },
                409,
                "idempotency_outcome_unknown",
                None,
            ),
            (
                Error::Store {
                    tool: tool(),
                    source: StoreError::Unavailable(Box::new(std::io::Error::other("reset"))),
                },
                503,
                "idempotency_store_unavailable",
                Some("2"),
            ),
        ];
        for (e, status, code, retry) in cases {
            let p = Problem::from_error(&e, Duration::from_millis(1500));
            let (r, body) = answer(&p, None);
            assert_eq!(r.status().as_u16(), status, "{body}");
            assert_eq!(r.headers()["content-type"], PROBLEM_JSON);
            assert_eq!(
                r.headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap_or("")),
                retry,
                "{body}"
            );
            assert_eq!(body["code"], code);
            assert_eq!(body["type"], "about:blank");
            assert_eq!(body["title"], r.status().canonical_reason().unwrap_or(""));
            assert_eq!(body["status"], status);
            assert_eq!(body["instance"], "/orders");
            assert_eq!(body["detail"], body["message"]);
            if code != "idempotency_store_unavailable" {
                assert_eq!(body["ref"], "3f9a0c1b2d4e5f60-1", "{body}");
            }
        }
        let missing = Problem::key_required("create_order");
        let (r, body) = answer(&missing, Some("https://api.example.com/problems/"));
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            body["type"],
            "https://api.example.com/problems/idempotency_key_required"
        );
        assert_eq!(body["title"], "Idempotency-Key is missing");
        assert_eq!(body["param"], "Idempotency-Key");
        assert!(body.get("ref").is_none());
    }
}
