//! What the SQL stores share: the migrations bookkeeping, reading record rows back into the
//! store's answers (the decisions are `MemoryStore`'s, line for line), and error mapping. The SQL
//! itself stays in each backend's file.

use sha2::{Digest, Sha256};

use crate::clock::Timestamp;
use crate::key::{Fingerprint, Key, Reference};
use crate::record::{RecordState, RecordStatus, StoredResponse};
use crate::store::{Claim, OutboxEntry, Receipt, Settlement, StoreError, Token, Unsettled};

/// The library's own migrations table (never the application's `_sqlx_migrations`).
pub(crate) const MIGRATIONS_TABLE: &str = "idempotency_migrations";

/// How often a claim runs again when a concurrent writer changed the row under it (rare: a
/// conflicting insert committed after the statement's snapshot, or a concurrent takeover).
pub(crate) const CLAIM_ATTEMPTS: usize = 5;

/// How often a fenced update runs again when its follow-up read finds the row in a state the
/// update should have matched (the row was purged and claimed again in between).
pub(crate) const FENCE_ATTEMPTS: usize = 3;

/// An embedded migration: its version, a description and its SQL (several statements).
#[derive(Debug)]
pub(crate) struct Migration {
    pub version: i64,
    pub description: &'static str,
    pub sql: &'static str,
}

impl Migration {
    /// sha256 of the SQL with line endings normalised, so a CRLF checkout does not look edited.
    pub fn checksum(&self) -> Vec<u8> {
        let mut h = Sha256::new();
        for part in self.sql.split('\r') {
            h.update(part.as_bytes());
        }
        h.finalize().to_vec()
    }
}

/// The migrations of `known` that a database recording `applied` (version, checksum) still
/// needs, in order. Refuses a database that records a version this build does not know (it was
/// migrated by a newer build) or a known version whose SQL has changed since it was applied.
pub(crate) fn pending<'m>(
    known: &'m [Migration],
    applied: &[(i64, Vec<u8>)],
    place: &str,
) -> Result<Vec<&'m Migration>, StoreError> {
    let newest = known.iter().map(|m| m.version).max().unwrap_or(0);
    for (version, checksum) in applied {
        match known.iter().find(|m| m.version == *version) {
            None => {
                return Err(StoreError::migration(format!(
                    "{place} records migration {version} in {MIGRATIONS_TABLE}, which this build of the idempotency \
                     crate does not know (it knows 1 to {newest}): a newer build migrated it. Upgrade this server, \
                     or give it its own {place}"
                )))
            }
            Some(m) if m.checksum() != *checksum => {
                return Err(StoreError::migration(format!(
                    "migration {version} ({}) recorded in {MIGRATIONS_TABLE} differs from the one this build embeds; \
                     applied migrations must not change",
                    m.description
                )))
            }
            Some(_) => {}
        }
    }
    let mut todo: Vec<&Migration> = known
        .iter()
        .filter(|m| !applied.iter().any(|(v, _)| *v == m.version))
        .collect();
    todo.sort_by_key(|m| m.version);
    Ok(todo)
}

/// A migration statement failed: say which one.
pub(crate) fn migration_failed(m: &Migration, e: sqlx::Error) -> StoreError {
    StoreError::Migration {
        problem: format!("migration {} ({}) failed", m.version, m.description),
        source: Some(Box::new(e)),
    }
}

/// The migrations' own bookkeeping failed (the lock, the migrations table).
pub(crate) fn migration_error(e: sqlx::Error) -> StoreError {
    StoreError::Migration {
        problem: format!("the {MIGRATIONS_TABLE} bookkeeping failed"),
        source: Some(Box::new(e)),
    }
}

/// A database error: undecodable values are [`StoreError::Corrupt`], everything else
/// [`StoreError::Unavailable`].
pub(crate) fn db_error(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_) => StoreError::Corrupt {
            problem: "a column of a record could not be read".into(),
            source: Some(Box::new(e)),
        },
        e => StoreError::Unavailable(Box::new(e)),
    }
}

/// A store call that kept losing races with concurrent writers.
pub(crate) fn raced(operation: &'static str, attempts: usize) -> StoreError {
    StoreError::Contention {
        operation,
        attempts,
    }
}

pub(crate) fn key_of(bytes: &[u8]) -> Result<Key, StoreError> {
    Key::from_slice(bytes)
        .ok_or_else(|| StoreError::corrupt(format!("a key is {} bytes long, not 32", bytes.len())))
}

pub(crate) fn generation_of(g: i64) -> Result<u32, StoreError> {
    u32::try_from(g)
        .ok()
        .filter(|g| *g >= 1)
        .ok_or_else(|| StoreError::corrupt(format!("generation {g} is out of range")))
}

pub(crate) fn state_of(code: i16) -> Result<RecordState, StoreError> {
    RecordState::from_code(code)
        .ok_or_else(|| StoreError::corrupt(format!("unknown record state {code}")))
}

/// The columns of a record row that decide a claim and answer a status.
pub(crate) struct RecordRow {
    pub generation: i64,
    pub state: i16,
    pub fingerprint: Option<Vec<u8>>,
    pub claimed_at: i64,
    pub lease_expires_at: i64,
    pub completed_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub ok: Option<bool>,
    pub response: Option<String>,
}

impl RecordRow {
    fn response(&self) -> Option<StoredResponse> {
        match (&self.response, self.ok) {
            (Some(body), Some(ok)) => Some(StoredResponse {
                ok,
                body: body.clone(),
            }),
            _ => None,
        }
    }

    /// The answer to a claim that found this row and did not insert or take it over; `None`
    /// when the row is one a claim takes over (released, or completed with its window passed at
    /// `now`): the takeover lost a race with a concurrent writer, so the caller claims again.
    pub fn existing_claim(
        &self,
        key: &Key,
        fingerprint: &Option<Fingerprint>,
        now: Timestamp,
    ) -> Result<Option<Claim>, StoreError> {
        let reference = key.reference(generation_of(self.generation)?);
        let state = state_of(self.state)?;
        let expired =
            state == RecordState::Completed && self.expires_at.is_none_or(|e| now.as_millis() >= e);
        if state == RecordState::Released || expired {
            return Ok(None);
        }
        let stored = match &self.fingerprint {
            Some(b) => Some(Fingerprint::from_slice(b).ok_or_else(|| {
                StoreError::corrupt(format!(
                    "the fingerprint of ref {reference} is not 32 bytes"
                ))
            })?),
            None => None,
        };
        if matches!((&stored, fingerprint), (Some(a), Some(b)) if a != b) {
            return Ok(Some(Claim::Mismatch { reference }));
        }
        Ok(Some(match state {
            RecordState::InFlight => Claim::InFlight {
                reference,
                claimed_at: Timestamp::from_millis(self.claimed_at),
                lease_expires_at: Timestamp::from_millis(self.lease_expires_at),
            },
            RecordState::Unknown => Claim::Unknown {
                reference,
                since: Timestamp::from_millis(self.claimed_at),
            },
            _ => match (self.response(), self.completed_at) {
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

    pub fn status(&self, reference: Reference, tool: String) -> Result<RecordStatus, StoreError> {
        let state = state_of(self.state)?;
        Ok(RecordStatus {
            reference,
            tool,
            state,
            claimed_at: Timestamp::from_millis(self.claimed_at),
            lease_expires_at: state.lease_shown(
                Timestamp::from_millis(self.lease_expires_at),
                self.completed_at.map(Timestamp::from_millis),
            ),
            completed_at: self.completed_at.map(Timestamp::from_millis),
            expires_at: self.expires_at.map(Timestamp::from_millis),
            response: self.response(),
        })
    }
}

/// Why a fenced update changed nothing, from the row as a follow-up read found it (`None`: no
/// row): `Err` with the answer, or `Ok(())` when the row now matches what the update required
/// (it was purged and claimed again in between), so the update should run again.
pub(crate) fn why_fenced(
    key: &Key,
    token: Token,
    row: Option<(i64, i64, i16)>,
    allowed: &[RecordState],
) -> Result<(), StoreError> {
    let Some((generation, current, code)) = row else {
        return Err(StoreError::NotFound);
    };
    let reference = key.reference(generation_of(generation)?);
    if current != token.0 {
        return Err(StoreError::Fenced { reference });
    }
    let state = state_of(code)?;
    if !allowed.contains(&state) {
        return Err(StoreError::WrongState {
            reference,
            state: state.as_str(),
        });
    }
    Ok(())
}

/// An unsettled row as read: key, generation, tenant, tool, state, token, claimed_at.
pub(crate) type UnsettledRow<G> = (Vec<u8>, G, String, String, i16, i64, i64);

/// An unsettled row read back.
pub(crate) fn unsettled<G: Into<i64>>(row: UnsettledRow<G>) -> Result<Unsettled, StoreError> {
    let (key, generation, tenant, tool, code, token, claimed_at) = row;
    let key = key_of(&key)?;
    Ok(Unsettled {
        key,
        reference: key.reference(generation_of(generation.into())?),
        tenant,
        tool,
        state: state_of(code)?,
        token: Token(token),
        claimed_at: Timestamp::from_millis(claimed_at),
    })
}

/// The row id an outbox receipt of the SQL stores carries.
pub(crate) fn receipt_id(receipt: &Receipt) -> Result<i64, StoreError> {
    receipt
        .as_str()
        .parse()
        .map_err(|_| StoreError::ForeignReceipt {
            receipt: receipt.as_str().to_owned(),
        })
}

/// An outbox row as read: id, key, generation, topic, payload, attempts before this one.
pub(crate) type OutboxRow<G> = (i64, Vec<u8>, G, String, String, i32);

/// Outbox rows read back, oldest (lowest id) first.
pub(crate) fn outbox_entries<G: Into<i64>>(
    rows: Vec<OutboxRow<G>>,
) -> Result<Vec<OutboxEntry>, StoreError> {
    let mut rows = rows;
    rows.sort_by_key(|r| r.0);
    rows.into_iter()
        .map(|(id, key, generation, topic, payload, attempts)| {
            Ok(OutboxEntry {
                receipt: Receipt::new(id.to_string()),
                reference: key_of(&key)?.reference(generation_of(generation.into())?),
                topic,
                payload,
                attempts,
            })
        })
        .collect()
}

/// The columns a settlement writes: state, ok, response, completed_at, expires_at. A completed
/// answer is replayed until `expires_at`; a released record stops answering at once.
#[allow(clippy::type_complexity)]
pub(crate) fn settlement_columns(
    settlement: &Settlement,
    now: Timestamp,
    expires_at: Timestamp,
) -> (
    RecordState,
    Option<bool>,
    Option<&str>,
    Option<i64>,
    Option<i64>,
) {
    match settlement {
        Settlement::Completed(r) => (
            RecordState::Completed,
            Some(r.ok),
            Some(r.body.as_str()),
            Some(now.as_millis()),
            Some(expires_at.as_millis()),
        ),
        Settlement::Released => (
            RecordState::Released,
            None,
            None,
            Some(now.as_millis()),
            Some(now.as_millis()),
        ),
        Settlement::Unknown => (RecordState::Unknown, None, None, None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The SQL of both stores spells the state codes as literals.
    #[test]
    fn state_codes_match_the_sql() {
        assert_eq!(RecordState::InFlight.code(), 0);
        assert_eq!(RecordState::Completed.code(), 1);
        assert_eq!(RecordState::Unknown.code(), 2);
        assert_eq!(RecordState::Released.code(), 3);
    }

    #[test]
    fn unknown_or_edited_migrations_are_refused() {
        const KNOWN: &[Migration] = &[
            Migration {
                version: 1,
                description: "one",
                sql: "CREATE TABLE a (x INT);\n",
            },
            Migration {
                version: 2,
                description: "two",
                sql: "CREATE TABLE b (x INT);\n",
            },
        ];
        let sum = |i: usize| KNOWN[i].checksum();
        let todo = pending(KNOWN, &[(1, sum(0))], "schema").unwrap();
        assert_eq!(todo.iter().map(|m| m.version).collect::<Vec<_>>(), vec![2]);
        assert!(pending(KNOWN, &[(1, sum(0)), (2, sum(1))], "schema")
            .unwrap()
            .is_empty());
        let err = pending(KNOWN, &[(1, sum(0)), (3, vec![0])], "schema")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("migration 3") && err.contains("newer build"),
            "{err}"
        );
        let err = pending(KNOWN, &[(1, vec![0])], "schema")
            .unwrap_err()
            .to_string();
        assert!(err.contains("differs"), "{err}");
        let crlf = Migration {
            version: 1,
            description: "one",
            sql: "CREATE TABLE a (x INT);\r\n",
        };
        assert_eq!(crlf.checksum(), sum(0));
    }
}
