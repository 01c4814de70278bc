//! What the SQL stores share: the migration runner ([`migrate`](self::migrate)), the record row (one logical row on both
//! backends, see [`RecordRow`]) read back into the store's answers (the decisions are
//! `MemoryStore`'s, line for line), and error mapping. The records' SQL stays in each backend's
//! file.

use crate::clock::Timestamp;
use crate::key::{Key, Reference};
use crate::record::RecordState;
use crate::store::{OutboxEntry, Receipt, Settlement, StoreError, Token, Unsettled};

mod admin;
mod fence;
mod migrate;
mod row;
pub(crate) mod secret;
mod transaction;

pub(crate) use admin::{admin_record, admin_stats, sql_admin, AdminRow};
pub(crate) use fence::{fenced_query, Fence, SqlPool};
pub(crate) use migrate::{is_current, migrate, Bookkeeping, Migration};
pub(crate) use row::RecordRow;
pub(crate) use transaction::{kept, roll_back, take_back, SharedConnection, TxConnection};

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
