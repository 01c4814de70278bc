//! The record row of the SQL stores, the same on both backends, read back into the store's
//! answers: an existing record's claim answer and its status (the decisions are `MemoryStore`'s,
//! line for line).

use sqlx::{ColumnIndex, Decode, Row, Type};

use super::{generation_of, rest_of, split_state};
use crate::clock::Timestamp;
use crate::key::{Fingerprint, Key, Reference};
use crate::record::{RecordState, RecordStatus, StoredResponse};
use crate::store::{Claim, StoreError};

/// A record row, the same on both SQL backends (the migrations give the types): its primary key
/// `ref` ([`ref_of`]) is not read back, the caller knows it.
pub(crate) struct RecordRow {
    /// The key's other 24 bytes: a different key's record when they differ from the caller's.
    pub key_rest: Vec<u8>,
    pub generation: i32,
    /// [`state_code`]: in flight, completed (Ok or error), unknown or released.
    pub state: i16,
    /// Empty for a record with no arguments fingerprint (a call key's).
    pub fingerprint: Vec<u8>,
    pub claimed_at: i64,
    /// The lease's end while in flight or unknown; the end of the replay window once completed
    /// or released (a settled record's lease ended at `completed_at`).
    pub ends_at: i64,
    pub completed_at: Option<i64>,
    pub response: Option<String>,
}

impl RecordRow {
    /// Reads `key_rest, generation, state, fingerprint, claimed_at, ends_at, completed_at,
    /// response` from column `at` on.
    pub(in crate::store) fn read<'r, R: Row>(r: &'r R, at: usize) -> Result<Self, sqlx::Error>
    where
        usize: ColumnIndex<R>,
        i16: Decode<'r, R::Database> + Type<R::Database>,
        i32: Decode<'r, R::Database> + Type<R::Database>,
        i64: Decode<'r, R::Database> + Type<R::Database>,
        Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
        String: Decode<'r, R::Database> + Type<R::Database>,
    {
        Ok(RecordRow {
            key_rest: r.try_get(at)?,
            generation: r.try_get(at + 1)?,
            state: r.try_get(at + 2)?,
            fingerprint: r.try_get(at + 3)?,
            claimed_at: r.try_get(at + 4)?,
            ends_at: r.try_get(at + 5)?,
            completed_at: r.try_get(at + 6)?,
            response: r.try_get(at + 7)?,
        })
    }

    /// The generation a call that takes this row over runs under (the row is released, or
    /// completed with its window passed): a released record's own, an expired one's next. As the
    /// claim statements' `CASE WHEN state = 3 THEN generation ELSE generation + 1 END`.
    pub(in crate::store) fn next_generation(&self) -> Result<u32, StoreError> {
        let released = self.state == super::state_code(RecordState::Released, None);
        generation_of(i64::from(self.generation) + i64::from(!released))
    }

    fn response(&self, ok: Option<bool>) -> Option<StoredResponse> {
        match (&self.response, ok) {
            (Some(body), Some(ok)) => Some(StoredResponse {
                ok,
                body: body.clone(),
            }),
            _ => None,
        }
    }

    /// The answer to a claim of `key` that found this row under its `ref` and did not insert or
    /// take it over. Another key's record holds the reference: [`StoreError::ReferenceTaken`]
    /// (whatever its state, until it is purged). `None` when the row is one a claim takes over
    /// (released, or completed with its window passed at `now`): the takeover lost a race with a
    /// concurrent writer, so the caller claims again.
    pub(in crate::store) fn existing_claim(
        &self,
        key: &Key,
        fingerprint: &Option<Fingerprint>,
        now: Timestamp,
    ) -> Result<Option<Claim>, StoreError> {
        let reference = key.reference(generation_of(i64::from(self.generation))?);
        if self.key_rest.len() != rest_of(key).len() {
            return Err(StoreError::corrupt(format!(
                "the record holding ref {reference} has a key_rest of {} bytes, not 24",
                self.key_rest.len()
            )));
        }
        if self.key_rest != rest_of(key) {
            // Same first 8 bytes, so the same reference prefix: the holder's generation.
            return Err(StoreError::ReferenceTaken { reference });
        }
        let (state, ok) = split_state(self.state)?;
        let expired = state == RecordState::Completed && now.as_millis() >= self.ends_at;
        if state == RecordState::Released || expired {
            return Ok(None);
        }
        let stored = match &self.fingerprint[..] {
            [] => None,
            b => Some(Fingerprint::from_slice(b).ok_or_else(|| {
                StoreError::corrupt(format!(
                    "the fingerprint of ref {reference} is not 32 bytes"
                ))
            })?),
        };
        if matches!((&stored, fingerprint), (Some(a), Some(b)) if a != b) {
            return Ok(Some(Claim::Mismatch { reference }));
        }
        Ok(Some(match state {
            RecordState::InFlight => Claim::InFlight {
                reference,
                claimed_at: Timestamp::from_millis(self.claimed_at),
                lease_expires_at: Timestamp::from_millis(self.ends_at),
            },
            RecordState::Unknown => Claim::Unknown {
                reference,
                since: Timestamp::from_millis(self.claimed_at),
            },
            _ => match (self.response(ok), self.completed_at) {
                (Some(response), Some(at)) => Claim::Completed {
                    reference,
                    response,
                    completed_at: Timestamp::from_millis(at),
                },
                _ => {
                    return Err(StoreError::corrupt(format!(
                        "ref {reference} is completed without an answer"
                    )))
                }
            },
        }))
    }

    /// The row as the status tool shows it, checked as a claim would read it: a row a claim
    /// refuses as corrupt is corrupt here too. `read_at`: the store's clock at the read, if it
    /// has one of its own ([`RecordStatus::read_at`]).
    pub(in crate::store) fn status(
        &self,
        reference: Reference,
        tool: String,
        read_at: Option<Timestamp>,
    ) -> Result<RecordStatus, StoreError> {
        let (state, ok) = split_state(self.state)?;
        let generation = generation_of(i64::from(self.generation))?;
        let reference = reference.with_generation(generation);
        if self.key_rest.len() != 24 {
            return Err(StoreError::corrupt(format!(
                "the record of ref {reference} has a key_rest of {} bytes, not 24",
                self.key_rest.len()
            )));
        }
        if !matches!(self.fingerprint.len(), 0 | 32) {
            return Err(StoreError::corrupt(format!(
                "the fingerprint of ref {reference} is not 32 bytes"
            )));
        }
        if state == RecordState::Completed
            && (self.response(ok).is_none() || self.completed_at.is_none())
        {
            return Err(StoreError::corrupt(format!(
                "ref {reference} is completed without an answer"
            )));
        }
        let settled = matches!(state, RecordState::Completed | RecordState::Released);
        let ends_at = Timestamp::from_millis(self.ends_at);
        Ok(RecordStatus {
            reference,
            tool,
            state,
            claimed_at: Timestamp::from_millis(self.claimed_at),
            lease_expires_at: state
                .lease_shown(ends_at, self.completed_at.map(Timestamp::from_millis)),
            completed_at: self.completed_at.map(Timestamp::from_millis),
            expires_at: settled.then_some(ends_at),
            response: self.response(ok),
            read_at,
        })
    }
}
