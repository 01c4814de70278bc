//! What a handler's `Result<T, E>` means for the record, and what an idempotent call answers.
//!
//! `Ok(T)` is stored and replayed typed. An `Err(E)` has a [`Disposition`], chosen explicitly:
//! either by implementing [`Classify`] on the error type, or with the attribute's
//! `on_error = "retryable" | "definitive" | "unknown"` for every error of that tool. A tool
//! whose error type does neither does not compile.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::door::Door;
use crate::error::Error;
use crate::key::Reference;

/// What an error means for the operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// Nothing happened (the processor was unreachable, refused before acting): the claim is
    /// released and a repeat runs the handler again, under the same reference.
    Retryable,
    /// A final answer (a card decline): stored and replayed like a success.
    Definitive,
    /// The side effect may have happened (a downstream timeout): the claim is kept as "outcome
    /// unknown", repeats are told so, and only reconciliation settles it.
    Unknown,
}

/// Says what each error of a handler means. Implement it on your error type.
///
/// ```
/// use idempotency::{Classify, Disposition};
/// enum ChargeError { Declined, ProcessorDown, ProcessorTimeout }
/// impl Classify for ChargeError {
///     fn disposition(&self) -> Disposition {
///         match self {
///             ChargeError::Declined => Disposition::Definitive,
///             ChargeError::ProcessorDown => Disposition::Retryable,
///             ChargeError::ProcessorTimeout => Disposition::Unknown,
///         }
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say what its errors mean for a repeated call",
    label = "implement `idempotency::Classify` for `{Self}`",
    note = "or choose one disposition for every error with `#[idempotent(on_error = \"retryable\" | \"definitive\" | \"unknown\")]`"
)]
pub trait Classify {
    /// This error's disposition.
    fn disposition(&self) -> Disposition;
}

/// An error from an idempotent call: the handler's own (run now or replayed), or the wrapper's.
#[derive(Debug)]
pub enum Failure<E> {
    /// The handler's error (a definitive one may be a replay).
    Handler(E),
    /// The wrapper's answer: in flight, outcome unknown, mismatch, store failure...
    Wrapper(Error),
}

impl<E: From<Error>> Failure<E> {
    /// Folds the wrapper's answer into the handler's error type.
    pub fn into_error(self) -> E {
        match self {
            Failure::Handler(e) => e,
            Failure::Wrapper(e) => E::from(e),
        }
    }
}

/// The wrapper's answer with how it came about.
#[derive(Debug)]
pub struct Outcome<T, E> {
    /// What the handler returned now, or the stored answer, or the wrapper's own error.
    pub result: Result<T, E>,
    /// Whether `result` is a stored answer replayed (the handler did not run).
    pub replayed: bool,
    /// The operation's reference, when a claim was made or found.
    pub reference: Option<Reference>,
}

/// How the engine treats a tool's error type: classifies, stores and replays it (and a stored
/// answer of the same operation that came through the HTTP layer: a `4xx` response's JSON body
/// is decoded as the error). Built by the attribute from the error type's [`Classify`] impl or
/// from `on_error`.
pub struct ErrorPolicy<E> {
    pub(crate) classify: fn(&E) -> Disposition,
    pub(crate) encode: fn(&E) -> Result<String, String>,
    pub(crate) decode: fn(&str) -> Result<E, String>,
    pub(crate) describe: fn(&E) -> String,
    /// The door its calls come through: the form answers are stored in and read as.
    pub(crate) door: Door,
}

impl<E> std::fmt::Debug for ErrorPolicy<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Four function pointers: nothing a reader could use but their existence.
        f.debug_struct("ErrorPolicy").finish_non_exhaustive()
    }
}

impl<E> Clone for ErrorPolicy<E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for ErrorPolicy<E> {}

fn encode_json<E: Serialize>(e: &E) -> Result<String, String> {
    serde_json::to_string(e).map_err(|err| err.to_string())
}

fn decode_json<E: DeserializeOwned>(s: &str) -> Result<E, String> {
    serde_json::from_str(s).map_err(|err| err.to_string())
}

fn not_stored<E>(_: &E) -> Result<String, String> {
    Err("this tool's errors are never stored".into())
}

fn not_replayed<E>(_: &str) -> Result<E, String> {
    Err("this tool's errors are never stored, so none can be replayed".into())
}

fn describe<E: std::fmt::Display>(e: &E) -> String {
    e.to_string()
}

impl<E: std::fmt::Display> ErrorPolicy<E> {
    /// Each error says what it means ([`Classify`]); definitive ones are stored as JSON.
    pub fn classified() -> Self
    where
        E: Classify + Serialize + DeserializeOwned,
    {
        ErrorPolicy {
            classify: E::disposition,
            encode: encode_json::<E>,
            decode: decode_json::<E>,
            describe: describe::<E>,
            door: Door::Tool,
        }
    }

    /// Every error is definitive: stored and replayed.
    pub fn definitive() -> Self
    where
        E: Serialize + DeserializeOwned,
    {
        ErrorPolicy {
            classify: |_| Disposition::Definitive,
            encode: encode_json::<E>,
            decode: decode_json::<E>,
            describe: describe::<E>,
            door: Door::Tool,
        }
    }

    /// Every error is retryable: the claim is released.
    pub fn retryable() -> Self {
        ErrorPolicy {
            classify: |_| Disposition::Retryable,
            encode: not_stored::<E>,
            decode: not_replayed::<E>,
            describe: describe::<E>,
            door: Door::Tool,
        }
    }

    /// Every error leaves the outcome unknown.
    pub fn unknown() -> Self {
        ErrorPolicy {
            classify: |_| Disposition::Unknown,
            encode: not_stored::<E>,
            decode: not_replayed::<E>,
            describe: describe::<E>,
            door: Door::Tool,
        }
    }
}
