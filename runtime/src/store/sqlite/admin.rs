//! [`Admin`] for [`SqliteStore`]: read-only queries on its table (see the migration for the
//! columns).

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
/// What [`Maintenance::purge`](crate::store::Maintenance::purge) would delete.
const PURGEABLE: &str =
    "SELECT COUNT(*) FROM idempotency_records WHERE (state = 1 OR state = 3 OR state = 4) AND ends_at < $1";

crate::store::sql::sql_admin!(SqliteStore);
