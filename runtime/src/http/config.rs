//! What one layer knows of the route it guards: the operation, which methods it protects, how
//! the key is read and scoped, the bounds and the answers' details.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};

use super::fingerprint::Fingerprinter;
use crate::tool::ToolSpec;
use crate::Idempotency;

/// What a request's `Idempotency-Key` is scoped by, besides the authenticated caller (its
/// tenant and subject) and the operation's name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyScope {
    /// The request's method and path too (ACP SEP #120: "authenticated identity + endpoint
    /// path"): one key sent to `/orders/1/capture` and to `/orders/2/capture` names two records.
    #[default]
    Path,
    /// The operation only: the key names the same record as an MCP tool of the same name called
    /// with that client key by the same caller (`Prepared::client`), so the two can share it.
    Operation,
}

/// The layer's settings, shared by every service it makes.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) engine: Idempotency,
    pub(super) spec: ToolSpec,
    pub(super) methods: Vec<Method>,
    pub(super) key_required: bool,
    pub(super) scope: KeyScope,
    pub(super) max_body: usize,
    pub(super) max_response: usize,
    pub(super) replay_headers: Vec<HeaderName>,
    pub(super) fingerprint: Option<Arc<Fingerprinter>>,
    pub(super) fresh_keys: Option<Duration>,
    pub(super) retry_after: Duration,
    pub(super) problem_base: Option<Arc<str>>,
    /// The statuses of an MCP tool's answer and of its definitive error, replayed here.
    pub(super) tool_answers: ToolAnswers,
}

/// The statuses a tool's stored answers are replayed with.
#[derive(Clone, Copy, Debug)]
pub(super) struct ToolAnswers {
    pub(super) ok: StatusCode,
    pub(super) error: StatusCode,
}

impl Config {
    /// The defaults for the operation `spec` on `engine`.
    pub(super) fn new(engine: Idempotency, spec: ToolSpec) -> Config {
        Config {
            engine,
            spec,
            methods: vec![Method::POST, Method::PATCH],
            key_required: true,
            scope: KeyScope::Path,
            max_body: 1024 * 1024,
            max_response: 1024 * 1024,
            replay_headers: vec![http::header::CONTENT_TYPE, http::header::LOCATION],
            fingerprint: None,
            fresh_keys: None,
            retry_after: Duration::from_secs(1),
            problem_base: None,
            tool_answers: ToolAnswers {
                ok: StatusCode::OK,
                error: StatusCode::UNPROCESSABLE_ENTITY,
            },
        }
    }

    /// Whether requests of `method` are protected (the others pass through untouched).
    pub(super) fn protects(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("operation", &self.spec.name())
            .field("methods", &self.methods)
            .field("key_required", &self.key_required)
            .field("scope", &self.scope)
            .field("max_body", &self.max_body)
            .field("fingerprint", &self.fingerprint.is_some())
            .field("fresh_keys", &self.fresh_keys)
            .field("tool_answers", &self.tool_answers)
            .finish_non_exhaustive()
    }
}
