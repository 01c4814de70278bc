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
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use idempotency::{idempotent, Caller, Error, Idempotency, IdempotencyContext, MemoryStore};
//!
//! struct Ctx { engine: Idempotency, charges: AtomicUsize }
//! impl IdempotencyContext for Ctx {
//!     fn idempotency(&self) -> &Idempotency { &self.engine }
//!     // From your authentication, never from the model's arguments.
//!     fn caller(&self) -> Result<Caller, Error> { Ok(Caller::new("acme", "alice")) }
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Charge { amount_cents: u64 }
//!
//! #[idempotent(window = "15m", on_error = "retryable")]
//! async fn charge_card(ctx: &Ctx, args: Charge) -> Result<String, Error> {
//!     let reference = idempotency::Call::current().map(|c| c.reference());
//!     ctx.charges.fetch_add(1, Ordering::SeqCst); // the side effect, keyed downstream by `reference`
//!     Ok(format!("charged {} under {:?}", args.amount_cents, reference))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let ctx = Ctx { engine: Idempotency::new(MemoryStore::new()), charges: AtomicUsize::new(0) };
//! let first = charge_card(&ctx, Charge { amount_cents: 4200 }).await?;
//! let again = charge_card(&ctx, Charge { amount_cents: 4200 }).await?;
//! assert_eq!(first, again);                          // the stored answer
//! assert_eq!(ctx.charges.load(Ordering::SeqCst), 1); // one side effect
//! # Ok(()) }
//! ```
//!
//! Runtime note: the engine uses Tokio's timers (leases, timeouts), so it runs inside a Tokio
//! runtime with time enabled, as `#[tokio::main]` provides.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod canonical;
mod clock;
mod engine;
mod error;
mod key;
#[cfg(feature = "rmcp")]
pub mod mcp;
mod outcome;
pub mod reconcile;
mod record;
pub mod store;

#[doc(hidden)]
pub mod __private;

pub use canonical::{canonical_json, CanonicalError};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use engine::{
    Call, Failure, Idempotency, IdempotencyContext, Prepared, ToolSpec, DEFAULT_LEASE,
};
pub use error::{Error, UnknownReason, STATUS_TOOL};
pub use key::{Caller, Fingerprint, Key, Reference, ReferenceParseError};
pub use outcome::{Classify, Disposition, ErrorPolicy, Outcome};
pub use record::{RecordState, RecordStatus, StoredResponse};
pub use store::memory::MemoryStore;
pub use store::{
    BoxFuture, Claim, ClaimRequest, Completion, OutboxEntry, OutboxMessage, Settlement, Store,
    StoreError, Token, Unsettled, DEFAULT_RETENTION,
};

/// The `#[idempotent]` attribute: see the crate documentation and README.
pub use idempotency_macros::{idempotent, idempotent_tools};
