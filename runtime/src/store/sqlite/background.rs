//! [`SqliteStore`]'s background work: retention (purge), the claims to reconcile, and the outbox.

use super::SqliteStore;
use crate::clock::Timestamp;
use crate::store::sql::{self, db_error};
use crate::store::{
    BoxFuture, Maintenance, OutboxEntry, OutboxStore, Receipt, StoreError, Unsettled,
};

/// A purge batch: the oldest `$2` completed or released records whose window ended before `$1`,
/// read from `idempotency_records_settled` (its condition repeated term for term, or SQLite
/// would not use the partial index), so it stops after its batch. Writers are serialised, so
/// nothing changes the rows between the read and the delete.
pub(super) const PURGE: &str = "\
DELETE FROM idempotency_records WHERE ref IN
    (SELECT ref FROM idempotency_records WHERE (state = 1 OR state = 3 OR state = 4) AND ends_at < $1 ORDER BY ends_at LIMIT $2)";

/// The claims to reconcile at `$1`, at most `$2`, from `idempotency_records_open` (in-flight and
/// unknown records only, by claim time). Ties in the keys' byte order, as the memory store:
/// `ref` compared unsigned.
pub(super) const UNSETTLED: &str = "\
SELECT ref, key_rest, generation, tenant, subject, tool, state, token, claimed_at, window_ms
FROM idempotency_records WHERE state IN (0, 2) AND (state = 2 OR ends_at <= $1)
ORDER BY claimed_at, ref < 0, ref LIMIT $2";

impl Maintenance for SqliteStore {
    /// One statement (`PURGE`): its cost is its batch, not the file.
    fn purge(
        &self,
        _now: Timestamp,
        older_than: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let done = sqlx::query(PURGE)
                .bind(older_than.as_millis())
                .bind(i64::from(limit))
                .execute(&self.pool)
                .await
                .map_err(db_error)?;
            Ok(done.rows_affected())
        })
    }

    /// One statement (`UNSETTLED`): it reads the running calls, not the file.
    fn unsettled(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Unsettled>, StoreError>> {
        Box::pin(async move {
            let rows: Vec<sql::UnsettledRow> = sqlx::query_as(UNSETTLED)
                .bind(now.as_millis())
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await
                .map_err(db_error)?;
            rows.into_iter().map(sql::unsettled).collect()
        })
    }
}

impl OutboxStore for SqliteStore {
    fn fetch(
        &self,
        now: Timestamp,
        invisible_until: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<OutboxEntry>, StoreError>> {
        Box::pin(async move {
            let rows: Vec<sql::OutboxRow<i64>> = sqlx::query_as(
                "UPDATE idempotency_outbox SET attempts = attempts + 1, visible_at = $2 WHERE id IN \
                 (SELECT id FROM idempotency_outbox WHERE visible_at <= $1 ORDER BY id LIMIT $3) \
                 RETURNING id, key, generation, topic, payload, attempts - 1",
            )
            .bind(now.as_millis())
            .bind(invisible_until.as_millis())
            .bind(i64::from(limit))
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
