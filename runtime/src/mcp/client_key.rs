//! Client idempotency keys (`#[idempotent(client_key = "accept" | "require")]`), as the closed
//! MCP proposal SEP-3182 proposed them and as Stripe's `Idempotency-Key` works: the client
//! software — never the model — sends one key with every retry of one request, in the request's
//! `_meta` as [`META_KEY`] or, over streamable HTTP, in the [`HEADER`] header. The key is read
//! from nowhere else: the tool's arguments are the model's.
//!
//! With a key, the call's record is keyed by (tenant, subject, tool, client key) under the
//! server's secret and stores the fingerprint of the canonical arguments. A repeat with the same
//! arguments gets the stored answer; with other arguments, or while the first is running, the
//! client gets a JSON-RPC error whose `data.type` says which ([`KEY_CONFLICT`],
//! [`KEY_IN_PROGRESS`]), where SEP-3182 put it: the client software sent the key, so the client
//! software is answered, not the model. Every other answer is the tool result it always is.

use rmcp::model::{CallToolResponse, CallToolResult, ErrorCode, MetaObject};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{json, Value};

use super::answer::{META_REF, META_STATUS};
use crate::key::{header_key, ClientKey, ClientKeyError};
use crate::tool::ToolSpec;
use crate::Error;

/// The request `_meta` key that carries the client's idempotency key: the prefix this library's
/// result keys use (`idempotency/ref`...), not one MCP reserves.
pub const META_KEY: &str = "idempotency/key";
/// The HTTP header that carries the client's idempotency key over streamable HTTP (the IETF
/// draft's and Stripe's name). If the request also has [`META_KEY`], both must be equal.
pub const HEADER: &str = "Idempotency-Key";

/// The tool listing's `_meta` key (`tools/list`) saying that a tool takes the client's key:
/// `"accept"` or `"require"`.
pub const TOOL_META_CLIENT_KEY: &str = "idempotency/clientKey";

/// `error.data.type`: the key was used with other arguments (SEP-3182's word). Nothing was done.
pub const KEY_CONFLICT: &str = "idempotency_key_conflict";
/// `error.data.type`: the key's first request is still running (SEP-3182's word). Nothing was
/// done by this one.
pub const KEY_IN_PROGRESS: &str = "idempotency_key_in_progress";
/// `error.data.type`: a `client_key = "require"` tool got a request without a key.
pub const KEY_MISSING: &str = "idempotency_key_missing";
/// `error.data.type`: the request's key is unusable (length, characters, two different keys).
pub const KEY_INVALID: &str = "idempotency_key_invalid";
/// The JSON-RPC error code of [`KEY_IN_PROGRESS`]: implementation-defined (JSON-RPC's server
/// range, clear of the codes MCP assigns); clients should match `data.type`. The other three
/// are `-32602` (invalid params).
pub const IN_PROGRESS_CODE: i32 = -32090;

/// The listing `_meta` of a tool taking client keys: [`TOOL_META_CLIENT_KEY`] set to `mode`,
/// in the tool's `own` listing `_meta` if it has one.
pub fn client_key_meta(mode: &'static str, own: Option<MetaObject>) -> MetaObject {
    let mut meta = own.unwrap_or_default();
    meta.insert(TOOL_META_CLIENT_KEY.into(), Value::String(mode.into()));
    meta
}

/// Whether a tool takes a client key (`accept`) or insists on one (`require`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClientKeys {
    /// A key is used when sent; without one, the server derives the key from the arguments.
    Accept,
    /// A request without a key is refused.
    Require,
}

/// The client key of `request` for the tool `spec`: `None` when it carries none and the tool
/// accepts that; a JSON-RPC error (invalid params, `data.type` [`KEY_MISSING`] or
/// [`KEY_INVALID`]) when it is missing but required, or unusable.
pub(crate) fn client_key(
    request: &RequestContext<RoleServer>,
    mode: ClientKeys,
    spec: &ToolSpec,
) -> Result<Option<ClientKey>, ErrorData> {
    let refuse = |source| refusal(spec, source);
    match read(request) {
        Ok(Some(key)) => Ok(Some(key)),
        Ok(None) if mode == ClientKeys::Accept => Ok(None),
        Ok(None) => Err(refuse(ClientKeyError::Missing)),
        Err(e) => Err(refuse(e)),
    }
}

/// The refusal of a request whose client key is missing or unusable (`source`): invalid
/// params, `data.type` [`KEY_MISSING`] or [`KEY_INVALID`]; nothing was done.
pub(crate) fn refusal(spec: &ToolSpec, source: ClientKeyError) -> ErrorData {
    let missing = matches!(
        source,
        ClientKeyError::Missing | ClientKeyError::MissingField { .. }
    );
    let e = Error::ClientKey {
        tool: spec.name().to_owned(),
        source,
    };
    crate::metrics::refused(&e);
    let kind = if missing { KEY_MISSING } else { KEY_INVALID };
    ErrorData::invalid_params(
        e.advice(),
        Some(json!({"type": kind, META_STATUS: "invalid"})),
    )
}

/// The key in the request's `_meta` and HTTP headers, checked.
fn read(request: &RequestContext<RoleServer>) -> Result<Option<ClientKey>, ClientKeyError> {
    let mut found: Option<String> = match request.meta.get(META_KEY) {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => return Err(ClientKeyError::NotAString { found: kind(other) }),
    };
    if let Some(parts) = request.extensions.get::<http::request::Parts>() {
        for value in parts.headers.get_all(HEADER) {
            let text = header_key(value.as_bytes())?;
            match &found {
                Some(earlier) if earlier != text => return Err(ClientKeyError::Conflicting),
                Some(_) => {}
                None => found = Some(text.to_owned()),
            }
        }
    }
    found.map(ClientKey::new).transpose()
}

pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A wrapped tool's answer type: its completed result, if it has one.
pub(crate) trait KeyedAnswer {
    /// The completed tool result.
    fn completed(&self) -> Option<&CallToolResult>;
}

impl KeyedAnswer for CallToolResult {
    fn completed(&self) -> Option<&CallToolResult> {
        Some(self)
    }
}

impl KeyedAnswer for CallToolResponse {
    fn completed(&self) -> Option<&CallToolResult> {
        match self {
            CallToolResponse::Complete(r) => Some(r),
            _ => None,
        }
    }
}

/// A wrapped tool's `answer` to a request that carried a client key (`keyed`): the wrapper's
/// "in progress" and "payload mismatch" become the JSON-RPC errors SEP-3182 proposed
/// ([`KEY_IN_PROGRESS`], [`KEY_CONFLICT`]), with the reference and the status in `data`; every
/// other answer is unchanged.
pub(crate) fn keyed<R: KeyedAnswer>(
    spec: &ToolSpec,
    keyed: bool,
    answer: Result<R, ErrorData>,
) -> Result<R, ErrorData> {
    let Ok(done) = &answer else { return answer };
    let Some(result) = done
        .completed()
        .filter(|r| keyed && r.is_error == Some(true))
    else {
        return answer;
    };
    let meta = result.meta.as_ref().map(|m| &m.0);
    let status = meta
        .and_then(|m| m.get(META_STATUS))
        .and_then(Value::as_str);
    let reference = meta
        .and_then(|m| m.get(META_REF))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let tool = spec.name();
    let (code, kind, message) = match status {
        Some("in_flight") => (
            ErrorCode(IN_PROGRESS_CODE),
            KEY_IN_PROGRESS,
            format!("{tool}: the first request with this idempotency key is still in progress (ref {reference}); nothing was done by this one. Send it again later to get its answer, or call {} with ref {reference}.", crate::error::STATUS_TOOL),
        ),
        Some("payload_mismatch") => (
            ErrorCode::INVALID_PARAMS,
            KEY_CONFLICT,
            format!("{tool}: this idempotency key was already used with different arguments (ref {reference}); nothing was done. Send the original arguments with it to get the original answer, or a new key for a different request."),
        ),
        _ => return answer,
    };
    Err(ErrorData::new(
        code,
        message,
        Some(json!({"type": kind, "ref": reference, META_STATUS: status})),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_key_is_its_text_or_its_quoted_content() {
        assert_eq!(header_key(b"abc-12345"), Ok("abc-12345"));
        assert_eq!(header_key(b"\"abc-12345\""), Ok("abc-12345"));
        assert_eq!(
            header_key(b"abc\xff"),
            Err(ClientKeyError::Character { at: 4 })
        );
        // A space passes here and is refused by `ClientKey::new`, which counts the same way.
        assert_eq!(header_key(b"a b"), Ok("a b"));
        assert_eq!(
            ClientKey::new("a b-12345"),
            Err(ClientKeyError::Character { at: 2 })
        );
    }

    /// The request key uses this library's prefix, none MCP reserves.
    #[test]
    fn the_meta_key_is_not_reserved() {
        let (prefix, name) = META_KEY.split_once('/').expect("a prefixed key");
        assert_eq!((prefix, name), ("idempotency", "key"));
        // The code the guide documents, in JSON-RPC's implementation-defined server range.
        assert_eq!(IN_PROGRESS_CODE, -32090);
        assert!(!matches!(
            prefix.split('.').nth(1),
            Some("modelcontextprotocol" | "mcp")
        ));
    }
}
