//! [`IdempotencyLayer`]: the route's settings, and the [`Layer`] that wraps its service.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use serde_json::Value;
use tower_layer::Layer;

use super::config::{Config, KeyScope, ToolAnswers};
use super::fingerprint::FingerprintInput;
use super::service::IdempotencyService;
use crate::tool::ToolSpec;
use crate::Idempotency;

/// A [`Layer`] that makes one operation's requests safe to send twice with an
/// `Idempotency-Key`: each protected request's key is claimed before the inner service runs and
/// its response is recorded; a repeat gets the recorded response (see the [module](super)).
///
/// The operation is a [`ToolSpec`]: its name is part of the key (an MCP tool of the same
/// operation uses the same name), its window is how long a response is replayed, and its
/// `timeout`, `wait` and `recover` choices apply as they do to a tool. By default `POST` and
/// `PATCH` are protected and require a key; every other method passes through untouched.
///
/// ```
/// use std::time::Duration;
/// use idempotency::{http::{IdempotencyLayer, KeyScope}, store::MemoryStore, tool::ToolSpec, Idempotency};
/// use idempotency::tool::Recover;
///
/// const CAPTURE: ToolSpec = ToolSpec::new("capture_order", Duration::from_secs(24 * 3600))
///     .with_wait(Duration::from_secs(2))
///     .with_recover(Recover::Unknown);
/// let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), CAPTURE)
///     .methods([http::Method::POST])
///     .scope(KeyScope::Operation)
///     .tool_answers(http::StatusCode::CREATED, http::StatusCode::PAYMENT_REQUIRED)
///     .replay_headers([http::header::ETAG])
///     .fingerprint(|req| {
///         let id = req.path().rsplit('/').nth(1).ok_or("no order id in the path")?;
///         let amount = req.json().and_then(|b| b.get("amount")).cloned();
///         Ok(serde_json::json!({"order_id": id, "amount": amount}))
///     });
/// # let _ = layer;
/// ```
#[derive(Clone, Debug)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

impl IdempotencyLayer {
    /// A layer guarding the operation `spec` with `engine` (its store, secret and clock).
    pub fn new(engine: Idempotency, spec: ToolSpec) -> Self {
        IdempotencyLayer {
            config: Arc::new(Config::new(engine, spec)),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// The methods protected (default `POST` and `PATCH`); requests of any other method pass
    /// through untouched.
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.with(|c| c.methods = methods)
    }

    /// Requests without an `Idempotency-Key` pass through untouched instead of being refused
    /// with `400` (the default, as ACP requires on every `POST`).
    pub fn optional_key(self) -> Self {
        self.with(|c| c.key_required = false)
    }

    /// What the key is scoped by besides the caller and the operation (default
    /// [`KeyScope::Path`]).
    pub fn scope(self, scope: KeyScope) -> Self {
        self.with(|c| c.scope = scope)
    }

    /// The largest request body read (default 1 MiB): a larger one is answered `413` and the
    /// inner service does not see it.
    pub fn max_body(self, bytes: usize) -> Self {
        self.with(|c| c.max_body = bytes)
    }

    /// The largest response body recorded (default 1 MiB). The inner service has run when its
    /// response is found larger, so the operation is recorded as "outcome unknown" and the
    /// request is answered so: keep responses of protected routes small.
    pub fn max_response(self, bytes: usize) -> Self {
        self.with(|c| c.max_response = bytes)
    }

    /// Response headers recorded and replayed besides `Content-Type` and `Location` (an `ETag`,
    /// a rate limit's). The first answer carries all of its headers; a replay carries the
    /// recorded ones and `Idempotent-Replayed: true`.
    pub fn replay_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names: Vec<HeaderName> = names.into_iter().collect();
        self.with(|c| {
            for n in names {
                if !c.replay_headers.contains(&n) {
                    c.replay_headers.push(n);
                }
            }
        })
    }

    /// The JSON value requests are compared by, instead of `{method, path, query, body}`: the
    /// same key with another value is answered `422`. A route reached over MCP too fingerprints
    /// what the tool's arguments are (with [`KeyScope::Operation`], both share one record). An
    /// error refuses the request with `400` and the message. The operation's
    /// [`ignoring`](ToolSpec::ignoring) paths are left out of the value; a `meta.*` entry leaves
    /// nothing out here, as the value has no type to say which members are undeclared: build it
    /// from the tool's typed arguments (read, then serialised) and it holds none, as the tool's
    /// key does.
    pub fn fingerprint<F>(self, f: F) -> Self
    where
        F: Fn(&FingerprintInput<'_>) -> Result<Value, String> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        self.with(|c| c.fingerprint = Some(f))
    }

    /// The statuses an answer recorded by an MCP tool of the operation (sharing its record through
    /// [`KeyScope::Operation`]) is replayed with: its `T` as a `Content-Type: application/json`
    /// body with `ok` (default `200`), its definitive error `E`'s JSON with `error` (default
    /// `422`); both with `Idempotent-Replayed: true`.
    ///
    /// # Panics
    /// If `ok` is not a `2xx` status or `error` not a `4xx` one: a configuration mistake, found
    /// when the route is built.
    pub fn tool_answers(self, ok: StatusCode, error: StatusCode) -> Self {
        assert!(
            ok.is_success(),
            "IdempotencyLayer::tool_answers: a tool's answer is replayed with a 2xx status, not {ok}"
        );
        assert!(
            error.is_client_error(),
            "IdempotencyLayer::tool_answers: a tool's definitive error is replayed with a 4xx status, not {error}"
        );
        self.with(|c| c.tool_answers = ToolAnswers { ok, error })
    }

    /// Refuses (`409`, `idempotency_key_mismatch`) a request sent with a new key while an
    /// identical one (same caller, operation and fingerprint) sent with another key was received
    /// within `window`, running or recorded: a client that makes a fresh key on every attempt
    /// would otherwise run it again. Off by default (two identical orders may be meant).
    pub fn refuse_fresh_keys(self, window: Duration) -> Self {
        self.with(|c| c.fresh_keys = Some(window))
    }

    /// The `Retry-After` of the `409` (in progress) and `503` (store unavailable) answers
    /// (default 1 s, rounded up to whole seconds).
    pub fn retry_after(self, after: Duration) -> Self {
        self.with(|c| c.retry_after = after)
    }

    /// The prefix of the problems' `type` URIs: `type` is the prefix followed by the `code`
    /// (`https://api.example.com/problems/` gives
    /// `https://api.example.com/problems/idempotency_in_flight`). Without one, `type` is
    /// `about:blank` and `title` the status's phrase, as RFC 9457 asks.
    pub fn problem_types(self, prefix: impl Into<Arc<str>>) -> Self {
        let prefix = prefix.into();
        self.with(|c| c.problem_base = Some(prefix))
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.config.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn layer() -> IdempotencyLayer {
        const OP: ToolSpec = ToolSpec::new("create_order", Duration::from_secs(60));
        IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), OP)
    }

    #[test]
    #[should_panic(expected = "a 2xx status, not 422")]
    fn a_tools_answer_is_not_replayed_as_an_error() {
        let _ = layer().tool_answers(StatusCode::UNPROCESSABLE_ENTITY, StatusCode::CONFLICT);
    }

    #[test]
    #[should_panic(expected = "a 4xx status, not 500")]
    fn a_tools_error_is_not_replayed_as_a_5xx() {
        let _ = layer().tool_answers(StatusCode::OK, StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn tool_answers_are_200_and_422_unless_set() {
        let statuses = layer().config.tool_answers;
        assert_eq!(
            (statuses.ok, statuses.error),
            (StatusCode::OK, StatusCode::UNPROCESSABLE_ENTITY)
        );
        let set = layer().tool_answers(StatusCode::CREATED, StatusCode::PAYMENT_REQUIRED);
        let statuses = set.config.tool_answers;
        assert_eq!(
            (statuses.ok, statuses.error),
            (StatusCode::CREATED, StatusCode::PAYMENT_REQUIRED)
        );
    }
}
