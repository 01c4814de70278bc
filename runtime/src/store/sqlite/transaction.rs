//! Transactional calls on SQLite ([`TransactionalStore`]): the call's transaction holds the
//! file's write lock (`BEGIN IMMEDIATE`) and its record is written once, completed, before
//! `COMMIT`.
//!
//! The key is held by this store's own set of keys in transaction (the store and its clones
//! share it): a repeat in the same process is answered "in flight" at once. A repeat in another
//! process opening the same file waits for the write lock (the busy timeout, 5 s by default),
//! as every SQLite writer does, and then finds the committed record or none.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use sqlx::Sqlite;

use super::{bytes, window_ms, SqliteStore};
use crate::clock::Timestamp;
use crate::key::{Key, Reference};
use crate::record::{RecordState, StoredResponse};
use crate::store::sql::{
    db_error, kept, ref_of, ref_value, rest_of, roll_back, state_code, take_back, RecordRow,
    SharedConnection, TxConnection,
};
use crate::store::{
    Begun, BoxFuture, Claim, ClaimRequest, CommitError, OpenTransaction, StoreError,
    TransactionalStore, TxOutcome,
};

/// The keys (by `ref`) this store has a transaction open for, with the reference each runs
/// under and its caller's tenant.
#[derive(Debug, Default)]
pub(super) struct Busy(Mutex<HashMap<i64, (Reference, String)>>);

impl Busy {
    /// The map; a panic while it was locked left it consistent (every change is one insert or
    /// one remove).
    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<i64, (Reference, String)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn held(&self, r: i64) -> Option<Reference> {
        self.keys().get(&r).map(|(reference, _)| *reference)
    }

    /// Whether a call of `tenant` holds the key of `reference` under that very reference.
    fn runs(&self, tenant: &str, reference: Reference) -> bool {
        matches!(self.keys().get(&ref_value(&reference)), Some((r, t)) if *r == reference && t == tenant)
    }

    /// Holds `r` for a call of `tenant` unless another already does (its reference then).
    fn hold(
        self: &Arc<Self>,
        r: i64,
        reference: Reference,
        tenant: &str,
    ) -> Result<Holding, Reference> {
        let mut held = self.keys();
        if let Some((other, _)) = held.get(&r) {
            return Err(*other);
        }
        held.insert(r, (reference, tenant.to_owned()));
        Ok(Holding {
            busy: Arc::clone(self),
            r,
        })
    }
}

/// One key held in [`Busy`] until dropped.
#[derive(Debug)]
struct Holding {
    busy: Arc<Busy>,
    r: i64,
}

impl Holding {
    /// The call runs under `reference` (its generation known once the row was read).
    fn runs_under(&self, reference: Reference) {
        if let Some(held) = self.busy.keys().get_mut(&self.r) {
            held.0 = reference;
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.busy.keys().remove(&self.r);
    }
}

/// The record, completed, in the call's transaction: inserted, or written over the key's
/// released or window-expired row. `$1` ref, `$2` token, `$3` claimed_at, `$4` completed_at,
/// `$5` window_ms, `$6` generation, `$7` state, `$8` key_rest, `$9` tenant, `$10` subject,
/// `$11` tool, `$12` fingerprint, `$13` response.
const RECORD: &str = "\
INSERT INTO idempotency_records
    (ref, token, claimed_at, ends_at, window_ms, completed_at, generation, state, key_rest, tenant, subject, tool, fingerprint, response)
VALUES ($1, $2, $3, $4 + $5, $5, $4, $6, $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT (ref) DO UPDATE SET token = excluded.token,
    claimed_at = MAX(excluded.claimed_at, claimed_at + 1),
    ends_at = excluded.ends_at, window_ms = excluded.window_ms, completed_at = excluded.completed_at,
    generation = excluded.generation, state = excluded.state, tenant = excluded.tenant,
    subject = excluded.subject, tool = excluded.tool, fingerprint = excluded.fingerprint,
    response = excluded.response
WHERE key_rest = excluded.key_rest";

impl TransactionalStore for SqliteStore {
    fn running<'a>(
        &'a self,
        tenant: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(self.busy.runs(tenant, reference))))
    }

    fn begin<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Begun, StoreError>> {
        Box::pin(async move {
            let r = ref_of(&req.key);
            let in_flight = |reference| {
                Ok(Begun::Answered(Claim::InFlight {
                    reference,
                    claimed_at: req.now,
                    lease_expires_at: req.now + req.lease,
                }))
            };
            if self.busy.held(r).is_some() {
                // Answered from the committed record when there is one (a repeat that is only
                // reading it holds the key for a moment).
                if let Some(found) = self.committed(req).await? {
                    return Ok(Begun::Answered(found));
                }
            }
            let holding = match self.busy.hold(r, req.key.reference(1), req.tenant) {
                Ok(holding) => holding,
                Err(other) => return in_flight(other),
            };
            // Dropped from here on (its caller gone mid-statement), the connection is closed: it
            // may be inside the transaction, holding the write lock.
            let mut tx = TxConnection::open(self.pool.acquire().await.map_err(db_error)?);
            // Audited: the one value in it is an integer this store computed.
            let sql = format!(
                "BEGIN IMMEDIATE; SELECT key_rest, generation, state, fingerprint, claimed_at, ends_at, \
                 completed_at, response FROM idempotency_records WHERE ref = {r}"
            );
            // An error: `tx` is dropped, closing the connection.
            let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .fetch_all(&mut *tx.conn)
                .await
                .map_err(db_error)?;
            let shared = tx.share();
            let rec = match rows.first().map(|row| RecordRow::read(row, 0)).transpose() {
                Ok(rec) => rec,
                Err(e) => {
                    end(shared).await;
                    return Err(db_error(e));
                }
            };
            let found = match &rec {
                Some(rec) => match rec.existing_claim(&req.key, &req.fingerprint, req.now) {
                    Ok(found) => found,
                    Err(e) => {
                        end(shared).await;
                        return Err(e);
                    }
                },
                None => None,
            };
            if let Some(found) = found {
                end(shared).await;
                return Ok(Begun::Answered(found));
            }
            let generation = rec.as_ref().map_or(Ok(1), RecordRow::next_generation)?;
            let reference = req.key.reference(generation);
            holding.runs_under(reference);
            Ok(Begun::Open(Box::new(SqliteOpen {
                shared,
                _holding: holding,
                key: req.key,
                reference,
                token: req.token.0,
                claimed_at: req.now,
                window_ms: window_ms(req.window),
                tenant: req.tenant.to_owned(),
                subject: req.subject.unwrap_or("").to_owned(),
                tool: req.tool.to_owned(),
                fingerprint: req
                    .fingerprint
                    .as_ref()
                    .map_or_else(Vec::new, |f| f.as_bytes().to_vec()),
            })))
        })
    }
}

impl SqliteStore {
    /// The answer of the key's committed record, if it answers (completed, unknown, mismatch,
    /// in flight); read outside any transaction.
    async fn committed(&self, req: &ClaimRequest<'_>) -> Result<Option<Claim>, StoreError> {
        let row = sqlx::query(
            "SELECT key_rest, generation, state, fingerprint, claimed_at, ends_at, completed_at, response \
             FROM idempotency_records WHERE ref = $1",
        )
        .bind(ref_of(&req.key))
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?;
        match row {
            None => Ok(None),
            Some(row) => RecordRow::read(&row, 0).map_err(db_error)?.existing_claim(
                &req.key,
                &req.fingerprint,
                req.now,
            ),
        }
    }
}

/// Ends a transaction that wrote nothing; a connection that cannot is closed instead.
async fn end(shared: SharedConnection<Sqlite>) {
    roll_back(&shared).await;
}

/// A call's open transaction on SQLite, holding the file's write lock and its key in [`Busy`].
#[derive(Debug)]
struct SqliteOpen {
    shared: SharedConnection<Sqlite>,
    _holding: Holding,
    key: Key,
    reference: Reference,
    token: i64,
    claimed_at: Timestamp,
    window_ms: i64,
    tenant: String,
    subject: String,
    tool: String,
    fingerprint: Vec<u8>,
}

impl OpenTransaction for SqliteOpen {
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
            let conn = &mut *held.conn;
            // Still the call's transaction? `BEGIN` fails inside one; if it succeeds, the
            // handler ended the call's transaction itself.
            if sqlx::raw_sql("BEGIN").execute(&mut *conn).await.is_ok() {
                return Err(CommitError::RolledBack(StoreError::Config {
                    problem: "the handler ended the call's transaction itself (COMMIT or ROLLBACK through \
                              Call::transaction), so what it wrote before that is not part of the call; \
                              the call's record was not written"
                        .into(),
                    source: None,
                }));
            }
            let StoredResponse { ok, body } = outcome.response;
            let completed_at = outcome.now.max(self.claimed_at).as_millis();
            let written = sqlx::query(RECORD)
                .bind(ref_of(&self.key))
                .bind(self.token)
                .bind(self.claimed_at.as_millis())
                .bind(completed_at)
                .bind(self.window_ms)
                .bind(i64::from(self.reference.generation()))
                .bind(state_code(RecordState::Completed, Some(ok)))
                .bind(rest_of(&self.key))
                .bind(&self.tenant)
                .bind(&self.subject)
                .bind(&self.tool)
                .bind(&self.fingerprint)
                .bind(body)
                .execute(&mut *conn)
                .await;
            match written {
                Ok(done) if done.rows_affected() == 1 => {}
                Ok(_) => {
                    return Err(CommitError::RolledBack(StoreError::ReferenceTaken {
                        reference: self.reference,
                    }))
                }
                Err(e) => return Err(CommitError::RolledBack(db_error(e))),
            }
            for m in outcome.outbox {
                let queued = sqlx::query("INSERT INTO idempotency_outbox (key, generation, topic, payload, visible_at) VALUES ($1, $2, $3, $4, $5)")
                    .bind(bytes(&self.key))
                    .bind(i64::from(self.reference.generation()))
                    .bind(m.topic)
                    .bind(m.payload)
                    .bind(completed_at)
                    .execute(&mut *conn)
                    .await;
                if let Err(e) = queued {
                    return Err(CommitError::RolledBack(db_error(e)));
                }
            }
            // A refused COMMIT (a deferred constraint) can leave a SQLite transaction open: the
            // connection is closed, which ends it.
            held.commit(false).await
        })
    }

    fn rollback(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move { end(self.shared.clone()).await })
    }
}
