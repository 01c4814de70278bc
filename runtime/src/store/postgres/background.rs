//! [`PostgresStore`]'s background work: retention (purge), the claims to reconcile, and the outbox.

use super::statements::{clock, server_clock};
use super::PostgresStore;
use crate::clock::Timestamp;
use crate::store::sql::{self, db_error, SqlPool};
use crate::store::{
    BoxFuture, Maintenance, OutboxEntry, OutboxStore, Receipt, StoreError, Unsettled,
};

/// The runs of `idempotency_records_window`: each window length in the table, found by one
/// index probe per length (a recursive query: PostgreSQL 15 has no skip scan). The tail of a
/// statement that starts `WITH RECURSIVE`.
macro_rules! windows {
    () => {
        "w(s) AS ( \
             SELECT min(window_s) FROM idempotency_records \
           UNION ALL \
             SELECT (SELECT min(window_s) FROM idempotency_records WHERE window_s > w.s) \
             FROM w WHERE w.s IS NOT NULL)"
    };
}

/// A purge batch: at most `$2` completed or released records whose window ended before the
/// cutoff (the server's clock less the retention, `$3 - $1` ≤ 0). Per window length, it reads
/// `idempotency_records_window` from the oldest claim up to `cutoff - window` (a record's
/// window cannot end before its claim time plus its length), so it stops after its batch; the
/// only records it passes over there are the ones not settled yet and the few whose call ended
/// after the cutoff less the window (an index scan also marks the entries of rows an earlier
/// batch deleted as dead, so later batches skip them without visiting the table). The outer
/// conditions are checked again on each row as it is deleted, so a row a claim took over
/// meanwhile is left alone. `$1` now, `$2` limit, `$3` older than, `$4` the clock offset
/// ([`clock!`]).
pub(super) const PURGE: &str = concat!(
    "WITH RECURSIVE ",
    windows!(),
    " DELETE FROM idempotency_records \
     WHERE ref = ANY (ARRAY(SELECT c.ref FROM w CROSS JOIN LATERAL \
         (SELECT ref FROM idempotency_records \
          WHERE window_s = w.s AND claimed_at < ",
    clock!("$1", "$4"),
    " + ($3 - $1) - 1000::BIGINT * w.s \
            AND state IN (1, 3, 4) AND lease_or_settled_at + 1000::BIGINT * window_s < ",
    clock!("$1", "$4"),
    " + ($3 - $1) \
          ORDER BY claimed_at LIMIT $2) c \
         WHERE w.s IS NOT NULL LIMIT $2)) \
       AND state IN (1, 3, 4) AND lease_or_settled_at + 1000::BIGINT * window_s < ",
    clock!("$1", "$4"),
    " + ($3 - $1)"
);

/// A reconciler round, in one statement: the claims to reconcile (unknown, or in flight with
/// the lease ended by the server's clock), oldest claim first, ties in the keys' byte order as
/// the memory store (`ref` compared unsigned). It reads the claims made since the last round's
/// mark from `idempotency_records_window` (one range per window length) and adds the ones in
/// flight or unknown to `idempotency_watch`, drops from it the ones that settled, moves the
/// mark, and answers from the watched records and the new ones, by primary key. So a round
/// costs what was claimed since the last one plus what is running or stuck, not the table.
///
/// The new mark is the statement's clock, or the start of the oldest other transaction still
/// open in this database if earlier (a claim committing after this round's snapshot started no
/// earlier than its transaction) but at most 5 minutes earlier (a claim is one statement, and
/// an unrelated transaction left open must not pin the mark), less 5 s for a claim that
/// commits between this statement's snapshot and its read of `pg_stat_activity` (or whose
/// session this role may not see). A clock that stepped back past the mark (the server's, by
/// more than those 5 s) would put new claims below it: a round that finds its clock behind the
/// mark sets it an hour back instead, so the next round reads the claims made since the step
/// (a mark too early only costs a round that reads more). Rounds of several replicas may run at once: they insert the
/// same claims with `ON CONFLICT DO NOTHING` and move the mark with `GREATEST`, so the result
/// is the same; in the rare case where one inserts a watched claim the other is deleting while
/// each waits on the other's row, PostgreSQL aborts one as a deadlock, and the engine retries
/// that round at its next tick. `$1` now, `$2` limit, `$3` the clock offset.
pub(super) const UNSETTLED: &str = concat!(
    "WITH RECURSIVE ",
    windows!(),
    ", fresh AS ( \
         SELECT c.ref FROM w CROSS JOIN LATERAL \
             (SELECT ref FROM idempotency_records \
              WHERE window_s = w.s \
                AND claimed_at >= (SELECT mark FROM idempotency_reconciler) \
                AND state IN (0, 2) OFFSET 0) c \
         WHERE w.s IS NOT NULL), \
     watched AS (INSERT INTO idempotency_watch (ref) SELECT ref FROM fresh ON CONFLICT DO NOTHING), \
     settled AS (DELETE FROM idempotency_watch x WHERE NOT COALESCE( \
         (SELECT r.state IN (0, 2) FROM idempotency_records r WHERE r.ref = x.ref), false)), \
     now_ AS (SELECT ",
    clock!("$1", "$3"),
    " AS t, (SELECT (extract(epoch FROM min(xact_start)) * 1000)::BIGINT + $3::BIGINT \
         FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND xact_start IS NOT NULL \
           AND datname = current_database()) AS oldest), \
     moved AS (UPDATE idempotency_reconciler SET mark = CASE WHEN n.t < mark THEN n.t - 3600000 \
         ELSE GREATEST(mark, GREATEST(n.t - 300000, LEAST(n.t, n.oldest)) - 5000) END FROM now_ n) \
     SELECT r.ref, r.key_rest, r.generation, r.tenant, r.subject, r.tool, r.state, r.token, r.claimed_at, 1000::BIGINT * r.window_s \
     FROM (SELECT ref FROM idempotency_watch UNION SELECT ref FROM fresh) ids CROSS JOIN LATERAL \
         (SELECT * FROM idempotency_records WHERE ref = ids.ref OFFSET 0) r \
     WHERE r.state IN (0, 2) AND (r.state = 2 OR r.lease_or_settled_at <= (SELECT t FROM now_)     ) ORDER BY r.claimed_at, r.ref < 0, r.ref LIMIT $2"
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

    /// One statement (`UNSETTLED`): it reads what was claimed since the last round and the
    /// running calls, not the table.
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
        Box::pin(self.pool.ack(receipt))
    }
}
