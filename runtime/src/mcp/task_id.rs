//! MCP task ids: one task id names one claim of a record, `{reference}@{claim time in ms}`, the
//! claim time being the store's. Every store gives each new claim of a record a later claim
//! time than the one before it, so a call sent again after its attempt was released (a
//! retryable error: nothing was done) is a new task, and the old id keeps the terminal state of
//! its own attempt. A takeover of a call whose worker is gone (`recover = "rerun"`) continues
//! the claim (the store keeps its time): the task id stays, and it completes that task.

use std::fmt;

use crate::clock::Timestamp;
use crate::record::RecordStatus;
use crate::Reference;

/// The claim a task id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TaskId {
    /// The operation's reference (what the downstream system deduplicates on).
    pub(crate) reference: Reference,
    /// The store's time of the claim.
    pub(crate) claimed_at: Timestamp,
}

/// What became of the claim a task id names, by the record as it is now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The record's claim is this one: its state is the task's.
    Current,
    /// The record was claimed again since (same operation, so this claim was released: nothing
    /// was done under it). Terminal: `failed`.
    Superseded,
}

impl TaskId {
    /// The id of the claim `status` holds now.
    pub(crate) fn of(status: &RecordStatus) -> Self {
        TaskId {
            reference: status.reference,
            claimed_at: status.claimed_at,
        }
    }

    /// The id in `text`; `None` for anything this module did not write.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let (reference, ms) = text.split_once('@')?;
        if ms.is_empty() || !ms.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(TaskId {
            reference: reference.parse().ok()?,
            claimed_at: Timestamp::from_millis(ms.parse().ok()?),
        })
    }

    /// What became of this claim, by the record `status` read under its reference; `None` when
    /// the record is not this claim's (another operation of the key, or an id it never gave).
    pub(crate) fn attempt(&self, status: &RecordStatus) -> Option<Attempt> {
        if status.reference != self.reference {
            return None;
        }
        match status.claimed_at.cmp(&self.claimed_at) {
            std::cmp::Ordering::Equal => Some(Attempt::Current),
            std::cmp::Ordering::Greater => Some(Attempt::Superseded),
            std::cmp::Ordering::Less => None,
        }
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.reference, self.claimed_at.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RecordState;

    fn status(reference: &str, claimed_at: i64) -> RecordStatus {
        RecordStatus {
            reference: reference.parse().expect("a reference"),
            tool: "export_rows".into(),
            state: RecordState::InFlight,
            claimed_at: Timestamp::from_millis(claimed_at),
            lease_expires_at: Timestamp::from_millis(claimed_at + 30_000),
            completed_at: None,
            expires_at: None,
            response: None,
            read_at: None,
        }
    }

    #[test]
    fn an_id_is_its_reference_and_claim_time_and_reads_back() {
        let id = TaskId::of(&status("3f9a0c1b2d4e5f60-2", 1_765_000_000_123));
        assert_eq!(id.to_string(), "3f9a0c1b2d4e5f60-2@1765000000123");
        assert_eq!(TaskId::parse(&id.to_string()), Some(id));
        for bad in [
            "3f9a0c1b2d4e5f60-2",
            "3f9a0c1b2d4e5f60-2@",
            "3f9a0c1b2d4e5f60-2@-5",
            "3f9a0c1b2d4e5f60-2@+5",
            "3f9a0c1b2d4e5f60-2@1@2",
            "nonsense@5",
            "3f9a0c1b2d4e5f60-2@99999999999999999999",
        ] {
            assert_eq!(TaskId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_later_claim_supersedes_an_id_and_an_earlier_or_other_record_is_not_its() {
        let id = TaskId::of(&status("3f9a0c1b2d4e5f60-1", 5_000));
        assert_eq!(
            id.attempt(&status("3f9a0c1b2d4e5f60-1", 5_000)),
            Some(Attempt::Current)
        );
        assert_eq!(
            id.attempt(&status("3f9a0c1b2d4e5f60-1", 5_001)),
            Some(Attempt::Superseded)
        );
        assert_eq!(id.attempt(&status("3f9a0c1b2d4e5f60-1", 4_999)), None);
        assert_eq!(id.attempt(&status("3f9a0c1b2d4e5f60-2", 9_000)), None);
    }
}
