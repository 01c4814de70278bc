//! Repeats that wait for the call in progress (`wait`): the engine's waiters, woken at once when
//! this engine settles the record they wait on, and a store that says so.
//!
//! A waiter holds no claim and no store connection: it parks on its key's [`Notify`]. A store that
//! hears of other processes' settlements ([`RecordStore::watch`](crate::store::RecordStore::watch):
//! PostgreSQL's notices) wakes it too; otherwise, now and then (50 ms doubling to 500 ms, each
//! pause jittered down to half), it reads the record's status, which is how it sees a settlement
//! made by another process (with notices it still reads, from 500 ms doubling to 2 s, for a lease
//! that passed). The first waiter of this engine to see a settlement wakes the others on the key.
//! When either says the record may have moved on, the engine claims again, which answers as any
//! repeat would (replay, run, unknown...).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::Timestamp;
use crate::key::{Caller, Fingerprint, Key, Reference};
use crate::record::{RecordStatus, Standing};
use crate::store::{Claim, StoreError, TransactionalStore, Wake};

use super::answer::Found;

/// The first pause between two status reads of a waiter, and the longest (it doubles).
const FIRST_POLL: Duration = Duration::from_millis(50);
const LAST_POLL: Duration = Duration::from_millis(500);
/// The same, when the store sends word of settlements
/// ([`RecordStore::watch`](crate::store::RecordStore::watch)): the reads only catch what no notice
/// tells (a lease that passed, a notice lost with its connection).
const FIRST_POLL_HEARD: Duration = Duration::from_millis(500);
const LAST_POLL_HEARD: Duration = Duration::from_secs(2);

/// The repeats of one engine that are waiting, by key.
#[derive(Default)]
pub(super) struct Waiters {
    count: AtomicUsize,
    keys: Mutex<HashMap<Key, Entry>>,
}

struct Entry {
    notify: Arc<Notify>,
    waiters: usize,
    read: Arc<SharedRead>,
}

/// The claim read again after a wake, by one of the key's waiters for all: a completed answer
/// (with the fingerprint it was read for) is the others' too.
type SharedRead = tokio::sync::Mutex<Option<(Option<Fingerprint>, Claim)>>;

/// How long a woken waiter waits for another one's read of the record before reading it itself
/// (a store that does not answer the first holds the others up no longer than this).
const SHARED_READ_WAIT: Duration = Duration::from_millis(500);

impl Waiters {
    /// A place among the waiters on `key`, unless `max` are waiting already.
    pub(super) fn enter(self: &Arc<Self>, key: Key, max: usize) -> Option<Slot> {
        let taken = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        if taken.is_err() {
            return None;
        }
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = keys.entry(key).or_insert_with(|| Entry {
            notify: Arc::new(Notify::new()),
            waiters: 0,
            read: Arc::default(),
        });
        entry.waiters += 1;
        Some(Slot {
            waiters: self.clone(),
            key,
            notify: entry.notify.clone(),
            read: entry.read.clone(),
        })
    }

    /// `slot` if it is a place among the waiters on `key`; else (given back) a new place there,
    /// unless `max` are waiting already.
    pub(super) fn keep_or_enter(
        self: &Arc<Self>,
        slot: Option<Slot>,
        key: Key,
        max: usize,
    ) -> Option<Slot> {
        slot.filter(|s| s.key == key)
            .or_else(|| self.enter(key, max))
    }

    /// Wakes whoever waits on `key` (the record may have moved on).
    pub(super) fn wake(&self, key: Key) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = keys.get(&key) {
            entry.notify.notify_waiters();
        }
    }

    /// How many repeats are waiting now.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }
}

/// One waiting repeat's place; dropping it (answered, or the caller gone) gives it back.
pub(super) struct Slot {
    waiters: Arc<Waiters>,
    key: Key,
    notify: Arc<Notify>,
    read: Arc<SharedRead>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut keys = self
            .waiters
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = keys.get_mut(&self.key) {
            entry.waiters -= 1;
            if entry.waiters == 0 {
                keys.remove(&self.key);
            }
        }
        drop(keys);
        self.waiters.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How a wait ended.
pub(super) enum Waited {
    /// The record may have moved on: claim again.
    Moved,
    /// The time to wait is over.
    Over,
}

impl Slot {
    /// After a wake, the claim again, read once for this engine's waiters on the key: one reads
    /// it (`read`, a claim) while the others wait their turn, and a completed answer is theirs
    /// too (same key, same fingerprint), so a hundred woken waiters cost the store one read.
    /// Any other answer each reads for itself (a released call lets one of them run).
    pub(super) async fn read_again<E, Fut>(
        &self,
        fingerprint: Option<Fingerprint>,
        read: impl FnOnce() -> Fut,
    ) -> Result<Claim, E>
    where
        Fut: std::future::Future<Output = Result<Claim, E>>,
    {
        let Ok(mut shared) = tokio::time::timeout(SHARED_READ_WAIT, self.read.lock()).await else {
            return read().await;
        };
        if let Some((f, claim)) = &*shared
            && *f == fingerprint
        {
            return Ok(claim.clone());
        }
        let claim = read().await?;
        if matches!(claim, Claim::Completed { .. }) {
            *shared = Some((fingerprint, claim.clone()));
        }
        Ok(claim)
    }

    /// Waits until the call of `reference` may no longer be in flight (this engine settled
    /// it, the store sent word of a settlement, or a look says so: [`Look`]), or until `until`.
    /// One schedule for every call: a look every 50 ms doubling to 500 ms (from 500 ms to 2 s
    /// when the store sends word of settlements), each pause jittered down to half.
    pub(super) async fn wait(
        &self,
        core: &super::core::Core,
        look: Look<'_>,
        reference: Reference,
        until: tokio::time::Instant,
    ) -> Waited {
        let store = &*core.store;
        // Listening before anything is read: a settlement after the read still wakes this
        // waiter.
        let woken = self.notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        // A store that sends word of other processes' settlements: read the record less often
        // (a read still sees a lease that passed, or a notice lost with a connection). A
        // transaction's record appears only at its commit: nothing to hear of before.
        let heard = match look {
            Look::Transaction { .. } => false,
            Look::Record(_) => tokio::select! {
                () = &mut woken => return Waited::Moved,
                () = tokio::time::sleep_until(until) => return Waited::Over,
                watched = store.watch(self.key, reference, Wake::new(&self.notify)) => match watched {
                    Ok(heard) => heard,
                    Err(e) => {
                        tracing::debug!(%reference, error = %e, "idempotency: a waiting repeat could not ask for word of the settlement; reading the record instead");
                        false
                    }
                },
            },
        };
        let (mut pause, last) = if heard {
            (FIRST_POLL_HEARD, LAST_POLL_HEARD)
        } else {
            (FIRST_POLL, LAST_POLL)
        };
        loop {
            // A slow read does not delay the wake-up.
            let read = tokio::time::timeout_at(until, look.in_flight(core, reference));
            tokio::select! {
                () = &mut woken => return Waited::Moved,
                read = read => match read {
                    Err(_) => return Waited::Over,
                    Ok(Ok(true)) => {}
                    Ok(Ok(false)) => {
                        // The others waiting on this key here need not read it too.
                        self.notify.notify_waiters();
                        return Waited::Moved;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(%reference, error = %e, "idempotency: a waiting repeat could not read the record; still waiting");
                    }
                },
            }
            tokio::select! {
                () = &mut woken => return Waited::Moved,
                () = tokio::time::sleep(jittered(pause)) => {}
                () = tokio::time::sleep_until(until) => return Waited::Over,
            }
            pause = (pause * 2).min(last);
        }
    }
}

/// A call's schedule as a repeat, one for every kind of call: by when the store must answer it
/// (its timeout), how long and until when it may wait for the call in progress (the tool's wait,
/// else the engine's, bounded by the timeout), its place among the engine's waiting repeats while
/// it waits, and the pause before it claims again.
pub(super) struct Repeat {
    tool: &'static str,
    started: tokio::time::Instant,
    by: Option<tokio::time::Instant>,
    wait: Duration,
    until: Option<tokio::time::Instant>,
    /// At most this many repeats of the engine wait at once.
    max: usize,
    slot: Option<Slot>,
    /// Claims that found the call still in progress after a wake: each pauses longer.
    idle_reads: u32,
    tries: u32,
}

impl Repeat {
    /// The schedule of a call of `spec` starting now, in an engine that waits `wait` when the
    /// tool does not say, with at most `max` repeats waiting at once.
    pub(super) fn new(spec: &crate::tool::ToolSpec, wait: Duration, max: usize) -> Self {
        let started = tokio::time::Instant::now();
        let wait = spec.wait.unwrap_or(wait);
        let wait = spec.timeout.map_or(wait, |t| wait.min(t));
        Repeat {
            tool: spec.name,
            started,
            by: spec.timeout.map(|t| started + t),
            wait,
            until: (!wait.is_zero()).then(|| started + wait),
            max,
            slot: None,
            idle_reads: 0,
            tries: 0,
        }
    }

    /// Whether this is the call's first try (and counts it).
    pub(super) fn first_try(&mut self) -> bool {
        self.tries += 1;
        self.tries == 1
    }

    /// By when the store must have answered: the call's timeout, if it has one.
    pub(super) fn by(&self) -> Option<tokio::time::Instant> {
        self.by
    }

    /// Until when this repeat may wait for the call in progress; `None`: not at all.
    pub(super) fn until(&self) -> Option<tokio::time::Instant> {
        self.until
    }

    /// Whether this repeat may wait for the call in progress.
    pub(super) fn may_wait(&self) -> bool {
        self.until.is_some()
    }

    /// Its place among the waiters, while it waits.
    pub(super) fn slot(&self) -> Option<&Slot> {
        self.slot.as_ref()
    }

    /// Gives its place among the waiters back (it claims afresh, or runs).
    pub(super) fn leave(&mut self) {
        self.slot = None;
    }

    /// While it waits, before it claims again: the pause ([`pace`]).
    pub(super) async fn pace(&mut self) {
        if self.slot.is_some() {
            pace(&mut self.idle_reads, self.until).await;
        }
    }

    /// Waits for the call `on` in progress, among `waiters` (unless too many wait already: then
    /// `Over` at once), as long as this repeat may; progress reported meanwhile.
    pub(super) async fn wait(
        &mut self,
        core: &super::core::Core,
        waiters: &Arc<Waiters>,
        on: &InFlight<'_>,
    ) -> Waited {
        let (tool, reference) = (self.tool, on.reference);
        let Some(until) = self.until else {
            return Waited::Over;
        };
        self.slot = waiters.keep_or_enter(self.slot.take(), on.holder, self.max);
        let Some(waiting) = &self.slot else {
            tracing::info!(tool, %reference, max = self.max, "idempotency: too many repeats waiting; answering in progress at once");
            return Waited::Over;
        };
        tracing::debug!(tool, %reference, "idempotency: waiting for the call in progress");
        crate::metrics::waited(tool);
        let waited = waiting.wait(core, on.look, reference, until);
        let waited = crate::progress::reporting(reference, self.started, self.wait, waited).await;
        let waited_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::Span::current().record("idempotency.waited_ms", waited_ms);
        waited
    }
}

/// A call in flight a repeat may wait for: the record, the key that holds it, and what to look
/// at to learn that it moved on.
pub(super) struct InFlight<'a> {
    pub(super) found: Found,
    pub(super) reference: Reference,
    pub(super) holder: Key,
    pub(super) look: Look<'a>,
}

/// What a waiting repeat looks at to learn that the call it waits on may have moved on.
#[derive(Clone, Copy)]
pub(super) enum Look<'a> {
    /// The record's status, as `caller` may see it, judged on the store's clock
    /// ([`RecordStatus::standing`]); and the store's word of settlements.
    Record(&'a Caller),
    /// Whether the call's transaction is still open ([`TransactionalStore::running`]): its
    /// record appears only at its commit.
    Transaction {
        store: &'a dyn TransactionalStore,
        tenant: &'a str,
    },
}

impl Look<'_> {
    /// Whether `reference`'s call is still in flight with a live lease (or an open
    /// transaction).
    async fn in_flight(
        self,
        core: &super::core::Core,
        reference: Reference,
    ) -> Result<bool, StoreError> {
        match self {
            Look::Record(caller) => {
                let status = core
                    .store
                    .status(&caller.tenant, &caller.subject, reference)
                    .await?;
                Ok(status.is_some_and(|s| running(&s, reference, core.clock.now())))
            }
            Look::Transaction { store, tenant } => {
                crate::metrics::timed("running", store.running(tenant, reference)).await
            }
        }
    }
}

/// The first pause before a waiting repeat claims again after a wake or a read that said the
/// record moved on; it doubles with each claim that found the call still in progress, up to
/// [`LAST_POLL`].
const FIRST_REREAD: Duration = Duration::from_millis(5);

/// Before a waiting repeat claims again: a pause (jittered) that doubles with each claim that
/// found the call still in progress (`idle_reads`), so that no path between the store and the
/// wait loops without one, whatever the store answers (a record read as moved on that the claim
/// finds in progress, a wake for nothing). Never past `until`.
pub(super) async fn pace(idle_reads: &mut u32, until: Option<tokio::time::Instant>) {
    let pause = FIRST_REREAD
        .saturating_mul(1 << (*idle_reads).min(16))
        .min(LAST_POLL);
    *idle_reads = idle_reads.saturating_add(1);
    let at = tokio::time::Instant::now() + jittered(pause);
    tokio::time::sleep_until(until.map_or(at, |u| u.min(at))).await;
}

/// Between half `pause` and `pause`: waiters that began together do not read together (which
/// would open store connections for them at once).
fn jittered(pause: Duration) -> Duration {
    let noise = super::noise();
    let half = pause / 2;
    let spread = u64::try_from(half.as_micros()).unwrap_or(u64::MAX).max(1);
    half + Duration::from_micros(noise % spread)
}

/// Whether `s` is still `reference`'s call in flight with a live lease: the reading a repeat
/// and the status tool give ([`RecordStatus::standing`]).
fn running(s: &RecordStatus, reference: Reference, now: Timestamp) -> bool {
    s.standing(reference, now) == Standing::InFlight
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> Key {
        Key::from_bytes([n; 32])
    }

    /// Places are counted against the cap and given back on drop; a key's entry goes with its
    /// last waiter.
    #[test]
    fn places_are_capped_and_given_back() {
        let waiters = Arc::new(Waiters::default());
        let a = waiters.enter(key(1), 2).expect("room");
        let b = waiters.enter(key(1), 2).expect("room");
        assert!(waiters.enter(key(2), 2).is_none(), "past the cap");
        assert_eq!(waiters.waiting(), 2);
        drop(a);
        assert_eq!(waiters.waiting(), 1);
        let c = waiters.enter(key(2), 2).expect("a place was given back");
        drop((b, c));
        assert_eq!(waiters.waiting(), 0);
        assert!(waiters.keys.lock().expect("lock").is_empty());
    }
}
