//! The [`Store`] trait and its backends.
//!
//! Every backend answers the same questions with the same semantics; one conformance suite
//! (`tests/conformance.rs`) runs against all of them. Times are passed in by the engine (from its
//! [`Clock`](crate::Clock)), so the stores never read a clock of their own and replicas agree with
//! the engine that drives them.
//!
//! ## Claim semantics (all stores)
//!
//! | existing row | fingerprint | answer |
//! |---|---|---|
//! | none | – | [`Claim::New`] (generation 1, token = `now` in ms) |
//! | released | any | [`Claim::New`], same generation, token + 1 |
//! | completed, `now >= expires_at` | any | [`Claim::New`], generation + 1, token + 1 |
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
//! ## Background scans
//!
//! The SQL tables have no index but the key (a second index would cost bytes on every row and
//! keep completions from being HOT updates on PostgreSQL). [`Store::purge`] reads the table until
//! it has found its batch; [`Store::unsettled`] reads all of it (the unsettled records are
//! few, their sort is cheap, the rest of the table is the cost). Both are meant for background
//! tasks that run every few minutes: [`spawn_purger`] and the
//! [`Reconciler`](crate::reconcile::Reconciler), never per request.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::key::{Fingerprint, Key, Reference};
use crate::record::{RecordState, RecordStatus, StoredResponse};

pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
mod purger;
#[cfg(feature = "_sql")]
mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub use purger::spawn_purger;

/// A boxed, `Send` future: what the [`Store`] methods return, so the trait stays object-safe
/// (`Arc<dyn Store>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How long completed and released records are kept after they stop answering, before
/// [`Store::purge`] may delete them: 48 hours.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(48 * 3600);

/// A fencing token: bumped by every takeover and settlement. Only the holder of the current
/// token may complete, release or mark a record; a stale holder is told so.
///
/// A new record's token is its claim time in milliseconds, so a key claimed again after its
/// record was purged (48 h or more later) never hands out a token that a worker of the purged
/// record could still hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub i64);

/// What a claim asks for.
#[derive(Clone, Debug)]
pub struct ClaimRequest<'a> {
    /// The call's key.
    pub key: Key,
    /// The caller's tenant (kept for tenant-scoped status lookups).
    pub tenant: &'a str,
    /// The tool's name.
    pub tool: &'a str,
    /// The full arguments' fingerprint (business keys); `None` for call keys.
    pub fingerprint: Option<Fingerprint>,
    /// The engine's current time.
    pub now: Timestamp,
    /// When the claim's lease ends unless renewed.
    pub lease_expires_at: Timestamp,
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

/// A follow-on message (say, the receipt email) written in the same transaction as the
/// completion, keyed by the operation's reference, delivered at least once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxMessage {
    /// What kind of work it is (`"receipt_email"`), for the dispatcher to route.
    pub topic: String,
    /// The message's JSON text.
    pub payload: String,
}

/// A message waiting in the outbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxEntry {
    /// The store's id of the entry (for [`Store::outbox_ack`]).
    pub id: i64,
    /// The reference of the operation that wrote it: the receiving side dedupes by it.
    pub reference: Reference,
    /// The message's topic.
    pub topic: String,
    /// The message's JSON text.
    pub payload: String,
    /// How many times it was handed out before.
    pub attempts: i32,
}

/// What a completion records.
#[derive(Clone, Debug)]
pub struct Completion<'a> {
    /// The call's key.
    pub key: Key,
    /// The token the claim returned.
    pub token: Token,
    /// The answer to store.
    pub response: &'a StoredResponse,
    /// The engine's current time (becomes `completed_at`).
    pub now: Timestamp,
    /// Until when the answer is replayed (`now + window`).
    pub expires_at: Timestamp,
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
    /// The tool's name.
    pub tool: String,
    /// `InFlight` (lease expired) or `Unknown`.
    pub state: RecordState,
    /// The token the settlement must present.
    pub token: Token,
    /// When it was claimed.
    pub claimed_at: Timestamp,
}

/// How a reconciler settles an unsettled claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// It did happen: store this answer (replayed for `window` from now).
    Completed(StoredResponse),
    /// It did not happen: a repeat may run it (under the same reference).
    Released,
    /// Still cannot tell: mark it unknown and try again later.
    Unknown,
}

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database could not be reached or the statement failed.
    #[error("the idempotency store is unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The token presented is no longer the record's: someone else settled or took it over.
    #[error("the record of ref {reference} has moved on (its fencing token is stale); this worker's result was not recorded")]
    Fenced {
        /// The operation's reference.
        reference: Reference,
    },
    /// The record is in a state this operation does not apply to (e.g. releasing a completed record).
    #[error("the record of ref {reference} is {state}, not in flight; nothing was changed")]
    WrongState {
        /// The operation's reference.
        reference: Reference,
        /// Its current state.
        state: &'static str,
    },
    /// A record of a *different* key holds this key's reference: the two keys share their first
    /// 8 bytes. No two live records share a reference (downstream systems deduplicate on it), so
    /// the claim is refused until that record is purged.
    #[error("ref {reference} is held by the record of a different key (the two keys share their first 8 bytes); nothing was recorded")]
    ReferenceTaken {
        /// The reference both keys map to.
        reference: Reference,
    },
    /// There is no record for the key.
    #[error("no record for this key")]
    NotFound,
    /// A row could not be read back (wrong length, unknown state code): a newer schema or damage.
    #[error("the idempotency store holds a record this version cannot read: {0}")]
    Corrupt(String),
    /// The store's migrations could not be applied.
    #[error("the idempotency store's migrations failed: {0}")]
    Migration(String),
}

/// Where records live. Implemented by [`MemoryStore`](memory::MemoryStore) and, behind features,
/// `SqliteStore` and `PostgresStore`.
///
/// Every method takes its times from the caller. Implementations must make [`Store::claim`] atomic:
/// of many concurrent claims of one key exactly one gets [`Claim::New`].
pub trait Store: Send + Sync + 'static {
    /// Claims `req.key`, or reports why not, in one round trip (see the module docs' table).
    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>>;

    /// Records the outcome (fenced: the token must be current and the record in flight) and
    /// writes `c.outbox` in the same transaction.
    fn complete<'a>(&'a self, c: &'a Completion<'a>) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Gives the claim back: nothing was done, a repeat may run (fenced, in flight only).
    fn release(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Marks the claim's outcome unknown (fenced, in flight only).
    fn mark_unknown(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Extends an in-flight claim's lease (fenced), so a long body is not taken for a dead worker.
    fn renew(
        &self,
        key: Key,
        token: Token,
        lease_expires_at: Timestamp,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// The operation named by `reference`, if it belongs to `tenant` (another tenant's reference
    /// is `None`, exactly like one that does not exist). A reference whose generation has been
    /// superseded is `None` too.
    fn status<'a>(
        &'a self,
        tenant: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>>;

    /// Deletes up to `limit` completed or released records whose `expires_at` is before
    /// `older_than`; returns how many went. In-flight and unknown records are never purged.
    fn purge(&self, older_than: Timestamp, limit: u32) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// Up to `limit` claims to reconcile: in flight with `lease_expires_at <= now`, or unknown;
    /// oldest claim first.
    fn unsettled(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Unsettled>, StoreError>>;

    /// Settles an unsettled claim (fenced by `token`, which it then bumps, so the original worker's
    /// late completion is rejected). `Completed` answers repeats until `now + window`.
    fn settle<'a>(
        &'a self,
        key: Key,
        token: Token,
        settlement: &'a Settlement,
        now: Timestamp,
        window: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Up to `limit` outbox messages not yet acknowledged, oldest first; each handed-out message's
    /// attempt count goes up by one and it is not handed out again before `now + redeliver_after`.
    fn outbox_fetch(
        &self,
        now: Timestamp,
        redeliver_after: Duration,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<OutboxEntry>, StoreError>>;

    /// Acknowledges (deletes) a delivered outbox message.
    fn outbox_ack(&self, id: i64) -> BoxFuture<'_, Result<(), StoreError>>;
}
