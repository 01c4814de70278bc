//! [`Admin`] for [`PostgresStore`]: read-only queries on its table (see the migration for the
//! columns).

use super::statements::{ends_and_completed, ends_at};
use super::PostgresStore;

const RECORD: &str = concat!(
    "SELECT tenant, subject, tool, CAST(generation AS BIGINT), CAST(state AS BIGINT), claimed_at, ",
    ends_and_completed!(),
    ", 1000::BIGINT * window_s, response \
     FROM idempotency_records WHERE ref = $1"
);
/// Records by state, tool and whether their lease's or window's end has passed at `$1`.
const BY_STATE: &str = concat!(
    "SELECT CAST(state AS BIGINT), tool, CAST(CAST(",
    ends_at!(),
    " <= $1 AS INTEGER) AS BIGINT), COUNT(*) FROM idempotency_records GROUP BY 1, 2, 3"
);
const OLDEST_IN_FLIGHT: &str = "SELECT MIN(claimed_at) FROM idempotency_records WHERE state = 0";
const SIZE: &str = "SELECT pg_total_relation_size('idempotency_records')::BIGINT";
/// What [`Maintenance::purge`](crate::store::Maintenance::purge) would delete.
const PURGEABLE: &str = concat!(
    "SELECT COUNT(*) FROM idempotency_records WHERE state IN (1, 3, 4) AND ",
    ends_at!(),
    " < $1"
);

crate::store::sql::sql_admin!(PostgresStore);
