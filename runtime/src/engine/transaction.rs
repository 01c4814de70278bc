//! A transactional call's connection as its handler borrows it: [`Call::transaction`].

use std::ops::{Deref, DerefMut};

use sqlx::Database;

use super::call::Call;
use crate::store::sql::{SharedConnection, TxConnection};

/// The handler's borrow of its call's transaction (`#[idempotent(transactional)]`): a
/// connection of the store's pool, inside the transaction that also holds the call's record.
/// Use it as `&mut *tx` wherever sqlx takes an executor; what it writes commits with the call's
/// outcome, or not at all.
///
/// Do not `COMMIT` or `ROLLBACK` on it: the engine ends the transaction (on PostgreSQL a
/// transaction ended by the handler is detected and the call is answered "nothing was done").
/// Drop it before the handler returns: a borrow kept past the return (moved into a spawned task)
/// makes the engine roll the call back.
pub struct Transaction<DB: Database> {
    held: tokio::sync::OwnedMutexGuard<TxConnection<DB>>,
}

impl<DB: Database> std::fmt::Debug for Transaction<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("database", &DB::NAME)
            .finish_non_exhaustive()
    }
}

impl<DB: Database> Deref for Transaction<DB> {
    type Target = DB::Connection;
    fn deref(&self) -> &DB::Connection {
        &self.held.conn
    }
}

impl<DB: Database> DerefMut for Transaction<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.held.conn
    }
}

/// Why [`Call::transaction`] gave no connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransactionError {
    /// The tool is not `#[idempotent(transactional)]`.
    #[error("{tool} is not a transactional tool: add `transactional` to its #[idempotent(...)]")]
    NotTransactional {
        /// The tool's name.
        tool: &'static str,
    },
    /// The store's database is another one than the handler asked for.
    #[error("{tool}'s store is not a {asked} database")]
    OtherDatabase {
        /// The tool's name.
        tool: &'static str,
        /// The database the handler asked for.
        asked: &'static str,
    },
    /// The handler already holds a borrow of the transaction: drop it first.
    #[error("{tool}'s transaction is already borrowed: drop the other borrow first")]
    Borrowed {
        /// The tool's name.
        tool: &'static str,
    },
    /// The handler has returned: its transaction has been committed or rolled back.
    #[error("{tool}'s transaction has ended: the handler returned")]
    Ended {
        /// The tool's name.
        tool: &'static str,
    },
}

impl Call {
    /// Borrows this call's transaction, on the store's own database (`DB`: `sqlx::Postgres` or
    /// `sqlx::Sqlite`): what the handler writes through it commits in the same commit as the
    /// call's record, or not at all.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idempotency::Call;
    /// let call = Call::current().ok_or("not inside an #[idempotent] body")?;
    /// let mut tx = call.transaction::<sqlx::Sqlite>()?;
    /// sqlx::query("INSERT INTO orders (reference) VALUES (?1)")
    ///     .bind(call.reference().to_string())
    ///     .execute(&mut *tx)
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn transaction<DB: Database>(&self) -> Result<Transaction<DB>, TransactionError> {
        let tool = self.tool;
        let shared = self
            .transaction
            .clone()
            .ok_or(TransactionError::NotTransactional { tool })?;
        let shared: SharedConnection<DB> =
            shared
                .downcast()
                .map_err(|_| TransactionError::OtherDatabase {
                    tool,
                    asked: DB::NAME,
                })?;
        let held = shared
            .try_lock_owned()
            .map_err(|_| TransactionError::Borrowed { tool })?;
        if held.finished {
            return Err(TransactionError::Ended { tool });
        }
        Ok(Transaction { held })
    }
}
