//! [`Admin`] for [`PostgresStore`]: read-only queries on its table (see the migration for the
//! columns).

use super::PostgresStore;

/// The row keeps the window's length and one time (the lease's end while unsettled, the
/// settlement's after): the other stores' `ends_at` and `completed_at` worked out from them.
macro_rules! ends_at {
    () => {
        "CASE WHEN state IN (0, 2) THEN lease_or_settled_at ELSE lease_or_settled_at + 1000::BIGINT * window_s END"
    };
}

const RECORD: &str = concat!(
    "SELECT tenant, subject, tool, CAST(generation AS BIGINT), CAST(state AS BIGINT), claimed_at, ",
    ends_at!(),
    ", CASE WHEN state IN (0, 2) THEN NULL ELSE lease_or_settled_at END, 1000::BIGINT * window_s, response \
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
