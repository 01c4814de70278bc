//! A store wrapper whose methods do what a test scripts: pass through, fail, park until the test
//! lets them go (signalling that they were entered), hang forever, or commit and then lose the
//! reply. Unscripted calls pass through to the wrapped store.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use idempotency::clock::Timestamp;
use idempotency::key::{Key, SecretFingerprint};
use idempotency::store::{
    Begun, BoxFuture, Claim, ClaimRequest, CommitError, Maintenance, OpenTransaction, OutboxEntry,
    OutboxStore, Receipt, RecordStatus, RecordStore, SecretStore, Store, StoreError, Token,
    TransactionalStore, Transition, Transitioned, TxOutcome, Unsettled, Wake, WindowClock,
};
use idempotency::Reference;
use tokio::sync::{mpsc, Semaphore};

/// A store method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `claim`.
    Claim,
    /// `complete`.
    Complete,
    /// `release`.
    Release,
    /// `mark_unknown`.
    MarkUnknown,
    /// `renew`.
    Renew,
    /// `take_over`.
    TakeOver,
    /// `settle`.
    Settle,
    /// `status`.
    Status,
    /// `watch`.
    Watch,
    /// `purge`.
    Purge,
    /// `unsettled`.
    Unsettled,
    /// `fetch`.
    Fetch,
    /// `ack`.
    Ack,
    /// `swap_secret`.
    SwapSecret,
    /// A transactional call's `begin`.
    Begin,
    /// A transactional call's commit (`CommitThenFail`: committed, then the answer is lost).
    Commit,
}

/// What one call of a method does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// Calls the wrapped store.
    Pass,
    /// Answers `Unavailable` without calling the wrapped store.
    Fail,
    /// Signals that it was entered, waits until [`Scripted::unpark`], then calls the wrapped store.
    Park,
    /// Never answers.
    Hang,
    /// Calls the wrapped store (so the change commits), then answers `Unavailable`: the reply
    /// was lost.
    CommitThenFail,
    /// Calls the wrapped store, then signals and waits until [`Scripted::unpark`] before
    /// answering: the change is made, the reply is held.
    CommitThenPark,
    /// Calls the wrapped store and signals (through [`Scripted::parked`]) once it has answered.
    Report,
    /// Signals that it was entered, then calls the wrapped store once [`Scripted::unpark`] lets
    /// it, whether or not its caller still waits: a database finishes a statement its client
    /// stopped waiting for. Claims only.
    LandLate,
}

/// The wrapper.
pub struct Scripted {
    /// This wrapper, for the transactions it hands out (their commit is scripted too).
    me: std::sync::Weak<Scripted>,
    inner: Arc<dyn Store>,
    plan: Mutex<HashMap<Op, VecDeque<Act>>>,
    calls: Mutex<HashMap<Op, usize>>,
    parked_tx: mpsc::UnboundedSender<Op>,
    parked_rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<Op>>,
    gate: Semaphore,
}

impl Scripted {
    /// `inner`, wrapped: every method passes through until a test scripts it.
    pub fn new(inner: Arc<dyn Store>) -> Arc<Self> {
        let (parked_tx, parked_rx) = mpsc::unbounded_channel();
        Arc::new_cyclic(|me| Scripted {
            me: me.clone(),
            inner,
            plan: Mutex::default(),
            calls: Mutex::default(),
            parked_tx,
            parked_rx: tokio::sync::Mutex::new(parked_rx),
            gate: Semaphore::new(0),
        })
    }

    /// The next calls of `op` do `acts`, in order; later ones pass through.
    pub fn script(&self, op: Op, acts: impl IntoIterator<Item = Act>) {
        let mut plan = self.plan.lock().unwrap_or_else(PoisonError::into_inner);
        plan.entry(op).or_default().extend(acts);
    }

    /// How many times `op` was called.
    pub fn calls(&self, op: Op) -> usize {
        let calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        calls.get(&op).copied().unwrap_or(0)
    }

    /// Waits until a call parks (or a `Report` call has answered), and says which method it was.
    pub async fn parked(&self) -> Op {
        let mut rx = self.parked_rx.lock().await;
        rx.recv()
            .await
            .expect("the sender lives as long as the store")
    }

    /// Lets one parked call go on.
    pub fn unpark(&self) {
        self.gate.add_permits(1);
    }

    fn next(&self, op: Op) -> Act {
        *self
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(op)
            .or_default() += 1;
        let mut plan = self.plan.lock().unwrap_or_else(PoisonError::into_inner);
        plan.get_mut(&op)
            .and_then(VecDeque::pop_front)
            .unwrap_or(Act::Pass)
    }

    /// Runs `call` (only made when the script lets the call reach the wrapped store: some
    /// stores do their work when the method is called, before the future is polled).
    fn run<'a, T: Send + 'a, F>(
        &'a self,
        op: Op,
        call: impl FnOnce() -> F + Send + 'a,
    ) -> BoxFuture<'a, Result<T, StoreError>>
    where
        F: Future<Output = Result<T, StoreError>> + Send + 'a,
    {
        let act = self.next(op);
        self.act(op, act, call)
    }

    /// Does `act` for a call of `op` (see [`Scripted::run`]).
    fn act<'a, T: Send + 'a, F>(
        &'a self,
        op: Op,
        act: Act,
        call: impl FnOnce() -> F + Send + 'a,
    ) -> BoxFuture<'a, Result<T, StoreError>>
    where
        F: Future<Output = Result<T, StoreError>> + Send + 'a,
    {
        Box::pin(async move {
            match act {
                Act::Pass => call().await,
                Act::Fail => Err(unavailable(op)),
                Act::Hang => std::future::pending().await,
                Act::Park => {
                    let _ = self.parked_tx.send(op);
                    self.gate.acquire().await.expect("never closed").forget();
                    call().await
                }
                Act::CommitThenFail => {
                    let _ = call().await;
                    Err(unavailable(op))
                }
                Act::CommitThenPark => {
                    let r = call().await;
                    let _ = self.parked_tx.send(op);
                    self.gate.acquire().await.expect("never closed").forget();
                    r
                }
                Act::Report => {
                    let r = call().await;
                    let _ = self.parked_tx.send(op);
                    r
                }
                Act::LandLate => panic!("LandLate is scripted for claims only, not {op:?}"),
            }
        })
    }
}

impl Scripted {
    /// [`Act::LandLate`]: the claim runs in a task of its own, so dropping the returned future
    /// does not stop it.
    fn land_late<'a>(&'a self, req: &ClaimRequest<'_>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        let me = self.me.upgrade().expect("the store is alive while called");
        let (tenant, subject, tool) = (
            req.tenant.to_owned(),
            req.subject.map(str::to_owned),
            req.tool.to_owned(),
        );
        let (key, fingerprint, now, lease, window, token) = (
            req.key,
            req.fingerprint,
            req.now,
            req.lease,
            req.window,
            req.token,
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let _ = me.parked_tx.send(Op::Claim);
            me.gate.acquire().await.expect("never closed").forget();
            let req = ClaimRequest {
                key,
                tenant: &tenant,
                subject: subject.as_deref(),
                tool: &tool,
                fingerprint,
                now,
                lease,
                window,
                token,
            };
            let _ = tx.send(me.inner.claim(&req).await);
        });
        Box::pin(async move { rx.await.unwrap_or_else(|_| Err(unavailable(Op::Claim))) })
    }
}

fn unavailable(op: Op) -> StoreError {
    StoreError::Unavailable(format!("scripted failure of {op:?}").into())
}

impl RecordStore for Scripted {
    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        match self.next(Op::Claim) {
            Act::LandLate => self.land_late(req),
            act => self.act(Op::Claim, act, move || self.inner.claim(req)),
        }
    }
    /// Scripted per transition: `Op::Complete`, `Op::Release`, ... as the transition's kind; a
    /// transition this wrapper does not know passes through unscripted.
    fn transition<'a>(
        &'a self,
        key: Key,
        token: Token,
        op: Transition<'a>,
    ) -> BoxFuture<'a, Result<Transitioned, StoreError>> {
        let scripted = match op {
            Transition::Complete { .. } => Op::Complete,
            Transition::Release { .. } => Op::Release,
            Transition::MarkUnknown => Op::MarkUnknown,
            Transition::Renew { .. } => Op::Renew,
            Transition::TakeOver { .. } => Op::TakeOver,
            Transition::Settle { .. } => Op::Settle,
            _ => return self.inner.transition(key, token, op),
        };
        self.run(scripted, move || self.inner.transition(key, token, op))
    }
    fn status<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>> {
        self.run(Op::Status, move || {
            self.inner.status(tenant, subject, reference)
        })
    }
    fn watch<'a>(
        &'a self,
        key: Key,
        reference: Reference,
        wake: Wake,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.run(Op::Watch, move || self.inner.watch(key, reference, wake))
    }
    fn transactions(&self) -> Option<&dyn TransactionalStore> {
        self.inner
            .transactions()
            .map(|_| self as &dyn TransactionalStore)
    }
    fn window_clock(&self) -> WindowClock {
        self.inner.window_clock()
    }
}

impl TransactionalStore for Scripted {
    fn running<'a>(
        &'a self,
        tenant: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        match self.inner.transactions() {
            Some(inner) => inner.running(tenant, reference),
            None => Box::pin(std::future::ready(Ok(false))),
        }
    }

    fn begin<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Begun, StoreError>> {
        let begun = self.run(Op::Begin, move || async move {
            match self.inner.transactions() {
                Some(inner) => inner.begin(req).await,
                None => Err(unavailable(Op::Begin)),
            }
        });
        Box::pin(async move {
            Ok(match begun.await? {
                Begun::Open(inner) => Begun::Open(Box::new(ScriptedTransaction {
                    inner,
                    store: self
                        .me
                        .upgrade()
                        .expect("the wrapper lives while it is called"),
                })),
                answered => answered,
            })
        })
    }
}

/// An open transaction whose commit the wrapper scripts ([`Op::Commit`]).
#[derive(Debug)]
struct ScriptedTransaction {
    inner: Box<dyn OpenTransaction>,
    store: Arc<Scripted>,
}

impl std::fmt::Debug for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scripted")
    }
}

impl OpenTransaction for ScriptedTransaction {
    fn reference(&self) -> Reference {
        self.inner.reference()
    }
    fn connection(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        self.inner.connection()
    }
    fn commit(self: Box<Self>, outcome: TxOutcome) -> BoxFuture<'static, Result<(), CommitError>> {
        let act = self.store.next(Op::Commit);
        Box::pin(async move {
            let ScriptedTransaction { inner, store } = *self;
            match act {
                Act::Pass => inner.commit(outcome).await,
                // Dropped unanswered: its connection closes, the database rolls it back.
                Act::Fail => Err(CommitError::RolledBack(unavailable(Op::Commit))),
                Act::Hang => std::future::pending().await,
                Act::CommitThenFail => {
                    let _ = inner.commit(outcome).await;
                    Err(CommitError::Unknown(unavailable(Op::Commit)))
                }
                Act::LandLate => panic!("LandLate is scripted for claims only, not commits"),
                Act::Park | Act::CommitThenPark | Act::Report => {
                    let _ = store.parked_tx.send(Op::Commit);
                    store.gate.acquire().await.expect("never closed").forget();
                    inner.commit(outcome).await
                }
            }
        })
    }
    fn rollback(self: Box<Self>) -> BoxFuture<'static, ()> {
        self.inner.rollback()
    }
}

impl Maintenance for Scripted {
    fn purge(
        &self,
        now: Timestamp,
        older_than: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.run(Op::Purge, move || self.inner.purge(now, older_than, limit))
    }
    fn unsettled(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Unsettled>, StoreError>> {
        self.run(Op::Unsettled, move || self.inner.unsettled(now, limit))
    }
}

impl OutboxStore for Scripted {
    fn fetch(
        &self,
        now: Timestamp,
        invisible_until: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<OutboxEntry>, StoreError>> {
        self.run(Op::Fetch, move || {
            self.inner.fetch(now, invisible_until, limit)
        })
    }
    fn ack<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        self.run(Op::Ack, move || self.inner.ack(receipt))
    }
}

impl SecretStore for Scripted {
    fn swap_secret(
        &self,
        expected: Option<SecretFingerprint>,
        new: SecretFingerprint,
    ) -> BoxFuture<'_, Result<Option<SecretFingerprint>, StoreError>> {
        self.run(Op::SwapSecret, move || {
            self.inner.swap_secret(expected, new)
        })
    }
}
