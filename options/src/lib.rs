//! What the `#[idempotent]` attribute's options mean, written once for the three crates that read
//! them: the macro (which parses the attribute), the runtime (which acts on the values) and the
//! admin CLI (which reads durations on its command line). Like `serde_derive_internals`, it holds
//! no behaviour of its own: the spellings of the enum options with what each value means, and
//! the duration grammar.
//!
//! Use it through `idempotency`, which re-exports what a handler author needs ([`Recover`],
//! [`Scope`]).

mod choice;
mod duration;

pub use choice::{Answers, Choice, ClientKey, MissingKey, OnError, Recover, Scope, Spelling};
pub use duration::parse_duration;
