//! [`RecordStore`] for [`SqliteStore`]: the claim (one prepared batch, `CLAIM`), the status
//! read, and the transitions ([`Writes`], which `transition` dispatches to): the fenced updates
//! (complete, release, mark unknown, renew, settle) and the takeover.

use std::time::Duration;

use sqlx::query::Query;
use sqlx::sqlite::SqliteArguments;
use sqlx::{Row, Sqlite};

use super::statements::{CLAIM, CLAIM_WATCHED, COMPLETE, COMPLETE_RETURNING};
use super::{bytes, window_ms, SqliteStore};
use crate::clock::Timestamp;
use crate::key::{Key, Reference};
use crate::record::{RecordState, RecordStatus};
use crate::store::sql::{
    self, db_error, fenced_query, raced, ref_of, ref_value, rest_of, state_code, Fence, RecordRow,
    SqlPool, CLAIM_ATTEMPTS, FENCE_ATTEMPTS,
};
use crate::store::transition::{dispatch, Writes};
use crate::store::{
    BoxFuture, Claim, ClaimRequest, Completion, RecordStore, Settlement, StoreError, Token,
    TransactionalStore, Transition, Transitioned, WindowClock, WORKER_SETTLES,
};

/// A claim that waited this long for its connection watches itself ([`CLAIM_WATCHED`]): the
/// reconciler's mark trails a round's clock by the busy timeout and 5 s, which covers a claim's
/// wait for the write lock (at most the busy timeout) and this one, not a longer wait for a
/// connection of the pool.
pub(super) const WATCH_AFTER: Duration = Duration::from_secs(1);

impl SqliteStore {
    /// A completion with outbox messages: the update and the inserts in one transaction.
    async fn complete_with_outbox(&self, c: &Completion<'_>) -> Result<bool, StoreError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db_error)?;
        let generation: Option<i64> = sqlx::query_scalar(COMPLETE_RETURNING)
            .bind(ref_of(&c.key))
            .bind(rest_of(&c.key))
            .bind(c.token.0)
            .bind(state_code(RecordState::Completed, Some(c.response.ok)))
            .bind(c.response.body.as_str())
            .bind(c.now.as_millis())
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_error)?;
        let Some(generation) = generation else {
            return Ok(false);
        };
        for m in c.outbox {
            sqlx::query("INSERT INTO idempotency_outbox (key, generation, topic, payload, visible_at) VALUES ($1, $2, $3, $4, $5)")
                .bind(bytes(&c.key))
                .bind(generation)
                .bind(m.topic.as_str())
                .bind(m.payload.as_str())
                .bind(c.now.as_millis())
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(true)
    }
}

/// [`CLAIM`]'s parameters, in its text's order (see there), after whatever `query` holds.
pub(super) fn claim_query<'q>(
    query: Query<'q, Sqlite, SqliteArguments>,
    req: &'q ClaimRequest<'q>,
    fingerprint: &'q [u8],
) -> Query<'q, Sqlite, SqliteArguments> {
    query
        .bind(ref_of(&req.key))
        .bind(req.token.0)
        .bind(req.now.as_millis())
        .bind((req.now + req.lease).as_millis())
        .bind(window_ms(req.window))
        .bind(rest_of(&req.key))
        .bind(req.tenant)
        .bind(req.subject.unwrap_or(""))
        .bind(req.tool)
        .bind(fingerprint)
        .bind(ref_of(&req.key))
}

impl RecordStore for SqliteStore {
    /// The engine's times: `ends_at = now + window_ms` at the completion.
    fn window_clock(&self) -> WindowClock {
        WindowClock::Engine
    }

    /// One call to sqlx's SQLite worker answers a fresh claim, a takeover and a repeat alike:
    /// the upsert, then (only when it changed nothing) the row it found, in one prepared batch
    /// (`CLAIM`) read up to its first row: sqlx's worker stops there, so a claim that wins runs
    /// the upsert alone and sends one row back (reading the batch to its end cost a second
    /// statement and two more hand-offs from the worker thread, about 8,000 instructions a
    /// fresh call). The answer comes from that read; a row that changed between the two
    /// statements, so that it is now one to take over, makes the claim run again. A row of
    /// another key under the reference (a second call, about one claim in 2^64) is refused.
    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let fingerprint = req
                .fingerprint
                .as_ref()
                .map_or(&[][..], |f| &f.as_bytes()[..]);
            let started = std::time::Instant::now();
            for _ in 0..CLAIM_ATTEMPTS {
                let mut conn = self.pool.acquire().await.map_err(db_error)?;
                // Its time may be behind the reconciler's mark by now: watched, it is listed
                // once its lease ends whatever the mark.
                let query = if started.elapsed() >= WATCH_AFTER {
                    // The watch's row first: CLAIM_WATCHED's first parameter.
                    sqlx::query(CLAIM_WATCHED).bind(ref_of(&req.key))
                } else {
                    sqlx::query(CLAIM)
                };
                let row = claim_query(query, req, fingerprint)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(db_error)?;
                // Neither statement answered: the row went between them (a purge). Again.
                let Some(row) = row else { continue };
                let won: i64 = row.try_get(0).map_err(db_error)?;
                if won == 1 {
                    let generation: i64 = row.try_get(1).map_err(db_error)?;
                    let token: i64 = row.try_get(2).map_err(db_error)?;
                    return Ok(Claim::New {
                        reference: req.key.reference(sql::generation_of(generation)?),
                        token: Token(token),
                    });
                }
                let rec = RecordRow::read(&row, 1).map_err(db_error)?;
                if let Some(answer) = rec.existing_claim(&req.key, &req.fingerprint, req.now)? {
                    return Ok(answer);
                }
            }
            Err(raced("the claim", CLAIM_ATTEMPTS))
        })
    }

    /// A primary-key probe: the reference is the primary key.
    fn transactions(&self) -> Option<&dyn TransactionalStore> {
        Some(self)
    }

    fn status<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>> {
        Box::pin(async move {
            // A generation below 1 is read, and refused as corrupt, rather than hidden.
            let row = sqlx::query(
                "SELECT tool, key_rest, generation, state, fingerprint, claimed_at, ends_at, completed_at, \
                 response FROM idempotency_records WHERE ref = $1 AND tenant = $2 AND (generation >= $3 OR generation < 1) \
                 AND (subject = '' OR subject = $4)",
            )
            .bind(ref_value(&reference))
            .bind(tenant)
            .bind(i64::from(reference.generation()))
            .bind(subject)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
            let Some(row) = row else { return Ok(None) };
            let tool: String = row.try_get(0).map_err(db_error)?;
            RecordRow::read(&row, 1)
                .map_err(db_error)?
                .status(reference, tool, None)
                .map(Some)
        })
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

impl Writes for SqliteStore {
    fn complete<'a>(&'a self, c: Completion<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if c.outbox.is_empty() {
                let state = state_code(RecordState::Completed, Some(c.response.ok));
                return self
                    .pool
                    .fenced(&c.key, c.token, Fence::COMPLETION, || {
                        sqlx::query(COMPLETE)
                            .bind(state)
                            .bind(c.response.body.as_str())
                            .bind(c.now.as_millis())
                            .bind(c.now.as_millis())
                            .bind(ref_of(&c.key))
                            .bind(rest_of(&c.key).to_vec())
                            .bind(c.token.0)
                    })
                    .await;
            }
            for _ in 0..FENCE_ATTEMPTS {
                if self.complete_with_outbox(&c).await? {
                    return Ok(());
                }
                self.pool
                    .why_fenced(&c.key, c.token, WORKER_SETTLES)
                    .await?;
            }
            Err(raced("the completion", FENCE_ATTEMPTS))
        })
    }

    fn release(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let release = || {
                fenced_query(
                    "UPDATE idempotency_records SET state = 3, completed_at = $4, ends_at = $4, \
                     window_ms = 0 WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state IN (0, 2)",
                    &key,
                    token,
                )
                .bind(now.as_millis())
            };
            self.pool.fenced(&key, token, Fence::RELEASE, release).await
        })
    }

    fn mark_unknown(&self, key: Key, token: Token) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.pool.mark_unknown(key, token))
    }

    /// One statement; the state and the lease are the fence (the first takeover makes the lease
    /// live for the others: SQLite runs writers one at a time).
    fn take_over(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Reference, StoreError>> {
        let lease_expires_at = now + lease;
        Box::pin(async move {
            let generation: Option<i64> = sqlx::query_scalar(
                "UPDATE idempotency_records SET token = $3, state = 0, ends_at = $5 \
                 WHERE ref = $1 AND key_rest = $2 AND ((state = 0 AND ends_at <= $4) OR state = 2) \
                 RETURNING generation",
            )
            .bind(ref_of(&key))
            .bind(rest_of(&key))
            .bind(token.0)
            .bind(now.as_millis())
            .bind(lease_expires_at.as_millis())
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
            match generation {
                Some(g) => Ok(key.reference(sql::generation_of(g)?)),
                None => Err(self.pool.why_not_taken(&key).await),
            }
        })
    }

    fn renew(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let lease_expires_at = now + lease;
        Box::pin(async move {
            let renew = || {
                fenced_query(
                    "UPDATE idempotency_records SET ends_at = $4 WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state = 0",
                    &key,
                    token,
                )
                .bind(lease_expires_at.as_millis())
            };
            self.pool.fenced(&key, token, Fence::RENEWAL, renew).await
        })
    }

    fn settle<'a>(
        &'a self,
        key: Key,
        token: Token,
        settlement: &'a Settlement,
        at: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (code, body, completed) = sql::settlement_columns(settlement, at);
        // Unknown keeps its lease end in `ends_at`; released stops answering at once (its window
        // is 0, as a release's); completed answers for the record's own window from the
        // settlement.
        Box::pin(async move {
            let settle = || {
                fenced_query(
                    "UPDATE idempotency_records SET token = CASE WHEN $4 = 2 THEN token ELSE token + 1 END, state = $4, response = $5, \
                 completed_at = $6, \
                 ends_at = CASE $4 WHEN 2 THEN ends_at WHEN 3 THEN $6 ELSE $6 + window_ms END, \
                 window_ms = CASE $4 WHEN 3 THEN 0 ELSE window_ms END \
                 WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state IN (0, 2)",
                    &key,
                    token,
                )
                .bind(code)
                .bind(body)
                .bind(completed)
            };
            self.pool
                .fenced(&key, token, Fence::SETTLEMENT, settle)
                .await
        })
    }
}
