//! Transactional calls on PostgreSQL ([`TransactionalStore`]): the call's key is held by a
//! transaction-level advisory lock, its record is written once, completed, by the statement
//! before `COMMIT`.
//!
//! Round trips of a fresh call, besides the handler's own statements: one simple query
//! (`BEGIN`, the lock, the record's row read after the lock), the record's insert, `COMMIT`: as
//! many as hand-written code that opens a transaction, inserts its row and commits. A repeat of a
//! completed call is the first of them; its transaction is ended in the background.
//!
//! The lock is the two-`int4` form of `pg_try_advisory_xact_lock` on the reference's two
//! halves (its key space is not the one-`bigint` form's that applications mostly use), the high
//! half XORed with the oid of the store's `idempotency_records` table: advisory locks belong to
//! the database, so without it a store in another schema of the same database (tests, a
//! schema per tenant, staging beside production) holding the same key would answer this one's
//! calls "in flight". It is taken in a statement of its own, before the statement that reads the
//! row, so the read's snapshot is taken after the lock: a transaction that held the key and
//! committed is seen. With it, the call takes a shared one-`bigint` lock naming its tenant and
//! key ([`tenant_lock`]): the status tool's [`RUNNING`] check answers only the caller's tenant.
//!
//! The transaction is bounded by the call's: `BEGIN` is sent with `SET LOCAL statement_timeout`
//! and `idle_in_transaction_session_timeout` at the call's bound plus [`SETTLE_GRACE`], so the
//! server ends a transaction whose worker is gone (its host down, the connection half-open, the
//! `COMMIT` never arriving) and frees the key then, not when TCP gives up hours later.
//!
//! The read is a statement prepared on the connection ([`PREPARE_READ`], run by `EXECUTE` in
//! the same simple query as `BEGIN` and the lock): planned once per connection instead of at
//! every call, which is most of what a fresh call's first round trip costs the server beyond a
//! bare `BEGIN`. A connection that does not have it yet (a new one, or one reset by `DISCARD
//! ALL`) answers the `EXECUTE` with `26000`; the call then rolls back, prepares it and begins
//! again in one more round trip. If that fails too (a pooler in transaction mode hands each
//! transaction another server connection, or a statement of that name is not this store's), the
//! call reads with literals, planned at that call: slower, never wrong.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use sqlx::{Postgres, Row};

use super::statements::{ends_and_completed, ends_at, server_clock};
use super::{in_callers_frame, window_s, PostgresStore};
use crate::clock::Timestamp;
use crate::key::{Key, Reference};
use crate::record::{RecordState, StoredResponse};
use crate::store::sql::{
    db_error, kept, ref_of, ref_value, rest_of, roll_back, state_code, take_back, RecordRow,
    SharedConnection, TxConnection,
};
use crate::store::transaction::SETTLE_GRACE;
use crate::store::{
    Begun, BoxFuture, Claim, ClaimRequest, CommitError, OpenTransaction, StoreError,
    TransactionalStore, TxOutcome,
};

/// The record, completed, in the call's transaction: inserted, or written over the key's
/// released or window-expired row. Nothing is written when the transaction is not the one the
/// call began (`$13`, its start in µs): the handler ended it itself.
///
/// `$1` ref, `$2` token, `$3` claimed_at, `$4` window_s, `$5` generation, `$6` state, `$7`
/// key_rest, `$8` tenant, `$9` subject, `$10` tool, `$11` fingerprint, `$12` response, `$13`
/// the transaction's start, `$14` the engine's now, `$15` the clock offset.
macro_rules! record_sql {
    () => {
        concat!(
            "INSERT INTO idempotency_records AS r
    (ref, token, claimed_at, window_s, lease_or_settled_at, generation, state, key_rest, tenant, subject, tool, fingerprint, response)
SELECT $1, $2, $3, $4, GREATEST(COALESCE(",
            server_clock!(),
            " + $15::BIGINT, $14::BIGINT), $3), $5, $6, $7, $8, $9, $10, $11, $12
WHERE (date_part('epoch', transaction_timestamp()) * 1000000)::BIGINT = $13
ON CONFLICT (ref) DO UPDATE SET token = EXCLUDED.token,
    claimed_at = GREATEST(EXCLUDED.claimed_at, r.claimed_at + 1),
    window_s = EXCLUDED.window_s, lease_or_settled_at = EXCLUDED.lease_or_settled_at,
    generation = EXCLUDED.generation, state = EXCLUDED.state, watched = false,
    tenant = EXCLUDED.tenant, subject = EXCLUDED.subject, tool = EXCLUDED.tool,
    fingerprint = EXCLUDED.fingerprint, response = EXCLUDED.response
WHERE r.key_rest = EXCLUDED.key_rest"
        )
    };
}

const RECORD: &str = record_sql!();

/// The name of [`PREPARE_READ`]'s statement on a connection.
const READ_NAME: &str = "idempotency_tx_read";

/// Prepares the read of a transactional call's record after its lock: `$1` ref, `$2` the
/// clock offset (NULL: the engine's time `$3` is taken as given). One row, with the record's
/// columns NULL when it has none.
macro_rules! read_sql {
    () => {
        concat!(
            "SELECT COALESCE(",
            server_clock!(),
            " + $2, $3), (date_part('epoch', transaction_timestamp()) * 1000000)::BIGINT, \
             key_rest, generation, state, fingerprint, claimed_at, ",
            ends_and_completed!(),
            ", response FROM (SELECT 1) AS one LEFT JOIN idempotency_records ON ref = $1"
        )
    };
}

const PREPARE_READ: &str = concat!(
    "PREPARE idempotency_tx_read (BIGINT, BIGINT, BIGINT) AS ",
    read_sql!()
);

/// The read itself, for the rare call whose connection cannot keep [`PREPARE_READ`] (behind a
/// pooler that hands each transaction another server connection): sent with its values as
/// literals (integers this store computed) and planned at that call.
const READ: &str = read_sql!();

/// The server's answer to `EXECUTE` of a statement the connection has not prepared.
fn unprepared(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("26000"))
}

/// [`RECORD`] with the call's outbox messages (`$16` topics, `$17` payloads), in the same
/// statement; answers with the number of records written (1, or 0 as [`RECORD`]).
const RECORD_WITH_OUTBOX: &str = concat!(
    "WITH rec AS (",
    record_sql!(),
    " RETURNING generation, lease_or_settled_at),
box AS (
    INSERT INTO idempotency_outbox (visible_at, generation, key, topic, payload)
    SELECT rec.lease_or_settled_at, rec.generation, int8send($1) || $7, m.topic, m.payload
    FROM rec CROSS JOIN unnest($16::TEXT[], $17::TEXT[]) WITH ORDINALITY AS m(topic, payload, n)
    ORDER BY m.n
)
SELECT count(*) FROM rec"
);

/// Whether a session of this database holds both advisory locks a transactional call of this
/// store takes for a reference: the key's (`$1` its high half, an `int4` scoped by the records
/// table's oid as `begin` scopes it, `$2` its low half as an unsigned `bigint`) and the tenant's
/// ([`tenant_lock`], `$3`), and that the call it runs is generation `$4` (the key's record, `$5`
/// its `ref`, would be taken over by that generation). In `pg_locks` the two-`int4` form's keys
/// are `classid` and `objid`, as `oid`s, with `objsubid` 2; the one-`bigint` form's are its high
/// and low halves there, with `objsubid` 1.
const RUNNING: &str = "\
SELECT EXISTS (SELECT 1 FROM pg_locks k JOIN pg_locks t ON t.pid = k.pid
    WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 2
    AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND k.classid = ((($1::INT4 # 'idempotency_records'::REGCLASS::OID::INT4)::BIGINT) & 4294967295)::OID
    AND k.objid = $2::BIGINT::OID
    AND t.locktype = 'advisory' AND t.granted AND t.objsubid = 1 AND t.database = k.database
    AND t.classid = ((($3::BIGINT # 'idempotency_records'::REGCLASS::OID::BIGINT) >> 32) & 4294967295)::OID
    AND t.objid = (($3::BIGINT # 'idempotency_records'::REGCLASS::OID::BIGINT) & 4294967295)::OID)
AND $4::INT4 = COALESCE((SELECT CASE WHEN state = 3 THEN generation ELSE generation + 1 END
    FROM idempotency_records WHERE ref = $5), 1)";

/// The one-`bigint` advisory lock a call of `tenant` holds (shared) while its transaction runs
/// for the key whose `ref` is `r` (XORed with the records table's oid, as the key's lock):
/// FNV-1a of the tenant, mixed with the key.
fn tenant_lock(tenant: &str, r: i64) -> i64 {
    let fnv = tenant.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (fnv ^ (r as u64).rotate_left(29)) as i64
}

/// The database's bound on the call's transaction: `lease` (the body's) and the commit's grace,
/// in ms, as `statement_timeout` and `idle_in_transaction_session_timeout` take it (at most
/// `i32::MAX`).
fn bound_ms(lease: Duration) -> i64 {
    let ms = (lease + SETTLE_GRACE).as_millis();
    i64::try_from(ms)
        .unwrap_or(i64::MAX)
        .min(i64::from(i32::MAX))
}

impl TransactionalStore for PostgresStore {
    fn running<'a>(
        &'a self,
        tenant: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let r = ref_value(&reference);
            sqlx::query_scalar(RUNNING)
                .bind((r >> 32) as i32)
                .bind(i64::from(r as i32 as u32))
                .bind(tenant_lock(tenant, r))
                .bind(i32::try_from(reference.generation()).unwrap_or(i32::MAX))
                .bind(r)
                .fetch_one(&self.pool)
                .await
                .map_err(db_error)
        })
    }

    fn begin<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Begun, StoreError>> {
        Box::pin(async move {
            // Dropped from here on (its caller gone mid-statement), the connection is closed: it
            // may be inside the transaction, holding the key.
            let mut tx = TxConnection::open(self.pool.acquire().await.map_err(db_error)?);
            let r = ref_of(&req.key);
            // Literals only: integers this store computed.
            let offset = self
                .clock_offset
                .map_or_else(|| "NULL".to_owned(), |off| off.to_string());
            // The key's lock, and only if this call got it, its tenant's.
            let lock = format!(
                "BEGIN; SET LOCAL statement_timeout = {ms}; SET LOCAL idle_in_transaction_session_timeout = {ms}; \
                 SELECT CASE WHEN pg_try_advisory_xact_lock({hi} # 'idempotency_records'::REGCLASS::OID::INT4, {lo}) \
                 THEN pg_try_advisory_xact_lock_shared({t}::BIGINT # 'idempotency_records'::REGCLASS::OID::BIGINT) \
                 IS NOT NULL ELSE false END",
                ms = bound_ms(req.lease),
                hi = (r >> 32) as i32,
                lo = r as i32,
                t = tenant_lock(req.tenant, r),
            );
            let sql = format!(
                "{lock}; EXECUTE {READ_NAME}({r}, {offset}, {now})",
                now = req.now.as_millis(),
            );
            // Audited: every value in it is an integer this store computed.
            let mut begun = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                .fetch_all(&mut *tx.conn)
                .await;
            if matches!(&begun, Err(e) if unprepared(e)) {
                // The failed `EXECUTE` aborted the transaction: end it, prepare, begin again.
                let again = format!("ROLLBACK; {PREPARE_READ}; {sql}");
                begun = sqlx::raw_sql(sqlx::AssertSqlSafe(again))
                    .fetch_all(&mut *tx.conn)
                    .await;
            }
            if matches!(&begun, Err(sqlx::Error::Database(_))) {
                // The prepared read is missing again or is not ours (a pooler moved the session,
                // or a statement of that name with another shape): this call reads with literals.
                let read = READ
                    .replace("$1", &r.to_string())
                    .replace("$2", &offset)
                    .replace("$3", &req.now.as_millis().to_string());
                let literal = format!("ROLLBACK; {lock}; {read}");
                begun = sqlx::raw_sql(sqlx::AssertSqlSafe(literal))
                    .fetch_all(&mut *tx.conn)
                    .await;
            }
            // An error: `tx` is dropped, closing the connection.
            let rows = begun.map_err(db_error)?;
            let shared = tx.share();
            let read = || -> Result<_, sqlx::Error> {
                let locked: bool = rows.first().ok_or(sqlx::Error::RowNotFound)?.try_get(0)?;
                let row = rows.get(1).ok_or(sqlx::Error::RowNotFound)?;
                let clock: i64 = row.try_get(0)?;
                let started: i64 = row.try_get(1)?;
                let present: Option<Vec<u8>> = row.try_get(2)?;
                let rec = match present {
                    Some(_) => Some(RecordRow::read(row, 2)?),
                    None => None,
                };
                Ok((locked, clock, started, rec))
            };
            let (locked, clock, started, rec) = match read() {
                Ok(read) => read,
                Err(e) => {
                    end_in_background(shared);
                    return Err(db_error(e));
                }
            };
            let now = Timestamp::from_millis(clock);
            let shift = clock - req.now.as_millis();
            let found = match &rec {
                Some(rec) => match rec.existing_claim(&req.key, &req.fingerprint, now) {
                    Ok(found) => found,
                    Err(e) => {
                        end_in_background(shared);
                        return Err(e);
                    }
                },
                None => None,
            };
            // The generation a call run now gets.
            let generation = rec.as_ref().map_or(Ok(1), RecordRow::next_generation)?;
            if let Some(found) = found {
                end_in_background(shared);
                return Ok(Begun::Answered(in_callers_frame(found, shift)));
            }
            if !locked {
                // Another transaction holds the key: that call is running now.
                end_in_background(shared);
                return Ok(Begun::Answered(Claim::InFlight {
                    reference: req.key.reference(generation),
                    claimed_at: req.now,
                    lease_expires_at: req.now + req.lease,
                }));
            }
            Ok(Begun::Open(Box::new(PgOpen {
                shared,
                key: req.key,
                reference: req.key.reference(generation),
                token: req.token.0,
                claimed_at: clock,
                started,
                window_s: window_s(req.window),
                tenant: req.tenant.to_owned(),
                subject: req.subject.unwrap_or("").to_owned(),
                tool: req.tool.to_owned(),
                fingerprint: req
                    .fingerprint
                    .as_ref()
                    .map_or_else(Vec::new, |f| f.as_bytes().to_vec()),
                clock_offset: self.clock_offset,
            })))
        })
    }
}

/// Ends a transaction that wrote nothing (a repeat's, a busy key's) without holding up the
/// answer: `ROLLBACK` in the background; a connection that cannot is closed instead.
fn end_in_background(shared: SharedConnection<Postgres>) {
    tokio::spawn(async move { roll_back(&shared).await });
}

/// A call's open transaction on PostgreSQL, holding its key's advisory lock.
#[derive(Debug)]
struct PgOpen {
    shared: SharedConnection<Postgres>,
    key: Key,
    reference: Reference,
    token: i64,
    /// The server's clock when the transaction began (ms, with the store's offset).
    claimed_at: i64,
    /// `transaction_timestamp()` in µs: the record is written only in this transaction.
    started: i64,
    window_s: i32,
    tenant: String,
    subject: String,
    tool: String,
    fingerprint: Vec<u8>,
    clock_offset: Option<i64>,
}

impl OpenTransaction for PgOpen {
    fn reference(&self) -> Reference {
        self.reference
    }

    fn connection(&self) -> Arc<dyn Any + Send + Sync> {
        self.shared.clone()
    }

    fn commit(self: Box<Self>, outcome: TxOutcome) -> BoxFuture<'static, Result<(), CommitError>> {
        Box::pin(async move {
            let Some(mut held) = take_back(&self.shared) else {
                return Err(CommitError::RolledBack(kept()));
            };
            let StoredResponse { ok, body } = outcome.response;
            let sql = if outcome.outbox.is_empty() {
                RECORD
            } else {
                RECORD_WITH_OUTBOX
            };
            let mut query = sqlx::query(sql)
                .bind(ref_of(&self.key))
                .bind(self.token)
                .bind(self.claimed_at)
                .bind(self.window_s)
                .bind(i32::try_from(self.reference.generation()).unwrap_or(i32::MAX))
                .bind(state_code(RecordState::Completed, Some(ok)))
                .bind(rest_of(&self.key))
                .bind(&self.tenant)
                .bind(&self.subject)
                .bind(&self.tool)
                .bind(&self.fingerprint)
                .bind(body)
                .bind(self.started)
                .bind(outcome.now.as_millis())
                .bind(self.clock_offset);
            let written = if outcome.outbox.is_empty() {
                query
                    .execute(&mut *held.conn)
                    .await
                    .map(|done| done.rows_affected())
            } else {
                let (topics, payloads): (Vec<String>, Vec<String>) = outcome
                    .outbox
                    .into_iter()
                    .map(|m| (m.topic, m.payload))
                    .unzip();
                query = query.bind(topics).bind(payloads);
                query
                    .fetch_one(&mut *held.conn)
                    .await
                    .and_then(|row| row.try_get::<i64, _>(0))
                    .map(|n| u64::try_from(n).unwrap_or(0))
            };
            match written {
                Ok(1) => {}
                Ok(_) => {
                    // Not this call's transaction any more (or another key's record holds the
                    // reference): the connection is closed, nothing of it is committed here.
                    return Err(CommitError::RolledBack(StoreError::Config {
                        problem: "the call's record could not be written in its transaction: the handler ended the \
                                  transaction itself (COMMIT or ROLLBACK through Call::transaction), so what it \
                                  wrote before that is not part of the call"
                            .into(),
                        source: None,
                    }));
                }
                Err(e) => return Err(CommitError::RolledBack(db_error(e))),
            }
            // A refused COMMIT ends a PostgreSQL transaction.
            held.commit(true).await
        })
    }

    fn rollback(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move { roll_back(&self.shared).await })
    }
}
