//! What the SQL stores share: the migration runner, the record row (one logical row on both
//! backends, see [`RecordRow`]) read back into the store's answers (the decisions are
//! `MemoryStore`'s, line for line), and error mapping. The records' SQL stays in each backend's
//! file.

use sha2::{Digest, Sha256};
use sqlx::{
    AssertSqlSafe, ColumnIndex, Connection, Database, Decode, Encode, Executor, IntoArguments,
    Pool, Row, Type,
};

use crate::clock::Timestamp;
use crate::key::{Fingerprint, Key, Reference};
use crate::record::{RecordState, RecordStatus, StoredResponse};
use crate::store::{Claim, OutboxEntry, Receipt, Settlement, StoreError, Token, Unsettled};

/// The library's own migrations table (never the application's `_sqlx_migrations`).
const MIGRATIONS_TABLE: &str = "idempotency_migrations";

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
fn pending<'m>(
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

/// What the migration runner needs from a backend: a few statements of its own dialect. The
/// bookkeeping statements themselves (read the applied versions, record one) are the same SQL
/// on both.
pub(crate) struct Bookkeeping {
    /// Opens the one transaction everything runs in.
    pub begin: &'static str,
    /// Runs first in that transaction and serialises concurrent runs until it ends, if `begin`
    /// does not already (SQLite's `BEGIN IMMEDIATE` takes the file's write lock).
    pub lock: Option<&'static str>,
    /// One row, one nullable text column: the migrations table's name if it exists. (A check
    /// rather than `CREATE TABLE IF NOT EXISTS`: PostgreSQL requires the CREATE privilege on the
    /// schema even when the table exists, and logs a notice on every start.)
    pub exists: &'static str,
    /// Creates the migrations table: `version`, `description`, `checksum`, `applied_at`.
    pub create: &'static str,
    /// Where the records live, for messages: "this schema", "this database file".
    pub place: &'static str,
}

/// Applies the migrations of `known` that the database lacks, in one transaction (opened by
/// `b.begin`, locked by `b.lock`), and records each in [`MIGRATIONS_TABLE`] in that same
/// transaction, so a failed migration leaves nothing behind. Refuses a database recording a
/// migration this build does not know, or one whose SQL changed ([`pending`]).
pub(crate) async fn migrate<DB>(
    pool: &Pool<DB>,
    known: &[Migration],
    b: &Bookkeeping,
) -> Result<(), StoreError>
where
    DB: Database,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Vec<u8>: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> String: Decode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let mig = migration_error;
    let mut conn = pool.acquire().await.map_err(db_error)?;
    // `AssertSqlSafe` (it is a constant): with the `&'static str` impl, this generic fn's future
    // fails the callers' `Send` check ("implementation of `SqlSafeStr` is not general enough").
    let mut tx = conn.begin_with(AssertSqlSafe(b.begin)).await.map_err(mig)?;
    if let Some(lock) = b.lock {
        sqlx::query(lock).execute(&mut *tx).await.map_err(mig)?;
    }
    let exists: Option<String> = sqlx::query_scalar(b.exists)
        .fetch_one(&mut *tx)
        .await
        .map_err(mig)?;
    if exists.is_none() {
        sqlx::query(b.create).execute(&mut *tx).await.map_err(mig)?;
    }
    let rows = sqlx::query("SELECT version, checksum FROM idempotency_migrations ORDER BY version")
        .fetch_all(&mut *tx)
        .await
        .map_err(mig)?;
    let applied = rows
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<Vec<(i64, Vec<u8>)>, sqlx::Error>>()
        .map_err(mig)?;
    for m in pending(known, &applied, b.place)? {
        sqlx::raw_sql(m.sql)
            .execute(&mut *tx)
            .await
            .map_err(|e| migration_failed(m, e))?;
        sqlx::query(
            "INSERT INTO idempotency_migrations (version, description, checksum) VALUES ($1, $2, $3)",
        )
        .bind(m.version)
        .bind(m.description)
        .bind(m.checksum())
        .execute(&mut *tx)
        .await
        .map_err(|e| migration_failed(m, e))?;
    }
    tx.commit().await.map_err(mig)
}

/// A migration statement failed: say which one.
fn migration_failed(m: &Migration, e: sqlx::Error) -> StoreError {
    StoreError::Migration {
        problem: format!("migration {} ({}) failed", m.version, m.description),
        source: Some(Box::new(e)),
    }
}

/// The migrations' own bookkeeping failed (the lock, the migrations table).
fn migration_error(e: sqlx::Error) -> StoreError {
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

fn key_of(bytes: &[u8]) -> Result<Key, StoreError> {
    Key::from_slice(bytes)
        .ok_or_else(|| StoreError::corrupt(format!("a key is {} bytes long, not 32", bytes.len())))
}

/// A record row's primary key, `ref`: the key's first 8 bytes (its references' prefix),
/// big-endian, as a signed 64-bit integer.
pub(crate) fn ref_of(key: &Key) -> i64 {
    ref_value(&key.reference(1))
}

/// The `ref` a reference names.
pub(crate) fn ref_value(reference: &Reference) -> i64 {
    i64::from_be_bytes(*reference.prefix())
}

/// A record row's `key_rest`: the key's other 24 bytes.
pub(crate) fn rest_of(key: &Key) -> &[u8] {
    &key.as_bytes()[8..]
}

/// The key of a record row, put back together from `ref` and `key_rest`.
fn key_from(r: i64, rest: &[u8]) -> Result<Key, StoreError> {
    let rest: &[u8; 24] = rest.try_into().map_err(|_| {
        StoreError::corrupt(format!(
            "the key_rest of ref {r:016x} is {} bytes long, not 24",
            rest.len()
        ))
    })?;
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&r.to_be_bytes());
    bytes[8..].copy_from_slice(rest);
    Ok(Key::from_bytes(bytes))
}

pub(crate) fn generation_of(g: i64) -> Result<u32, StoreError> {
    u32::try_from(g)
        .ok()
        .filter(|g| *g >= 1)
        .ok_or_else(|| StoreError::corrupt(format!("generation {g} is out of range")))
}

/// The `state` code of a record completed with a definitive error. The other codes are
/// [`RecordState::code`]; a completed record's `ok` is folded into its state (1 Ok, 4 error).
const COMPLETED_ERR: i16 = 4;

/// A record's `state` column: [`RecordState::code`], with a completed record's `ok` folded in.
pub(crate) fn state_code(state: RecordState, ok: Option<bool>) -> i16 {
    match (state, ok) {
        (RecordState::Completed, Some(false)) => COMPLETED_ERR,
        _ => state.code(),
    }
}

/// The inverse of [`state_code`]: the state and, for a completed record, whether its answer is
/// `Ok`.
fn split_state(code: i16) -> Result<(RecordState, Option<bool>), StoreError> {
    match (code, RecordState::from_code(code)) {
        (COMPLETED_ERR, _) => Ok((RecordState::Completed, Some(false))),
        (_, Some(RecordState::Completed)) => Ok((RecordState::Completed, Some(true))),
        (_, Some(state)) => Ok((state, None)),
        (_, None) => Err(StoreError::corrupt(format!("unknown record state {code}"))),
    }
}

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
    pub fn read<'r, R: Row>(r: &'r R, at: usize) -> Result<Self, sqlx::Error>
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
    pub fn existing_claim(
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

    pub fn status(&self, reference: Reference, tool: String) -> Result<RecordStatus, StoreError> {
        let (state, ok) = split_state(self.state)?;
        let settled = matches!(state, RecordState::Completed | RecordState::Released);
        let ends_at = Timestamp::from_millis(self.ends_at);
        Ok(RecordStatus {
            reference: reference.with_generation(generation_of(i64::from(self.generation))?),
            tool,
            state,
            claimed_at: Timestamp::from_millis(self.claimed_at),
            lease_expires_at: state
                .lease_shown(ends_at, self.completed_at.map(Timestamp::from_millis)),
            completed_at: self.completed_at.map(Timestamp::from_millis),
            expires_at: settled.then_some(ends_at),
            response: self.response(ok),
        })
    }
}

/// What a fenced update's follow-up read finds under the key's `ref`: generation, token,
/// state, key_rest.
pub(crate) type FenceRow = (i32, i64, i16, Vec<u8>);

/// Why a fenced update changed nothing, from the row as a follow-up read found it (`None`: no
/// row): `Err` with the answer, or `Ok(())` when the row now matches what the update required
/// (it was purged and claimed again in between), so the update should run again.
pub(crate) fn why_fenced(
    key: &Key,
    token: Token,
    row: Option<FenceRow>,
    allowed: &[RecordState],
) -> Result<(), StoreError> {
    let Some((generation, current, code, _)) = row.filter(|r| r.3 == rest_of(key)) else {
        return Err(StoreError::NotFound);
    };
    let reference = key.reference(generation_of(i64::from(generation))?);
    if current != token.0 {
        return Err(StoreError::Fenced { reference });
    }
    let (state, _) = split_state(code)?;
    if !allowed.contains(&state) {
        return Err(StoreError::WrongState {
            reference,
            state: state.as_str(),
        });
    }
    Ok(())
}

/// An unsettled row as read: ref, key_rest, generation, tenant, tool, state, token, claimed_at.
pub(crate) type UnsettledRow = (i64, Vec<u8>, i32, String, String, i16, i64, i64);

/// An unsettled row read back.
pub(crate) fn unsettled(row: UnsettledRow) -> Result<Unsettled, StoreError> {
    let (r, rest, generation, tenant, tool, code, token, claimed_at) = row;
    let key = key_from(r, &rest)?;
    Ok(Unsettled {
        key,
        reference: key.reference(generation_of(i64::from(generation))?),
        tenant,
        tool,
        state: split_state(code)?.0,
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

/// The columns a settlement writes: state (its [`state_code`]), response, completed_at,
/// ends_at (`None`: keep the lease's end). A completed answer is replayed until `expires_at`; a
/// released record stops answering at once.
pub(crate) fn settlement_columns(
    settlement: &Settlement,
    now: Timestamp,
    expires_at: Timestamp,
) -> (i16, Option<&str>, Option<i64>, Option<i64>) {
    match settlement {
        Settlement::Completed(r) => (
            state_code(RecordState::Completed, Some(r.ok)),
            Some(r.body.as_str()),
            Some(now.as_millis()),
            Some(expires_at.as_millis()),
        ),
        Settlement::Released => (
            RecordState::Released.code(),
            None,
            Some(now.as_millis()),
            Some(now.as_millis()),
        ),
        Settlement::Unknown => (RecordState::Unknown.code(), None, None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The SQL of both stores spells the state codes as literals.
    #[test]
    fn state_codes_match_the_sql() {
        use RecordState::*;
        let codes = [
            (InFlight, None, 0),
            (Completed, Some(true), 1),
            (Unknown, None, 2),
            (Released, None, 3),
            (Completed, Some(false), 4),
        ];
        for (state, ok, code) in codes {
            assert_eq!(state_code(state, ok), code);
            assert_eq!(split_state(code).unwrap(), (state, ok));
        }
        assert!(matches!(split_state(5), Err(StoreError::Corrupt { .. })));
    }

    #[test]
    fn a_key_is_its_ref_and_key_rest() {
        for first in [0x00u8, 0x7f, 0x80, 0xff] {
            let mut bytes = [first; 32];
            bytes[31] = 1;
            let key = Key::from_bytes(bytes);
            assert_eq!(key_from(ref_of(&key), rest_of(&key)).unwrap(), key);
            assert_eq!(ref_of(&key).to_be_bytes()[..], bytes[..8]);
        }
        assert!(key_from(1, &[0; 2]).is_err());
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
