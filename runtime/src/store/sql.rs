//! What the SQL stores share: reading a record row back into the store's answers, the
//! migrations list, and error mapping. The SQL itself stays in each backend's file.

use crate::clock::Timestamp;
use crate::key::{Fingerprint, Key, Reference};
use crate::record::{RecordState, RecordStatus, StoredResponse};
use crate::store::{Claim, StoreError, Unsettled, Token};

/// A migration: its version and its SQL (several statements).
pub(crate) struct Migration {
    pub version: i64,
    pub description: &'static str,
    pub sql: &'static str,
}

/// The name of the library's own migrations table (never the application's `_sqlx_migrations`).
pub(crate) const MIGRATIONS_TABLE: &str = "idempotency_migrations";

pub(crate) fn unavailable(e: sqlx::Error) -> StoreError {
    StoreError::Unavailable(Box::new(e))
}

/// The columns of a record row that decide a claim and a status.
pub(crate) struct RecordRow {
    pub generation: i64,
    pub state: i16,
    pub fingerprint: Option<Vec<u8>>,
    pub token: i64,
    pub claimed_at: i64,
    pub lease_expires_at: i64,
    pub completed_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub ok: Option<bool>,
    pub response: Option<String>,
}

fn generation(g: i64) -> Result<u32, StoreError> {
    u32::try_from(g).map_err(|_| StoreError::Corrupt(format!("generation {g} is out of range")))
}

fn state(code: i16) -> Result<RecordState, StoreError> {
    RecordState::from_code(code).ok_or_else(|| StoreError::Corrupt(format!("unknown record state {code}")))
}

impl RecordRow {
    pub fn reference(&self, key: &Key) -> Result<Reference, StoreError> {
        Ok(key.reference(generation(self.generation)?))
    }

    fn response(&self) -> Option<StoredResponse> {
        match (&self.response, self.ok) {
            (Some(body), Some(ok)) => Some(StoredResponse { ok, body: body.clone() }),
            _ => None,
        }
    }

    /// The answer to a claim that did not insert or take over the row (see the table in
    /// `store/mod.rs`; `MemoryStore` is the reference).
    pub fn existing_claim(&self, key: &Key, fingerprint: &Option<Fingerprint>) -> Result<Claim, StoreError> {
        let reference = self.reference(key)?;
        let stored_fp = match &self.fingerprint {
            Some(b) => Some(Fingerprint::from_slice(b).ok_or_else(|| StoreError::Corrupt("fingerprint is not 32 bytes".into()))?),
            None => None,
        };
        if let (Some(a), Some(b)) = (&stored_fp, fingerprint) {
            if a != b {
                return Ok(Claim::Mismatch { reference });
            }
        }
        Ok(match state(self.state)? {
            RecordState::InFlight => Claim::InFlight {
                reference,
                claimed_at: Timestamp::from_millis(self.claimed_at),
                lease_expires_at: Timestamp::from_millis(self.lease_expires_at),
            },
            RecordState::Unknown => Claim::Unknown { reference, since: Timestamp::from_millis(self.claimed_at) },
            RecordState::Completed => match (self.response(), self.completed_at) {
                (Some(response), Some(at)) => Claim::Completed { reference, response, completed_at: Timestamp::from_millis(at) },
                _ => return Err(StoreError::Corrupt(format!("ref {reference} is completed without an answer"))),
            },
            // A released or expired row is always taken over by the claim statement; seeing one
            // here means it changed between the two halves of the statement: try again.
            RecordState::Released => return Err(StoreError::Unavailable("the record changed during the claim; retry".into())),
        })
    }

    pub fn status(&self, reference: Reference, tool: String) -> Result<RecordStatus, StoreError> {
        Ok(RecordStatus {
            reference,
            tool,
            state: state(self.state)?,
            claimed_at: Timestamp::from_millis(self.claimed_at),
            lease_expires_at: Timestamp::from_millis(self.lease_expires_at),
            completed_at: self.completed_at.map(Timestamp::from_millis),
            expires_at: self.expires_at.map(Timestamp::from_millis),
            response: self.response(),
        })
    }
}

/// Why a fenced update changed nothing, from the row as it is now (`None`: no row).
pub(crate) fn fenced_failure(key: &Key, token: Token, now: Option<(i64, i64, i16)>, allowed: &[RecordState]) -> StoreError {
    match now {
        None => StoreError::NotFound,
        Some((generation, current, code)) => {
            let reference = key.reference(u32::try_from(generation).unwrap_or(0));
            if current != token.0 {
                StoreError::Fenced { reference }
            } else {
                let st = RecordState::from_code(code);
                match st {
                    Some(s) if !allowed.contains(&s) => StoreError::WrongState { reference, state: s.as_str() },
                    Some(_) => StoreError::Unavailable("the record changed during the update; retry".into()),
                    None => StoreError::Corrupt(format!("unknown record state {code}")),
                }
            }
        }
    }
}

pub(crate) fn unsettled(key: &[u8], generation_: i64, tenant: String, tool: String, code: i16, token: i64, claimed_at: i64) -> Result<Unsettled, StoreError> {
    let key = Key::from_slice(key).ok_or_else(|| StoreError::Corrupt("key is not 32 bytes".into()))?;
    Ok(Unsettled {
        key,
        reference: key.reference(generation(generation_)?),
        tenant,
        tool,
        state: state(code)?,
        token: Token(token),
        claimed_at: Timestamp::from_millis(claimed_at),
    })
}

pub(crate) fn key_of(bytes: &[u8]) -> Result<Key, StoreError> {
    Key::from_slice(bytes).ok_or_else(|| StoreError::Corrupt("key is not 32 bytes".into()))
}

pub(crate) fn u32_gen(g: i64) -> Result<u32, StoreError> {
    generation(g)
}
