//! [`PostgresStore`]: what to run when one machine is not enough. Every replica of the server
//! shares one database; the primary key makes exactly one replica win each claim.
//!
//! The primary key is the reference itself: the key's first 8 bytes as a `BIGINT`, with the
//! other 24 bytes beside it. Downstream systems deduplicate on the reference, so no two live
//! records may share one; the primary key makes that a rule (a different key whose reference is
//! held gets [`StoreError::ReferenceTaken`]), keeps each index entry at 16 bytes, and makes a
//! status lookup a primary-key probe. See `migrations/postgres/0001_records.sql` for the row
//! (the SQLite store keeps the same one).
//!
//! Every call is one statement, so one round trip: a fresh claim is one insert, a repeat the same
//! statement returning the row it found; a completion is a single `UPDATE` (with its outbox
//! messages, a single statement that updates and inserts). Two cases take a second statement: a
//! claim that finds a released or window-expired record of its own key takes it over, and a
//! rejected update reads the row again to say why.

use std::time::Duration;

use sqlx::postgres::PgPool;
use sqlx::{Row, ValueRef};

use super::sql::{self, db_error, raced, ref_of, ref_value, rest_of, RecordRow, CLAIM_ATTEMPTS};
use super::transition::dispatch;
use super::{
    BoxFuture, Claim, ClaimRequest, RecordStore, StoreError, Token, Transition, Transitioned, Wake,
};
use crate::clock::Timestamp;
use crate::key::{Key, Reference};
use crate::record::{RecordState, RecordStatus};

mod admin;
mod background;
mod connect;
mod notices;
mod secret;
mod statements;
mod transaction;
mod writes;

use statements::{
    ends_and_completed, ends_at, server_clock, CLAIM, CLAIM_ON_SERVER_CLOCK, TAKEOVER,
};

/// The row a [`CLAIM`] found, from its whole-row column: the record's columns in the
/// migration's order (`ref` … `response`), with the other stores' `ends_at` and `completed_at`
/// worked out as [`ends_and_completed!`] does in SQL.
fn found_row(value: sqlx::postgres::PgValueRef<'_>) -> Result<RecordRow, sqlx::Error> {
    let decode = |e| sqlx::Error::Decode(e);
    let mut r = sqlx::postgres::types::PgRecordDecoder::new(value).map_err(decode)?;
    let _ref: i64 = r.try_decode().map_err(decode)?;
    let _token: i64 = r.try_decode().map_err(decode)?;
    let claimed_at: i64 = r.try_decode().map_err(decode)?;
    let lease_or_settled_at: i64 = r.try_decode().map_err(decode)?;
    let window_s: i32 = r.try_decode().map_err(decode)?;
    let generation: i32 = r.try_decode().map_err(decode)?;
    let state: i16 = r.try_decode().map_err(decode)?;
    let _watched: bool = r.try_decode().map_err(decode)?;
    let key_rest: Vec<u8> = r.try_decode().map_err(decode)?;
    let _tenant: String = r.try_decode().map_err(decode)?;
    let _subject: String = r.try_decode().map_err(decode)?;
    let _tool: String = r.try_decode().map_err(decode)?;
    let fingerprint: Vec<u8> = r.try_decode().map_err(decode)?;
    let response: Option<String> = r.try_decode().map_err(decode)?;
    let unsettled = matches!(
        RecordState::from_code(state),
        Some(RecordState::InFlight | RecordState::Unknown)
    );
    Ok(RecordRow {
        key_rest,
        generation,
        state,
        fingerprint,
        claimed_at,
        ends_at: if unsettled {
            lease_or_settled_at
        } else {
            lease_or_settled_at.saturating_add(1000 * i64::from(window_s))
        },
        completed_at: (!unsettled).then_some(lease_or_settled_at),
        response,
    })
}

/// A window's length as the row keeps it (`window_s`): whole seconds, rounded up (see the
/// migration), saturating.
fn window_s(window: Duration) -> i32 {
    i32::try_from(window.as_secs() + u64::from(window.subsec_nanos() > 0)).unwrap_or(i32::MAX)
}

/// A [`Store`](super::Store) on PostgreSQL, for servers with several replicas.
///
/// ```no_run
/// # async fn demo() -> Result<(), idempotency::store::StoreError> {
/// use idempotency::{store::PostgresStore, Idempotency};
/// let store = PostgresStore::connect("postgres://app@db.internal/app").await?;
/// let engine = Idempotency::new(store);
/// # let _ = engine; Ok(()) }
/// ```
///
/// ## Plans
///
/// sqlx prepares each statement once per connection and PostgreSQL may then switch it to a
/// generic plan. A generic plan made while `idempotency_records` was empty (and analysed) is a
/// sequential scan, and it stays one as the table grows. The connections this store opens
/// therefore run with `enable_seqscan = off` and `jit = off` ([`PostgresStore::tune`]): every
/// statement it runs has an index plan (the per-call ones the primary key; purge and the
/// reconciler's round `idempotency_records_window`, see [`Maintenance`](super::Maintenance)),
/// so generic plans use an index whatever the table's size when they were made.
/// (`plan_cache_mode = force_custom_plan` would also do, but planning the
/// claim on every call costs about 0.1 ms, doubling a repeat's latency.)
///
/// ## Time
///
/// Replicas' clocks disagree; the database's is the one they share. Every statement reads the
/// server's clock (`statement_timestamp()`) and keeps only the durations the engine chose (the
/// lease, the window, the retention), so a replica whose clock is minutes ahead or behind claims,
/// replays, expires leases and purges exactly as one whose clock is right. A completion is never
/// recorded earlier than its claim, so the database's clock stepping back cannot end a window
/// early either.
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pool: PgPool,
    /// `Some(offset)`: the server's clock plus `offset` ms (0 outside tests); `None`: the
    /// engine's times as given (tests that move time by hand).
    clock_offset: Option<i64>,
    /// Settlement notices for waiting repeats, shared by the store's clones.
    notices: std::sync::Arc<notices::Notices>,
}

/// `claim`'s times moved from the server's clock to the caller's (`t - shift`), so that a lease
/// the server counts as live is live by the caller's `now` too.
fn in_callers_frame(claim: Claim, shift: i64) -> Claim {
    let back = |t: Timestamp| Timestamp::from_millis(t.as_millis().saturating_sub(shift));
    match claim {
        Claim::InFlight {
            reference,
            claimed_at,
            lease_expires_at,
        } => Claim::InFlight {
            reference,
            claimed_at: back(claimed_at),
            lease_expires_at: back(lease_expires_at),
        },
        Claim::Completed {
            reference,
            response,
            completed_at,
        } => Claim::Completed {
            reference,
            response,
            completed_at: back(completed_at),
        },
        Claim::Unknown { reference, since } => Claim::Unknown {
            reference,
            since: back(since),
        },
        other => other,
    }
}

impl RecordStore for PostgresStore {
    /// The database server's clock (the engine's only in tests that move time by hand).
    fn window_clock(&self) -> super::WindowClock {
        match self.clock_offset {
            Some(_) => super::WindowClock::Own,
            None => super::WindowClock::Engine,
        }
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let fingerprint = req
                .fingerprint
                .as_ref()
                .map_or(&[][..], |f| &f.as_bytes()[..]);
            let window_s = window_s(req.window);
            // `$1` … `$5`, the same in every claim statement.
            let head = |sql: &'static str| {
                sqlx::query(sql)
                    .bind(ref_of(&req.key))
                    .bind(rest_of(&req.key))
                    .bind(req.tenant)
                    .bind(req.tool)
                    .bind(fingerprint)
            };
            let bound = |sql| {
                head(sql)
                    .bind(req.now.as_millis())
                    .bind((req.now + req.lease).as_millis())
                    .bind(req.token.0)
                    .bind(req.subject.unwrap_or(""))
                    .bind(self.clock_offset)
                    .bind(window_s)
            };
            let claim = || match self.clock_offset {
                Some(0) => head(CLAIM_ON_SERVER_CLOCK)
                    .bind(
                        (req.now + req.lease)
                            .as_millis()
                            .saturating_sub(req.now.as_millis()),
                    )
                    .bind(req.token.0)
                    .bind(req.subject.unwrap_or(""))
                    .bind(window_s),
                _ => bound(CLAIM),
            };
            for _ in 0..CLAIM_ATTEMPTS {
                let row = claim().fetch_optional(&self.pool).await.map_err(db_error)?;
                let Some(row) = row else {
                    return Ok(Claim::New {
                        reference: req.key.reference(1),
                        token: req.token,
                    });
                };
                let found = row.try_get_raw(0).map_err(db_error)?;
                if found.is_null() {
                    continue;
                }
                let rec = found_row(found).map_err(db_error)?;
                let clock: i64 = row.try_get(1).map_err(db_error)?;
                let clock = Timestamp::from_millis(clock);
                if let Some(answer) = rec.existing_claim(&req.key, &req.fingerprint, clock)? {
                    // Judged by the server's clock, answered in the caller's: the engine
                    // compares the lease end with its own `now`.
                    return Ok(in_callers_frame(
                        answer,
                        clock.as_millis() - req.now.as_millis(),
                    ));
                }
                let taken = bound(TAKEOVER)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db_error)?;
                if let Some(row) = taken {
                    let generation: i32 = row.try_get(0).map_err(db_error)?;
                    let token: i64 = row.try_get(1).map_err(db_error)?;
                    return Ok(Claim::New {
                        reference: req
                            .key
                            .reference(sql::generation_of(i64::from(generation))?),
                        token: Token(token),
                    });
                }
            }
            Err(raced("the claim", CLAIM_ATTEMPTS))
        })
    }

    /// A primary-key probe: the reference is the primary key.
    fn status<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>> {
        Box::pin(async move {
            // A generation below 1 is read, and refused as corrupt, rather than hidden.
            let row = sqlx::query(concat!(
                "SELECT tool, key_rest, generation, state, fingerprint, claimed_at, ",
                ends_and_completed!(),
                ", response, ",
                server_clock!(),
                " FROM idempotency_records WHERE ref = $1 AND tenant = $2 AND (generation >= $3 OR generation < 1) \
                 AND (subject = '' OR subject = $4)"
            ))
            .bind(ref_value(&reference))
            .bind(tenant)
            .bind(i64::from(reference.generation()))
            .bind(subject)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
            let Some(row) = row else { return Ok(None) };
            let tool: String = row.try_get(0).map_err(db_error)?;
            let server: i64 = row.try_get(9).map_err(db_error)?;
            // Judged on the server's clock (shifted as every statement of this store is), or
            // the engine's for a store told to trust it.
            let read_at = self
                .clock_offset
                .map(|off| Timestamp::from_millis(server.saturating_add(off)));
            RecordRow::read(&row, 1)
                .map_err(db_error)?
                .status(reference, tool, read_at)
                .map(Some)
        })
    }

    /// A flag on the record and a notice from the migration's trigger (see `notices.rs`).
    fn transactions(&self) -> Option<&dyn super::TransactionalStore> {
        Some(self)
    }

    fn watch<'a>(
        &'a self,
        key: Key,
        reference: Reference,
        wake: Wake,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.notices.watch(&self.pool, key, reference, wake))
    }

    fn transition<'a>(
        &'a self,
        key: Key,
        token: Token,
        op: Transition<'a>,
    ) -> BoxFuture<'a, Result<Transitioned, StoreError>> {
        dispatch(self, key, token, op)
    }
}
