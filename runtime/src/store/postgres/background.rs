//! [`PostgresStore`]'s background work: retention (purge), the claims to reconcile, and the outbox.

use super::{clock, PostgresStore};
use crate::clock::Timestamp;
use crate::store::sql::{self, db_error};
use crate::store::{
    BoxFuture, Maintenance, OutboxEntry, OutboxStore, Receipt, StoreError, Unsettled,
};

/// A purge batch: the oldest `$2` completed or released records whose window ended before the
/// cutoff (the server's clock less the retention, `$3 - $1` ≤ 0), read in window-end order from
/// `idempotency_records_settled`, so it stops after its batch (an index scan also marks the
/// entries of rows an earlier batch deleted as dead, so later batches skip them without visiting
/// the table). The outer conditions are checked again on each row as it is deleted, so a row a
/// claim took over meanwhile is left alone. `$1` now, `$2` limit, `$3` older than, `$4` the
/// clock offset ([`clock!`]).
pub(super) const PURGE: &str = concat!(
    "DELETE FROM idempotency_records \
     WHERE ref = ANY (ARRAY(SELECT ref FROM idempotency_records \
                            WHERE state IN (1, 3, 4) AND ends_at < ",
    clock!("$1", "$4"),
    " + ($3 - $1) ORDER BY ends_at LIMIT $2)) \
       AND state IN (1, 3, 4) AND ends_at < ",
    clock!("$1", "$4"),
    " + ($3 - $1)"
);

/// The claims to reconcile, from `idempotency_records_open` (in-flight and unknown records only,
/// by claim time): unknown, or in flight with the lease ended by the server's clock. Ties in the
/// keys' byte order, as the memory store: `ref` compared unsigned. `$1` now, `$2` limit, `$3`
/// the clock offset.
pub(super) const UNSETTLED: &str = concat!(
    "SELECT ref, key_rest, generation, tenant, subject, tool, state, token, claimed_at \
     FROM idempotency_records WHERE state IN (0, 2) AND (state = 2 OR ends_at <= ",
    clock!("$1", "$3"),
    ") ORDER BY claimed_at, ref < 0, ref LIMIT $2"
);

impl Maintenance for PostgresStore {
    /// One statement (`PURGE`): its cost is its batch, not the table.
    fn purge(
        &self,
        now: Timestamp,
        older_than: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let done = sqlx::query(PURGE)
                .bind(now.as_millis())
                .bind(i64::from(limit))
                .bind(older_than.as_millis())
                .bind(self.clock_offset)
                .execute(&self.pool)
                .await
                .map_err(db_error)?;
            Ok(done.rows_affected())
        })
    }

    /// One statement (`UNSETTLED`): it reads the running calls, not the table.
    fn unsettled(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Unsettled>, StoreError>> {
        Box::pin(async move {
            let rows: Vec<sql::UnsettledRow> = sqlx::query_as(UNSETTLED)
                .bind(now.as_millis())
                .bind(i64::from(limit))
                .bind(self.clock_offset)
                .fetch_all(&self.pool)
                .await
                .map_err(db_error)?;
            rows.into_iter().map(sql::unsettled).collect()
        })
    }
}

impl OutboxStore for PostgresStore {
    fn fetch(
        &self,
        now: Timestamp,
        invisible_until: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<OutboxEntry>, StoreError>> {
        Box::pin(async move {
            let rows: Vec<sql::OutboxRow<i32>> = sqlx::query_as(concat!(
                "UPDATE idempotency_outbox SET attempts = attempts + 1, visible_at = ",
                clock!("$1", "$4"),
                " + ($2 - $1) WHERE id IN \
                 (SELECT id FROM idempotency_outbox WHERE visible_at <= ",
                clock!("$1", "$4"),
                " ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) \
                 RETURNING id, key, generation, topic, payload, attempts - 1"
            ))
            .bind(now.as_millis())
            .bind(invisible_until.as_millis())
            .bind(i64::from(limit))
            .bind(self.clock_offset)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
            sql::outbox_entries(rows)
        })
    }

    fn ack<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let id = sql::receipt_id(receipt)?;
            sqlx::query("DELETE FROM idempotency_outbox WHERE id = $1")
                .bind(id)
                .execute(&self.pool)
                .await
                .map_err(db_error)?;
            Ok(())
        })
    }
}
