//! Word to the caller while a repeat waits for the call in progress (`wait`): the integration
//! that knows the caller (rmcp: a client that sent a progress token) sets a reporter for the
//! call, and the engine calls it as the wait begins and then every second. Without such an
//! integration (no `rmcp` feature) nothing can set one, and a wait is only a wait.

use std::future::Future;
#[cfg(feature = "rmcp")]
use std::sync::Arc;
use std::time::Duration;

use crate::key::Reference;

/// How a waiting repeat stands: what it waits for, how long it has waited, for how long it may.
#[cfg(feature = "rmcp")]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waiting {
    pub(crate) reference: Reference,
    pub(crate) waited: Duration,
    pub(crate) wait: Duration,
}

/// Told how a waiting repeat stands; must not block (it runs on the waiting task).
#[cfg(feature = "rmcp")]
#[derive(Clone)]
pub(crate) struct Reporter(pub(crate) Arc<dyn Fn(Waiting) + Send + Sync>);

#[cfg(feature = "rmcp")]
impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reporter")
    }
}

/// How often a waiting repeat reports.
#[cfg(feature = "rmcp")]
const EVERY: Duration = Duration::from_secs(1);

#[cfg(feature = "rmcp")]
tokio::task_local! {
    static REPORTER: Reporter;
}

/// Runs `call` with `reporter` (if any) told how its waits stand.
#[cfg(feature = "rmcp")]
pub(crate) async fn scope<F: Future>(reporter: Option<Reporter>, call: F) -> F::Output {
    match reporter {
        Some(r) => REPORTER.scope(r, call).await,
        None => call.await,
    }
}

/// Runs `wait` (a repeat waiting for `reference`, since `since`, for at most `wait`), reporting
/// as it begins and every second to the reporter of the call, if it has one.
#[cfg(feature = "rmcp")]
pub(crate) async fn reporting<F: Future>(
    reference: Reference,
    since: tokio::time::Instant,
    wait: Duration,
    waiting: F,
) -> F::Output {
    let Ok(reporter) = REPORTER.try_with(Reporter::clone) else {
        return waiting.await;
    };
    tokio::pin!(waiting);
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tokio::select! {
            out = &mut waiting => return out,
            _ = tick.tick() => (reporter.0)(Waiting { reference, waited: since.elapsed(), wait }),
        }
    }
}

/// Runs `wait`: without an integration that sets a reporter, there is no one to tell.
#[cfg(not(feature = "rmcp"))]
pub(crate) async fn reporting<F: Future>(
    _reference: Reference,
    _since: tokio::time::Instant,
    _wait: Duration,
    waiting: F,
) -> F::Output {
    waiting.await
}
