//! [`IdempotencyService`]: one protected request, from its key to its answer — read the key and
//! the caller, read the body within the bound, fingerprint it, claim, run the inner service,
//! record its response (never a `5xx`; a `4xx` as a definitive error), and answer: the response,
//! the recorded one replayed (or an MCP tool's answer of the same record), or a problem.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{response, Request, Response};
use http_body::Body;
use serde_json::Value;
use tower_service::Service;

use super::body::{self, Unread};
use super::config::{Config, KeyScope};
use super::envelope::{self, Envelope};
use super::fingerprint;
use super::fresh::{self, SameRequest};
use super::header;
use super::problem::Problem;
use crate::door::{Door, HttpAnswer};
use crate::key::{ClientKey, ClientKeyError, KeyMaterial, Owner, Scope};
use crate::outcome::{Disposition, ErrorPolicy, Failure};
use crate::tool::Prepared;
use crate::{Caller, Error};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The service an [`IdempotencyLayer`](super::IdempotencyLayer) wraps around an inner one.
///
/// The inner service takes and returns bodies that can be made from [`Bytes`] (axum's `Body`
/// can): a protected request's body is read whole and handed on as one chunk, and its response
/// is read whole to be recorded.
#[derive(Clone, Debug)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> IdempotencyService<S> {
    pub(super) fn new(inner: S, config: Arc<Config>) -> Self {
        IdempotencyService { inner, config }
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for IdempotencyService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display + Send + 'static,
    ReqB: Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + From<Bytes> + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        if !self.config.protects(request.method()) {
            return Box::pin(self.inner.call(request));
        }
        // The service polled ready goes with the request; a clone stays for the next one.
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        let config = self.config.clone();
        Box::pin(async move { protect(&config, ready, request).await })
    }
}

/// One request of a protected method.
async fn protect<S, ReqB, ResB>(
    config: &Config,
    mut inner: S,
    request: Request<ReqB>,
) -> Result<Response<ResB>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send,
    S::Future: Send,
    S::Error: std::fmt::Display + Send,
    ReqB: Body + From<Bytes> + Send,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + From<Bytes> + Send,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    let operation = config.spec.name();
    let instance = request.uri().path().to_owned();
    let answer = |p: Problem| Ok(p.response(config.problem_base.as_deref(), &instance));
    let key = match header::read(request.headers()) {
        Ok(Some(key)) => key,
        Ok(None) if !config.key_required => return inner.call(request).await,
        Ok(None) => {
            refused(operation, ClientKeyError::Missing);
            return answer(Problem::key_required(operation));
        }
        Err(e) => {
            let problem = Problem::key_invalid(&e);
            refused(operation, e);
            return answer(problem);
        }
    };
    let Some(caller) = request.extensions().get::<Caller>().cloned() else {
        tracing::error!(
            operation,
            "idempotency: no idempotency::Caller in the request's extensions; put the layer inside the authentication that inserts it"
        );
        return answer(Problem::no_caller(operation));
    };
    let (parts, content) = request.into_parts();
    let bytes = match body::read(content, config.max_body).await {
        Ok(bytes) => bytes,
        Err(Unread::TooLarge) => return answer(Problem::too_large(config.max_body)),
        Err(Unread::Failed(why)) => return answer(Problem::unreadable_body(&why)),
    };
    let value = match fingerprint::value(config.fingerprint.as_deref(), &parts, &bytes) {
        Ok(value) => value,
        Err(why) => return answer(Problem::unfingerprinted(&why)),
    };
    let route =
        (config.scope == KeyScope::Path).then(|| format!("{} {}", parts.method, parts.uri.path()));
    let keyed = Keyed {
        caller: &caller,
        key: &key,
        route: route.as_deref(),
        value: &value,
    };
    let prepared = match keyed.prepare(config) {
        Ok(p) => p,
        Err(e) => return answer(Problem::from_error(&e, config.retry_after)),
    };
    let mut first = None;
    let run = Run {
        config,
        inner,
        request: Request::from_parts(parts, ReqB::from(bytes)),
        keyed,
    };
    let out = config
        .engine
        .execute_raw(prepared, policy::<ResB>(), run.run(&mut first))
        .await;
    let recorded = match out.result {
        Ok(recorded) => recorded,
        Err(Failure::Handler(Passed::Definitive(envelope))) => HttpAnswer::Response(envelope),
        Err(Failure::Handler(Passed::Response(response))) => return Ok(response),
        Err(Failure::Handler(Passed::Refused(problem))) => return answer(problem),
        Err(Failure::Handler(Passed::Unknown(why))) => {
            return answer(Problem::unknown(operation, out.reference, &why))
        }
        Err(Failure::Wrapper(e)) => return answer(Problem::from_error(&e, config.retry_after)),
    };
    match first.take().filter(|_| !out.replayed) {
        Some((parts, bytes)) => Ok(Response::from_parts(parts, ResB::from(bytes))),
        None => replay(config, &recorded)
            .or_else(|why| answer(Problem::replay_failed(operation, out.reference, &why))),
    }
}

/// A recorded answer, replayed: a response this layer recorded, or the answer of an MCP tool of
/// the operation as JSON with the route's status for it.
fn replay<B: From<Bytes>>(config: &Config, recorded: &HttpAnswer) -> Result<Response<B>, String> {
    match recorded {
        HttpAnswer::Response(envelope) => envelope.replay(),
        HttpAnswer::Tool(tool) => {
            let statuses = config.tool_answers;
            let status = if tool.ok { statuses.ok } else { statuses.error };
            Ok(envelope::tool_answer(&tool.answer, status))
        }
    }
}

/// Counts a request refused for its key, as the MCP integration counts its refusals.
fn refused(operation: &str, source: ClientKeyError) {
    crate::metrics::refused(&Error::ClientKey {
        tool: operation.to_owned(),
        source,
    });
}

/// What a request is keyed by.
#[derive(Clone, Copy)]
struct Keyed<'a> {
    caller: &'a Caller,
    key: &'a ClientKey,
    /// `METHOD path`, for path-scoped keys.
    route: Option<&'a str>,
    value: &'a Value,
}

impl Keyed<'_> {
    /// The call for the engine: keyed by the caller, the operation (and the route) and the
    /// client's key; fingerprinted by the value.
    fn prepare(&self, config: &Config) -> Result<Prepared, Error> {
        let mut prepared = Prepared::client(self.caller, &config.spec, self.key, self.value)?;
        if let Some(route) = self.route {
            let tool = format!("{} {route}", config.spec.name());
            let owner = Owner {
                caller: self.caller,
                tool: &tool,
                scope: Scope::Subject,
            };
            prepared.key =
                KeyMaterial::client(owner, self.key).map_err(|e| Error::InvalidCaller {
                    reason: e.to_string(),
                })?;
        }
        Ok(prepared)
    }
}

/// The inner service's run under the claim.
struct Run<'a, S, B> {
    config: &'a Config,
    inner: S,
    request: Request<B>,
    keyed: Keyed<'a>,
}

impl<S, ReqB, ResB> Run<'_, S, ReqB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: std::fmt::Display,
    ResB: Body,
    ResB::Error: Into<BoxError>,
{
    /// Runs the inner service (after the fresh-key check, if the route has it) and reads its
    /// response: the envelope to record (a `4xx`'s as a definitive error), with the response's
    /// head and body left in `first` for this request's own answer; or why it is not recorded.
    async fn run(
        mut self,
        first: &mut Option<(response::Parts, Bytes)>,
    ) -> Result<HttpAnswer, Passed<ResB>> {
        let config = self.config;
        let same = SameRequest {
            operation: config.spec.name(),
            route: self.keyed.route,
            request: self.keyed.value,
        };
        fresh::check(config, self.keyed.caller, same, self.keyed.key)
            .await
            .map_err(Passed::Refused)?;
        let response = match self.inner.call(self.request).await {
            Ok(response) => response,
            Err(e) => return Err(Passed::Unknown(format!("the service failed: {e}"))),
        };
        let (parts, content) = response.into_parts();
        if parts.status.is_server_error() {
            return Err(Passed::Response(Response::from_parts(parts, content)));
        }
        let bytes = match body::read(content, config.max_response).await {
            Ok(bytes) => bytes,
            Err(Unread::TooLarge) => {
                return Err(Passed::Unknown(format!(
                    "its response is larger than the {} bytes the idempotency layer records",
                    config.max_response
                )))
            }
            Err(Unread::Failed(why)) => {
                return Err(Passed::Unknown(format!(
                    "its response failed midway ({why})"
                )))
            }
        };
        let envelope = Envelope::of(&parts, &bytes, &config.replay_headers);
        let client_error = parts.status.is_client_error();
        *first = Some((parts, bytes));
        if client_error {
            return Err(Passed::Definitive(envelope));
        }
        Ok(HttpAnswer::Response(envelope))
    }
}

/// A run whose response is not recorded as an answer: a `4xx` recorded as a definitive error,
/// or a response not recorded at all.
enum Passed<B> {
    /// A `4xx`: recorded as the operation's definitive error (a tool of the operation reads its
    /// body as its error type).
    Definitive(Envelope),
    /// A `5xx`: given back, and passed to the client as it is.
    Response(Response<B>),
    /// Refused before the inner service ran (a fresh key): given back.
    Refused(Problem),
    /// The inner service may have acted but its response cannot be recorded: outcome unknown.
    Unknown(String),
}

/// How the engine treats a run that is not an answer: a `4xx` is a definitive error, stored as
/// its envelope; the others are never stored. Stored in the layer's form, and read back whole
/// ([`HttpAnswer`], never through `decode`), whichever door recorded it.
fn policy<B>() -> ErrorPolicy<Passed<B>> {
    ErrorPolicy {
        classify: |p| match p {
            Passed::Definitive(_) => Disposition::Definitive,
            Passed::Response(_) | Passed::Refused(_) => Disposition::Retryable,
            Passed::Unknown(_) => Disposition::Unknown,
        },
        encode: |p| match p {
            Passed::Definitive(envelope) => {
                serde_json::to_string(envelope).map_err(|e| e.to_string())
            }
            _ => Err("a response that is not recorded is never stored".to_owned()),
        },
        decode: |_| Err("the HTTP layer reads its records whole, never as an error".to_owned()),
        door: Door::Http,
        describe: |p| match p {
            Passed::Definitive(envelope) => format!("the service answered {}", envelope.status),
            Passed::Response(r) => format!("the service answered {}", r.status()),
            Passed::Refused(_) => "the request was refused before the service ran".to_owned(),
            Passed::Unknown(why) => why.clone(),
        },
    }
}
