//! What an operator reads across tenants (`idempotency-admin`): one record by its reference
//! whatever its tenant, counts by tool and standing, and what a purge would delete. Every
//! backend answers them itself, so no tool outside the library needs to know a backend's table
//! or record format.

use std::time::Duration;

use super::{BoxFuture, StoreError, Unsettled};
use crate::clock::Timestamp;
use crate::key::Reference;
use crate::record::{RecordState, Standing};

/// A record as an operator sees it, whatever its tenant ([`Admin::record`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminRecord {
    /// The record's reference, with its current generation.
    pub reference: Reference,
    /// The tenant it belongs to.
    pub tenant: String,
    /// The subject, for a subject-scoped record.
    pub subject: Option<String>,
    /// The tool called.
    pub tool: String,
    /// Its state.
    pub state: RecordState,
    /// Completed with an error answer.
    pub error_answer: bool,
    /// When it was claimed (by the store's clock).
    pub claimed_at: Timestamp,
    /// The lease end while unsettled, the window end once settled.
    pub ends_at: Timestamp,
    /// When it was settled.
    pub completed_at: Option<Timestamp>,
    /// The tool's replay window, as its claim recorded it.
    pub window: Duration,
    /// The stored answer.
    pub answer: Option<String>,
}

impl AdminRecord {
    /// What the record means at `now` ([`Standing::of`]): the reading a repeat and the status
    /// tool give.
    pub fn standing(&self, now: Timestamp) -> Standing {
        let ok = (self.state == RecordState::Completed).then_some(!self.error_answer);
        let passed = now >= self.ends_at;
        Standing::of(self.state, ok, passed, passed)
    }
}

/// Counts over every record of a store ([`Admin::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// How many records the store holds.
    pub records: u64,
    /// Records by tool and what they mean at the time asked, ordered by tool, then standing's
    /// name.
    pub by_tool_and_standing: Vec<(String, Standing, u64)>,
    /// The oldest claim still in flight.
    pub oldest_in_flight: Option<Timestamp>,
    /// The space the records take, as the backend measures it (a table's size with its indexes;
    /// the records' own bytes on Redis).
    pub bytes: u64,
}

// The backends that count their records here: the SQL stores and Redis.
#[cfg(any(feature = "_sql", feature = "redis"))]
impl StoreStats {
    /// Adds `n` records of `tool` that mean `standing`.
    pub(crate) fn count(&mut self, tool: &str, standing: Standing, n: u64) {
        self.records += n;
        match self
            .by_tool_and_standing
            .iter_mut()
            .find(|(t, s, _)| t == tool && *s == standing)
        {
            Some(group) => group.2 += n,
            None => self
                .by_tool_and_standing
                .push((tool.to_owned(), standing, n)),
        }
    }

    /// Orders the groups by tool, then standing's name.
    pub(crate) fn sorted(mut self) -> Self {
        self.by_tool_and_standing
            .sort_by(|a, b| (&a.0, a.1.as_str()).cmp(&(&b.0, b.1.as_str())));
        self
    }
}

/// The reads an operator's tool makes across tenants. Each backend implements them on its own
/// data (the SQL stores on their table, Redis through its shard indexes, never a keyspace scan);
/// none of them is for a request path.
pub trait Admin: Send + Sync + 'static {
    /// The record under `reference`'s key, whatever its tenant and generation (its `reference`
    /// names the current generation); `None` if there is none. A handler's lookup is
    /// [`status`](super::RecordStore::status), which is tenant-scoped.
    fn record(
        &self,
        reference: Reference,
    ) -> BoxFuture<'_, Result<Option<AdminRecord>, StoreError>>;

    /// Counts over every record, each read as it means at `now` (by this caller's clock).
    fn stats(&self, now: Timestamp) -> BoxFuture<'_, Result<StoreStats, StoreError>>;

    /// How many records [`purge`](super::Maintenance::purge) at `now` and `older_than` would
    /// delete (settled, window ended before `older_than`), without deleting any.
    fn purgeable(
        &self,
        now: Timestamp,
        older_than: Timestamp,
    ) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// The claims [`unsettled`](super::Maintenance::unsettled) would hand the reconciler at
    /// `now` (in flight with the lease ended, or unknown), at most `limit`, oldest claim first,
    /// without its bookkeeping: the SQL stores read the table and write nothing (a scan, for
    /// operators only); Redis runs the reconciler's read, which may drop index entries of records
    /// that expired.
    fn unsettled_claims(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Unsettled>, StoreError>>;

    /// The store's own clock now (PostgreSQL's `now()`, Redis's `TIME`), or `None` for a store
    /// on one machine, which has none (memory, SQLite): the time an operator's reads judge by.
    fn server_time(&self) -> BoxFuture<'_, Result<Option<Timestamp>, StoreError>> {
        Box::pin(async { Ok(None) })
    }

    /// Whether a store is here. Opening a SQL store already checks its tables; a Redis
    /// namespace exists once it holds a record index or a secret fingerprint.
    fn exists(&self) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(async { Ok(true) })
    }
}
