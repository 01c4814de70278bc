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
/// The server's clock (`now()`), in ms, the time an operator's reads judge by.
const NOW: Option<&str> = Some("SELECT CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT)");
/// The claims to reconcile at `$1`, at most `$2`, in the reconciler's order, read only.
const UNSETTLED_READ: &str =
    "SELECT ref, key_rest, generation, tenant, subject, tool, state, token, \
     claimed_at, 1000::BIGINT * window_s FROM idempotency_records \
     WHERE state IN (0, 2) AND (state = 2 OR lease_or_settled_at <= $1) \
     ORDER BY claimed_at, ref < 0, ref LIMIT $2";

crate::store::sql::sql_admin!(PostgresStore);
