//! The wrapper's own answers. Each message says what happened, names the reference and says what
//! to do next, in words a person or a model can act on.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::key::{ClientKeyError, KeyError, Reference};
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
    /// The handler panicked while it was running; its message.
    Panicked(String),
    /// The side effect ran but its answer could not be recorded (the store's error is the
    /// [`Error`]'s source).
    NotRecorded,
    /// While this attempt ran, its record was settled or taken over by someone else (a
    /// reconciler that found its lease passed, an operator), so its result could not be
    /// recorded.
    LeaseLost,
    /// This attempt's lease passed before its handler finished, without a renewal the store
    /// accepted (the store was unreachable, or the process was paused), so the handler was
    /// stopped where it stood: it may have acted.
    LeaseExpired,
    /// An identical call's lease ended at this time without a word from its worker (it crashed,
    /// was cut off, or could not record its outcome); it has not been reconciled yet.
    Unreported {
        /// When its lease ended.
        lease_ended: Timestamp,
    },
    /// An earlier call with these arguments ended this way; it has not been reconciled yet.
    Earlier,
    /// A transactional call's commit went unanswered (the connection broke): it committed or it
    /// did not, and a repeat finds out (it replays the committed answer, or runs once).
    CommitUnanswered,
}

impl std::fmt::Display for UnknownReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnknownReason::TimedOut(d) => write!(f, "it did not finish within {}", humanize(*d)),
            UnknownReason::Handler(m) => write!(f, "{m}"),
            UnknownReason::Panicked(m) => write!(f, "the handler failed while it was running ({m})"),
            UnknownReason::NotRecorded => f.write_str("it ran but its answer could not be recorded"),
            UnknownReason::LeaseLost => f.write_str(
                "its record was settled elsewhere while it ran (its lease had passed), so its result was not recorded",
            ),
            UnknownReason::LeaseExpired => f.write_str(
                "it could not renew its claim in time (the store was unreachable or the server paused), so it was stopped where it stood",
            ),
            UnknownReason::Unreported { lease_ended } => write!(
                f,
                "an identical call's worker has not reported since its lease ended at {lease_ended}"
            ),
            UnknownReason::Earlier => f.write_str("an earlier identical call did not report back"),
            UnknownReason::CommitUnanswered => {
                f.write_str("the database's answer to its commit was lost")
            }
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
///
/// `Display` says what happened in one short sentence and never repeats its
/// [`source`](std::error::Error::source); [`Error::advice`] is the whole paragraph for a person or
/// a model: what happened, the reference, and what to do next. The MCP integration answers with
/// `advice()`; a plain handler whose errors reach a model should show it too.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An identical call is running now.
    #[error(
        "{tool} with these arguments is already in progress (ref {reference}, started {since})"
    )]
    InFlight {
        /// The tool.
        tool: String,
        /// The running operation's reference.
        reference: Reference,
        /// When it started.
        since: Timestamp,
    },
    /// The call may or may not have taken effect.
    #[error("the outcome of {tool} is unknown (ref {reference}): {reason}")]
    OutcomeUnknown {
        /// The tool.
        tool: String,
        /// The operation's reference.
        reference: Reference,
        /// Why it is unknown.
        reason: UnknownReason,
        /// The store's error, when recording the outcome failed.
        #[source]
        source: Option<StoreError>,
    },
    /// The business key was already used with other arguments.
    #[error(
        "{tool}: this business key was already used with different arguments (ref {reference})"
    )]
    PayloadMismatch {
        /// The tool.
        tool: String,
        /// The reference of the operation that holds the business key.
        reference: Reference,
    },
    /// The call could not be claimed, so the handler did not run. Whether trying again helps
    /// depends on the store's error ([`Error::safe_to_retry`]).
    #[error("{tool} was not run: the call could not be recorded")]
    Store {
        /// The tool.
        tool: String,
        /// What the store said.
        #[source]
        source: StoreError,
    },
    /// The call's record is in the store but cannot be read (damaged, or written in a shape this
    /// version does not know), so the handler did not run. Every repeat gets the same answer until
    /// an operator repairs, settles or removes the record.
    #[error(
        "{tool} was not run: its record (ref {reference}) in the idempotency store cannot be read"
    )]
    Unreadable {
        /// The tool.
        tool: String,
        /// The reference of the call's key (its first generation: `idempotency-admin inspect`
        /// finds the record by it whatever its generation).
        reference: Reference,
        /// What the store could not read ([`StoreError::Corrupt`]).
        #[source]
        source: StoreError,
    },
    /// The handler failed without taking effect (a retryable error), but its claim could not be
    /// given back, so repeats cannot run yet.
    #[error("{tool} did not take effect, but its claim (ref {reference}) could not be released")]
    NotReleased {
        /// The tool.
        tool: String,
        /// The claim's reference.
        reference: Reference,
        /// What the handler said.
        handler: String,
        /// Why the release failed.
        #[source]
        source: StoreError,
    },
    /// A different call's record holds this call's reference (their keys share the first 8
    /// bytes, a 1-in-2^64 coincidence per live record). Nothing was done: two live calls never
    /// share a reference, since downstream systems deduplicate on it.
    #[error("{tool}: ref {reference} already names a different call, so this call was not run")]
    ReferenceTaken {
        /// The tool.
        tool: String,
        /// The reference both calls map to.
        reference: Reference,
    },
    /// The arguments cannot be keyed (NaN, a non-string map key...).
    #[error("{tool}: the arguments cannot be keyed, so nothing was done")]
    Arguments {
        /// The tool.
        tool: String,
        /// What the keying said.
        #[source]
        source: KeyError,
    },
    /// The tool takes the client's idempotency key and the request's is missing (where the tool
    /// requires one) or unusable.
    #[error("{tool}: the request has no usable idempotency key, so nothing was done")]
    ClientKey {
        /// The tool.
        tool: String,
        /// What is wrong with it.
        #[source]
        source: ClientKeyError,
    },
    /// The caller's identity is missing or unusable.
    #[error("the caller could not be identified, so nothing was done: {reason}")]
    InvalidCaller {
        /// What is wrong.
        reason: String,
    },
    /// A stored answer could not be read back as the handler's type: it changed between releases,
    /// or the operation was answered over HTTP with a response that is not this tool's answer.
    #[error("{tool}: the stored answer of ref {reference} cannot be read as this call's answer ({message})")]
    Replay {
        /// The tool.
        tool: String,
        /// The completed operation's reference.
        reference: Reference,
        /// The decoder's message.
        message: String,
    },
    /// The answer could not be serialised for storing: the handler's output type cannot be stored.
    #[error("{tool}: the answer of ref {reference} could not be stored ({message}); its outcome is recorded as unknown")]
    Unstorable {
        /// The tool.
        tool: String,
        /// The operation's reference.
        reference: Reference,
        /// The serialiser's message.
        message: String,
    },
    /// A transactional call was rolled back: nothing it wrote stays and no record was kept, so
    /// the same call may be sent again (it runs once).
    #[error("{tool} (ref {reference}) was rolled back: {reason}")]
    RolledBack {
        /// The tool.
        tool: String,
        /// The reference it ran under.
        reference: Reference,
        /// Why: the handler panicked, ran past its timeout, kept its transaction, or the
        /// database refused the commit.
        reason: String,
        /// The database's error, when it refused.
        #[source]
        source: Option<StoreError>,
    },
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
            | Error::Unstorable { reference, .. }
            | Error::Unreadable { reference, .. }
            | Error::NotReleased { reference, .. }
            | Error::RolledBack { reference, .. } => Some(*reference),
            _ => None,
        }
    }

    /// Whether the caller may simply send the same call again: nothing was done and the store's
    /// failure was a passing one (unreachable, or contended).
    pub fn safe_to_retry(&self) -> bool {
        matches!(self, Error::Store { source, .. } if source.is_transient())
            || matches!(self, Error::RolledBack { .. })
    }

    /// Whether nothing was done by this call (no side effect ran because of it).
    pub fn nothing_done(&self) -> bool {
        matches!(
            self,
            Error::InFlight { .. }
                | Error::NotReleased { .. }
                | Error::PayloadMismatch { .. }
                | Error::ReferenceTaken { .. }
                | Error::Store { .. }
                | Error::Unreadable { .. }
                | Error::Arguments { .. }
                | Error::ClientKey { .. }
                | Error::InvalidCaller { .. }
                | Error::RolledBack { .. }
        )
    }

    /// The whole answer for a person or a model: what happened (this error's `Display`), the
    /// reference, and what to do next. The MCP integration answers with it.
    ///
    /// ```
    /// use idempotency::{Error, Reference};
    /// let e = Error::PayloadMismatch { tool: "ship".into(), reference: "3f9a0c1b2d4e5f60-1".parse().unwrap() };
    /// assert!(e.advice().starts_with(&e.to_string()));
    /// assert!(e.advice().contains("Repeat the original arguments"));
    /// ```
    pub fn advice(&self) -> String {
        let next = match self {
            Error::InFlight { reference, .. } => format!(
                "Do not submit it again; call {STATUS_TOOL} with ref {reference} to learn its outcome."
            ),
            Error::OutcomeUnknown { reference, reason: UnknownReason::CommitUnanswered, .. } => format!(
                "Call {STATUS_TOOL} with ref {reference}: if it completed, that is its answer; if it is not found, nothing was done and the call may be sent again (it runs once)."
            ),
            Error::RolledBack { .. } => "Nothing was done. It is safe to send the same call again.".to_owned(),
            Error::OutcomeUnknown { reference, .. } => format!(
                "It may or may not have taken effect. Do not retry it; call {STATUS_TOOL} with ref {reference} to learn what happened."
            ),
            Error::PayloadMismatch { .. } => "Nothing was done. Repeat the original arguments to get the original answer, or use a new key for a different request.".to_owned(),
            Error::Store { source, .. } if source.is_transient() => {
                "Nothing was done. It is safe to try again shortly.".to_owned()
            }
            Error::Store { source, .. } => format!(
                "Nothing was done, and trying again will not help: {source}. Report this to the server's operator."
            ),
            Error::Unreadable { reference, .. } => format!(
                "Nothing was done. Do not retry: every repeat gets this same answer until the server's operator repairs, settles or removes the record of ref {reference} (idempotency-admin inspect {reference} shows it)."
            ),
            Error::NotReleased { reference, handler, .. } => format!(
                "The handler said: {handler}. Nothing was done, but a repeat is told the call is in progress until its lease passes, and then that its outcome is unknown until it is reconciled; call {STATUS_TOOL} with ref {reference} to follow it."
            ),
            Error::ReferenceTaken { .. } => "Nothing was done. Retrying will not help until that record is purged; report this to the server's operator.".to_owned(),
            Error::Arguments { source, .. } => format!("{}.", deepest(source)),
            Error::ClientKey { source, .. } => format!("{source}."),
            Error::InvalidCaller { .. } => String::new(),
            Error::Replay { reference, .. } => format!(
                "The call is not run again; call {STATUS_TOOL} with ref {reference} to see the stored answer."
            ),
            Error::Unstorable { reference, .. } => format!(
                "Do not retry it; call {STATUS_TOOL} with ref {reference}."
            ),
        };
        if next.is_empty() {
            format!("{self}.")
        } else {
            format!("{self}. {next}")
        }
    }
}

/// The innermost cause of `e`: the one that says what is wrong.
fn deepest(e: &(dyn std::error::Error + 'static)) -> String {
    let mut at = e;
    while let Some(next) = at.source() {
        at = next;
    }
    at.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Caller, Key};
    use crate::store::StoreError;

    fn r() -> Reference {
        Key::for_call(&crate::key::Secret::demo(), &Caller::new("a", "b"), "t", &1)
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
        let s = in_flight.advice();
        assert!(
            s.contains(&r().to_string())
                && s.contains("Do not submit it again")
                && s.contains(STATUS_TOOL),
            "{s}"
        );
        assert!(!in_flight.to_string().contains(STATUS_TOOL));
        let unknown = Error::OutcomeUnknown {
            tool: "charge_card".into(),
            reference: r(),
            reason: UnknownReason::TimedOut(Duration::from_secs(30)),
            source: None,
        };
        let s = unknown.advice();
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
        let s = taken.advice();
        assert!(
            s.contains(&r().to_string())
                && s.contains("Nothing was done")
                && !taken.safe_to_retry(),
            "{s}"
        );
    }

    /// Every cause in a chain is printed once: no `Display` repeats its source.
    #[test]
    fn each_cause_appears_once_in_the_chain() {
        let io = std::io::Error::other("connection reset by peer");
        let chains = [
            Error::Store {
                tool: "charge_card".into(),
                source: StoreError::Unavailable(Box::new(io)),
            },
            Error::OutcomeUnknown {
                tool: "charge_card".into(),
                reference: r(),
                reason: UnknownReason::NotRecorded,
                source: Some(StoreError::Corrupt {
                    problem: "a state code this version does not know".into(),
                    source: Some(Box::new(std::io::Error::other("code 9"))),
                }),
            },
            Error::Arguments {
                tool: "charge_card".into(),
                source: KeyError::Canonical(crate::canonical::CanonicalError::NonFiniteNumber),
            },
        ];
        for e in &chains {
            let mut texts = vec![e.to_string()];
            let mut at: &dyn std::error::Error = e;
            while let Some(next) = at.source() {
                texts.push(next.to_string());
                at = next;
            }
            assert!(texts.len() >= 2, "{texts:?}");
            let whole = texts.join(": ");
            for t in &texts[1..] {
                assert_eq!(
                    whole.matches(t.as_str()).count(),
                    1,
                    "{t:?} repeated in {whole:?}"
                );
            }
        }
        let permanent = &chains[1];
        assert!(!permanent.safe_to_retry());
        assert!(chains[0].safe_to_retry());
        assert!(chains[0].advice().contains("safe to try again"));
        let config = Error::Store {
            tool: "t".into(),
            source: StoreError::Migration {
                problem: "migration 1 failed".into(),
                source: None,
            },
        };
        assert!(
            config.advice().contains("will not help"),
            "{}",
            config.advice()
        );
        assert!(!config.to_string().contains("unavailable"));
    }

    /// A record that cannot be read: nothing was done, retrying will not help, the reference is
    /// named and the operator is the next step; the store's words are the source, said once.
    #[test]
    fn an_unreadable_record_is_never_safe_to_retry() {
        let e = Error::Unreadable {
            tool: "charge_card".into(),
            reference: r(),
            source: StoreError::corrupt("unknown record state 9"),
        };
        let s = e.advice();
        assert!(!e.safe_to_retry() && e.nothing_done(), "{s}");
        assert_eq!(e.reference(), Some(r()));
        assert!(
            s.contains(&r().to_string())
                && s.contains("cannot be read")
                && s.contains("Do not retry")
                && s.contains("idempotency-admin")
                && !s.contains("try again shortly"),
            "{s}"
        );
        assert!(!e.to_string().contains("state 9"), "{e}");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(humanize(Duration::from_secs(900)), "15 min");
        assert_eq!(humanize(Duration::from_secs(7200)), "2 h");
        assert_eq!(humanize(Duration::from_millis(1500)), "1500 ms");
        assert_eq!(humanize(Duration::from_secs(45)), "45 s");
    }
}
