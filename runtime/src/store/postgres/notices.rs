//! Settlement notices for repeats that wait (`wait`) on a call another replica runs: one
//! listening connection per store, opened at the first wait, and a flag on the record.
//!
//! A waiting repeat first makes sure this store listens on channel `idempotency_settled`, then
//! sets the record's `watched` flag (one fenced `UPDATE`, skipped when it is set already). When
//! a watched record leaves flight, the migration's trigger sends a notice at commit naming the
//! schema and the key, and the listener wakes the repeats waiting on that key here. The order
//! closes every gap: a settlement committed before the flag was set is seen by the repeat's next
//! read of the record; one committed after it finds the flag and notifies a connection that
//! already listens. Records nobody waits on never notify, so completions do not take NOTIFY's
//! commit-time lock.
//!
//! The listening connection is not one of the pool's: it comes from a pool of one of its own
//! (same options), so waiting takes nothing from the calls. When it is lost, everything waiting
//! is woken to read its record again (a notice may have been missed) and it reconnects.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};

use super::super::sql::{db_error, ref_of, rest_of};
use super::super::{StoreError, Wake};
use crate::key::{Key, Reference};

/// The channel the migration's trigger notifies.
const CHANNEL: &str = "idempotency_settled";

/// Past this many watched keys, the keys whose repeats are all gone are dropped as new ones come.
const PRUNE_AT: usize = 1024;

/// Sets the flag (`$1` ref, `$2` key_rest, `$3` generation) and answers whether the record is
/// that call in flight and watched: set now, or set already (then no write, and no row lock).
const WATCH: &str = "\
WITH w AS (
    UPDATE idempotency_records SET watched = true
    WHERE ref = $1 AND key_rest = $2 AND generation = $3 AND state = 0 AND NOT watched
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM w) OR EXISTS (
    SELECT 1 FROM idempotency_records
    WHERE ref = $1 AND key_rest = $2 AND generation = $3 AND state = 0 AND watched
)";

/// A store's notices: nothing until the first wait, then a listening connection.
#[derive(Debug, Default)]
pub(super) struct Notices {
    listening: tokio::sync::OnceCell<Arc<Listening>>,
}

/// The listening side: who waits on which key (by the key's hex, as notices name it).
#[derive(Debug)]
struct Listening {
    /// This store's schema: notices from other schemas of the database are not for it.
    schema: String,
    waiting: Mutex<HashMap<String, Vec<Wake>>>,
    task: tokio::task::AbortHandle,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listening {
    /// Wakes the repeats waiting on the key a notice names.
    fn heard(&self, payload: &str) {
        let Some((schema, key)) = payload.split_once(' ') else {
            return;
        };
        if schema != self.schema {
            return;
        }
        let wakes = self
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        for wake in wakes.into_iter().flatten() {
            wake.wake();
        }
    }

    /// Wakes everyone: a notice may have been missed.
    fn wake_all(&self) {
        let all = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(PoisonError::into_inner));
        for wake in all.into_values().flatten() {
            wake.wake();
        }
    }

    fn add(&self, key: &Key, wake: Wake) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.len() >= PRUNE_AT && waiting.len().is_power_of_two() {
            waiting.retain(|_, wakes| {
                wakes.retain(|w| !w.is_gone());
                !wakes.is_empty()
            });
        }
        let wakes = waiting.entry(key.to_string()).or_default();
        wakes.retain(|w| !w.is_gone());
        wakes.push(wake);
    }
}

impl Notices {
    /// See [`RecordStore::watch`](super::super::RecordStore::watch).
    pub(super) async fn watch(
        &self,
        pool: &PgPool,
        key: Key,
        reference: Reference,
        wake: Wake,
    ) -> Result<bool, StoreError> {
        let listening = match self.listening.get_or_try_init(|| listen(pool)).await {
            Ok(l) => l,
            Err(e) => {
                // The waiting repeat reads its record now and then instead.
                tracing::debug!(error = %e, "idempotency: could not listen for settlement notices");
                return Ok(false);
            }
        };
        listening.add(&key, wake);
        sqlx::query_scalar(WATCH)
            .bind(ref_of(&key))
            .bind(rest_of(&key))
            .bind(i64::from(reference.generation()))
            .fetch_one(pool)
            .await
            .map_err(db_error)
    }
}

/// Opens the listening connection and starts the task that reads it.
async fn listen(pool: &PgPool) -> Result<Arc<Listening>, StoreError> {
    let own = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with((*pool.connect_options()).clone())
        .await
        .map_err(db_error)?;
    let mut listener = PgListener::connect_with(&own).await.map_err(db_error)?;
    listener.ignore_pool_close_event(true);
    let schema: String = sqlx::query_scalar("SELECT current_schema()::TEXT")
        .fetch_one(&mut listener)
        .await
        .map_err(db_error)?;
    listener.listen(CHANNEL).await.map_err(db_error)?;
    Ok(Arc::new_cyclic(|me: &Weak<Listening>| {
        let task = tokio::spawn(read(listener, me.clone())).abort_handle();
        Listening {
            schema,
            waiting: Mutex::default(),
            task,
        }
    }))
}

/// Reads notices until the store is gone.
async fn read(mut listener: PgListener, listening: Weak<Listening>) {
    loop {
        let next = listener.try_recv().await;
        let Some(l) = listening.upgrade() else { return };
        match next {
            Ok(Some(notice)) => l.heard(notice.payload()),
            // Lost and connected again (listening again): a notice may have been missed.
            Ok(None) => l.wake_all(),
            Err(e) => {
                tracing::warn!(error = %e, "idempotency: the connection listening for settlement notices failed; waiting repeats read their records instead until it is back");
                l.wake_all();
                drop(l);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
