//! The fenced writes of [`PostgresStore`] ([`Writes`], which its `RecordStore::transition`
//! dispatches to): one `UPDATE` each, on the server's clock; one that changes nothing reads the
//! row again to say why.

use std::time::Duration;

use super::statements::{
    clock, server_clock, COMPLETE, COMPLETE_ON_SERVER_CLOCK, COMPLETE_WITH_OUTBOX,
};
use super::PostgresStore;
use crate::clock::Timestamp;
use crate::key::{Key, Reference};
use crate::record::RecordState;
use crate::store::sql::{
    self, db_error, fenced_query, ref_of, rest_of, state_code, Fence, SqlPool,
};
use crate::store::transition::Writes;
use crate::store::{BoxFuture, Completion, Settlement, StoreError, Token};

impl Writes for PostgresStore {
    fn complete<'a>(&'a self, c: Completion<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let topics: Vec<&str> = c.outbox.iter().map(|m| m.topic.as_str()).collect();
            let payloads: Vec<&str> = c.outbox.iter().map(|m| m.payload.as_str()).collect();
            let state = state_code(RecordState::Completed, Some(c.response.ok));
            self.pool
                .fenced(&c.key, c.token, Fence::COMPLETION, || {
                    let head = |sql| {
                        fenced_query(sql, &c.key, c.token)
                            .bind(state)
                            .bind(c.response.body.as_str())
                    };
                    match (c.outbox.is_empty(), self.clock_offset) {
                        (true, Some(0)) => head(COMPLETE_ON_SERVER_CLOCK),
                        (true, offset) => head(COMPLETE).bind(c.now.as_millis()).bind(offset),
                        (false, offset) => head(COMPLETE_WITH_OUTBOX)
                            .bind(c.now.as_millis())
                            .bind(offset)
                            .bind(&topics)
                            .bind(&payloads),
                    }
                })
                .await
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
                    concat!(
                        "UPDATE idempotency_records SET state = 3, lease_or_settled_at = GREATEST(",
                        clock!("$4", "$5"),
                        ", claimed_at), window_s = 0 WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state IN (0, 2)"
                    ),
                    &key,
                    token,
                )
                .bind(now.as_millis())
                .bind(self.clock_offset)
            };
            self.pool.fenced(&key, token, Fence::RELEASE, release).await
        })
    }

    fn mark_unknown(&self, key: Key, token: Token) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.pool.mark_unknown(key, token))
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
                    concat!(
                    "UPDATE idempotency_records SET lease_or_settled_at = ",
                    clock!("$4", "$6"),
                    " + ($5 - $4) WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state = 0"
                ),
                    &key,
                    token,
                )
                .bind(now.as_millis())
                .bind(lease_expires_at.as_millis())
                .bind(self.clock_offset)
            };
            self.pool.fenced(&key, token, Fence::RENEWAL, renew).await
        })
    }

    /// One statement on the server's clock; the state and the lease are the fence. Under READ
    /// COMMITTED a concurrent takeover waits on the winner's row lock, then re-checks the row it
    /// now sees (its lease live): exactly one wins.
    fn take_over(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Reference, StoreError>> {
        let lease_expires_at = now + lease;
        Box::pin(async move {
            let generation: Option<i32> = sqlx::query_scalar(concat!(
                "UPDATE idempotency_records SET token = $3, state = 0, lease_or_settled_at = ",
                clock!("$4", "$6"),
                " + ($5 - $4) WHERE ref = $1 AND key_rest = $2 \
                 AND ((state = 0 AND lease_or_settled_at <= ",
                clock!("$4", "$6"),
                ") OR state = 2) RETURNING generation"
            ))
            .bind(ref_of(&key))
            .bind(rest_of(&key).to_vec())
            .bind(token.0)
            .bind(now.as_millis())
            .bind(lease_expires_at.as_millis())
            .bind(self.clock_offset)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
            match generation {
                Some(g) => Ok(key.reference(sql::generation_of(i64::from(g))?)),
                None => Err(self.pool.why_not_taken(&key).await),
            }
        })
    }

    fn settle<'a>(
        &'a self,
        key: Key,
        token: Token,
        settlement: &'a Settlement,
        at: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (code, body, _) = sql::settlement_columns(settlement, at);
        // Settled at the statement's clock (never before the claim). Completed keeps the
        // record's own window (the claim's); released stops answering at once, as a release
        // does; unknown keeps its lease end in `lease_or_settled_at`.
        Box::pin(async move {
            let settle = || {
                fenced_query(
                concat!(
                    "UPDATE idempotency_records SET token = CASE WHEN $4 = 2 THEN token ELSE token + 1 END, state = $4, response = $5, \
                     lease_or_settled_at = CASE WHEN $4 = 2 THEN lease_or_settled_at ELSE GREATEST(",
                    clock!("$6", "$7"),
                    ", claimed_at) END, \
                     window_s = CASE WHEN $4 = 3 THEN 0 ELSE window_s END \
                     WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state IN (0, 2)"
                ),
                &key,
                token,
            )
            .bind(code)
            .bind(body)
            .bind(at.as_millis())
            .bind(self.clock_offset)
            };
            self.pool
                .fenced(&key, token, Fence::SETTLEMENT, settle)
                .await
        })
    }
}
