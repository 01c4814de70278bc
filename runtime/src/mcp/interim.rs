//! Tools that answer `CallToolResponse`: besides a completed result, rmcp lets a tool answer
//! `input_required` (a multi-round-trip request: the client fulfils the input requests and sends
//! the call again with `inputResponses` and the echoed `requestState`).
//!
//! An `input_required` answer is never stored as the operation's answer. It is an interim answer
//! given before the side effect (the tool asks, then acts): the claim is released, as for a
//! retryable error, so the continuation — the same tool and arguments, hence the same key, from
//! any replica — claims it again and runs the body, which now reads the client's responses and
//! completes. Its completed answer is stored: a repeat of the original call or of the
//! continuation gets it replayed; a continuation arriving while another runs is told "in flight".
//! A tool must therefore not act before asking: a side effect followed by `input_required` would
//! run again in the continuation.

use std::fmt;

use rmcp::model::{CallToolResponse, CallToolResult, CreateTaskResult, InputRequiredResult};
use rmcp::ErrorData;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::outcome::{Classify, Disposition, ErrorPolicy, Failure, Outcome};

/// A wrapped `CallToolResponse` tool's error side: its own error, or an answer that is not the
/// operation's (an `input_required` round), carried out of the engine without being stored.
#[derive(Debug)]
pub enum Interim<E> {
    /// The handler's error.
    Handler(E),
    /// The handler asked the client for input: released, not stored.
    InputRequired(InputRequiredResult),
    /// The handler made a task of the call itself (rmcp's in-memory task): passed on to the
    /// client, and the operation's outcome is unknown to the wrapper — a repeat is told so
    /// rather than starting another task.
    Task(Box<CreateTaskResult>),
}

impl<E: fmt::Display> fmt::Display for Interim<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Interim::Handler(e) => e.fmt(f),
            Interim::InputRequired(_) => f.write_str("the tool asked the client for input"),
            Interim::Task(t) => write!(f, "the tool made a task of the call ({})", t.task.task_id),
        }
    }
}

/// Only a handler's error is ever stored (an input round is released), as the error itself.
impl<E: Serialize> Serialize for Interim<E> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Interim::Handler(e) => e.serialize(s),
            Interim::InputRequired(_) | Interim::Task(_) => Err(serde::ser::Error::custom(
                "an input_required or task answer is never stored",
            )),
        }
    }
}

impl<'de, E: DeserializeOwned> Deserialize<'de> for Interim<E> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        E::deserialize(d).map(Interim::Handler)
    }
}

impl<E> Interim<E> {
    /// An input round is released; a task leaves the outcome unknown; a handler error is `e`.
    fn interim(&self, e: Disposition) -> Disposition {
        match self {
            Interim::Handler(_) => e,
            Interim::InputRequired(_) => Disposition::Retryable,
            Interim::Task(_) => Disposition::Unknown,
        }
    }
}

impl<E: fmt::Display> Interim<E> {
    /// `E`'s own [`Classify`]; an input round is released.
    pub fn classified() -> ErrorPolicy<Self>
    where
        E: Classify + Serialize + DeserializeOwned,
    {
        // Not an `impl Classify for Interim<E>`: rustc would list it in every "`E` does not say
        // what its errors mean" error.
        ErrorPolicy {
            classify: |i| match i {
                Interim::Handler(e) => e.disposition(),
                other => other.interim(Disposition::Definitive),
            },
            ..ErrorPolicy::definitive()
        }
    }

    /// Every handler error is definitive; an input round is released.
    pub fn definitive() -> ErrorPolicy<Self>
    where
        E: Serialize + DeserializeOwned,
    {
        ErrorPolicy {
            classify: |i| i.interim(Disposition::Definitive),
            ..ErrorPolicy::definitive()
        }
    }

    /// Every handler error is retryable; an input round is released.
    pub fn retryable() -> ErrorPolicy<Self> {
        ErrorPolicy {
            classify: |i| i.interim(Disposition::Retryable),
            ..ErrorPolicy::retryable()
        }
    }

    /// Every handler error leaves the outcome unknown; an input round is released.
    pub fn unknown() -> ErrorPolicy<Self> {
        ErrorPolicy {
            classify: |i| i.interim(Disposition::Unknown),
            ..ErrorPolicy::unknown()
        }
    }
}

/// The handler's `CallToolResponse` split into what is stored (a completed result) and what is
/// not (an input round).
pub(crate) fn split_response<E>(
    r: Result<CallToolResponse, E>,
) -> Result<CallToolResult, Interim<E>> {
    match r {
        Ok(CallToolResponse::Complete(result)) => Ok(result),
        Ok(CallToolResponse::InputRequired(ir)) => Err(Interim::InputRequired(ir)),
        Ok(CallToolResponse::Task(t)) => Err(Interim::Task(Box::new(t))),
        Ok(other) => Ok(unknown_kind(other)),
        Err(e) => Err(Interim::Handler(e)),
    }
}

/// A response kind newer than this version (`CallToolResponse` is non-exhaustive): an error
/// result saying so, stored like any completed answer, so a repeat does not run the call again.
fn unknown_kind(other: CallToolResponse) -> CallToolResult {
    tracing::warn!(
        ?other,
        "a wrapped tool answered with a response kind this version does not know"
    );
    CallToolResult::error(vec![rmcp::model::ContentBlock::text(
        "This tool answered with a kind of answer this server's idempotency layer does not know; the call ran once and will not run again for this key.",
    )])
}

/// [`answer_verbatim`](super::answer_verbatim) for a `CallToolResponse` tool: a completed result
/// verbatim (reference and replay marker in `_meta`), an input round as it was given; a handler's
/// error as `policy` describes it.
pub(crate) fn answer_response<E>(
    outcome: Outcome<CallToolResult, Failure<Interim<E>>>,
    policy: ErrorPolicy<Interim<E>>,
) -> Result<CallToolResponse, ErrorData> {
    match outcome.result {
        Err(Failure::Handler(Interim::InputRequired(ir))) => {
            Ok(CallToolResponse::InputRequired(ir))
        }
        Err(Failure::Handler(Interim::Task(t))) => Ok(CallToolResponse::Task(*t)),
        _ => super::answer_verbatim(super::answer::described(outcome, policy))
            .map(CallToolResponse::Complete),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Serialize, serde::Deserialize)]
    struct Declined;

    impl fmt::Display for Declined {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("declined")
        }
    }

    impl Classify for Declined {
        fn disposition(&self) -> Disposition {
            Disposition::Definitive
        }
    }

    #[test]
    fn an_input_round_is_released_whatever_the_handler_errors_mean() {
        let asked =
            || Interim::<Declined>::InputRequired(InputRequiredResult::from_request_state("s"));
        for policy in [
            Interim::<Declined>::definitive(),
            Interim::<Declined>::retryable(),
            Interim::<Declined>::unknown(),
        ] {
            assert_eq!((policy.classify)(&asked()), Disposition::Retryable);
            assert!((policy.encode)(&asked()).is_err());
        }
        let d = Interim::<Declined>::definitive();
        assert_eq!(
            (d.classify)(&Interim::Handler(Declined)),
            Disposition::Definitive
        );
        let stored = (d.encode)(&Interim::Handler(Declined)).unwrap();
        assert!(matches!(
            (d.decode)(&stored),
            Ok(Interim::Handler(Declined))
        ));
        let u = Interim::<Declined>::unknown();
        assert_eq!(
            (u.classify)(&Interim::Handler(Declined)),
            Disposition::Unknown
        );
    }

    #[test]
    fn the_response_is_split_into_what_is_stored_and_what_is_not() {
        let done: Result<CallToolResponse, Declined> = Ok(CallToolResult::success(vec![]).into());
        assert!(split_response(done).is_ok());
        let asked: Result<CallToolResponse, Declined> =
            Ok(InputRequiredResult::from_request_state("s").into());
        assert!(matches!(
            split_response(asked),
            Err(Interim::InputRequired(_))
        ));
        let failed: Result<CallToolResponse, Declined> = Err(Declined);
        assert!(matches!(
            split_response(failed),
            Err(Interim::Handler(Declined))
        ));
        // A task the handler made itself: passed on, and the outcome left unknown.
        let task = rmcp::model::Task::new("t-1", rmcp::model::TaskStatus::Working, "a", "a");
        let made: Result<CallToolResponse, Declined> =
            Ok(CallToolResponse::Task(CreateTaskResult::new(task)));
        let Err(made) = split_response(made) else {
            panic!("a task is not a completed answer")
        };
        for policy in [
            Interim::<Declined>::classified(),
            Interim::<Declined>::definitive(),
            Interim::<Declined>::retryable(),
        ] {
            assert_eq!((policy.classify)(&made), Disposition::Unknown);
        }
        let answered = answer_response(
            Outcome {
                result: Err(Failure::Handler(made)),
                replayed: false,
                reference: None,
            },
            Interim::<Declined>::retryable(),
        );
        assert!(matches!(answered, Ok(CallToolResponse::Task(_))));
    }
}
