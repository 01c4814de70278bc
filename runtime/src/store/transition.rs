//! The fenced writes of one record as one method: [`RecordStore::transition`] makes a
//! [`Transition`] and answers [`Transitioned`]; [`Fenced`] gives callers a method per transition.
//!
//! "Fenced" means: the write applies only when the record's current token is the one presented
//! and its state is one the transition allows; otherwise nothing changes and the answer says
//! why: [`StoreError::Fenced`] (another token is current), [`StoreError::WrongState`] (the token
//! is current, the state is not allowed) or [`StoreError::NotFound`] (no record for the key).
//! [`Transition::TakeOver`] alone is fenced by the state and the lease instead of the token.

use std::time::Duration;

use super::{
    BoxFuture, Completion, OutboxMessage, RecordStore, Settlement, StoreError, StoredResponse,
    Token,
};
use crate::clock::Timestamp;
use crate::key::{Key, Reference};

/// One fenced write of a record, the `op` of [`RecordStore::transition`] (which also takes the
/// record's key and a token). Each variant's answer is [`Transitioned::Done`] but
/// [`Transition::TakeOver`]'s, which is [`Transitioned::TakenOver`].
///
/// More transitions may come: a store asked for one it does not know answers
/// [`StoreError::Contract`] and changes nothing.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Transition<'a> {
    /// Records the outcome and writes `outbox` in the same transaction. Fenced: the token must
    /// be current and the record in flight or unknown (an unknown record takes its worker's late
    /// answer: same token, nobody took over). The record is completed with `response`, replayed
    /// for the record's window from `now`.
    Complete {
        /// The answer to store.
        response: &'a StoredResponse,
        /// Follow-on messages to write in the same transaction.
        outbox: &'a [OutboxMessage],
        /// When it completed: the answer is replayed for the record's window from then.
        now: Timestamp,
    },
    /// Gives the claim back at `at`: nothing was done, a repeat may run it (and takes it over
    /// under the same reference). Fenced: in flight or unknown.
    Release {
        /// When it was released.
        at: Timestamp,
    },
    /// Marks the claim's outcome unknown: it is never run again; only a settlement (or the
    /// worker's late completion) ends it. Fenced: in flight only.
    MarkUnknown,
    /// Extends an in-flight claim's lease to end `lease` after `now`, so a long body is not
    /// taken for a dead worker. Fenced: in flight only.
    Renew {
        /// The engine's current time.
        now: Timestamp,
        /// How long the lease lasts from `now`.
        lease: Duration,
    },
    /// Takes over a call whose worker is gone, to run its body again under the same reference
    /// (`recover = "rerun"`): a record of the key that is in flight with its lease ended at or
    /// before `now`, or unknown, becomes in flight under the token given (the *new* attempt's
    /// token) with its lease ending `lease` after `now`, same generation. Atomic: of concurrent
    /// takeovers (and claims) exactly one wins, because the winner's lease is live for the
    /// others. Fenced by the state and the lease, not a token: any other state is
    /// [`StoreError::WrongState`], no record [`StoreError::NotFound`]. The old worker's late
    /// completion is fenced by the new token. Answers [`Transitioned::TakenOver`] with the
    /// record's reference.
    TakeOver {
        /// The engine's current time.
        now: Timestamp,
        /// How long the new attempt's lease lasts from `now`.
        lease: Duration,
    },
    /// Settles an in-flight or unknown claim at `at` (fenced by the token). A completed or
    /// released settlement then bumps the token by one, so the original worker's late completion
    /// is rejected; an unknown one keeps it, so the worker's late answer (the truth) still
    /// lands. A `Completed` settlement answers repeats for the record's own window (the one its
    /// claim recorded) from `at`.
    Settle {
        /// How it is settled.
        settlement: &'a Settlement,
        /// When it is settled.
        at: Timestamp,
    },
}

impl Transition<'_> {
    /// The transition's name, as [`Fenced`]'s methods and the store-latency metric
    /// (`operation` label) call it: `complete`, `release`, `mark_unknown`, `renew`, `take_over`
    /// or `settle`.
    pub fn name(&self) -> &'static str {
        match self {
            Transition::Complete { .. } => "complete",
            Transition::Release { .. } => "release",
            Transition::MarkUnknown => "mark_unknown",
            Transition::Renew { .. } => "renew",
            Transition::TakeOver { .. } => "take_over",
            Transition::Settle { .. } => "settle",
        }
    }
}

/// What a [`Transition`] that applied answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transitioned {
    /// It applied (every transition but [`Transition::TakeOver`]).
    Done,
    /// [`Transition::TakeOver`] applied: the record, in flight under the new token, is this
    /// reference's (the same generation as before).
    TakenOver(Reference),
}

/// The fenced writes as one method each, for callers: every method makes its [`Transition`],
/// calls [`RecordStore::transition`] and turns the answer into the method's own (an answer the
/// transition never gives is [`StoreError::Contract`]). Implemented for every [`RecordStore`],
/// `dyn Store` included: `use idempotency::store::Fenced` and call `store.complete(&c)`.
pub trait Fenced: RecordStore {
    /// [`Transition::Complete`] of `c.key` under `c.token`.
    fn complete<'a>(&'a self, c: &'a Completion<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        let op = Transition::Complete {
            response: c.response,
            outbox: c.outbox,
            now: c.now,
        };
        done(op.name(), self.transition(c.key, c.token, op))
    }

    /// [`Transition::Release`] at `at`.
    fn release(
        &self,
        key: Key,
        token: Token,
        at: Timestamp,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let op = Transition::Release { at };
        done(op.name(), self.transition(key, token, op))
    }

    /// [`Transition::MarkUnknown`].
    fn mark_unknown(&self, key: Key, token: Token) -> BoxFuture<'_, Result<(), StoreError>> {
        let op = Transition::MarkUnknown;
        done(op.name(), self.transition(key, token, op))
    }

    /// [`Transition::Renew`]: the lease ends `lease` after `now`.
    fn renew(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let op = Transition::Renew { now, lease };
        done(op.name(), self.transition(key, token, op))
    }

    /// [`Transition::TakeOver`] under the new attempt's `token`: answers the record's reference.
    fn take_over(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Reference, StoreError>> {
        let op = Transition::TakeOver { now, lease };
        let fut = self.transition(key, token, op);
        Box::pin(async move {
            match fut.await? {
                Transitioned::TakenOver(reference) => Ok(reference),
                other => Err(unexpected(op.name(), other)),
            }
        })
    }

    /// [`Transition::Settle`] at `at`.
    fn settle<'a>(
        &'a self,
        key: Key,
        token: Token,
        settlement: &'a Settlement,
        at: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let op = Transition::Settle { settlement, at };
        done(op.name(), self.transition(key, token, op))
    }
}

impl<S: RecordStore + ?Sized> Fenced for S {}

/// `fut`, the answer of the transition `name`, which must be [`Transitioned::Done`].
fn done<'a>(
    name: &'static str,
    fut: BoxFuture<'a, Result<Transitioned, StoreError>>,
) -> BoxFuture<'a, Result<(), StoreError>> {
    Box::pin(async move {
        match fut.await? {
            Transitioned::Done => Ok(()),
            other => Err(unexpected(name, other)),
        }
    })
}

/// The error for the transition `name` answered with `answer`, which it never answers.
fn unexpected(name: &str, answer: Transitioned) -> StoreError {
    StoreError::Contract {
        problem: format!("its transition answered {name} with {answer:?}"),
    }
}

/// The six fenced writes as the built-in backends write them, one method each;
/// [`dispatch`] makes their [`RecordStore::transition`] of them.
pub(crate) trait Writes: Sync {
    /// [`Transition::Complete`], with its key and token.
    fn complete<'a>(&'a self, c: Completion<'a>) -> BoxFuture<'a, Result<(), StoreError>>;
    /// [`Transition::Release`].
    fn release(
        &self,
        key: Key,
        token: Token,
        at: Timestamp,
    ) -> BoxFuture<'_, Result<(), StoreError>>;
    /// [`Transition::MarkUnknown`].
    fn mark_unknown(&self, key: Key, token: Token) -> BoxFuture<'_, Result<(), StoreError>>;
    /// [`Transition::Renew`].
    fn renew(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>>;
    /// [`Transition::TakeOver`].
    fn take_over(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Reference, StoreError>>;
    /// [`Transition::Settle`].
    fn settle<'a>(
        &'a self,
        key: Key,
        token: Token,
        settlement: &'a Settlement,
        at: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// `store`'s [`RecordStore::transition`]: `op` by the [`Writes`] method that makes it. The
/// method is called at once (a store that does its work when called, before its future is
/// polled, still does).
pub(crate) fn dispatch<'a, S: Writes>(
    store: &'a S,
    key: Key,
    token: Token,
    op: Transition<'a>,
) -> BoxFuture<'a, Result<Transitioned, StoreError>> {
    let fut = match op {
        Transition::Complete {
            response,
            outbox,
            now,
        } => store.complete(Completion {
            key,
            token,
            response,
            now,
            outbox,
        }),
        Transition::Release { at } => store.release(key, token, at),
        Transition::MarkUnknown => store.mark_unknown(key, token),
        Transition::Renew { now, lease } => store.renew(key, token, now, lease),
        Transition::TakeOver { now, lease } => {
            let fut = store.take_over(key, token, now, lease);
            return Box::pin(async move { fut.await.map(Transitioned::TakenOver) });
        }
        Transition::Settle { settlement, at } => store.settle(key, token, settlement, at),
    };
    Box::pin(async move { fut.await.map(|()| Transitioned::Done) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Claim, ClaimRequest, RecordStatus};

    /// A store whose every transition answers `answer`.
    struct Answers(Transitioned);

    impl RecordStore for Answers {
        fn claim<'a>(
            &'a self,
            _: &'a ClaimRequest<'a>,
        ) -> BoxFuture<'a, Result<Claim, StoreError>> {
            Box::pin(async { Err(StoreError::NotFound) })
        }
        fn transition<'a>(
            &'a self,
            _: Key,
            _: Token,
            _: Transition<'a>,
        ) -> BoxFuture<'a, Result<Transitioned, StoreError>> {
            let answer = self.0;
            Box::pin(async move { Ok(answer) })
        }
        fn status<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
            _: Reference,
        ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>> {
            Box::pin(async { Ok(None) })
        }
    }

    fn key() -> Key {
        Key::from_bytes([7; 32])
    }

    /// An answer the transition never gives is a contract error naming both, never a panic;
    /// the right one is passed on.
    #[tokio::test]
    async fn a_wrong_answer_is_a_contract_error() {
        let reference = key().reference(1);
        let at = Timestamp::from_millis(1);
        let taken = Answers(Transitioned::TakenOver(reference));
        let e = taken
            .release(key(), Token(1), at)
            .await
            .expect_err("refused");
        assert!(
            matches!(&e, StoreError::Contract { problem } if problem.contains("release") && problem.contains("TakenOver")),
            "{e}"
        );
        assert_eq!(
            taken
                .take_over(key(), Token(2), at, Duration::from_secs(1))
                .await
                .expect("taken"),
            reference
        );
        let done = Answers(Transitioned::Done);
        let e = done
            .take_over(key(), Token(2), at, Duration::from_secs(1))
            .await
            .expect_err("refused");
        assert!(
            matches!(&e, StoreError::Contract { problem } if problem.contains("take_over")),
            "{e}"
        );
        // Through `dyn Store`'s supertrait too.
        let store: std::sync::Arc<dyn crate::store::Store> =
            std::sync::Arc::new(crate::store::MemoryStore::new());
        assert!(matches!(
            store.mark_unknown(key(), Token(1)).await,
            Err(StoreError::NotFound)
        ));
    }
}
