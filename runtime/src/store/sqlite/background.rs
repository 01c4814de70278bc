//! [`SqliteStore`]'s background work: retention (purge), the claims to reconcile, and the outbox.

use super::statements::windows;
use super::SqliteStore;
use crate::clock::Timestamp;
use crate::store::sql::{self, db_error, SqlPool};
use crate::store::{
    BoxFuture, Maintenance, OutboxEntry, OutboxStore, Receipt, StoreError, Unsettled,
};

/// A purge batch: at most `$2` completed or released records whose window ended before `$1`.
/// Per window length, it reads `idempotency_records_window` from the oldest claim up to
/// `$1 - window_ms` (a record's window cannot end before its claim time plus its length), so
/// it stops after its batch; the only records it passes over there are the ones not settled yet
/// and the few whose call ended after the cutoff less the window. `CROSS JOIN` keeps the runs
/// the outer loop. Writers are serialised, so nothing changes the rows between the read and
/// the delete.
pub(super) const PURGE: &str = concat!(
    "WITH RECURSIVE ",
    windows!(),
    " DELETE FROM idempotency_records WHERE ref IN \
         (SELECT r.ref FROM w CROSS JOIN idempotency_records r \
          WHERE w.s IS NOT NULL AND r.window_ms = w.s AND r.claimed_at < $1 - w.s \
            AND r.state IN (1, 3, 4) AND r.ends_at < $1 \
          LIMIT $2)"
);

/// A reconciler round's read: the claims made since the mark, read from
/// `idempotency_records_window` (one range per window length), that are in flight or unknown.
/// Outside the round's transaction, so the file's writers go on while it visits each claim's
/// row for its state; what it finds goes to [`UNSETTLED`] as a JSON array.
pub(super) const FRESH: &str = concat!(
    "WITH RECURSIVE ",
    windows!(),
    " SELECT r.ref FROM w CROSS JOIN idempotency_records r \
     WHERE w.s IS NOT NULL AND r.window_ms = w.s \
       AND r.claimed_at >= (SELECT mark FROM idempotency_reconciler) AND r.state IN (0, 2)"
);

/// A reconciler round's write, in one `BEGIN IMMEDIATE` transaction, after [`FRESH`]: the
/// claims to reconcile at `$1` (unknown, or in flight with the lease ended), at most `$2`,
/// oldest claim first, ties in the keys' byte order as the memory store (`ref` compared
/// unsigned). It adds what `FRESH` found (`$4`, a JSON array of references) to
/// `idempotency_watch`, drops from it the ones that settled (or were purged), moves the mark to
/// `$3` ms before `$1`, and answers from the watched records, by primary key. So a round costs
/// what was claimed since the last one plus what is running or stuck, not the file, and holds
/// the write lock only for the watch.
///
/// The mark trails the round's clock (`$3`: the busy timeout and 5 s) because a claim takes its
/// time before it waits for the write lock, so it may commit after a round that started later
/// than its claim time (a claim that commits after `FRESH` read, with a time before the new
/// mark, waited longer than that); a claim that waited long for a connection watches itself
/// (`CLAIM_WATCHED`). A round whose clock is behind the mark (the clock stepped back by more
/// than the lag) sets it an hour back instead, so the next round reads the claims made since
/// the step (a mark too early only costs a round that reads more).
pub(super) const UNSETTLED: &str = "\
INSERT OR IGNORE INTO idempotency_watch (ref) SELECT value FROM json_each($4);
DELETE FROM idempotency_watch WHERE NOT EXISTS (SELECT 1 FROM idempotency_records r
    WHERE r.ref = idempotency_watch.ref AND r.state IN (0, 2));
UPDATE idempotency_reconciler SET mark = CASE WHEN $1 < mark THEN $1 - 3600000
    ELSE max(mark, $1 - $3) END;
SELECT r.ref, r.key_rest, r.generation, r.tenant, r.subject, r.tool, r.state, r.token,
    r.claimed_at, r.window_ms
FROM idempotency_watch x CROSS JOIN idempotency_records r
WHERE r.ref = x.ref AND r.state IN (0, 2) AND (r.state = 2 OR r.ends_at <= $1)
ORDER BY r.claimed_at, r.ref < 0, r.ref LIMIT $2";

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

    /// A read (`FRESH`), then one transaction (`UNSETTLED`): it reads what was claimed since
    /// the last round and the running calls, not the file.
    fn unsettled(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Unsettled>, StoreError>> {
        Box::pin(async move {
            let fresh: Vec<i64> = sqlx::query_scalar(FRESH)
                .fetch_all(&self.pool)
                .await
                .map_err(db_error)?;
            let fresh = format!(
                "[{}]",
                fresh
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            );
            let mut tx = self
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(db_error)?;
            let rows: Vec<sql::UnsettledRow> = sqlx::query_as(UNSETTLED)
                .bind(now.as_millis())
                .bind(i64::from(limit))
                .bind(self.mark_lag_ms)
                .bind(fresh)
                .fetch_all(&mut *tx)
                .await
                .map_err(db_error)?;
            tx.commit().await.map_err(db_error)?;
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
        Box::pin(self.pool.ack(receipt))
    }
}
