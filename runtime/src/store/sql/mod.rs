//! What the SQL stores share: the migration runner ([`migrate`](self::migrate)), the record row (one logical row on both
//! backends, see [`RecordRow`]) read back into the store's answers (the decisions are
//! `MemoryStore`'s, line for line), and error mapping. The records' SQL stays in each backend's
//! file.

use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::clock::Timestamp;
use crate::key::{Fingerprint, Key, Reference};
use crate::record::{RecordState, RecordStatus, StoredResponse};
use crate::store::{Claim, OutboxEntry, Receipt, Settlement, StoreError, Token, Unsettled};

mod migrate;
pub(crate) mod secret;

pub(crate) use migrate::{migrate, Bookkeeping, Migration};

/// How often a claim runs again when a concurrent writer changed the row under it (rare: a
/// conflicting insert committed after the statement's snapshot, or a concurrent takeover).
pub(crate) const CLAIM_ATTEMPTS: usize = 5;

/// How often a fenced update runs again when its follow-up read finds the row in a state the
/// update should have matched (the row was purged and claimed again in between).
pub(crate) const FENCE_ATTEMPTS: usize = 3;

/// A database error, classified:
///
/// - [`StoreError::Corrupt`]: a value of a record cannot be read (wrong type, undecodable, a
///   column missing), or the database says its data is damaged or of the wrong type (SQLite
///   `CORRUPT`, `NOTADB`, `MISMATCH`; PostgreSQL data exceptions, class `22`, such as an
///   overflow computing with a stored value, and `XX001`/`XX002` data or index corruption).
///   Trying again finds it the same.
/// - [`StoreError::Config`]: sqlx was configured wrongly (a bad connection string or option).
/// - [`StoreError::Unavailable`], everything else: unreachable, timed out, a dropped connection,
///   a pool that is exhausted or closed, a database that is busy or locked, shutting down, a
///   standby (read only), out of resources, or a transaction that lost a serialization race.
pub(crate) fn db_error(e: sqlx::Error) -> StoreError {
    let corrupt = |problem: &str, e: sqlx::Error| StoreError::Corrupt {
        problem: problem.into(),
        source: Some(Box::new(e)),
    };
    match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. } => {
            corrupt("a column of a record could not be read", e)
        }
        sqlx::Error::Configuration(_) => StoreError::Config {
            problem: "the database connection is configured wrongly".into(),
            source: Some(Box::new(e)),
        },
        sqlx::Error::Database(ref d) if damaged(d.code().as_deref()) => {
            corrupt("the database says a record's data is damaged", e)
        }
        e => StoreError::Unavailable(Box::new(e)),
    }
}

/// Whether a database error code says the data itself is damaged or of the wrong type: SQLite's
/// (extended) result codes `CORRUPT` (11), `NOTADB` (26), `MISMATCH` (20); PostgreSQL's SQLSTATE
/// class `22` (data exception) and `XX001`/`XX002` (data or index corrupted). Not `22021` and
/// `22P05`: text the call sent (a tenant, a tool name) the database's encoding cannot hold.
fn damaged(code: Option<&str>) -> bool {
    match code {
        // A SQLSTATE is five characters; SQLite's extended codes are below 10,000.
        Some(state) if state.len() == 5 => {
            (state.starts_with("22") && !matches!(state, "22021" | "22P05"))
                || matches!(state, "XX001" | "XX002")
        }
        Some(sqlite) => sqlite
            .parse::<i64>()
            .is_ok_and(|n| matches!(n & 0xff, 11 | 20 | 26)),
        None => false,
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
    pub(super) fn read<'r, R: Row>(r: &'r R, at: usize) -> Result<Self, sqlx::Error>
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
    pub(super) fn existing_claim(
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
    /// refuses as corrupt is corrupt here too.
    pub(super) fn status(
        &self,
        reference: Reference,
        tool: String,
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

/// Why a takeover ([`RecordStore::take_over`](crate::store::RecordStore::take_over)) changed
/// nothing, from the row as a follow-up read found it (`None`: no row): no record of this key,
/// or one in a state (or with a live lease) a takeover may not touch.
pub(crate) fn why_not_taken(key: &Key, row: Option<FenceRow>) -> StoreError {
    let Some((generation, _, code, _)) = row.filter(|r| r.3 == rest_of(key)) else {
        return StoreError::NotFound;
    };
    match (generation_of(i64::from(generation)), split_state(code)) {
        (Ok(g), Ok((state, _))) => StoreError::WrongState {
            reference: key.reference(g),
            state: state.as_str(),
        },
        (Err(e), _) | (_, Err(e)) => e,
    }
}

/// An unsettled row as read: ref, key_rest, generation, tenant, subject, tool, state, token,
/// claimed_at, the window in ms.
pub(crate) type UnsettledRow = (
    i64,
    Vec<u8>,
    i32,
    String,
    String,
    String,
    i16,
    i64,
    i64,
    i64,
);

/// An unsettled row read back.
pub(crate) fn unsettled(row: UnsettledRow) -> Result<Unsettled, StoreError> {
    let (r, rest, generation, tenant, subject, tool, code, token, claimed_at, window_ms) = row;
    let window = u64::try_from(window_ms).map_err(|_| {
        StoreError::corrupt(format!(
            "the window of ref {r:016x} is {window_ms} ms, below zero"
        ))
    })?;
    let key = key_from(r, &rest)?;
    Ok(Unsettled {
        key,
        reference: key.reference(generation_of(i64::from(generation))?),
        tenant,
        subject: (!subject.is_empty()).then_some(subject),
        tool,
        state: split_state(code)?.0,
        token: Token(token),
        claimed_at: Timestamp::from_millis(claimed_at),
        window: std::time::Duration::from_millis(window),
    })
}

/// A record row as the admin reads select it (both backends, every value widened to BIGINT):
/// tenant, subject, tool, generation, state, claimed_at, ends_at, completed_at, window (ms),
/// response.
pub(crate) type AdminRow = (
    String,
    String,
    String,
    i64,
    i64,
    i64,
    i64,
    Option<i64>,
    i64,
    Option<String>,
);

/// An admin row read back as the record `reference` names (its generation the row's).
pub(crate) fn admin_record(
    reference: Reference,
    row: AdminRow,
) -> Result<crate::store::AdminRecord, StoreError> {
    let (
        tenant,
        subject,
        tool,
        generation,
        code,
        claimed_at,
        ends_at,
        completed_at,
        window,
        response,
    ) = row;
    let (state, ok) = split_state(i16::try_from(code).unwrap_or(i16::MAX))?;
    let window = u64::try_from(window).map_err(|_| {
        StoreError::corrupt(format!(
            "the window of ref {reference} is {window} ms, below zero"
        ))
    })?;
    Ok(crate::store::AdminRecord {
        reference: reference.with_generation(generation_of(generation)?),
        tenant,
        subject: (!subject.is_empty()).then_some(subject),
        tool,
        state,
        error_answer: ok == Some(false),
        claimed_at: Timestamp::from_millis(claimed_at),
        ends_at: Timestamp::from_millis(ends_at),
        completed_at: completed_at.map(Timestamp::from_millis),
        window: std::time::Duration::from_millis(window),
        answer: response,
    })
}

/// Stats from groups of (state, tool, whether `ends_at` has passed (1/0), records), the oldest
/// claim in flight and the table's size.
pub(crate) fn admin_stats(
    groups: Vec<(i64, String, i64, i64)>,
    oldest_in_flight: Option<i64>,
    bytes: i64,
) -> Result<crate::store::StoreStats, StoreError> {
    let mut stats = crate::store::StoreStats {
        oldest_in_flight: oldest_in_flight.map(Timestamp::from_millis),
        bytes: u64::try_from(bytes).unwrap_or(0),
        ..Default::default()
    };
    for (code, tool, passed, n) in groups {
        let (state, ok) = split_state(i16::try_from(code).unwrap_or(i16::MAX)).map_err(|_| {
            StoreError::corrupt(format!(
                "{n} records of tool {tool} have the state code {code}, which this version does not know"
            ))
        })?;
        let passed = passed != 0;
        let standing = crate::record::Standing::of(state, ok, passed, passed);
        stats.count(&tool, standing, u64::try_from(n).unwrap_or(0));
    }
    Ok(stats.sorted())
}

/// The [`SecretStore`](crate::store::SecretStore) of a SQL store, the same on both backends:
/// each backend's `secret.rs` names its `INSERT` of the first fingerprint (`INSTALL`) and
/// invokes this.
macro_rules! sql_secret {
    ($store:ty) => {
        impl $crate::store::SecretStore for $store {
            fn swap_secret(
                &self,
                expected: Option<$crate::key::SecretFingerprint>,
                new: $crate::key::SecretFingerprint,
            ) -> $crate::store::BoxFuture<
                '_,
                Result<Option<$crate::key::SecretFingerprint>, $crate::store::StoreError>,
            > {
                Box::pin(async move {
                    let new = new.as_bytes().to_vec();
                    let query = match expected {
                        None => sqlx::query_scalar(INSTALL).bind(new),
                        Some(e) => sqlx::query_scalar($crate::store::sql::secret::ROTATE)
                            .bind(e.as_bytes().to_vec())
                            .bind(new),
                    };
                    let found: Option<Vec<u8>> = query
                        .fetch_optional(&self.pool)
                        .await
                        .map_err($crate::store::sql::db_error)?;
                    $crate::store::sql::secret::stored(found)
                })
            }
        }
    };
}
pub(crate) use sql_secret;

/// The [`Admin`](crate::store::Admin) reads of a SQL store, the same on both backends: each
/// backend's `admin.rs` names its statements (`RECORD`, `BY_STATE`, `OLDEST_IN_FLIGHT`, `SIZE`,
/// `PURGEABLE`: the columns [`AdminRow`] and [`admin_stats`] read) and invokes this.
macro_rules! sql_admin {
    ($store:ty) => {
        impl $crate::store::Admin for $store {
            fn record(
                &self,
                reference: $crate::key::Reference,
            ) -> $crate::store::BoxFuture<
                '_,
                Result<Option<$crate::store::AdminRecord>, $crate::store::StoreError>,
            > {
                Box::pin(async move {
                    let row: Option<$crate::store::sql::AdminRow> = sqlx::query_as(RECORD)
                        .bind($crate::store::sql::ref_value(&reference))
                        .fetch_optional(&self.pool)
                        .await
                        .map_err($crate::store::sql::db_error)?;
                    row.map(|r| $crate::store::sql::admin_record(reference, r))
                        .transpose()
                })
            }

            fn stats(
                &self,
                now: $crate::clock::Timestamp,
            ) -> $crate::store::BoxFuture<
                '_,
                Result<$crate::store::StoreStats, $crate::store::StoreError>,
            > {
                Box::pin(async move {
                    let groups = sqlx::query_as(BY_STATE)
                        .bind(now.as_millis())
                        .fetch_all(&self.pool)
                        .await
                        .map_err($crate::store::sql::db_error)?;
                    let oldest = sqlx::query_scalar(OLDEST_IN_FLIGHT)
                        .fetch_one(&self.pool)
                        .await
                        .map_err($crate::store::sql::db_error)?;
                    let bytes = sqlx::query_scalar(SIZE)
                        .fetch_one(&self.pool)
                        .await
                        .map_err($crate::store::sql::db_error)?;
                    $crate::store::sql::admin_stats(groups, oldest, bytes)
                })
            }

            fn purgeable(
                &self,
                _now: $crate::clock::Timestamp,
                older_than: $crate::clock::Timestamp,
            ) -> $crate::store::BoxFuture<'_, Result<u64, $crate::store::StoreError>> {
                Box::pin(async move {
                    let n: i64 = sqlx::query_scalar(PURGEABLE)
                        .bind(older_than.as_millis())
                        .fetch_one(&self.pool)
                        .await
                        .map_err($crate::store::sql::db_error)?;
                    Ok(u64::try_from(n).unwrap_or(0))
                })
            }
        }
    };
}
pub(crate) use sql_admin;

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

/// The columns a settlement writes: state (its [`state_code`]), response, completed_at (`None`
/// for unknown). The window's end follows from the state in each backend's statement: a
/// completed answer is replayed for the record's own window, a released record stops answering
/// at once, an unknown one keeps its lease's end.
pub(crate) fn settlement_columns(
    settlement: &Settlement,
    now: Timestamp,
) -> (i16, Option<&str>, Option<i64>) {
    match settlement {
        Settlement::Completed(r) => (
            state_code(RecordState::Completed, Some(r.ok)),
            Some(r.body.as_str()),
            Some(now.as_millis()),
        ),
        Settlement::Released => (RecordState::Released.code(), None, Some(now.as_millis())),
        Settlement::Unknown => (RecordState::Unknown.code(), None, None),
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
    fn damage_is_told_from_passing_failures() {
        for code in ["11", "267", "26", "20", "22003", "22P02", "XX001", "XX002"] {
            assert!(damaged(Some(code)), "{code}");
        }
        for code in [
            "5", "517", "6", "13", "40001", "40P01", "57P01", "08006", "53300", "25006", "22021",
            "22P05",
        ] {
            assert!(!damaged(Some(code)), "{code}");
        }
        assert!(!damaged(None));
        assert!(db_error(sqlx::Error::PoolTimedOut).is_transient());
        assert!(matches!(
            db_error(sqlx::Error::ColumnIndexOutOfBounds { index: 9, len: 3 }),
            StoreError::Corrupt { .. }
        ));
    }

    /// A stored error is its own group (`failed`), never a second `completed` of the same tool;
    /// a completed record whose window passed is `expired`; an in-flight one whose lease passed
    /// is `lease_passed`.
    #[test]
    fn admin_stats_group_by_standing() {
        let groups = vec![
            (1, "charge".to_owned(), 0, 5),
            (4, "charge".to_owned(), 0, 2),
            (1, "charge".to_owned(), 1, 3),
            (0, "charge".to_owned(), 1, 1),
            (0, "ship".to_owned(), 0, 4),
        ];
        let stats = admin_stats(groups, Some(7), 4096).unwrap();
        let names: Vec<(&str, &str, u64)> = stats
            .by_tool_and_standing
            .iter()
            .map(|(t, s, n)| (t.as_str(), s.as_str(), *n))
            .collect();
        assert_eq!(
            names,
            [
                ("charge", "completed", 5),
                ("charge", "expired", 3),
                ("charge", "failed", 2),
                ("charge", "lease_passed", 1),
                ("ship", "in_flight", 4),
            ]
        );
        assert_eq!(stats.records, 15);
        assert!(admin_stats(vec![(9, "x".into(), 0, 1)], None, 0).is_err());
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
}
