//! What both SQL stores run alike on their pool ([`SqlPool`]), above all the fenced updates: an
//! update that matches the key's row only under the caller's token and in the states it allows,
//! run again (at most [`FENCE_ATTEMPTS`] times) while a follow-up read of the row finds that it
//! should have matched; and why one (or a takeover) changed nothing, from that read.

use sqlx::query::Query;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use super::{
    db_error, generation_of, raced, receipt_id, ref_of, rest_of, split_state, FENCE_ATTEMPTS,
};
use crate::key::Key;
use crate::record::RecordState;
use crate::store::{Receipt, StoreError, Token, WORKER_SETTLES};

/// The row under a key's `ref` now, for [`why_fenced`] and [`why_not_taken`]: [`FenceRow`].
const ROW_NOW: &str =
    "SELECT generation, token, state, key_rest FROM idempotency_records WHERE ref = $1";

/// Marks an in-flight record's outcome unknown ([`Fence::MARK_UNKNOWN`]); the same statement on
/// both backends. Parameters: [`fenced_query`]'s.
const MARK_UNKNOWN: &str = "UPDATE idempotency_records SET state = 2 \
     WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state = 0";

/// A database the SQL stores run on: how many rows a statement changed (sqlx has no trait for
/// it), and the types the fenced statements bind and read.
pub(crate) trait SqlDatabase: Database
where
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    i64: Encode<'static, Self> + Type<Self>,
    Vec<u8>: Encode<'static, Self> + Type<Self>,
    FenceRow: for<'r> FromRow<'r, Self::Row>,
{
    /// The rows `done` changed.
    fn changed(done: &Self::QueryResult) -> u64;
}

#[cfg(feature = "postgres")]
impl SqlDatabase for sqlx::Postgres {
    fn changed(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }
}

#[cfg(feature = "sqlite")]
impl SqlDatabase for sqlx::Sqlite {
    fn changed(done: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        done.rows_affected()
    }
}

/// A fenced statement's first three parameters: `$1` ref, `$2` key_rest, `$3` token.
pub(crate) fn fenced_query<DB>(
    sql: &'static str,
    key: &Key,
    token: Token,
) -> Query<'static, DB, DB::Arguments>
where
    DB: Database,
    i64: Encode<'static, DB> + Type<DB>,
    Vec<u8>: Encode<'static, DB> + Type<DB>,
{
    sqlx::query(sql)
        .bind(ref_of(key))
        .bind(rest_of(key).to_vec())
        .bind(token.0)
}

/// What the SQL stores run alike on their pool: the fenced updates, and the outbox's
/// acknowledgement.
pub(crate) trait SqlPool<DB: Database> {
    /// Why an update fenced to the `allowed` states under `token` changed nothing, from the
    /// row under the key's `ref` now: `Err` with the answer, or `Ok(())` when the row now matches
    /// (purged and claimed again in between), so the update should run again.
    async fn why_fenced(
        &self,
        key: &Key,
        token: Token,
        allowed: &[RecordState],
    ) -> Result<(), StoreError>;

    /// Why a takeover changed nothing, from the row under the key's `ref` now.
    async fn why_not_taken(&self, key: &Key) -> StoreError;

    /// Runs a fenced update built by `query` (each attempt builds it anew: a sqlx query is
    /// spent by running it); when it changes nothing, reads the row to say why, or runs it again
    /// when the row now matches (purged and claimed again in between).
    async fn fenced(
        &self,
        key: &Key,
        token: Token,
        fence: Fence,
        query: impl Fn() -> Query<'static, DB, DB::Arguments> + Send,
    ) -> Result<(), StoreError>;

    /// Marks the in-flight record of `key` held under `token` outcome unknown.
    async fn mark_unknown(&self, key: Key, token: Token) -> Result<(), StoreError>;

    /// Deletes the delivered outbox message `receipt` names.
    async fn ack(&self, receipt: &Receipt) -> Result<(), StoreError>;
}

impl<DB> SqlPool<DB> for Pool<DB>
where
    DB: SqlDatabase,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    i64: Encode<'static, DB> + Type<DB>,
    Vec<u8>: Encode<'static, DB> + Type<DB>,
    FenceRow: for<'r> FromRow<'r, DB::Row>,
    DB::Arguments: IntoArguments<DB>,
{
    async fn why_fenced(
        &self,
        key: &Key,
        token: Token,
        allowed: &[RecordState],
    ) -> Result<(), StoreError> {
        why_fenced(key, token, row_now(self, key).await?, allowed)
    }

    async fn why_not_taken(&self, key: &Key) -> StoreError {
        match row_now(self, key).await {
            Ok(row) => why_not_taken(key, row),
            Err(e) => e,
        }
    }

    async fn fenced(
        &self,
        key: &Key,
        token: Token,
        fence: Fence,
        query: impl Fn() -> Query<'static, DB, DB::Arguments> + Send,
    ) -> Result<(), StoreError> {
        for _ in 0..FENCE_ATTEMPTS {
            let done = query().execute(self).await.map_err(db_error)?;
            if DB::changed(&done) > 0 {
                return Ok(());
            }
            self.why_fenced(key, token, fence.allowed).await?;
        }
        Err(raced(fence.what, FENCE_ATTEMPTS))
    }

    async fn mark_unknown(&self, key: Key, token: Token) -> Result<(), StoreError> {
        let mark = || fenced_query(MARK_UNKNOWN, &key, token);
        self.fenced(&key, token, Fence::MARK_UNKNOWN, mark).await
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), StoreError> {
        let id = receipt_id(receipt)?;
        sqlx::query("DELETE FROM idempotency_outbox WHERE id = $1")
            .bind(id)
            .execute(self)
            .await
            .map_err(db_error)?;
        Ok(())
    }
}

/// What a fenced update requires: the states it applies in, and what it is (for the error when
/// it keeps losing races).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fence {
    pub(crate) allowed: &'static [RecordState],
    pub(crate) what: &'static str,
}

impl Fence {
    pub(crate) const COMPLETION: Fence = Fence {
        allowed: WORKER_SETTLES,
        what: "the completion",
    };
    pub(crate) const RELEASE: Fence = Fence {
        allowed: WORKER_SETTLES,
        what: "the release",
    };
    pub(crate) const MARK_UNKNOWN: Fence = Fence {
        allowed: &[RecordState::InFlight],
        what: "marking the outcome unknown",
    };
    pub(crate) const RENEWAL: Fence = Fence {
        allowed: &[RecordState::InFlight],
        what: "the lease renewal",
    };
    pub(crate) const SETTLEMENT: Fence = Fence {
        allowed: &[RecordState::InFlight, RecordState::Unknown],
        what: "the settlement",
    };
}

/// The row under the key's `ref` now (`None`: there is none).
async fn row_now<DB>(pool: &Pool<DB>, key: &Key) -> Result<Option<FenceRow>, StoreError>
where
    DB: SqlDatabase,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    i64: Encode<'static, DB> + Type<DB>,
    Vec<u8>: Encode<'static, DB> + Type<DB>,
    FenceRow: for<'r> FromRow<'r, DB::Row>,
    DB::Arguments: IntoArguments<DB>,
{
    sqlx::query_as(ROW_NOW)
        .bind(ref_of(key))
        .fetch_optional(pool)
        .await
        .map_err(db_error)
}

/// What a fenced update's follow-up read finds under the key's `ref`: generation, token,
/// state, key_rest.
type FenceRow = (i32, i64, i16, Vec<u8>);

/// Why a fenced update changed nothing, from the row as a follow-up read found it (`None`: no
/// row): `Err` with the answer, or `Ok(())` when the row now matches what the update required
/// (it was purged and claimed again in between), so the update should run again.
fn why_fenced(
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

/// Why a takeover ([`Transition::TakeOver`](crate::store::Transition::TakeOver)) changed
/// nothing, from the row as a follow-up read found it (`None`: no row): no record of this key,
/// or one in a state (or with a live lease) a takeover may not touch.
fn why_not_taken(key: &Key, row: Option<FenceRow>) -> StoreError {
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
