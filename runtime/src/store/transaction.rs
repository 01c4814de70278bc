//! Transactional calls: a store whose records live in a database the handler also writes to
//! runs the claim, the handler's writes and the outcome in one transaction
//! ([`TransactionalStore`]).
//!
//! While the transaction is open the key is held by the database (PostgreSQL: a
//! transaction-level advisory lock; SQLite: the process's own set of keys in transaction, and the
//! file's write lock), never by an uncommitted row another session would wait on: a concurrent
//! repeat is answered "in flight" at once. The record is written once, completed, in the same
//! commit as the handler's writes; a worker that dies leaves nothing (the database rolls the
//! transaction back), so the next repeat runs as a fresh call. No lease, no reconciler.
//!
//! The transaction is bounded: the request's `lease` is how long the call may run (the tool's
//! timeout, else the engine's lease), and the store makes the database end the transaction by
//! then plus [`SETTLE_GRACE`] for the commit (PostgreSQL: `statement_timeout` and
//! `idle_in_transaction_session_timeout` set with `BEGIN`), so a worker whose host is gone while
//! its connection stays half-open does not hold the key until TCP gives up.

use std::any::Any;
use std::time::Duration;

use super::{BoxFuture, Claim, ClaimRequest, OutboxMessage, StoreError};
use crate::clock::Timestamp;
use crate::key::Reference;
use crate::record::StoredResponse;

/// How long a transactional call's commit or rollback may take after its body's bound: the
/// engine waits that long for the answer, and the store's database ends the transaction then.
pub(crate) const SETTLE_GRACE: Duration = Duration::from_secs(1);

/// A store that can run a call in one transaction of its database.
pub trait TransactionalStore: Send + Sync + 'static {
    /// Opens the call's transaction and holds its key, or answers from the key's record.
    ///
    /// [`Begun::Open`] when the key is free (no record, or one a claim takes over: released, or
    /// completed with its window passed): the transaction is open and the call runs under the
    /// reference it names. [`Begun::Answered`] otherwise: the record's answer as
    /// [`RecordStore::claim`](super::RecordStore::claim) would give it (completed, unknown,
    /// mismatch, in flight), or [`Claim::InFlight`] when another transaction holds the key.
    ///
    /// `req.lease` is how long the call may run: the database should end the transaction (and
    /// free the key) if it is still open that long, plus a second for the commit, after `BEGIN`.
    fn begin<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Begun, StoreError>>;

    /// Whether a transactional call of `tenant` is running now under exactly `reference` (its key
    /// held by an open transaction, with that generation): its record appears only at its commit,
    /// so the status tool asks this when it finds none. Another tenant's call, or another
    /// generation of the key, is `false`. A store that can only see its own process's
    /// transactions answers for those.
    fn running<'a>(
        &'a self,
        tenant: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
}

/// What [`TransactionalStore::begin`] found.
#[derive(Debug)]
pub enum Begun {
    /// The transaction is open and holds the key.
    Open(Box<dyn OpenTransaction>),
    /// The key's record (or another transaction holding it) answers the call.
    Answered(Claim),
}

/// A call's open transaction. Dropped without [`commit`](OpenTransaction::commit) or
/// [`rollback`](OpenTransaction::rollback), its connection is closed, so the database rolls it
/// back.
pub trait OpenTransaction: Send + Sync + std::fmt::Debug {
    /// The reference the call runs under.
    fn reference(&self) -> Reference;

    /// The connection the handler borrows through
    /// [`Call::transaction`](crate::Call::transaction): an `Arc` of the backend's shared
    /// connection, which the engine downcasts to the database the handler asks for.
    fn connection(&self) -> std::sync::Arc<dyn Any + Send + Sync>;

    /// Writes the record, completed with `outcome` (and its outbox messages), and commits: the
    /// handler's writes with it. Refused, rolling back, while the handler still holds the
    /// connection.
    fn commit(self: Box<Self>, outcome: TxOutcome) -> BoxFuture<'static, Result<(), CommitError>>;

    /// Rolls back: nothing the handler wrote stays, and no record is written.
    fn rollback(self: Box<Self>) -> BoxFuture<'static, ()>;
}

/// The outcome a transactional call commits with.
#[derive(Debug)]
pub struct TxOutcome {
    /// The answer: Ok, or a definitive error, replayed for the tool's window.
    pub response: StoredResponse,
    /// Follow-on messages written in the same commit.
    pub outbox: Vec<OutboxMessage>,
    /// The engine's time (the store's clock decides where it has one).
    pub now: Timestamp,
}

/// Why a transactional call's commit failed.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The database refused the commit or a statement before it (a constraint checked at commit,
    /// a serialization failure, the handler still holding the connection or having ended the
    /// transaction itself): nothing the call wrote stays.
    #[error("the transaction was rolled back")]
    RolledBack(#[source] StoreError),
    /// The commit's answer was lost (the connection broke): it may or may not have committed.
    /// A repeat finds out: it replays the record if it committed and runs once if not.
    #[error("the commit's answer was lost")]
    Unknown(#[source] StoreError),
}
