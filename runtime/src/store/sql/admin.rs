//! The [`Admin`](crate::store::Admin) reads of the SQL stores: the admin row read back, the
//! stats, and `sql_admin!`, which each backend invokes with its statements.

use super::{generation_of, split_state};
use crate::clock::Timestamp;
use crate::key::Reference;
use crate::store::StoreError;

/// A record row as the admin reads select it (both backends, every value widened to BIGINT):
/// tenant, subject, tool, generation, state, claimed_at, ends_at, completed_at, window (ms),
/// response.
pub(crate) type AdminRow = (
    String,
    String,
    String,
    i64,
    i64,
    i64,
    i64,
    Option<i64>,
    i64,
    Option<String>,
);

/// An admin row read back as the record `reference` names (its generation the row's).
pub(crate) fn admin_record(
    reference: Reference,
    row: AdminRow,
) -> Result<crate::store::AdminRecord, StoreError> {
    let (
        tenant,
        subject,
        tool,
        generation,
        code,
        claimed_at,
        ends_at,
        completed_at,
        window,
        response,
    ) = row;
    let (state, ok) = split_state(i16::try_from(code).unwrap_or(i16::MAX))?;
    let window = u64::try_from(window).map_err(|_| {
        StoreError::corrupt(format!(
            "the window of ref {reference} is {window} ms, below zero"
        ))
    })?;
    Ok(crate::store::AdminRecord {
        reference: reference.with_generation(generation_of(generation)?),
        tenant,
        subject: (!subject.is_empty()).then_some(subject),
        tool,
        state,
        error_answer: ok == Some(false),
        claimed_at: Timestamp::from_millis(claimed_at),
        ends_at: Timestamp::from_millis(ends_at),
        completed_at: completed_at.map(Timestamp::from_millis),
        window: std::time::Duration::from_millis(window),
        answer: response,
    })
}

/// Stats from groups of (state, tool, whether `ends_at` has passed (1/0), records), the oldest
/// claim in flight and the table's size.
pub(crate) fn admin_stats(
    groups: Vec<(i64, String, i64, i64)>,
    oldest_in_flight: Option<i64>,
    bytes: i64,
) -> Result<crate::store::StoreStats, StoreError> {
    let mut stats = crate::store::StoreStats {
        oldest_in_flight: oldest_in_flight.map(Timestamp::from_millis),
        bytes: u64::try_from(bytes).unwrap_or(0),
        ..Default::default()
    };
    for (code, tool, passed, n) in groups {
        let (state, ok) = split_state(i16::try_from(code).unwrap_or(i16::MAX)).map_err(|_| {
            StoreError::corrupt(format!(
                "{n} records of tool {tool} have the state code {code}, which this version does not know"
            ))
        })?;
        let passed = passed != 0;
        let standing = crate::record::Standing::of(state, ok, passed, passed);
        stats.count(&tool, standing, u64::try_from(n).unwrap_or(0));
    }
    Ok(stats.sorted())
}

/// The [`Admin`](crate::store::Admin) reads of a SQL store, the same on both backends: each
/// backend's `admin.rs` names its statements (`RECORD`, `BY_STATE`, `OLDEST_IN_FLIGHT`, `SIZE`,
/// `PURGEABLE`, `UNSETTLED_READ`, and `NOW`, its server's clock in ms if it has one: the columns [`AdminRow`] and [`admin_stats`] read) and invokes this.
macro_rules! sql_admin {
    ($store:ty) => {
        impl $crate::store::Admin for $store {
            fn record(
                &self,
                reference: $crate::key::Reference,
            ) -> $crate::store::BoxFuture<
                '_,
                Result<Option<$crate::store::AdminRecord>, $crate::store::StoreError>,
            > {
                Box::pin(async move {
                    let row: Option<$crate::store::sql::AdminRow> = sqlx::query_as(RECORD)
                        .bind($crate::store::sql::ref_value(&reference))
                        .fetch_optional(&self.pool)
                        .await
                        .map_err($crate::store::sql::db_error)?;
                    row.map(|r| $crate::store::sql::admin_record(reference, r))
                        .transpose()
                })
            }

            fn stats(
                &self,
                now: $crate::clock::Timestamp,
            ) -> $crate::store::BoxFuture<
                '_,
                Result<$crate::store::StoreStats, $crate::store::StoreError>,
            > {
                Box::pin(async move {
                    let groups = sqlx::query_as(BY_STATE)
                        .bind(now.as_millis())
                        .fetch_all(&self.pool)
                        .await
                        .map_err($crate::store::sql::db_error)?;
                    let oldest = sqlx::query_scalar(OLDEST_IN_FLIGHT)
                        .fetch_one(&self.pool)
                        .await
                        .map_err($crate::store::sql::db_error)?;
                    let bytes = sqlx::query_scalar(SIZE)
                        .fetch_one(&self.pool)
                        .await
                        .map_err($crate::store::sql::db_error)?;
                    $crate::store::sql::admin_stats(groups, oldest, bytes)
                })
            }

            fn unsettled_claims(
                &self,
                now: $crate::clock::Timestamp,
                limit: u32,
            ) -> $crate::store::BoxFuture<
                '_,
                Result<Vec<$crate::store::Unsettled>, $crate::store::StoreError>,
            > {
                Box::pin(async move {
                    let rows: Vec<$crate::store::sql::UnsettledRow> =
                        sqlx::query_as(UNSETTLED_READ)
                            .bind(now.as_millis())
                            .bind(i64::from(limit))
                            .fetch_all(&self.pool)
                            .await
                            .map_err($crate::store::sql::db_error)?;
                    rows.into_iter()
                        .map($crate::store::sql::unsettled)
                        .collect()
                })
            }

            fn server_time(
                &self,
            ) -> $crate::store::BoxFuture<
                '_,
                Result<Option<$crate::clock::Timestamp>, $crate::store::StoreError>,
            > {
                Box::pin(async move {
                    let Some(now) = NOW else {
                        return Ok(None);
                    };
                    let ms: i64 = sqlx::query_scalar(now)
                        .fetch_one(&self.pool)
                        .await
                        .map_err($crate::store::sql::db_error)?;
                    Ok(Some($crate::clock::Timestamp::from_millis(ms)))
                })
            }

            fn purgeable(
                &self,
                _now: $crate::clock::Timestamp,
                older_than: $crate::clock::Timestamp,
            ) -> $crate::store::BoxFuture<'_, Result<u64, $crate::store::StoreError>> {
                Box::pin(async move {
                    let n: i64 = sqlx::query_scalar(PURGEABLE)
                        .bind(older_than.as_millis())
                        .fetch_one(&self.pool)
                        .await
                        .map_err($crate::store::sql::db_error)?;
                    Ok(u64::try_from(n).unwrap_or(0))
                })
            }
        }
    };
}
pub(crate) use sql_admin;
