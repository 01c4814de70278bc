//! Connecting to a PostgreSQL schema that must already hold a store
//! ([`PostgresStore::connect_existing`], for operators' tools).

use sqlx::postgres::PgConnectOptions;

use super::super::sql;
use super::connect::{BOOKKEEPING, MIGRATIONS};
use super::{PostgresStore, StoreError};
use crate::store::Access;

impl PostgresStore {
    /// Connects to `url` only if its schema (the first of the `search_path` that exists) already
    /// holds a store: never creates a table, never migrates. A schema without this library's
    /// `idempotency_migrations` table is refused with [`StoreError::NoStore`] naming the schema
    /// and the database, a store at an older schema than this build's with
    /// [`StoreError::Migration`]. With [`Access::ReadOnly`] every session runs with
    /// `default_transaction_read_only = on`, so not even a stray statement could write.
    ///
    /// Connection failures say why, as [`PostgresStore::connect`]'s do.
    pub async fn connect_existing(url: &str, access: Access) -> Result<Self, StoreError> {
        let mut options: PgConnectOptions =
            url.parse().map_err(|e: sqlx::Error| StoreError::Config {
                problem: "the PostgreSQL connection URL is not usable".into(),
                source: Some(Box::new(e)),
            })?;
        if access == Access::ReadOnly {
            options = options.options([("default_transaction_read_only", "on")]);
        }
        let database = format!(
            "postgres://{}@{}:{}/{}",
            options.get_username(),
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or(options.get_username()),
        );
        let pool = Self::pool_for(options).await?;
        if !sql::is_current(&pool, MIGRATIONS, &BOOKKEEPING).await? {
            let schema: Option<String> = sqlx::query_scalar("SELECT current_schema()::TEXT")
                .fetch_one(&pool)
                .await
                .map_err(sql::db_error)?;
            pool.close().await;
            let schema = schema.map_or_else(
                || "no schema of the search_path".to_owned(),
                |s| format!("the schema {s}"),
            );
            return Err(StoreError::NoStore {
                place: format!(
                    "{schema} of {database} has no idempotency tables (no idempotency_migrations table)"
                ),
            });
        }
        let store = Self::unmigrated(pool);
        store.check_tuned().await?;
        Ok(store)
    }
}
