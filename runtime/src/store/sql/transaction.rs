//! A transactional call's connection, shared by the engine and the handler's borrow
//! ([`Call::transaction`](crate::Call::transaction)).

use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::Database;

use crate::store::{CommitError, StoreError};

/// The connection a transactional call's transaction is open on. Dropped while the transaction
/// is open (the call's future dropped, a panic, the handler keeping its borrow), the connection
/// is closed instead of going back to the pool, so the database rolls the transaction back.
#[derive(Debug)]
pub(crate) struct TxConnection<DB: Database> {
    pub(crate) conn: PoolConnection<DB>,
    /// Between `BEGIN` and a commit or rollback the database answered.
    pub(crate) open: bool,
    /// The engine has taken the transaction back: the handler can no longer borrow it.
    pub(crate) finished: bool,
}

impl<DB: Database> TxConnection<DB> {
    /// `conn`, about to begin a transaction: from the first statement on, dropping it closes
    /// the connection (a `BEGIN` whose answer was never read may have opened one).
    pub(crate) fn open(conn: PoolConnection<DB>) -> Self {
        TxConnection {
            conn,
            open: true,
            finished: false,
        }
    }

    /// Shared by the engine and the handler's borrow.
    pub(crate) fn share(self) -> SharedConnection<DB> {
        Arc::new(tokio::sync::Mutex::new(self))
    }

    /// `COMMIT`. A refusal the database answered is a rollback; when `refusal_ends_it` (it does
    /// on PostgreSQL; a SQLite transaction can stay open after a refused `COMMIT`) the
    /// connection goes back to the pool, else it is closed, which ends the transaction. No
    /// answer at all: the commit may or may not have happened.
    pub(crate) async fn commit(&mut self, refusal_ends_it: bool) -> Result<(), CommitError>
    where
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    {
        match sqlx::raw_sql("COMMIT").execute(&mut *self.conn).await {
            Ok(_) => {
                self.open = false;
                Ok(())
            }
            Err(e @ sqlx::Error::Database(_)) => {
                self.open = !refusal_ends_it;
                Err(CommitError::RolledBack(super::db_error(e)))
            }
            Err(e) => Err(CommitError::Unknown(super::db_error(e))),
        }
    }
}

impl<DB: Database> Drop for TxConnection<DB> {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

/// [`TxConnection`] as the engine and the handler share it.
pub(crate) type SharedConnection<DB> = Arc<tokio::sync::Mutex<TxConnection<DB>>>;

/// The engine takes the connection back after the body: refused (`None`) while the handler
/// still holds a borrow (a guard kept past its return, in a spawned task); the transaction is
/// then never committed, and closes with the last borrow.
pub(crate) fn take_back<DB: Database>(
    shared: &SharedConnection<DB>,
) -> Option<tokio::sync::OwnedMutexGuard<TxConnection<DB>>> {
    let mut held = Arc::clone(shared).try_lock_owned().ok()?;
    held.finished = true;
    Some(held)
}

/// Ends a transaction without keeping anything it wrote: `ROLLBACK` once the engine has it back
/// (a connection that cannot, or a handler that kept its borrow, closes instead).
pub(crate) async fn roll_back<DB: Database>(shared: &SharedConnection<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let Some(mut held) = take_back(shared) else {
        return;
    };
    if sqlx::raw_sql("ROLLBACK")
        .execute(&mut *held.conn)
        .await
        .is_ok()
    {
        held.open = false;
    }
}

/// The handler still holds its borrow of the transaction after returning.
pub(crate) fn kept() -> StoreError {
    StoreError::Config {
        problem: "the handler kept its borrow of the call's transaction (Call::transaction) past its return: \
                  the transaction is rolled back when that borrow is dropped"
            .into(),
        source: None,
    }
}
