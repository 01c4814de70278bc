//! Where records live: the four store traits, their types, and the backends.
//!
//! A backend implements four object-safe traits; anything that implements all four is a
//! [`Store`], which is what [`Idempotency::builder`](crate::Idempotency::builder) takes:
//!
//! - [`RecordStore`]: one record's state machine, per call: [`claim`](RecordStore::claim),
//!   [`transition`](RecordStore::transition) (the fenced writes, each a [`Transition`]),
//!   [`status`](RecordStore::status), and three with defaults: [`watch`](RecordStore::watch),
//!   [`transactions`](RecordStore::transactions), [`window_clock`](RecordStore::window_clock);
//!   [`Fenced`], implemented for every record store, gives each transition a method of its own
//!   ([`complete`](Fenced::complete), [`release`](Fenced::release),
//!   [`mark_unknown`](Fenced::mark_unknown), [`renew`](Fenced::renew),
//!   [`take_over`](Fenced::take_over), [`settle`](Fenced::settle));
//! - [`Maintenance`]: background work over many records: [`purge`](Maintenance::purge),
//!   [`unsettled`](Maintenance::unsettled);
//! - [`OutboxStore`]: follow-on messages written with a completion: [`fetch`](OutboxStore::fetch),
//!   [`ack`](OutboxStore::ack), each entry named by a backend-chosen [`Receipt`];
//! - [`SecretStore`]: the fingerprint of the secret the store's keys are made with
//!   ([`swap_secret`](SecretStore::swap_secret)), so that an engine with another secret is
//!   refused.
//!
//! A store author's guide (the contract on one page, and how to run the conformance suite
//! against a new store) is `docs/store-authors.md`.
//!
//! The backends: [`MemoryStore`] (tests), `SqliteStore` (feature `sqlite`, the embedded default),
//! `PostgresStore` (feature `postgres`) and `RedisStore` (feature `redis`: one Redis or a Redis
//! Cluster, native expiry).
//!
//! Every backend answers the same questions with the same semantics; one conformance suite
//! ([`conformance`], feature `conformance`) runs against all of them, and against yours.
//!
//! ## Time
//!
//! Every method that needs a time is passed the engine's `now` (from its
//! [`Clock`](crate::clock::Clock)) and, where it needs more, lengths from that `now` (a lease),
//! never an end computed by the caller. The replay window is a property of the record: the claim gives its
//! length ([`ClaimRequest::window`]) and the store keeps it, so a completion or settlement at
//! `at` answers repeats until `at + window` whoever settles it. A store on one
//! machine (memory, SQLite) uses them as given. A store shared by replicas whose clocks may
//! disagree (PostgreSQL) decides by its own server clock instead: it reads `server_now` in the
//! statement and shifts every time of the call by `server_now - now`, so the durations the
//! engine chose are kept and every replica is judged by one clock; the times a claim answers
//! with are shifted back into the caller's frame, so the engine's own comparisons (has this
//! in-flight claim's lease passed?) agree with the server's. Either way a completion,
//! release or settlement never records a time earlier than the record's claim, so a clock that
//! steps back cannot end a window early.
//!
//! ## Claim semantics (all stores)
//!
//! | existing row | fingerprint | answer |
//! |---|---|---|
//! | none | – | [`Claim::New`] (generation 1, the request's token) |
//! | released | any | [`Claim::New`], same generation, the request's token |
//! | completed, `now >= expires_at` | any | [`Claim::New`], generation + 1, the request's token |
//! | in flight / completed (live) / unknown | differs | [`Claim::Mismatch`] |
//! | in flight | same | [`Claim::InFlight`] (even when its lease has expired: never re-run on a lease) |
//! | completed, `now < expires_at` | same | [`Claim::Completed`] with the stored answer |
//! | unknown | same | [`Claim::Unknown`] |
//!
//! A fingerprint of `None` (call keys, whose key already covers every argument) never mismatches.
//!
//! A reference names one record: when a record of a *different* key shares this key's first 8
//! bytes (so its reference), the claim fails with [`StoreError::ReferenceTaken`] whatever that
//! record's state, until it is purged.
//!
//! ## Round trips (SQL stores)
//!
//! A claim is one round trip whatever its answer: on PostgreSQL one statement (an
//! `INSERT … ON CONFLICT DO NOTHING` that returns the row it found); on SQLite one call into
//! sqlx's worker thread holding two statements (the guarded upsert, then the row it found, read
//! only when the upsert changed nothing). Two rare cases take a second one: a claim that takes
//! over a released or window-expired record on PostgreSQL, and a claim whose reference another
//! key's record holds. Completions, releases and the other fenced updates are one statement;
//! one that changes nothing reads the row again to say why.
//!
//! ## Background work
//!
//! Purge and the reconciler cost their batch, not the table. The SQL stores keep one index
//! beside the primary key, on two columns a completion does not change, so that a completion
//! writes the row alone (PostgreSQL: a HOT update; SQLite leaves an index whose columns an
//! update keeps untouched): the window's length and the claim time (`idempotency_records_window`).
//! A purge batch reads each window length's run up to the cutoff less that length; a
//! reconciler round reads the claims made since the last round's mark and the ones earlier
//! rounds found unsettled (`idempotency_watch`). So a purge batch costs the same at 1M or 170M
//! records however rare expired ones are, and a reconciler round costs what was claimed since
//! the last one and what is running (see `migrations/postgres/0001_records.sql` and
//! `migrations/sqlite/0001_records.sql` for the design, `docs/scaling.md` for the
//! measurements). Both are still meant for background tasks, the
//! [`Purger`](crate::tasks::Purger) and the [`Reconciler`](crate::tasks::Reconciler), never per
//! request; on the SQL stores [`Maintenance::unsettled`] writes its bookkeeping (the mark, the
//! watched claims) as it reads.
//!
//! ## Method contracts
//!
//! Every method takes its times from the caller (see [Time](#time)) and answers in one
//! round trip where the notes above do not say otherwise. The fenced writes are the
//! [`Transition`]s of [`RecordStore::transition`] (one row each below). "Fenced" means: the
//! update applies only when the record's current token is the one presented and its state is one
//! the transition allows; otherwise nothing changes and the answer says why:
//! [`StoreError::Fenced`] (another token is current), [`StoreError::WrongState`] (the token is
//! current, the state is not allowed) or [`StoreError::NotFound`] (no record for the key).
//!
//! | method | allowed states | effect |
//! |---|---|---|
//! | [`RecordStore::claim`] | any | the table above; atomic: of concurrent claims of one key exactly one gets [`Claim::New`] |
//! | [`Transition::Complete`] | in flight, unknown | completed with the answer, replayed for the record's window from `now`; the outbox messages written in the same transaction (an unknown record takes its worker's late answer: same token, nobody took over) |
//! | [`Transition::Release`] | in flight, unknown | released at `at` (a repeat takes it over under the same reference) |
//! | [`Transition::MarkUnknown`] | in flight | unknown (never re-run; only a settlement ends it) |
//! | [`Transition::Renew`] | in flight | the lease ends `lease` after `now` |
//! | [`Transition::TakeOver`] | in flight (lease ended at or before `now`), unknown | in flight under the new token, same generation (fenced by state and lease, not token); answers [`Transitioned::TakenOver`], every other transition [`Transitioned::Done`] |
//! | [`Transition::Settle`] | in flight, unknown | the [`Settlement`] (completed: replayed for the record's window from `at`); a completed or released settlement bumps the token by one, so the original worker's late completion is fenced; an unknown one keeps it, so the worker's late answer (the truth) still lands |
//! | [`RecordStore::status`] | any | the record of the reference's key, if the tenant (and, for a subject-scoped record, the subject) may see it (anyone else's is `None`, like one that does not exist); for a superseded generation, the key's current record, whose `reference` names the newer generation |
//! | [`Maintenance::purge`] | completed, released | deletes up to `limit` records whose window ended before `older_than` |
//! | [`Maintenance::unsettled`] | in flight (lease ended at or before `now`), unknown | up to `limit`, oldest claim first |
//! | [`OutboxStore::fetch`] | – | up to `limit` messages visible at `now`, oldest first; each becomes invisible until `invisible_until` and its attempt count goes up |
//! | [`OutboxStore::ack`] | – | deletes the message; acknowledging one already gone is not an error |
//! | [`SecretStore::swap_secret`] | – | compare-and-set of the store's one secret fingerprint; atomic |
//!
//! Errors: [`StoreError::is_transient`] says whether trying again may help (the store was
//! unreachable, or the operation kept losing races); configuration mistakes, failed migrations
//! and rows the backend cannot read are their own variants and keep their sources.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::key::{Fingerprint, Key, Reference, SecretFingerprint};

mod access;
mod admin;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod error;
mod memory;
mod outbox;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "_sql")]
pub(crate) mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
pub(crate) mod transaction;
mod transition;
mod wake;

pub use crate::record::{RecordState, RecordStatus, Standing, StoredResponse};
pub use access::Access;
pub use admin::{Admin, AdminRecord, StoreStats};
pub use error::{BoxError, StoreError};
pub use memory::MemoryStore;
pub use outbox::{OutboxEntry, OutboxMessage, Receipt};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::PostgresStore;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisConnection, RedisStore, RedisStoreBuilder};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteStore;
pub use transaction::{Begun, CommitError, OpenTransaction, TransactionalStore, TxOutcome};
pub use transition::{Fenced, Transition, Transitioned};
pub use wake::Wake;

/// The states in which the claim's own worker may still settle its record with its token
/// (complete, release): in flight, and unknown. An unknown record whose worker then reports
/// (it was paused or cut off past its lease and a round marked it unknown, with nobody taking
/// over since) takes the worker's answer: it is the truth the round could not know.
pub(crate) const WORKER_SETTLES: &[RecordState] = &[RecordState::InFlight, RecordState::Unknown];

/// A boxed, `Send` future: what the store methods return, so the traits stay object-safe
/// (`Arc<dyn Store>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How long completed and released records are kept after they stop answering, before
/// [`Maintenance::purge`] may delete them: 48 hours.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(48 * 3600);

/// A fencing token: replaced by every claim that creates or takes over a record (the claim
/// request's own token) and bumped by every settlement. Only the holder of the current token may
/// complete, release or mark a record; a stale holder is told so.
///
/// The engine proposes `claim time in ms × 2^20 + 20 random bits`, so a key claimed again after
/// its record was purged (48 h or more later) never hands out a token that a worker of the purged
/// record could still hold, and two attempts never share one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub i64);

/// What a claim asks for.
#[derive(Clone, Debug)]
pub struct ClaimRequest<'a> {
    /// The call's key.
    pub key: Key,
    /// The caller's tenant (status lookups are scoped to it).
    pub tenant: &'a str,
    /// The caller's subject, for a subject-scoped record (only that subject of the tenant may
    /// look it up); `None` for a tenant-scoped one (any subject of the tenant may).
    pub subject: Option<&'a str>,
    /// The tool's name.
    pub tool: &'a str,
    /// The full arguments' fingerprint (business keys); `None` for call keys.
    pub fingerprint: Option<Fingerprint>,
    /// The engine's current time.
    pub now: Timestamp,
    /// How long the claim's lease lasts from `now` unless renewed.
    pub lease: Duration,
    /// The tool's replay window: how long after its completion (or a settlement as completed) a
    /// record answers repeats. The store keeps it on the record from the claim on; completions,
    /// settlements and takeovers use the record's window, never one given later, so one engine
    /// (or an admin tool) settling records of tools with different windows settles each right.
    pub window: Duration,
    /// The fencing token this attempt proposes: a new or taken-over record gets it. The engine
    /// makes one per attempt (unique, and growing with its claim time), so when the claim's reply
    /// is lost the engine can still release exactly the claim it may have made.
    pub token: Token,
}

/// The answer to a claim, decided in one round trip.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This caller holds the claim: run the body.
    New {
        /// The operation's reference.
        reference: Reference,
        /// The fencing token for complete / release / mark-unknown.
        token: Token,
    },
    /// Someone is running this call now.
    InFlight {
        /// The operation's reference.
        reference: Reference,
        /// When it was claimed.
        claimed_at: Timestamp,
        /// When its lease ends (a passed lease means its worker may have died: reconcile).
        lease_expires_at: Timestamp,
    },
    /// Already done: here is the stored answer.
    Completed {
        /// The operation's reference.
        reference: Reference,
        /// The stored answer.
        response: StoredResponse,
        /// When it completed.
        completed_at: Timestamp,
    },
    /// It started and its outcome is unknown; it will not run again until reconciled.
    Unknown {
        /// The operation's reference.
        reference: Reference,
        /// When it was claimed.
        since: Timestamp,
    },
    /// The business key was used with different arguments.
    Mismatch {
        /// The reference of the operation that holds the business key.
        reference: Reference,
    },
}

/// What a completion records: the argument of [`Fenced::complete`], which makes it the
/// [`Transition::Complete`] of `key` under `token`.
#[derive(Clone, Debug)]
pub struct Completion<'a> {
    /// The call's key.
    pub key: Key,
    /// The token the claim returned.
    pub token: Token,
    /// The answer to store.
    pub response: &'a StoredResponse,
    /// When it completed: the answer is replayed for the record's window from then.
    pub now: Timestamp,
    /// Follow-on messages to write in the same transaction.
    pub outbox: &'a [OutboxMessage],
}

/// A claim that needs reconciling: in flight with an expired lease, or unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsettled {
    /// The call's key.
    pub key: Key,
    /// The operation's reference (what to ask the processor about).
    pub reference: Reference,
    /// The caller's tenant.
    pub tenant: String,
    /// The caller's subject, for a subject-scoped record.
    pub subject: Option<String>,
    /// The tool's name.
    pub tool: String,
    /// `InFlight` (lease expired) or `Unknown`.
    pub state: RecordState,
    /// The token the settlement must present.
    pub token: Token,
    /// When it was claimed.
    pub claimed_at: Timestamp,
    /// The tool's replay window, as the claim recorded it: a settlement as completed is replayed
    /// for this long.
    pub window: Duration,
}

/// How a reconciler settles an unsettled claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// It did happen: store this answer.
    Completed(StoredResponse),
    /// It did not happen: a repeat may run it (under the same reference).
    Released,
    /// Still cannot tell: mark it unknown and try again later.
    Unknown,
}

/// One record's state machine, in six methods (see the module docs for each contract): three a
/// store writes, [`claim`](RecordStore::claim), [`transition`](RecordStore::transition) (every
/// fenced write, a [`Transition`]) and [`status`](RecordStore::status), and three with defaults,
/// [`watch`](RecordStore::watch), [`transactions`](RecordStore::transactions) and
/// [`window_clock`](RecordStore::window_clock). Callers make transitions through [`Fenced`].
pub trait RecordStore: Send + Sync + 'static {
    /// Claims `req.key`, or reports why not, in one round trip (see the module docs' table).
    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>>;

    /// Makes the fenced write `op` to the record of `key`, presenting `token` (for
    /// [`Transition::TakeOver`], the new attempt's token, which the record then holds). Each
    /// transition's allowed states, effect and answer are its variant's (and the module docs'
    /// table): one that applies answers [`Transitioned::Done`] ([`Transitioned::TakenOver`] for a
    /// takeover); one that does not changes nothing and answers [`StoreError::Fenced`],
    /// [`StoreError::WrongState`] or [`StoreError::NotFound`]. A transition this store does not
    /// know is [`StoreError::Contract`]. Callers use [`Fenced`]'s methods.
    fn transition<'a>(
        &'a self,
        key: Key,
        token: Token,
        op: Transition<'a>,
    ) -> BoxFuture<'a, Result<Transitioned, StoreError>>;

    /// The operation named by `reference`, if `tenant` and `subject` may see it: the record's
    /// tenant is `tenant` and, for a subject-scoped record, its subject is `subject` (anyone
    /// else's reference is `None`, exactly like one that does not exist). For a reference whose
    /// generation has been superseded (its key moved on after the window, which only a completed
    /// operation allows), the key's current record: its `reference` names the newer generation.
    fn status<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>>;

    /// Asks to be told when the record of `key` under `reference` leaves flight (completed,
    /// released, unknown, settled) through any process: from then on, such a change calls
    /// `wake.wake()` once, soon after it commits. Answers whether it will: `false` when this
    /// store cannot hear of other processes' changes (the default; the engine's waiting repeats
    /// then read the record now and then) or when the record is no longer that call in flight.
    /// A store that answers `true` must not miss a change committed after this call returned,
    /// and may wake for nothing (the repeats read the record again). Used only by repeats that
    /// wait (`wait`); the engine wakes its own waiters itself.
    fn watch<'a>(
        &'a self,
        key: Key,
        reference: Reference,
        wake: Wake,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let _ = (key, reference, wake);
        Box::pin(std::future::ready(Ok(false)))
    }

    /// This store's transactional calls (`#[idempotent(transactional)]`), if it runs them: the
    /// SQL stores do. `None` (the default): an engine on it refuses to start while such a tool is
    /// linked in.
    fn transactions(&self) -> Option<&dyn TransactionalStore> {
        None
    }

    /// The clock this store ends windows by, which an engine's cache of completed answers
    /// follows so that it never replays one after its record's window ended.
    /// [`WindowClock::Unknown`] (the default): the engine keeps no answer of this store's.
    fn window_clock(&self) -> WindowClock {
        WindowClock::Unknown
    }
}

/// The clock a store ends records' windows by ([`RecordStore::window_clock`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WindowClock {
    /// The engine's times as given: a record completed with [`Completion::now`] answers repeats
    /// whose [`ClaimRequest::now`] is before `now + window`, and no later one.
    Engine,
    /// The store's own clock (a database server's), which runs at the rate of real time: a
    /// record's window ends no earlier, in real time, than its length after the completion was
    /// sent. The cache ends an answer by this process's monotonic clock from before it sent
    /// the completion, 0.1% early (twice the most NTP slews a clock). A step of the store's
    /// clock (set forward by hand, a failover to a server whose clock is ahead) is not seen.
    Own,
    /// Not said: nothing of this store's is cached.
    Unknown,
}

/// Background work over many records: retention and reconciliation.
pub trait Maintenance: Send + Sync + 'static {
    /// Deletes up to `limit` completed or released records whose window ended before
    /// `older_than` (relative to `now`: `now - retention`); returns how many went. In-flight and
    /// unknown records are never purged.
    fn purge(
        &self,
        now: Timestamp,
        older_than: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// Up to `limit` claims to reconcile: in flight with `lease_expires_at <= now`, or unknown;
    /// oldest claim first.
    fn unsettled(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Unsettled>, StoreError>>;
}

/// Follow-on messages written with completions, delivered at least once.
pub trait OutboxStore: Send + Sync + 'static {
    /// Up to `limit` messages visible at `now`, oldest first; each handed-out message's attempt
    /// count goes up by one and it stays invisible until `invisible_until`.
    fn fetch(
        &self,
        now: Timestamp,
        invisible_until: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<OutboxEntry>, StoreError>>;

    /// Acknowledges (deletes) a delivered message by the receipt [`OutboxStore::fetch`] gave it.
    /// A receipt this store did not issue is [`StoreError::ForeignReceipt`].
    fn ack<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// Where a store keeps the fingerprint of the secret its keys are made with
/// ([`Secret::fingerprint`](crate::key::Secret::fingerprint): an HMAC of a fixed label, never
/// the secret). One value per store (per schema, file, Redis namespace), set by the first engine
/// that starts on it and changed only by a rotation; the engine's check is
/// [`IdempotencyBuilder::start`](crate::IdempotencyBuilder::start).
pub trait SecretStore: Send + Sync + 'static {
    /// Compare-and-set, atomic: when the stored fingerprint is `expected` (`None`: none is
    /// stored), stores `new`. Answers the fingerprint stored once it is done: `Some(new)` when it
    /// stored it (or found it there already), else the one it found (`None`: none stored).
    fn swap_secret(
        &self,
        expected: Option<SecretFingerprint>,
        new: SecretFingerprint,
    ) -> BoxFuture<'_, Result<Option<SecretFingerprint>, StoreError>>;
}

/// A complete backend: all four traits. Implemented automatically for any type that implements
/// them; the engine and its background tasks hold an `Arc<dyn Store>`.
pub trait Store: RecordStore + Maintenance + OutboxStore + SecretStore {}

impl<S: RecordStore + Maintenance + OutboxStore + SecretStore + ?Sized> Store for S {}
