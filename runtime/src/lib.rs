//! # idempotency
//!
//! Make a tool handler of an MCP server safe to call twice.
//!
//! Hosts and models repeat tool calls: a host retries on timeout, a transport replays, a model
//! re-issues, a second host calls, a client library retries. This crate makes a repeat of the same
//! call return the first call's answer instead of running the side effect again:
//!
//! 1. the key is derived **on the server** ([`Key::for_call`]) from the caller's tenant and subject,
//!    the tool name and the canonical JSON ([`canonical_json`]) of the typed arguments — never from
//!    the model;
//! 2. the key is **claimed** in a [`Store`] before the side effect runs;
//! 3. the body runs with the call's short [`Reference`], to pass downstream as the processor's own
//!    idempotency reference;
//! 4. the outcome is **recorded**, so a later repeat gets the stored answer.
//!
//! The `#[idempotent]` attribute does all of this around an `async fn`; the [`Idempotency`]
//! engine underneath can also be used by hand.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod canonical;
mod clock;
mod engine;
mod error;
mod key;
mod outcome;
pub mod reconcile;
mod record;
pub mod store;
#[cfg(feature = "rmcp")]
pub mod mcp;

#[doc(hidden)]
pub mod __private;

pub use canonical::{canonical_json, CanonicalError};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use engine::{Call, Failure, Idempotency, IdempotencyContext, Prepared, ToolSpec, DEFAULT_LEASE};
pub use error::{Error, UnknownReason, STATUS_TOOL};
pub use key::{Caller, Fingerprint, Key, Reference, ReferenceParseError};
pub use outcome::{Classify, Disposition, ErrorPolicy, Outcome};
pub use record::{RecordState, RecordStatus, StoredResponse};
pub use store::{
    BoxFuture, Claim, ClaimRequest, Completion, OutboxEntry, OutboxMessage, Settlement, Store, StoreError,
    Token, Unsettled, DEFAULT_RETENTION,
};
pub use store::memory::MemoryStore;

/// The `#[idempotent]` attribute: see the crate documentation and README.
pub use idempotency_macros::{idempotent, idempotent_tools};
