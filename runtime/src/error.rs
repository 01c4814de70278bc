//! The wrapper's own answers. Each message says what happened, names the reference and says what
//! to do next, in words a person or a model can act on.

use std::time::Duration;

use crate::canonical::CanonicalError;
use crate::clock::Timestamp;
use crate::key::Reference;
use crate::store::StoreError;

/// The name of the status tool the messages point to (see `idempotency::mcp`).
pub const STATUS_TOOL: &str = "idempotency_status";

/// Why an outcome is unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnknownReason {
    /// The call ran longer than its `timeout` and was abandoned.
    TimedOut(Duration),
    /// The handler said so (an error with [`Disposition::Unknown`](crate::Disposition::Unknown)); its message.
    Handler(String),
    /// The handler panicked after it started.
    Panicked,
    /// The call was cancelled (its future dropped) after it started.
    Cancelled,
    /// The side effect ran but its answer could not be recorded.
    NotRecorded(String),
    /// An earlier call with these arguments ended this way; it has not been reconciled yet.
    Earlier,
}

impl std::fmt::Display for UnknownReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnknownReason::TimedOut(d) => write!(f, "it did not finish within {}", humanize(*d)),
            UnknownReason::Handler(m) => write!(f, "{m}"),
            UnknownReason::Panicked => f.write_str("the handler failed while it was running"),
            UnknownReason::Cancelled => f.write_str("the call was cancelled while it was running"),
            UnknownReason::NotRecorded(m) => {
                write!(f, "it ran but its answer could not be recorded ({m})")
            }
            UnknownReason::Earlier => f.write_str("an earlier identical call did not report back"),
        }
    }
}

fn humanize(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_millis() != 0 || s == 0 {
        format!("{} ms", d.as_millis())
    } else if s.is_multiple_of(3600) {
        format!("{} h", s / 3600)
    } else if s.is_multiple_of(60) {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

/// What the idempotency wrapper answers instead of running the handler (or after it could not
/// record it). Tool errors convert from it (`impl From<idempotency::Error> for MyError`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An identical call is running now.
    #[error("{tool} with these arguments is already in progress (ref {reference}, started {since}). Do not submit it again; call {STATUS_TOOL} with ref {reference} to learn its outcome.")]
    InFlight {
        /// The tool.
        tool: String,
        /// The running operation's reference.
        reference: Reference,
        /// When it started.
        since: Timestamp,
    },
    /// The call may or may not have taken effect.
    #[error("The outcome of {tool} is unknown (ref {reference}): {reason}. It may or may not have taken effect. Do not retry it; call {STATUS_TOOL} with ref {reference} to learn what happened.")]
    OutcomeUnknown {
        /// The tool.
        tool: String,
        /// The operation's reference.
        reference: Reference,
        /// Why it is unknown.
        reason: UnknownReason,
    },
    /// The business key was already used with other arguments.
    #[error("{tool}: this business key was already used with different arguments (ref {reference}). Nothing was done. Repeat the original arguments to get the original answer, or use a new key for a different request.")]
    PayloadMismatch {
        /// The tool.
        tool: String,
        /// The reference of the operation that holds the business key.
        reference: Reference,
    },
    /// The store could not be reached before the handler ran.
    #[error("{tool}: could not record this call, so nothing was done. It is safe to try again shortly. ({source})")]
    StoreUnavailable {
        /// The tool.
        tool: String,
        /// What the store said.
        #[source]
        source: StoreError,
    },
    /// A different call's record holds this call's reference (their keys share the first 8
    /// bytes, a 1-in-2^64 coincidence per live record). Nothing was done: two live calls never
    /// share a reference, since downstream systems deduplicate on it.
    #[error("{tool}: ref {reference} already names a different call, so this call was not run and nothing was done. Retrying will not help until that record is purged; report this to the server's operator.")]
    ReferenceTaken {
        /// The tool.
        tool: String,
        /// The reference both calls map to.
        reference: Reference,
    },
    /// The arguments cannot be made canonical JSON (NaN, a non-string map key...).
    #[error("{tool}: the arguments cannot be keyed, so nothing was done: {source}")]
    Arguments {
        /// The tool.
        tool: String,
        /// What the canonicaliser said.
        #[source]
        source: CanonicalError,
    },
    /// The caller's identity is missing or unusable.
    #[error("the caller could not be identified, so nothing was done: {reason}")]
    InvalidCaller {
        /// What is wrong.
        reason: String,
    },
    /// A stored answer could not be read back as the handler's type (it changed between releases).
    #[error("{tool}: the stored answer of ref {reference} cannot be read by this version of the server ({message}). The call is not run again; call {STATUS_TOOL} with ref {reference} to see the stored answer.")]
    Replay {
        /// The tool.
        tool: String,
        /// The completed operation's reference.
        reference: Reference,
        /// The decoder's message.
        message: String,
    },
    /// The answer could not be serialised for storing: the handler's output type cannot be stored.
    #[error("{tool}: the answer of ref {reference} could not be stored ({message}); the outcome is recorded as unknown. Do not retry it; call {STATUS_TOOL} with ref {reference}.")]
    Unstorable {
        /// The tool.
        tool: String,
        /// The operation's reference.
        reference: Reference,
        /// The serialiser's message.
        message: String,
    },
}

impl From<CanonicalError> for Error {
    fn from(source: CanonicalError) -> Self {
        Error::Arguments {
            tool: String::new(),
            source,
        }
    }
}

impl Error {
    /// The reference the answer is about, if there is one.
    pub fn reference(&self) -> Option<Reference> {
        match self {
            Error::InFlight { reference, .. }
            | Error::OutcomeUnknown { reference, .. }
            | Error::PayloadMismatch { reference, .. }
            | Error::ReferenceTaken { reference, .. }
            | Error::Replay { reference, .. }
            | Error::Unstorable { reference, .. } => Some(*reference),
            _ => None,
        }
    }

    /// Whether the caller may simply send the same call again (nothing was done and nothing runs).
    pub fn safe_to_retry(&self) -> bool {
        matches!(self, Error::StoreUnavailable { .. })
    }

    /// Whether nothing was done by this call (no side effect ran because of it).
    pub fn nothing_done(&self) -> bool {
        matches!(
            self,
            Error::InFlight { .. }
                | Error::PayloadMismatch { .. }
                | Error::ReferenceTaken { .. }
                | Error::StoreUnavailable { .. }
                | Error::Arguments { .. }
                | Error::InvalidCaller { .. }
        )
    }

    pub(crate) fn with_tool(mut self, name: &str) -> Self {
        if let Error::Arguments { tool, .. } = &mut self {
            if tool.is_empty() {
                *tool = name.to_owned();
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Caller, Key};

    fn r() -> Reference {
        Key::for_call(&Caller::new("a", "b"), "t", &1)
            .unwrap()
            .reference(1)
    }

    #[test]
    fn messages_name_the_ref_and_the_next_step() {
        let in_flight = Error::InFlight {
            tool: "charge_card".into(),
            reference: r(),
            since: Timestamp::from_millis(0),
        };
        let s = in_flight.to_string();
        assert!(
            s.contains(&r().to_string())
                && s.contains("Do not submit it again")
                && s.contains(STATUS_TOOL),
            "{s}"
        );
        let unknown = Error::OutcomeUnknown {
            tool: "charge_card".into(),
            reference: r(),
            reason: UnknownReason::TimedOut(Duration::from_secs(30)),
        };
        let s = unknown.to_string();
        assert!(
            s.contains("unknown") && s.contains("30 s") && s.contains("Do not retry"),
            "{s}"
        );
        assert!(!unknown.nothing_done());
        let mismatch = Error::PayloadMismatch {
            tool: "ship".into(),
            reference: r(),
        };
        assert!(mismatch.to_string().contains("different arguments"));
        assert!(mismatch.nothing_done());
        let taken = Error::ReferenceTaken {
            tool: "charge_card".into(),
            reference: r(),
        };
        let s = taken.to_string();
        assert!(
            s.contains(&r().to_string())
                && s.contains("nothing was done")
                && !taken.safe_to_retry(),
            "{s}"
        );
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(humanize(Duration::from_secs(900)), "15 min");
        assert_eq!(humanize(Duration::from_secs(7200)), "2 h");
        assert_eq!(humanize(Duration::from_millis(1500)), "1500 ms");
        assert_eq!(humanize(Duration::from_secs(45)), "45 s");
    }
}
