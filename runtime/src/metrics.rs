//! What the library counts, through the [`metrics`](https://docs.rs/metrics) facade. The library
//! installs no exporter: install the recorder of your choice (Prometheus, StatsD...) and these
//! appear in it; without one they cost next to nothing.
//!
//! Every metric is described (a recorder that prints `# HELP`, as Prometheus's does, shows the
//! text of [`METRICS`]) when an engine is built. Histograms are in seconds; [`BUCKETS`] are bucket
//! bounds for them from 0.1 ms to 10 s, for a recorder that needs them set (Prometheus's exporter
//! makes summaries without).
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `idempotency_calls_total` | counter | `tool`, `answer` | calls by answer: `fresh` (the body ran), `replayed` (a stored answer), `in_flight`, `unknown` (outcome unknown), `mismatch` (payload mismatch), `refused` (nothing was done: store down, arguments or caller that cannot be keyed, a reference taken, a stored answer that cannot be read), `rolled_back` (a transactional call) |
//! | `idempotency_call_seconds` | histogram | `tool`, `answer` | how long a call took, by answer (as above) |
//! | `idempotency_store_seconds` | histogram | `operation` | the store's latency per operation (`claim`, `complete`, `release`, `mark_unknown`, `renew`, `take_over`, `settle`, `status`, `watch`, `purge`, `unsettled`, `fetch`, `ack`, `swap_secret`; a transactional call's `begin`, `commit`, `rollback`, and a waiting repeat's `running`), failures included |
//! | `idempotency_waited_total` | counter | `tool` | repeats that waited for the call in progress (`wait`) |
//! | `idempotency_cache_total` | counter | `tool`, `result` | lookups in the engine's cache of completed answers: `hit` (replayed with no store round trip) or `miss` |
//! | `idempotency_cache_evictions_total` | counter | `tool` | answers the cache let go to make room (counted under the tool of the answer put) |
//! | `idempotency_unsettled_records` | gauge | – | unsettled records (in flight past their lease, or unknown) the last lease-expiry round found, up to its batch of 100 |
//! | `idempotency_unknown_records` | gauge | – | of those, the ones the round left "outcome unknown" |
//! | `idempotency_unsettled_seen_total` | counter | – | unsettled records reconciliation rounds looked at |
//! | `idempotency_reruns_total` | counter | `tool` | calls whose worker was gone run again under their reference (`recover = "rerun"`) |
//! | `idempotency_purged_total` | counter | – | records the purger deleted |

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::outcome::{Failure, Outcome};
use crate::store::BoxFuture;

/// Counter: calls by tool and answer.
pub const CALLS: &str = "idempotency_calls_total";
/// Histogram: call duration in seconds, by tool and answer.
pub const CALL_SECONDS: &str = "idempotency_call_seconds";
/// Counter: repeats that waited for the call in progress, by tool.
pub const WAITED: &str = "idempotency_waited_total";
/// Gauge: unsettled records the last lease-expiry round found.
pub const UNSETTLED: &str = "idempotency_unsettled_records";
/// Gauge: records the last lease-expiry round left "outcome unknown".
pub const UNKNOWN: &str = "idempotency_unknown_records";

/// Bucket bounds in seconds, 0.1 ms to 10 s, for the histograms of a recorder that needs them
/// (`PrometheusBuilder::set_buckets`).
pub const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// A metric's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution (in seconds).
    Histogram,
}

/// Every metric the library records: name, kind, description (the `# HELP` text).
pub const METRICS: &[(&str, Kind, &str)] = &[
    (CALLS, Kind::Counter, "Calls of idempotent tools, by tool and answer (fresh, replayed, in_flight, unknown, mismatch, refused, rolled_back)."),
    (CALL_SECONDS, Kind::Histogram, "How long an idempotent call took, in seconds, by tool and answer."),
    (STORE_SECONDS, Kind::Histogram, "Latency of the idempotency store, in seconds, by operation, failures included."),
    (WAITED, Kind::Counter, "Repeats that waited for the call in progress, by tool."),
    (CACHE, Kind::Counter, "Lookups in the engine's cache of completed answers, by tool and result (hit, miss)."),
    (CACHE_EVICTIONS, Kind::Counter, "Answers the cache of completed answers let go to make room, by tool."),
    (UNSETTLED, Kind::Gauge, "Unsettled records (in flight past their lease, or unknown) the last lease-expiry round found, up to its batch."),
    (UNKNOWN, Kind::Gauge, "Records the last lease-expiry round left outcome unknown."),
    (UNSETTLED_SEEN, Kind::Counter, "Unsettled records reconciliation rounds looked at."),
    (RERUNS, Kind::Counter, "Calls whose worker was gone, run again under their reference (recover = rerun)."),
    (PURGED, Kind::Counter, "Records the purger deleted."),
];

/// Describes every metric to the installed recorder (its `# HELP` lines). An engine does it as
/// it is built; call it again after installing a recorder later.
pub fn describe() {
    for (name, kind, help) in METRICS {
        let unit = match kind {
            Kind::Histogram => Some(metrics::Unit::Seconds),
            _ => None,
        };
        match (kind, unit) {
            (Kind::Counter, _) => metrics::describe_counter!(*name, *help),
            (Kind::Gauge, _) => metrics::describe_gauge!(*name, *help),
            (Kind::Histogram, Some(unit)) => metrics::describe_histogram!(*name, unit, *help),
            (Kind::Histogram, None) => metrics::describe_histogram!(*name, *help),
        }
    }
}

/// Counts a repeat that waited for the call in progress.
pub(crate) fn waited(tool: &'static str) {
    metrics::counter!(WAITED, "tool" => tool).increment(1);
}

/// Sets the gauges from a lease-expiry round: `unsettled` found, `unknown` left unknown.
pub(crate) fn round(unsettled: usize, unknown: usize) {
    metrics::gauge!(UNSETTLED).set(unsettled as f64);
    metrics::gauge!(UNKNOWN).set(unknown as f64);
}
/// Histogram: store latency in seconds, by operation.
pub const STORE_SECONDS: &str = "idempotency_store_seconds";
/// Counter: unsettled records seen by reconciliation rounds.
pub const UNSETTLED_SEEN: &str = "idempotency_unsettled_seen_total";
/// Counter: records purged.
pub const PURGED: &str = "idempotency_purged_total";
/// Counter: calls run again under their reference because their worker was gone.
pub const RERUNS: &str = "idempotency_reruns_total";

/// Counter: calls looked up in the engine's cache of completed answers, by tool and result.
pub const CACHE: &str = "idempotency_cache_total";
/// Counter: answers the cache let go to make room, by tool (of the one put).
pub const CACHE_EVICTIONS: &str = "idempotency_cache_evictions_total";

/// Counts a lookup in the cache of completed answers.
pub(crate) fn cache(tool: &'static str, hit: bool) {
    let result = if hit { "hit" } else { "miss" };
    metrics::counter!(CACHE, "tool" => tool, "result" => result).increment(1);
}

/// Counts answers the cache let go to make room.
pub(crate) fn cache_evicted(tool: &'static str, n: u64) {
    metrics::counter!(CACHE_EVICTIONS, "tool" => tool).increment(n);
}

/// Counts a call run again under its reference (`recover = "rerun"`).
pub(crate) fn rerun(tool: &'static str) {
    metrics::counter!(RERUNS, "tool" => tool).increment(1);
}

/// Counts one call's answer, and how long it took; the answer's label.
pub(crate) fn call<T, E>(
    tool: &'static str,
    outcome: &Outcome<T, Failure<E>>,
    took: Duration,
) -> &'static str {
    let answer = match &outcome.result {
        _ if outcome.replayed => "replayed",
        Ok(_) | Err(Failure::Handler(_)) => "fresh",
        Err(Failure::Wrapper(e)) => wrapper_answer(e),
    };
    metrics::counter!(CALLS, "tool" => tool, "answer" => answer).increment(1);
    metrics::histogram!(CALL_SECONDS, "tool" => tool, "answer" => answer)
        .record(took.as_secs_f64());
    answer
}

/// Counts a call refused before it reached the engine (a caller or arguments that cannot be
/// keyed).
#[cfg(any(feature = "rmcp", feature = "http"))]
pub(crate) fn refused(e: &Error) {
    let tool = match e {
        Error::Arguments { tool, .. } | Error::ClientKey { tool, .. } => tool.clone(),
        _ => String::from("unknown"),
    };
    metrics::counter!(CALLS, "tool" => tool, "answer" => wrapper_answer(e)).increment(1);
}

fn wrapper_answer(e: &Error) -> &'static str {
    match e {
        Error::InFlight { .. } => "in_flight",
        Error::OutcomeUnknown { .. } | Error::Unstorable { .. } => "unknown",
        Error::PayloadMismatch { .. } => "mismatch",
        Error::Store { .. }
        | Error::Unreadable { .. }
        | Error::NotReleased { .. }
        | Error::ReferenceTaken { .. }
        | Error::Arguments { .. }
        | Error::ClientKey { .. }
        | Error::InvalidCaller { .. }
        | Error::Replay { .. } => "refused",
        Error::RolledBack { .. } => "rolled_back",
    }
}

/// `fut`, a store call, timed into [`STORE_SECONDS`] under `operation`.
pub(crate) fn timed<'a, T: 'a>(operation: &'static str, fut: BoxFuture<'a, T>) -> BoxFuture<'a, T> {
    Box::pin(async move {
        let started = Instant::now();
        let out = fut.await;
        metrics::histogram!(STORE_SECONDS, "operation" => operation)
            .record(started.elapsed().as_secs_f64());
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `answer` label of a rolled-back transactional call, as docs/metrics.md
    /// lists it.
    #[test]
    fn a_rolled_back_call_is_counted_as_such() {
        let e = Error::RolledBack {
            tool: "place_order".into(),
            reference: "3f9a0c1b2d4e5f60-1".parse().expect("a reference"),
            reason: "the handler failed".into(),
            source: None,
        };
        assert_eq!(wrapper_answer(&e), "rolled_back");
        let readme = include_str!("../../docs/metrics.md");
        assert!(
            readme.contains("`refused`, `rolled_back`"),
            "docs/metrics.md's metrics table lists it"
        );
    }
}
