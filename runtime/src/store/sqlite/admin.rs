//! [`Admin`] for [`SqliteStore`]: read-only queries on its table (see the migration for the
//! columns).

use super::statements::windows;
use super::SqliteStore;

const RECORD: &str =
    "SELECT tenant, subject, tool, CAST(generation AS BIGINT), CAST(state AS BIGINT), \
                      claimed_at, ends_at, completed_at, window_ms, response \
                      FROM idempotency_records WHERE ref = $1";
/// Records by state, tool and whether their `ends_at` (the lease's end while unsettled, the
/// window's end once settled) has passed at `$1`.
const BY_STATE: &str =
    "SELECT CAST(state AS BIGINT), tool, CAST(ends_at <= $1 AS BIGINT), COUNT(*) \
                        FROM idempotency_records GROUP BY 1, 2, 3";
const OLDEST_IN_FLIGHT: &str = "SELECT MIN(claimed_at) FROM idempotency_records WHERE state = 0";
const SIZE: &str = "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()";
/// What [`Maintenance::purge`](crate::store::Maintenance::purge) would delete, read as it reads
/// (`idempotency_records_window`, each window length's run up to `$1 - window_ms`).
const PURGEABLE: &str = concat!(
    "WITH RECURSIVE ",
    windows!(),
    " SELECT COUNT(*) FROM w CROSS JOIN idempotency_records r \
     WHERE w.s IS NOT NULL AND r.window_ms = w.s AND r.claimed_at < $1 - w.s \
       AND r.state IN (1, 3, 4) AND r.ends_at < $1"
);
/// SQLite has no server clock: an operator's reads judge by the caller's.
const NOW: Option<&str> = None;
/// The claims to reconcile at `$1`, at most `$2`, in the reconciler's order, read only.
const UNSETTLED_READ: &str =
    "SELECT ref, key_rest, generation, tenant, subject, tool, state, token, claimed_at, window_ms \
     FROM idempotency_records WHERE state IN (0, 2) AND (state = 2 OR ends_at <= $1) \
     ORDER BY claimed_at, ref < 0, ref LIMIT $2";

crate::store::sql::sql_admin!(SqliteStore);
