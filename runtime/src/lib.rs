//! # idempotency
//!
//! Make a tool handler of an MCP server safe to call twice.
//!
//! Hosts and models repeat tool calls: a host retries on timeout, a transport replays, a model
//! re-issues, a second host calls, a client library retries. This crate makes a repeat of the same
//! call return the first call's answer instead of running the side effect again:
//!
//! 1. the key is derived **on the server** ([`key::Key::for_call`]): HMAC-SHA256 under the
//!    server's [`key::Secret`] of the caller's tenant (and subject), the tool name and the
//!    canonical JSON of the typed arguments — never from the model;
//! 2. the key is **claimed** in a [`Store`](store::Store) before the side effect runs;
//! 3. the body runs with the call's short [`Reference`], to pass downstream as the processor's own
//!    idempotency reference;
//! 4. the outcome is **recorded**, so a later repeat gets the stored answer.
//!
//! The `#[idempotent]` attribute does all of this around an `async fn`; the [`Idempotency`]
//! engine underneath can also be used by hand.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use idempotency::{idempotent, store::MemoryStore, Caller, Error, Idempotency, IdempotencyContext};
//!
//! struct Ctx { engine: Idempotency, charges: AtomicUsize }
//! impl IdempotencyContext for Ctx {
//!     fn idempotency(&self) -> &Idempotency { &self.engine }
//!     // From your authentication, never from the model's arguments.
//!     fn caller(&self, _: &()) -> Result<Caller, Error> { Ok(Caller::new("acme", "alice")) }
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
//! ## Where things are
//!
//! The crate root holds what a handler author needs. The rest lives in modules:
//! [`store`] (the backends and the traits a new backend implements), [`tasks`] (purger and
//! reconciler), [`outbox`] (follow-on messages and their dispatcher), [`tool`], [`outcome`],
//! [`error`], [`key`], [`clock`], [`mcp`] (feature `rmcp`) and [`http`] (feature `http`).
//!
//! ## Features
//!
//! - `sqlite` (default): [`store::SqliteStore`], the embedded default;
//! - `postgres`: [`store::PostgresStore`], for many server replicas on one database;
//! - `redis`: [`store::RedisStore`], on one Redis or a Redis Cluster;
//! - `rmcp`: the MCP integration ([`mcp`]) for the official Rust SDK;
//! - `http`: [`http::IdempotencyLayer`], a `tower` layer (axum 0.8) that answers
//!   `Idempotency-Key` requests once, on the same engine and stores;
//! - `tls`: the SQL stores reach a PostgreSQL that requires TLS (`sslmode=require`, as managed
//!   databases do), through rustls with the webpki roots;
//! - `test-util`: [`clock::ManualClock`], a clock tests move by hand;
//! - `conformance`: [`store::conformance`], the suite every built-in store passes, to prove a
//!   store of your own.
//!
//! Runtime note: the engine uses Tokio's timers (leases, timeouts), so it runs inside a Tokio
//! runtime with time enabled, as `#[tokio::main]` provides.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The README's Rust blocks, compiled as doctests (`cargo test --doc`): they need the rmcp and
// SQLite features, and exist only under rustdoc's doctest pass, so no build sees this item.
#[cfg(all(doctest, feature = "rmcp", feature = "sqlite"))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

// The store author's page (`docs/store-authors.md`), its example compiled and run as a doctest.
#[cfg(all(doctest, feature = "conformance"))]
#[doc = include_str!("../../docs/store-authors.md")]
pub struct StoreAuthorsDoctests;

mod canonical;
pub mod clock;
mod context;
#[cfg(test)]
mod doc_paths;
mod door;
mod engine;
pub mod error;
#[cfg(test)]
mod files;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
pub mod key;
#[cfg(test)]
mod layering;
#[cfg(feature = "rmcp")]
#[cfg_attr(docsrs, doc(cfg(feature = "rmcp")))]
pub mod mcp;
pub mod metrics;
mod origin;
pub mod outbox;
pub mod outcome;
mod periodic;
mod progress;
mod record;
pub mod store;
pub mod tasks;
pub mod tool;

#[doc(hidden)]
pub mod __private;

pub use canonical::canonical_json;
pub use context::IdempotencyContext;
pub use engine::{Call, EnqueueError};
pub use engine::{Idempotency, IdempotencyBuilder};
#[cfg(feature = "_sql")]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub use engine::{Transaction, TransactionError};
pub use error::Error;
pub use key::{Caller, Reference};
pub use outcome::{Classify, Disposition};

/// The `#[idempotent]` attribute: see the crate documentation and README.
pub use idempotency_macros::{idempotent, idempotent_tools};
