//! The record's life: what a store keeps for one key.
//!
//! ```text
//!            claim                complete(Ok / definitive Err)
//!  (none) ──────────► in flight ─────────────────────────────► completed ──(window passes)──► next claim is a
//!                        │  │                                                                new operation
//!                        │  └── timeout / cancelled / panicked after start ──► unknown ──(reconcile)──► completed | released
//!                        └───── retryable error / nothing started ──► released ──(next claim takes it over, same ref)
//! ```
//!
//! A completed record answers repeats for `window` after it was *completed*; an in-flight or
//! unknown record never expires by window (only reconciliation settles it).

use crate::clock::Timestamp;
use crate::key::Reference;

/// Where a record is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// Claimed; the body is running (or its worker died and the lease will tell).
    InFlight,
    /// Finished with a stored answer (`Ok`, or a definitive error such as a card decline).
    Completed,
    /// The body started and then the outcome was lost (timeout, cancellation, panic, a store
    /// failure after the side effect). Never re-run automatically; reconcile it.
    Unknown,
    /// Given back: nothing was done (retryable error, or the body never started). The next claim
    /// takes it over under the same reference.
    Released,
}

impl RecordState {
    /// The small integer the SQL stores keep in their `state` column.
    #[cfg_attr(not(feature = "_sql"), allow(dead_code))]
    pub(crate) fn code(self) -> i16 {
        match self {
            RecordState::InFlight => 0,
            RecordState::Completed => 1,
            RecordState::Unknown => 2,
            RecordState::Released => 3,
        }
    }

    /// The state for a `state` column value; `None` for a value this version does not know.
    #[cfg_attr(not(feature = "_sql"), allow(dead_code))]
    pub(crate) fn from_code(code: i16) -> Option<Self> {
        Some(match code {
            0 => RecordState::InFlight,
            1 => RecordState::Completed,
            2 => RecordState::Unknown,
            3 => RecordState::Released,
            _ => return None,
        })
    }

    /// The lease a status reports: a record's lease ends when it settles (completes or is
    /// released), so a settled record reports `completed_at`; otherwise `lease_expires_at`.
    pub(crate) fn lease_shown(
        self,
        lease_expires_at: Timestamp,
        completed_at: Option<Timestamp>,
    ) -> Timestamp {
        match (self, completed_at) {
            (RecordState::Completed | RecordState::Released, Some(at)) => at,
            _ => lease_expires_at,
        }
    }

    /// A lowercase name for messages and logs: `in_flight`, `completed`, `unknown`, `released`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::InFlight => "in_flight",
            RecordState::Completed => "completed",
            RecordState::Unknown => "unknown",
            RecordState::Released => "released",
        }
    }
}

/// What a record means at a given time: the one reading that a repeat of the call, the status
/// tool and the admin CLI share, so they never tell two stories about one operation.
///
/// ```
/// use idempotency::store::{RecordState, Standing};
/// // Claimed, and nobody has renewed its lease since it passed: what a repeat is told.
/// assert_eq!(Standing::of(RecordState::InFlight, None, true, false), Standing::LeasePassed);
/// assert_eq!(Standing::LeasePassed.as_str(), "lease_passed");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Standing {
    /// Claimed and running: its worker renews the lease. Do not submit it again.
    InFlight,
    /// Claimed, and its lease passed without a renewal: its worker died or could not record.
    /// The outcome is unknown until it is settled (a repeat is told "outcome unknown").
    LeasePassed,
    /// Started, and its outcome was lost (timeout, panic, a failed record): unknown until
    /// settled; never run again by itself.
    Unknown,
    /// Completed with an `Ok` answer, replayed to repeats until its window ends.
    Completed,
    /// Completed with a definitive error, replayed to repeats until its window ends.
    Failed,
    /// Completed, and its window has ended: its answer is no longer replayed, and calling again
    /// runs the call again as a new operation.
    Expired,
    /// Given back: nothing was done. Calling again runs it (under the same reference).
    Released,
    /// The reference names an earlier operation of a key that has moved on (it completed and its
    /// window passed; the same call was made again since).
    Superseded,
}

impl Standing {
    /// The one decision: a record in `state` (with `ok`, for a completed one, whether its answer
    /// is `Ok`), whose lease has or has not passed and whose replay window has or has not ended,
    /// by whoever's clock reads the record.
    pub fn of(
        state: RecordState,
        ok: Option<bool>,
        lease_passed: bool,
        window_ended: bool,
    ) -> Self {
        match state {
            RecordState::InFlight if lease_passed => Standing::LeasePassed,
            RecordState::InFlight => Standing::InFlight,
            RecordState::Unknown => Standing::Unknown,
            RecordState::Released => Standing::Released,
            RecordState::Completed if window_ended => Standing::Expired,
            RecordState::Completed if ok == Some(false) => Standing::Failed,
            RecordState::Completed => Standing::Completed,
        }
    }

    /// A lowercase name for messages, logs and the admin CLI: `in_flight`, `lease_passed`,
    /// `unknown`, `completed`, `failed`, `expired`, `released`, `superseded`.
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::InFlight => "in_flight",
            Standing::LeasePassed => "lease_passed",
            Standing::Unknown => "unknown",
            Standing::Completed => "completed",
            Standing::Failed => "failed",
            Standing::Expired => "expired",
            Standing::Released => "released",
            Standing::Superseded => "superseded",
        }
    }
}

impl std::fmt::Display for Standing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored answer: whether the handler returned `Ok` or a definitive `Err`, and the JSON of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    /// `true` for `Ok(T)`, `false` for a definitive error.
    pub ok: bool,
    /// The JSON text of `T` (or of the error).
    pub body: String,
}

/// What the status lookup reports about one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordStatus {
    /// The operation's reference.
    pub reference: Reference,
    /// The tool it belongs to.
    pub tool: String,
    /// Where it is in its life.
    pub state: RecordState,
    /// When it was (last) claimed.
    pub claimed_at: Timestamp,
    /// When the in-flight lease ends; once completed or released, when it settled (the lease
    /// ended then).
    pub lease_expires_at: Timestamp,
    /// When it completed (or was settled), if it did.
    pub completed_at: Option<Timestamp>,
    /// Until when it answers repeats, once completed.
    pub expires_at: Option<Timestamp>,
    /// The stored answer, once completed.
    pub response: Option<StoredResponse>,
    /// The store's own clock when it read the record, for a store whose times are its server's
    /// (PostgreSQL, Redis: per shard on a cluster); `None` for a store on the engine's clock
    /// (memory, SQLite, a store told to trust the engine's clock). [`RecordStatus::standing`]
    /// judges the lease and the window by it, so a reader whose clock is off never reads a live
    /// call as gone, or a live answer as expired.
    pub read_at: Option<Timestamp>,
}

impl RecordStatus {
    /// What this record means to someone who asked about `asked` (the reference they hold):
    /// [`Standing::of`] on its state and times, or [`Standing::Superseded`] when the key has
    /// moved on past `asked`'s operation. Judged on the store's clock ([`RecordStatus::read_at`]);
    /// `now`, the reader's clock, only for a store that has none of its own.
    pub fn standing(&self, asked: Reference, now: Timestamp) -> Standing {
        if self.reference.generation() > asked.generation() {
            return Standing::Superseded;
        }
        let now = self.read_at.unwrap_or(now);
        Standing::of(
            self.state,
            self.response.as_ref().map(|r| r.ok),
            now >= self.lease_expires_at,
            self.expires_at.is_some_and(|e| now >= e),
        )
    }
}
