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
}
