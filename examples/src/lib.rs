//! Shared pieces of the example servers: store choice by environment, the transports (stdio by
//! default, `--http ADDR` for streamable HTTP with bearer identities and caller-bound sessions,
//! `--http ADDR --stateless` for streamable HTTP without sessions), and the downstream stubs.

use std::collections::HashMap;
use std::sync::Arc;

use idempotency::key::Secret;
use idempotency::mcp::CallerBoundSessions;
use idempotency::store::{PostgresStore, SqliteStore};
use idempotency::tasks::Reconcile;
use idempotency::{Caller, Idempotency, IdempotencyBuilder};
use rmcp::transport::streamable_http_server::{
    session::{local::LocalSessionManager, never::NeverSessionManager},
    StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{ServerHandler, ServiceExt};

pub mod acp;
pub mod carrier;
pub mod charge;
pub mod processor;
pub mod shipment;

/// The default SQLite file, created on first run (override with `IDEMPOTENCY_SQLITE`).
pub const DEFAULT_SQLITE: &str = "idempotency.db";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The engine on the store the environment asks for: PostgreSQL when `DATABASE_URL` is set (many
/// replicas share it), otherwise the SQLite file `IDEMPOTENCY_SQLITE` (default `idempotency.db`).
/// Claims whose worker never reported are settled by `reconcile` (asking the downstream stub by
/// reference); its answers are replayed for each tool's own window.
///
/// On the shared store the server refuses to start without `IDEMPOTENCY_SECRET` (the demo
/// secret is for the local SQLite demo only), and, like every engine, when the store's records
/// are keyed with another secret ([`IdempotencyBuilder::start`](idempotency::IdempotencyBuilder::start)).
///
/// `IDEMPOTENCY_WAIT` (default `0s`) is how long a repeat that finds its call in progress waits
/// for its answer ([`IdempotencyBuilder::wait`](idempotency::IdempotencyBuilder::wait)).
pub async fn engine_from_env(reconcile: impl Reconcile) -> Result<(Idempotency, String), BoxError> {
    let (engine, _, store) = open_from_env(|builder| builder.reconcile(reconcile)).await?;
    Ok((engine, store))
}

/// The store's own database: where a tool that writes beside its records
/// (`#[idempotent(transactional)]`) keeps its tables, and which transaction it borrows
/// (`Call::transaction::<sqlx::Postgres>()` or `::<sqlx::Sqlite>()`).
#[derive(Clone, Debug)]
pub enum Database {
    /// PostgreSQL (`DATABASE_URL`): the store's pool.
    Postgres(sqlx::PgPool),
    /// The SQLite file: the store's pool.
    Sqlite(sqlx::SqlitePool),
}

/// Like [`engine_from_env`], for a server of transactional tools: the same store, the same
/// environment, and also the store's [`Database`]. No reconciler: a transactional call is never
/// left unsettled (a worker that dies leaves nothing; the next repeat runs once).
pub async fn engine_and_database_from_env() -> Result<(Idempotency, Database, String), BoxError> {
    open_from_env(|builder| builder).await
}

/// The engine on the environment's store, its builder finished by `configure`, and the store's
/// database.
async fn open_from_env(
    configure: impl FnOnce(IdempotencyBuilder) -> IdempotencyBuilder,
) -> Result<(Idempotency, Database, String), BoxError> {
    let wait = wait_from_env()?;
    // Installed before the engine is built, so that it describes its metrics to it.
    metrics_handle()?;
    let (engine, database, store) = open_store_from_env(configure, wait).await?;
    // Deletes records 48 h past their window, every minute (its metrics with the rest).
    idempotency::tasks::Purger::new(&engine).spawn();
    Ok((engine, database, store))
}

/// The Prometheus recorder of this process (installed at the first call), with the library's
/// histogram buckets.
fn metrics_handle() -> Result<metrics_exporter_prometheus::PrometheusHandle, BoxError> {
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(idempotency::metrics::BUCKETS)
        .map_err(|e| format!("cannot set the metrics buckets: {e}"))?
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    idempotency::metrics::describe();
    Ok(HANDLE.get_or_init(|| handle).clone())
}

/// `/metrics`, rendered by `handle`.
fn metrics_route(handle: metrics_exporter_prometheus::PrometheusHandle) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let handle = handle.clone();
            async move { handle.render() }
        }),
    )
}

/// [`open_from_env`]'s store and engine.
async fn open_store_from_env(
    configure: impl FnOnce(IdempotencyBuilder) -> IdempotencyBuilder,
    wait: std::time::Duration,
) -> Result<(Idempotency, Database, String), BoxError> {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        let secret = secret_from_env(SecretUse::Shared("DATABASE_URL"))?;
        // The store's error names the database it tried (`postgres://user@host:port/db`),
        // never the password.
        let store = PostgresStore::connect(&url).await.map_err(|e| {
            format!(
                "cannot open the PostgreSQL store at DATABASE_URL: {}",
                chain(&e)
            )
        })?;
        let database = Database::Postgres(store.pool().clone());
        let engine = configure(Idempotency::builder(store).secret(secret).wait(wait))
            .start()
            .await
            .map_err(|e| {
                format!(
                    "cannot start on the PostgreSQL store at DATABASE_URL: {}",
                    chain(&e)
                )
            })?;
        return Ok((engine, database, "PostgreSQL (DATABASE_URL)".into()));
    }
    let secret = secret_from_env(SecretUse::Local)?;
    let path = std::env::var("IDEMPOTENCY_SQLITE").unwrap_or_else(|_| DEFAULT_SQLITE.into());
    let store = SqliteStore::open(&path)
        .await
        .map_err(|e| format!("cannot open the SQLite store {path}: {}", chain(&e)))?;
    let database = Database::Sqlite(store.pool().clone());
    let engine = configure(Idempotency::builder(store).secret(secret).wait(wait))
        .start()
        .await
        .map_err(|e| format!("cannot start on the SQLite store {path}: {}", chain(&e)))?;
    // Said whole: a stdio server runs in whatever directory its host starts it in.
    let shown = std::path::absolute(&path).map_or(path.clone(), |p| p.display().to_string());
    Ok((
        engine,
        database,
        format!("SQLite file {shown} (set IDEMPOTENCY_SQLITE to choose it)"),
    ))
}

/// `IDEMPOTENCY_WAIT`: a whole number and a unit (`ms`, `s`, `m`); unset means no wait.
pub(crate) fn wait_from_env() -> Result<std::time::Duration, BoxError> {
    match std::env::var("IDEMPOTENCY_WAIT") {
        Ok(text) => parse_wait(&text).ok_or_else(|| {
            format!("IDEMPOTENCY_WAIT={text:?} is not a duration: give a whole number and a unit (ms, s or m), e.g. 500ms, 3s").into()
        }),
        Err(_) => Ok(std::time::Duration::ZERO),
    }
}

fn parse_wait(text: &str) -> Option<std::time::Duration> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit())?;
    let n: u64 = text[..digits].parse().ok()?;
    match &text[digits..] {
        "ms" => Some(std::time::Duration::from_millis(n)),
        "s" => Some(std::time::Duration::from_secs(n)),
        "m" => Some(std::time::Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

/// `e` and its causes, `: `-separated (a cause whose text is already there is not repeated).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

/// Where the secret is used: whether the published demo secret may stand in for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretUse {
    /// A store of this machine (the SQLite demo): the demo secret is allowed, with a warning.
    Local,
    /// A store replicas share, named by the variable that configures it (`DATABASE_URL`): the
    /// demo secret is refused, since a replica on it beside others on a real secret would run
    /// every call a second time, and anyone can recompute its references.
    Shared(&'static str),
}

/// The key secret from `IDEMPOTENCY_SECRET` (at least 16 bytes). Without it, the published
/// demo secret for a [`SecretUse::Local`] store, and an error for a shared one.
pub fn secret_from_env(usage: SecretUse) -> Result<Secret, BoxError> {
    let secret = match std::env::var("IDEMPOTENCY_SECRET") {
        Ok(s) => Secret::new(s)?,
        Err(_) => Secret::demo(),
    };
    match usage {
        SecretUse::Shared(store) if secret == Secret::demo() => Err(format!(
            "IDEMPOTENCY_SECRET is not set (or is the published demo secret), and {store} names a store \
             that replicas share: set IDEMPOTENCY_SECRET to the same 32 random bytes on every replica \
             (e.g. `openssl rand -hex 32`); the demo secret is only for the local SQLite demo"
        )
        .into()),
        SecretUse::Local if secret == Secret::demo() => {
            eprintln!("IDEMPOTENCY_SECRET is not set: using the published demo secret (fine for a demo, never for production)");
            Ok(secret)
        }
        _ => Ok(secret),
    }
}

/// How the server talks: stdio (what MCP hosts launch) or streamable HTTP.
#[derive(Clone, Debug)]
pub enum Transport {
    /// JSON-RPC over stdin/stdout; the caller is the configured local identity.
    Stdio,
    /// Streamable HTTP at this `host:port` (a name like `localhost:8080` or an address like
    /// `127.0.0.1:8080`); each request's caller comes from its bearer token.
    Http(String, HttpMode),
}

/// Whether the HTTP server keeps sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpMode {
    /// rmcp's default: `initialize` opens a session (`Mcp-Session-Id`) whose streams can be
    /// resumed (`GET` with `Last-Event-ID`) and ended (`DELETE`). Each session is bound to the
    /// caller that opened it ([`idempotency::mcp::CallerBoundSessions`]).
    Sessions,
    /// `--stateless`: no sessions at all; every `POST` is served on its own (MCP 2026-07-28
    /// removed sessions). There is no session to hijack, and no server-initiated stream to resume.
    Stateless,
}

impl Transport {
    /// From the command line: no arguments → stdio; `--http ADDR` → HTTP with sessions;
    /// `--http ADDR --stateless` → HTTP without sessions.
    pub fn from_args() -> Result<Transport, String> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Transport::parse(&args)
    }

    /// [`Transport::from_args`] of these arguments (the program's name left out).
    pub fn parse(args: &[&str]) -> Result<Transport, String> {
        let usage = "usage: [--http ADDR [--stateless]]   (no arguments: speak MCP over stdio)";
        let (addr, mode) = match args {
            [] => return Ok(Transport::Stdio),
            ["--http", addr] => (addr, HttpMode::Sessions),
            ["--http", addr, "--stateless"] | ["--stateless", "--http", addr] => {
                (addr, HttpMode::Stateless)
            }
            _ => return Err(usage.into()),
        };
        match addr.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                Ok(Transport::Http((*addr).to_owned(), mode))
            }
            _ => Err(format!(
                "--http needs HOST:PORT, like 127.0.0.1:8080 or localhost:8080, not `{addr}`"
            )),
        }
    }
}

/// The identity of stdio calls: `IDEMPOTENCY_TENANT` / `IDEMPOTENCY_SUBJECT`, default `local` / `stdio-user`.
pub fn stdio_caller() -> Caller {
    Caller::new(
        std::env::var("IDEMPOTENCY_TENANT").unwrap_or_else(|_| "local".into()),
        std::env::var("IDEMPOTENCY_SUBJECT").unwrap_or_else(|_| "stdio-user".into()),
    )
}

/// Demo bearer tokens → callers. From `IDEMPOTENCY_TOKENS` (`token=tenant:subject,...`), or two
/// built-in demo tokens: `acme-token` (acme/alice) and `globex-token` (globex/bob).
/// A real server would verify a JWT or session here.
pub fn bearer_table() -> HashMap<String, Caller> {
    let spec = std::env::var("IDEMPOTENCY_TOKENS")
        .unwrap_or_else(|_| "acme-token=acme:alice,globex-token=globex:bob".into());
    spec.split(',')
        .filter_map(|entry| {
            let (token, who) = entry.split_once('=')?;
            let (tenant, subject) = who.split_once(':')?;
            Some((
                token.trim().to_owned(),
                Caller::new(tenant.trim(), subject.trim()),
            ))
        })
        .collect()
}

/// Serves `make()` over `transport` until the client goes away (stdio) or forever (HTTP).
pub async fn serve<S, F>(make: F, transport: Transport) -> Result<(), BoxError>
where
    S: ServerHandler + Send + Sync + 'static,
    F: Fn() -> S + Send + Sync + 'static,
{
    serve_with(make, transport, None).await
}

/// Like [`serve`], with `routes` served beside `/mcp` behind the same bearer authentication
/// (each request's [`Caller`] in its extensions). Routes need HTTP: with stdio they are refused.
pub async fn serve_with<S, F>(
    make: F,
    transport: Transport,
    routes: Option<axum::Router>,
) -> Result<(), BoxError>
where
    S: ServerHandler + Send + Sync + 'static,
    F: Fn() -> S + Send + Sync + 'static,
{
    if routes.is_some() && matches!(transport, Transport::Stdio) {
        return Err("this server's HTTP routes need --http ADDR".into());
    }
    let metrics = metrics_handle()?;
    // `METRICS_ADDR`: /metrics on an address of its own (any transport); without it, HTTP
    // servers serve it beside /mcp.
    let metrics_apart = match std::env::var("METRICS_ADDR") {
        Ok(addr) => {
            let listener = tokio::net::TcpListener::bind(addr.as_str())
                .await
                .map_err(|e| format!("cannot listen on METRICS_ADDR={addr}: {e}"))?;
            tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
            let app = metrics_route(metrics.clone());
            tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::error!(error = %e, "the metrics endpoint stopped");
                }
            });
            true
        }
        Err(_) => false,
    };
    match transport {
        Transport::Stdio => {
            let running = make().serve(rmcp::transport::stdio()).await?;
            running.waiting().await?;
        }
        Transport::Http(addr, mode) => {
            let mcp = match mode {
                HttpMode::Sessions => {
                    let service: StreamableHttpService<S, LocalSessionManager> =
                        StreamableHttpService::new(
                            move || Ok(make()),
                            Default::default(),
                            StreamableHttpServerConfig::default(),
                        );
                    axum::Router::new().nest_service("/mcp", service)
                }
                HttpMode::Stateless => {
                    let service: StreamableHttpService<S, NeverSessionManager> =
                        StreamableHttpService::new(
                            move || Ok(make()),
                            Default::default(),
                            StreamableHttpServerConfig::default().with_legacy_session_mode(false),
                        );
                    axum::Router::new().nest_service("/mcp", service)
                }
            };
            // Layers listed later run first: authenticate, then the session binding, then rmcp.
            // (Stateless, the binding has nothing to bind and refuses any Mcp-Session-Id.)
            let sessions = CallerBoundSessions::new();
            let tokens = Arc::new(bearer_table());
            let app = mcp
                .layer(axum::middleware::from_fn(
                    move |req, next: axum::middleware::Next| {
                        let sessions = sessions.clone();
                        async move { sessions.guard(req, |req| next.run(req)).await }
                    },
                ))
                .merge(routes.unwrap_or_default())
                .layer(axum::middleware::from_fn(move |req, next| {
                    authenticate(tokens.clone(), req, next)
                }));
            // Prometheus metrics at /metrics (unauthenticated), beside the MCP endpoint unless
            // METRICS_ADDR put them apart.
            let app = if metrics_apart {
                app
            } else {
                app.merge(metrics_route(metrics))
            };
            let listener = tokio::net::TcpListener::bind(addr.as_str())
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
            tracing::info!("streamable HTTP, {mode:?} mode");
            tracing::info!("listening on http://{}/mcp", listener.local_addr()?);
            axum::serve(listener, app).await?;
        }
    }
    Ok(())
}

/// The auth middleware: a known bearer token puts its [`Caller`] into the request's extensions
/// (where `idempotency::mcp::Identity` finds it); anything else is 401.
async fn authenticate(
    tokens: Arc<HashMap<String, Caller>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let caller = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|t| tokens.get(t.trim()))
        .cloned();
    match caller {
        Some(c) => {
            req.extensions_mut().insert(c);
            next.run(req).await
        }
        None => axum::response::Response::builder()
            .status(401)
            .header(axum::http::header::WWW_AUTHENTICATE, "Bearer")
            .body(axum::body::Body::from("missing or unknown bearer token"))
            .unwrap_or_default(),
    }
}

/// Logs go to stderr (stdout carries the MCP protocol over stdio), filtered by `RUST_LOG`
/// (default `info`). rmcp's own events stay at `warn` unless `RUST_LOG` names `rmcp`: its debug
/// events print whole requests, tool arguments (a card token) included.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(log_filter(std::env::var("RUST_LOG").ok().as_deref()))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

/// The filter for `RUST_LOG` (see [`init_logging`]).
fn log_filter(rust_log: Option<&str>) -> tracing_subscriber::EnvFilter {
    let asked = rust_log.filter(|s| !s.trim().is_empty()).unwrap_or("info");
    let directives = if asked.contains("rmcp") {
        asked.to_owned()
    } else {
        format!("{asked},rmcp=warn")
    };
    tracing_subscriber::EnvFilter::try_new(&directives).unwrap_or_else(|e| {
        eprintln!("RUST_LOG={asked:?} is not a filter ({e}); logging at info");
        tracing_subscriber::EnvFilter::new("info,rmcp=warn")
    })
}

/// A server's exit: on an error, `error: ` and the whole chain of causes on stderr, exit code 1.
pub fn exit(result: Result<(), BoxError>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", chain(&*e));
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn wait_durations() {
        assert_eq!(super::parse_wait("0s"), Some(Duration::ZERO));
        assert_eq!(super::parse_wait("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(super::parse_wait(" 3s "), Some(Duration::from_secs(3)));
        assert_eq!(super::parse_wait("2m"), Some(Duration::from_secs(120)));
        for bad in ["", "3", "s", "3h", "-1s", "1.5s"] {
            assert_eq!(super::parse_wait(bad), None, "{bad:?}");
        }
    }
}
