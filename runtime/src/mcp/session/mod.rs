//! Streamable-HTTP sessions that belong to the caller who opened them.
//!
//! rmcp's streamable HTTP server (in its default, stateful mode) answers `initialize` with an
//! `Mcp-Session-Id` and from then on routes every request carrying that id to the session: tool
//! calls (`POST`), the server's streams and their resumption (`GET`, with `Last-Event-ID` to
//! replay what a dropped stream missed) and its end (`DELETE`). The id is all it checks. Your
//! authentication establishes who sends each request, but nothing ties the session to that
//! caller: another tenant holding the id could resume the stream and read the receipt, or end
//! the session. [`CallerBoundSessions`] is that tie.
//!
//! It is plain `http` code, independent of the web framework: [`CallerBoundSessions::guard`]
//! takes the request and the rest of the stack as a closure. It must run *after* your
//! authentication (it reads the [`Caller`] your middleware put into the request's extensions)
//! and *before* rmcp's service.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::{HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use tokio::time::Instant;

use crate::Caller;

/// The header rmcp names a session with (HTTP header names are case-insensitive).
const SESSION_HEADER: &str = "mcp-session-id";

/// The one answer to every refused request: the same words whether the session is someone
/// else's, unknown, ended, or the request has no caller, so a refusal says nothing about which.
const REFUSAL: &str = "Forbidden: no session of yours has this id";

/// How often, at most, a new binding sweeps out forgotten ones.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Binds each streamable-HTTP session to the [`Caller`] that opened it; only that caller may
/// use, resume or end it.
///
/// Put [`guard`](Self::guard) between your authentication and rmcp's `StreamableHttpService`:
///
/// - a request without an `Mcp-Session-Id` passes; if rmcp answers it with a new session id
///   (an `initialize`), the session is bound to the request's caller before the answer leaves;
/// - a request with an `Mcp-Session-Id` passes only when its caller is the session's owner;
///   anything else — another caller, an id that was never issued or is no longer bound, a
///   repeated or unreadable header, a request with no [`Caller`] at all — is answered
///   `403 Forbidden` with one fixed text, so a refusal never tells whether the session exists;
/// - the owner's successful `DELETE` unbinds the session, and so does a `404` from rmcp (the
///   session ended on the server, e.g. after rmcp's idle timeout): the owner learns it is gone,
///   re-initialises, and later requests with the old id are refused.
///
/// A binding nobody has used for an hour (or [`forget_after`](Self::forget_after)) is
/// forgotten, so sessions that end without a `DELETE` do not accumulate; a request on a
/// forgotten binding is refused like any unknown id.
///
/// Clones share their bindings. They live in this process's memory, like rmcp's
/// `LocalSessionManager` sessions; a server that restores sessions on other replicas (rmcp's
/// `session_store`) must keep the owner beside the session state instead. An event store shared
/// between sessions (`LocalSessionManager::with_event_store`) replays by event id alone, which
/// this binding does not cover. Stateless mode (`legacy_session_mode: false`) issues no session
/// ids, so there is nothing to bind there.
///
/// ```
/// use idempotency::{mcp::CallerBoundSessions, Caller};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let sessions = CallerBoundSessions::new();
/// // What an auth middleware produces: a request carrying its caller.
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Caller::new("acme", "alice"));
/// // rmcp opens a session for it...
/// let response: http::Response<String> = sessions
///     .guard(request, |_request| async {
///         http::Response::builder().header("mcp-session-id", "s-1").body(String::new()).unwrap()
///     })
///     .await;
/// assert_eq!(response.status(), 200);
///
/// // ...and another caller presenting that id is turned away before rmcp sees the request.
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Caller::new("globex", "bob"));
/// request.headers_mut().insert("mcp-session-id", "s-1".parse().unwrap());
/// let response: http::Response<String> = sessions
///     .guard(request, |_request| async { unreachable!("refused before rmcp") })
///     .await;
/// assert_eq!(response.status(), 403);
/// # });
/// ```
///
/// With axum, after the authentication layer (layers listed later run first):
///
/// ```ignore
/// let sessions = CallerBoundSessions::new();
/// let app = axum::Router::new()
///     .nest_service("/mcp", rmcp_service)
///     .layer(axum::middleware::from_fn(move |req, next: axum::middleware::Next| {
///         let sessions = sessions.clone();
///         async move { sessions.guard(req, |req| next.run(req)).await }
///     }))
///     .layer(axum::middleware::from_fn(authenticate)); // inserts the Caller
/// ```
#[derive(Clone, Debug)]
pub struct CallerBoundSessions {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    forget_after: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    owners: HashMap<String, Binding>,
    last_sweep: Instant,
}

#[derive(Debug)]
struct Binding {
    owner: Caller,
    last_used: Instant,
}

impl Default for CallerBoundSessions {
    fn default() -> Self {
        CallerBoundSessions::new()
    }
}

impl CallerBoundSessions {
    /// No sessions bound yet; bindings unused for an hour are forgotten.
    pub fn new() -> Self {
        CallerBoundSessions::forget_after(Duration::from_secs(3600))
    }

    /// No sessions bound yet; bindings unused for `forget_after` are forgotten. Keep it longer
    /// than a live session may go without a request from its client (rmcp's
    /// `LocalSessionManager` ends a session after five idle minutes by default): a forgotten
    /// binding refuses its owner too.
    pub fn forget_after(forget_after: Duration) -> Self {
        CallerBoundSessions {
            inner: Arc::new(Inner {
                forget_after,
                state: Mutex::new(State {
                    owners: HashMap::new(),
                    last_sweep: Instant::now(),
                }),
            }),
        }
    }

    /// Checks `request` against the session it names and, if it may pass, runs `next` (the
    /// rest of the stack: rmcp's service) on it; see [`CallerBoundSessions`] for the rules. A
    /// refusal is `403 Forbidden` with a fixed plain-text body, and `next` is not called.
    pub async fn guard<B, R, F, Fut>(&self, request: Request<B>, next: F) -> Response<R>
    where
        F: FnOnce(Request<B>) -> Fut,
        Fut: Future<Output = Response<R>>,
        R: From<&'static str>,
    {
        let Some(caller) = request.extensions().get::<Caller>().cloned() else {
            tracing::warn!("refused an MCP HTTP request without an authenticated caller");
            return refused();
        };
        let named = match session_id(request.headers()) {
            Named::None => None,
            Named::One(id) => Some(id),
            Named::Unreadable => {
                tracing::warn!(tenant = %caller.tenant, subject = %caller.subject, "refused a request with an unreadable session id");
                return refused();
            }
        };
        let Some(id) = named else {
            // No session named: nothing to protect yet. A session rmcp opens now is this
            // caller's, bound before its id reaches the client.
            let response = next(request).await;
            if let Named::One(id) = session_id(response.headers()) {
                self.bind(id, caller);
            }
            return response;
        };
        if !self.owned_by(&id, &caller) {
            // Never log the id: it is what a hijacker would need.
            tracing::warn!(tenant = %caller.tenant, subject = %caller.subject, "refused a request for a session this caller does not own");
            return refused();
        }
        let deleting = request.method() == Method::DELETE;
        let response = next(request).await;
        let status = response.status();
        if (deleting && status.is_success()) || status == StatusCode::NOT_FOUND {
            self.forget(&id);
        }
        response
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every critical section leaves the map consistent, so a poisoned lock is still usable.
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bind(&self, id: String, owner: Caller) {
        let now = Instant::now();
        let forget_after = self.inner.forget_after;
        let mut state = self.lock();
        if now.duration_since(state.last_sweep) >= SWEEP_EVERY.min(forget_after) {
            state
                .owners
                .retain(|_, b| now.duration_since(b.last_used) < forget_after);
            state.last_sweep = now;
        }
        // Never re-bind an id that is already bound (rmcp's ids are random; this is a guard).
        state.owners.entry(id).or_insert(Binding {
            owner,
            last_used: now,
        });
    }

    fn owned_by(&self, id: &str, caller: &Caller) -> bool {
        let now = Instant::now();
        let forget_after = self.inner.forget_after;
        let mut state = self.lock();
        match state.owners.get_mut(id) {
            Some(b) if now.duration_since(b.last_used) >= forget_after => {
                state.owners.remove(id);
                false
            }
            Some(b) if b.owner == *caller => {
                b.last_used = now;
                true
            }
            _ => false,
        }
    }

    fn forget(&self, id: &str) {
        self.lock().owners.remove(id);
    }
}

enum Named {
    None,
    One(String),
    Unreadable,
}

fn session_id(headers: &HeaderMap) -> Named {
    let mut values = headers.get_all(SESSION_HEADER).iter();
    match (values.next(), values.next()) {
        (None, _) => Named::None,
        (Some(v), None) => match v.to_str() {
            Ok(id) => Named::One(id.to_owned()),
            Err(_) => Named::Unreadable,
        },
        (Some(_), Some(_)) => Named::Unreadable,
    }
}

fn refused<R: From<&'static str>>() -> Response<R> {
    let mut response = Response::new(R::from(REFUSAL));
    *response.status_mut() = StatusCode::FORBIDDEN;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests;
