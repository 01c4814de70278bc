//! [`PostgresStore`]: what to run when one machine is not enough. Every replica of the server
//! shares one database; the primary key makes exactly one replica win each claim.
//!
//! The primary key is the reference itself: the key's first 8 bytes as a `BIGINT`, with the
//! other 24 bytes beside it. Downstream systems deduplicate on the reference, so no two live
//! records may share one; the primary key makes that a rule (a different key whose reference is
//! held gets [`StoreError::ReferenceTaken`]), keeps each index entry at 16 bytes, and makes a
//! status lookup a primary-key probe. See `migrations/postgres/0001_records.sql` for the row
//! (the SQLite store keeps the same one).
//!
//! Every call is one statement, so one round trip: a fresh claim is one insert, a repeat the same
//! statement returning the row it found; a completion is a single `UPDATE` (with its outbox
//! messages, a single statement that updates and inserts). Two cases take a second statement: a
//! claim that finds a released or window-expired record of its own key takes it over, and a
//! rejected update reads the row again to say why.

use std::time::Duration;

use sqlx::postgres::{PgArguments, PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::query::Query;
use sqlx::{Postgres, Row, ValueRef};

use super::sql::{
    self, db_error, raced, ref_of, ref_value, rest_of, state_code, why_fenced, Bookkeeping,
    Migration, RecordRow, CLAIM_ATTEMPTS, FENCE_ATTEMPTS,
};
use super::{
    BoxFuture, Claim, ClaimRequest, Completion, RecordStore, Settlement, StoreError, Token, Wake,
};
use crate::clock::Timestamp;
use crate::key::{Key, Reference};
use crate::record::{RecordState, RecordStatus};

mod admin;
mod background;
mod notices;
mod secret;

/// The database server's clock in ms since the epoch (`statement_timestamp()`, one value for the
/// whole statement): the clock of every statement a store outside tests runs.
///
/// `date_part` (a `float8`, which resolves a microsecond of this clock until the 2250s; the cast
/// rounds to the nearest ms) rather than `extract` (a `numeric`): on PostgreSQL 15 the numeric
/// form cost about 2 µs more of server time each time a statement evaluated it, 4 µs a claim
/// (the server's own statement durations, BENCHMARKS.md).
macro_rules! server_clock {
    () => {
        "(date_part('epoch', statement_timestamp()) * 1000)::BIGINT"
    };
}

/// The statement's clock, in ms since the epoch: the database server's ([`server_clock!`]) plus
/// the store's offset `$off`, or, when `$off` is NULL (a store told to trust the engine's clock,
/// for tests that move time by hand), the engine's `now` parameter as given. Every other time of
/// the statement is shifted by the same amount (`clock + (t - now)`), keeping the durations the
/// engine chose. The per-call statements also come in a form on [`server_clock!`] alone, which
/// a store without an offset (every store outside tests) runs: two parameters fewer and no
/// `COALESCE` to build on each execution.
macro_rules! clock {
    ($now:literal, $off:literal) => {
        concat!(
            "COALESCE(",
            server_clock!(),
            " + ",
            $off,
            "::BIGINT, ",
            $now,
            "::BIGINT)"
        )
    };
}
pub(super) use {clock, server_clock};

/// The row's `ends_at` as the other stores keep it: the lease's end while in flight or unknown,
/// else the window's end. See the migration for the columns behind it.
macro_rules! ends_at {
    () => {
        "CASE WHEN state IN (0, 2) THEN lease_or_settled_at ELSE lease_or_settled_at + 1000::BIGINT * window_s END"
    };
}

/// The row's times as the other stores keep them (`RecordRow` reads these): [`ends_at!`], and
/// the completion (settlement) time, NULL while in flight or unknown.
macro_rules! ends_and_completed {
    () => {
        concat!(
            ends_at!(),
            ", CASE WHEN state IN (0, 2) THEN NULL ELSE lease_or_settled_at END"
        )
    };
}
use {ends_and_completed, ends_at};

const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    description: "records and outbox",
    sql: include_str!("../../../migrations/postgres/0001_records.sql"),
}];

/// The pool size [`PostgresStore::connect`] uses.
const POOL_SIZE: u32 = 10;

/// Two-key advisory lock for migrations: a constant ("idmp") and the schema, so stores in
/// different schemas of one database migrate independently.
const MIGRATION_LOCK: &str =
    "SELECT pg_advisory_xact_lock(1768189296, hashtext(coalesce(current_schema(), '')))";

/// The migration runner's statements for PostgreSQL: a transaction under [`MIGRATION_LOCK`].
const BOOKKEEPING: Bookkeeping = Bookkeeping {
    begin: "BEGIN",
    lock: Some(MIGRATION_LOCK),
    exists: "SELECT to_regclass('idempotency_migrations')::TEXT",
    create: "CREATE TABLE idempotency_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
             checksum BYTEA NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    place: "this schema",
};

/// The claim, in one statement: insert the record, or, when the reference's row exists, return
/// it as it was. A fresh call is a bare primary-key insert (and its entry in
/// `idempotency_records_window`); a repeat writes nothing, so it takes no row lock and no
/// transaction id (a lock would cost the repeat a WAL flush at commit).
///
/// Parameters: `$1` ref, `$2` key_rest, `$3` tenant, `$4` tool, `$5` fingerprint, `$6` now,
/// `$7` lease end, `$8` token, `$9` subject (`''` for a tenant-scoped record), `$10` the clock
/// offset ([`clock!`]), `$11` the window's length in seconds (shared with [`TAKEOVER`]).
///
/// No row comes back when the insert won. Otherwise one row of two columns: the row found,
/// whole (`r`, of the table's row type, read by [`found_row`]), and the statement's clock, by
/// which the caller judges whether a found record's window has ended. The row is read by a
/// scalar subquery, evaluated only when the insert found the key taken. The found row is one
/// column rather than one column each because PostgreSQL builds every column's projection on
/// each execution, the branch that did not run included; and the shape (no `UNION ALL` with a
/// row from the insert) because it is the plan with the fewest nodes to start. In pgbench,
/// one client, without the commit's flush, the claim and completion took 0.353 ms with eight
/// columns under a `UNION ALL`, 0.341 ms with the row whole, 0.336 ms in this shape, and a bare
/// insert 0.328 ms (`tests/benches/pg_claim_shapes.sh`, BENCHMARKS.md).
///
/// The found row is NULL when a conflicting row was committed after the statement's snapshot
/// (READ COMMITTED: the insert waited on another replica's claim of the key): the claim runs
/// again, and never takes that for a win.
const CLAIM: &str = claim_sql!(
    clock: clock!("$6", "$10"),
    lease_end: concat!(clock!("$6", "$10"), " + ($7 - $6)"),
    token: "$8",
    subject: "$9",
    window: "$11"
);

/// [`CLAIM`] on the server's clock alone ([`server_clock!`]), for a store with no clock offset:
/// `$1` … `$5` as [`CLAIM`], `$6` the lease's length in ms, `$7` token, `$8` subject, `$9` the
/// window's length in seconds.
const CLAIM_ON_SERVER_CLOCK: &str = claim_sql!(
    clock: server_clock!(),
    lease_end: concat!(server_clock!(), " + $6"),
    token: "$7",
    subject: "$8",
    window: "$9"
);

/// The text of [`CLAIM`] and [`CLAIM_ON_SERVER_CLOCK`]: `$1` … `$5` are the same in both.
macro_rules! claim_sql {
    (clock: $clock:expr, lease_end: $lease_end:expr, token: $token:literal, subject: $subject:literal, window: $window:literal) => {
        concat!(
            "\
WITH ins AS (
    INSERT INTO idempotency_records
        (ref, token, claimed_at, window_s, lease_or_settled_at, generation, state, key_rest, tenant, subject, tool, fingerprint)
    VALUES ($1, ", $token, ", ", $clock, ", ", $window, ", ", $lease_end, ", 1, 0, $2, $3, ", $subject, ", $4, $5)
    ON CONFLICT (ref) DO NOTHING
    RETURNING 1
)
SELECT (SELECT r FROM idempotency_records r WHERE ref = $1), ", $clock, "
WHERE NOT EXISTS (SELECT 1 FROM ins)"
        )
    };
}
use claim_sql;

/// The row a [`CLAIM`] found, from its whole-row column: the record's columns in the
/// migration's order (`ref` … `response`), with the other stores' `ends_at` and `completed_at`
/// worked out as [`ends_and_completed!`] does in SQL.
fn found_row(value: sqlx::postgres::PgValueRef<'_>) -> Result<RecordRow, sqlx::Error> {
    let decode = |e| sqlx::Error::Decode(e);
    let mut r = sqlx::postgres::types::PgRecordDecoder::new(value).map_err(decode)?;
    let _ref: i64 = r.try_decode().map_err(decode)?;
    let _token: i64 = r.try_decode().map_err(decode)?;
    let claimed_at: i64 = r.try_decode().map_err(decode)?;
    let lease_or_settled_at: i64 = r.try_decode().map_err(decode)?;
    let window_s: i32 = r.try_decode().map_err(decode)?;
    let generation: i32 = r.try_decode().map_err(decode)?;
    let state: i16 = r.try_decode().map_err(decode)?;
    let _watched: bool = r.try_decode().map_err(decode)?;
    let key_rest: Vec<u8> = r.try_decode().map_err(decode)?;
    let _tenant: String = r.try_decode().map_err(decode)?;
    let _subject: String = r.try_decode().map_err(decode)?;
    let _tool: String = r.try_decode().map_err(decode)?;
    let fingerprint: Vec<u8> = r.try_decode().map_err(decode)?;
    let response: Option<String> = r.try_decode().map_err(decode)?;
    let unsettled = matches!(
        RecordState::from_code(state),
        Some(RecordState::InFlight | RecordState::Unknown)
    );
    Ok(RecordRow {
        key_rest,
        generation,
        state,
        fingerprint,
        claimed_at,
        ends_at: if unsettled {
            lease_or_settled_at
        } else {
            lease_or_settled_at.saturating_add(1000 * i64::from(window_s))
        },
        completed_at: (!unsettled).then_some(lease_or_settled_at),
        response,
    })
}

/// The rare second statement of a claim that found a released or window-expired record of its
/// own key: take it over (the request's token; generation + 1 only for an expired window), if it still
/// qualifies. Same parameters as [`CLAIM`].
const TAKEOVER: &str = concat!(
    "\
UPDATE idempotency_records SET
    token = $8,
    claimed_at = ",
    clock!("$6", "$10"),
    ",
    window_s = $11,
    lease_or_settled_at = ",
    clock!("$6", "$10"),
    " + ($7 - $6),
    generation = CASE WHEN state = 3 THEN generation ELSE generation + 1 END,
    state = 0,
    watched = false,
    tenant = $3,
    subject = $9,
    tool = $4,
    fingerprint = $5,
    response = NULL
WHERE ref = $1 AND key_rest = $2 AND (state = 3 OR (state IN (1, 4) AND lease_or_settled_at + 1000::BIGINT * window_s <= ",
    clock!("$6", "$10"),
    "))
RETURNING generation, token"
);

/// `$1` ref, `$2` key_rest, `$3` token, `$4` state, `$5` response, `$6` now, `$7` clock offset.
/// The window is the record's own (`window_s`, from the claim), untouched, so no indexed column
/// changes: a HOT update. The completion time is never earlier than the claim's, so a clock that
/// stepped back cannot end the window early.
const COMPLETE: &str = complete_sql!(clock!("$6", "$7"));

/// [`COMPLETE`] on the server's clock alone ([`server_clock!`]), for a store with no clock
/// offset: `$1` … `$5` as [`COMPLETE`].
const COMPLETE_ON_SERVER_CLOCK: &str = complete_sql!(server_clock!());

/// The text of [`COMPLETE`] and [`COMPLETE_ON_SERVER_CLOCK`].
macro_rules! complete_sql {
    ($clock:expr) => {
        concat!(
            "UPDATE idempotency_records SET state = $4, response = $5, lease_or_settled_at = GREATEST(",
            $clock,
            ", claimed_at) WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state = 0"
        )
    };
}
use complete_sql;

/// A completion with outbox messages: one statement, so one transaction and one round trip. It
/// inserts as many rows as there are messages, or none when the update was fenced. Parameters
/// as [`COMPLETE`], then `$8` topics and `$9` payloads.
const COMPLETE_WITH_OUTBOX: &str = concat!(
    "\
WITH done AS (
    UPDATE idempotency_records SET state = $4, response = $5,
        lease_or_settled_at = GREATEST(",
    clock!("$6", "$7"),
    ", claimed_at)
    WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state = 0
    RETURNING generation, lease_or_settled_at
)
INSERT INTO idempotency_outbox (visible_at, generation, key, topic, payload)
SELECT done.lease_or_settled_at, done.generation, int8send($1) || $2, m.topic, m.payload
FROM done CROSS JOIN unnest($8::TEXT[], $9::TEXT[]) WITH ORDINALITY AS m(topic, payload, n)
ORDER BY m.n"
);

const ROW_NOW: &str =
    "SELECT generation, token, state, key_rest FROM idempotency_records WHERE ref = $1";

type PgQuery = Query<'static, Postgres, PgArguments>;

/// A [`Store`](super::Store) on PostgreSQL, for servers with several replicas.
///
/// ```no_run
/// # async fn demo() -> Result<(), idempotency::store::StoreError> {
/// use idempotency::{store::PostgresStore, Idempotency};
/// let store = PostgresStore::connect("postgres://app@db.internal/app").await?;
/// let engine = Idempotency::new(store);
/// # let _ = engine; Ok(()) }
/// ```
///
/// ## Plans
///
/// sqlx prepares each statement once per connection and PostgreSQL may then switch it to a
/// generic plan. A generic plan made while `idempotency_records` was empty (and analysed) is a
/// sequential scan, and it stays one as the table grows. The connections this store opens
/// therefore run with `enable_seqscan = off` and `jit = off` ([`PostgresStore::tune`]): every
/// statement it runs has an index plan (the per-call ones the primary key; purge and the
/// reconciler's round `idempotency_records_window`, see [`Maintenance`](super::Maintenance)),
/// so generic plans use an index whatever the table's size when they were made.
/// (`plan_cache_mode = force_custom_plan` would also do, but planning the
/// claim on every call costs about 0.1 ms, doubling a repeat's latency.)
///
/// ## Time
///
/// Replicas' clocks disagree; the database's is the one they share. Every statement reads the
/// server's clock (`statement_timestamp()`) and keeps only the durations the engine chose (the
/// lease, the window, the retention), so a replica whose clock is minutes ahead or behind claims,
/// replays, expires leases and purges exactly as one whose clock is right. A completion is never
/// recorded earlier than its claim, so the database's clock stepping back cannot end a window
/// early either.
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pool: PgPool,
    /// `Some(offset)`: the server's clock plus `offset` ms (0 outside tests); `None`: the
    /// engine's times as given (tests that move time by hand).
    clock_offset: Option<i64>,
    /// Settlement notices for waiting repeats, shared by the store's clones.
    notices: std::sync::Arc<notices::Notices>,
}

impl PostgresStore {
    /// Connects to `url` (a pool of 10 connections, tuned by [`PostgresStore::tune`]) and runs the
    /// migrations.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options: PgConnectOptions =
            url.parse().map_err(|e: sqlx::Error| StoreError::Config {
                problem: "the PostgreSQL connection URL is not usable".into(),
                source: Some(Box::new(e)),
            })?;
        Self::connect_with(options).await
    }

    /// Like [`PostgresStore::connect`], from connection options (say, with a `search_path`).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), idempotency::store::StoreError> {
    /// use idempotency::store::PostgresStore;
    /// use sqlx::postgres::PgConnectOptions;
    /// let options = PgConnectOptions::new().host("db.internal").database("app")
    ///     .options([("search_path", "idempotency")]);
    /// let store = PostgresStore::connect_with(options).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn connect_with(options: PgConnectOptions) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(Self::tune(options))
            .await
            .map_err(db_error)?;
        Self::from_pool(pool).await
    }

    /// Adds the session settings this store's statements are planned for: `enable_seqscan = off`
    /// (a lookup never falls back to a sequential scan, even with a generic plan made on an empty
    /// table) and `jit = off`. Use it on the options of a pool you build yourself for
    /// [`PostgresStore::from_pool`]; keep that pool for the store, as the settings apply to every
    /// statement on its connections.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idempotency::store::PostgresStore;
    /// let options = "postgres://app@db.internal/app".parse()?;
    /// let pool = sqlx::postgres::PgPoolOptions::new()
    ///     .max_connections(32)
    ///     .connect_with(PostgresStore::tune(options))
    ///     .await?;
    /// let store = PostgresStore::from_pool(pool).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn tune(options: PgConnectOptions) -> PgConnectOptions {
        options.options([("enable_seqscan", "off"), ("jit", "off")])
    }

    /// A store on an existing pool; runs the migrations. Build the pool's options with
    /// [`PostgresStore::tune`] (a warning is logged if its connections are not tuned).
    pub async fn from_pool(pool: PgPool) -> Result<Self, StoreError> {
        let store = PostgresStore {
            pool,
            clock_offset: Some(0),
            notices: std::sync::Arc::default(),
        };
        store.migrate().await?;
        let seqscan: String = sqlx::query_scalar("SELECT current_setting('enable_seqscan')")
            .fetch_one(&store.pool)
            .await
            .map_err(db_error)?;
        if seqscan != "off" {
            tracing::warn!(
                "PostgresStore: this pool's connections run with enable_seqscan = on; a statement first planned \
                 while the records table was empty can keep a sequential-scan plan as it grows. Build the pool \
                 from PostgresStore::tune(options)."
            );
        }
        Ok(store)
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// For tests that move time by hand (`ManualClock`): this store uses the engine's times as
    /// given instead of the database server's clock. Never for replicas: their clocks disagree.
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn trusting_engine_clock(mut self) -> Self {
        self.clock_offset = None;
        self
    }

    /// For tests: this store reads the database server's clock shifted by `offset_ms`, as if the
    /// database's clock had jumped (a window's end reached without waiting for it).
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn with_server_clock_offset(mut self, offset_ms: i64) -> Self {
        self.clock_offset = Some(offset_ms);
        self
    }

    /// Applies the migrations this build embeds that the database lacks, in one transaction under
    /// an advisory lock (replicas starting together apply them once), and records them in the
    /// library's own `idempotency_migrations` table. Refuses a database that records a migration
    /// this build does not know. The constructors call it; running it again changes nothing.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sql::migrate(&self.pool, MIGRATIONS, &BOOKKEEPING).await
    }

    /// The row under the key's `ref` now, for [`why_fenced`].
    async fn row_now(&self, key: &Key) -> Result<Option<sql::FenceRow>, StoreError> {
        sqlx::query_as(ROW_NOW)
            .bind(ref_of(key))
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)
    }

    /// Runs a fenced update; when it changes nothing, reads the row to say why.
    async fn fenced(
        &self,
        key: Key,
        token: Token,
        (allowed, what): (&[RecordState], &'static str),
        query: impl Fn() -> PgQuery + Send,
    ) -> Result<(), StoreError> {
        for _ in 0..FENCE_ATTEMPTS {
            let done = query().execute(&self.pool).await.map_err(db_error)?;
            if done.rows_affected() > 0 {
                return Ok(());
            }
            why_fenced(&key, token, self.row_now(&key).await?, allowed)?;
        }
        Err(raced(what, FENCE_ATTEMPTS))
    }
}

/// `claim`'s times moved from the server's clock to the caller's (`t - shift`), so that a lease
/// the server counts as live is live by the caller's `now` too.
fn in_callers_frame(claim: Claim, shift: i64) -> Claim {
    let back = |t: Timestamp| Timestamp::from_millis(t.as_millis().saturating_sub(shift));
    match claim {
        Claim::InFlight {
            reference,
            claimed_at,
            lease_expires_at,
        } => Claim::InFlight {
            reference,
            claimed_at: back(claimed_at),
            lease_expires_at: back(lease_expires_at),
        },
        Claim::Completed {
            reference,
            response,
            completed_at,
        } => Claim::Completed {
            reference,
            response,
            completed_at: back(completed_at),
        },
        Claim::Unknown { reference, since } => Claim::Unknown {
            reference,
            since: back(since),
        },
        other => other,
    }
}

/// A fenced statement's first three parameters: `$1` ref, `$2` key_rest, `$3` token.
fn fenced_query(sql: &'static str, key: &Key, token: Token) -> PgQuery {
    sqlx::query(sql)
        .bind(ref_of(key))
        .bind(rest_of(key).to_vec())
        .bind(token.0)
}

impl RecordStore for PostgresStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let fingerprint = req
                .fingerprint
                .as_ref()
                .map_or(&[][..], |f| &f.as_bytes()[..]);
            // Whole seconds, rounded up (see the migration).
            let window_s =
                i32::try_from(req.window.as_secs() + u64::from(req.window.subsec_nanos() > 0))
                    .unwrap_or(i32::MAX);
            // `$1` … `$5`, the same in every claim statement.
            let head = |sql: &'static str| {
                sqlx::query(sql)
                    .bind(ref_of(&req.key))
                    .bind(rest_of(&req.key))
                    .bind(req.tenant)
                    .bind(req.tool)
                    .bind(fingerprint)
            };
            let bound = |sql| {
                head(sql)
                    .bind(req.now.as_millis())
                    .bind((req.now + req.lease).as_millis())
                    .bind(req.token.0)
                    .bind(req.subject.unwrap_or(""))
                    .bind(self.clock_offset)
                    .bind(window_s)
            };
            let claim = || match self.clock_offset {
                Some(0) => head(CLAIM_ON_SERVER_CLOCK)
                    .bind(
                        (req.now + req.lease)
                            .as_millis()
                            .saturating_sub(req.now.as_millis()),
                    )
                    .bind(req.token.0)
                    .bind(req.subject.unwrap_or(""))
                    .bind(window_s),
                _ => bound(CLAIM),
            };
            for _ in 0..CLAIM_ATTEMPTS {
                let row = claim().fetch_optional(&self.pool).await.map_err(db_error)?;
                let Some(row) = row else {
                    return Ok(Claim::New {
                        reference: req.key.reference(1),
                        token: req.token,
                    });
                };
                let found = row.try_get_raw(0).map_err(db_error)?;
                if found.is_null() {
                    continue;
                }
                let rec = found_row(found).map_err(db_error)?;
                let clock: i64 = row.try_get(1).map_err(db_error)?;
                let clock = Timestamp::from_millis(clock);
                if let Some(answer) = rec.existing_claim(&req.key, &req.fingerprint, clock)? {
                    // Judged by the server's clock, answered in the caller's: the engine
                    // compares the lease end with its own `now`.
                    return Ok(in_callers_frame(
                        answer,
                        clock.as_millis() - req.now.as_millis(),
                    ));
                }
                let taken = bound(TAKEOVER)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db_error)?;
                if let Some(row) = taken {
                    let generation: i32 = row.try_get(0).map_err(db_error)?;
                    let token: i64 = row.try_get(1).map_err(db_error)?;
                    return Ok(Claim::New {
                        reference: req
                            .key
                            .reference(sql::generation_of(i64::from(generation))?),
                        token: Token(token),
                    });
                }
            }
            Err(raced("the claim", CLAIM_ATTEMPTS))
        })
    }

    fn complete<'a>(&'a self, c: &'a Completion<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let topics: Vec<&str> = c.outbox.iter().map(|m| m.topic.as_str()).collect();
            let payloads: Vec<&str> = c.outbox.iter().map(|m| m.payload.as_str()).collect();
            let state = state_code(RecordState::Completed, Some(c.response.ok));
            self.fenced(
                c.key,
                c.token,
                (&[RecordState::InFlight], "the completion"),
                || {
                    let head = |sql| {
                        fenced_query(sql, &c.key, c.token)
                            .bind(state)
                            .bind(c.response.body.as_str())
                    };
                    match (c.outbox.is_empty(), self.clock_offset) {
                        (true, Some(0)) => head(COMPLETE_ON_SERVER_CLOCK),
                        (true, offset) => head(COMPLETE).bind(c.now.as_millis()).bind(offset),
                        (false, offset) => head(COMPLETE_WITH_OUTBOX)
                            .bind(c.now.as_millis())
                            .bind(offset)
                            .bind(&topics)
                            .bind(&payloads),
                    }
                },
            )
            .await
        })
    }

    fn release(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.fenced(
            key,
            token, (&[RecordState::InFlight], "the release"),
            move || {
                fenced_query(
                    concat!(
                        "UPDATE idempotency_records SET state = 3, lease_or_settled_at = GREATEST(",
                        clock!("$4", "$5"),
                        ", claimed_at), window_s = 0 WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state = 0"
                    ),
                    &key,
                    token,
                )
                .bind(now.as_millis())
                .bind(self.clock_offset)
            }))
    }

    fn mark_unknown(&self, key: Key, token: Token) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.fenced(key, token, (&[RecordState::InFlight], "marking the outcome unknown"), move || {
            fenced_query(
                "UPDATE idempotency_records SET state = 2 WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state = 0",
                &key,
                token,
            )
        }))
    }

    fn renew(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let lease_expires_at = now + lease;
        Box::pin(self.fenced(
            key,
            token,
            (&[RecordState::InFlight], "the lease renewal"),
            move || {
                fenced_query(
                    concat!(
                    "UPDATE idempotency_records SET lease_or_settled_at = ",
                    clock!("$4", "$6"),
                    " + ($5 - $4) WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state = 0"
                ),
                    &key,
                    token,
                )
                .bind(now.as_millis())
                .bind(lease_expires_at.as_millis())
                .bind(self.clock_offset)
            },
        ))
    }

    /// One statement on the server's clock; the state and the lease are the fence. Under READ
    /// COMMITTED a concurrent takeover waits on the winner's row lock, then re-checks the row it
    /// now sees (its lease live): exactly one wins.
    fn take_over(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Reference, StoreError>> {
        let lease_expires_at = now + lease;
        Box::pin(async move {
            let generation: Option<i32> = sqlx::query_scalar(concat!(
                "UPDATE idempotency_records SET token = $3, state = 0, lease_or_settled_at = ",
                clock!("$4", "$6"),
                " + ($5 - $4) WHERE ref = $1 AND key_rest = $2 \
                 AND ((state = 0 AND lease_or_settled_at <= ",
                clock!("$4", "$6"),
                ") OR state = 2) RETURNING generation"
            ))
            .bind(ref_of(&key))
            .bind(rest_of(&key).to_vec())
            .bind(token.0)
            .bind(now.as_millis())
            .bind(lease_expires_at.as_millis())
            .bind(self.clock_offset)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
            match generation {
                Some(g) => Ok(key.reference(sql::generation_of(i64::from(g))?)),
                None => Err(sql::why_not_taken(&key, self.row_now(&key).await?)),
            }
        })
    }

    /// A primary-key probe: the reference is the primary key.
    fn status<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>> {
        Box::pin(async move {
            // A generation below 1 is read, and refused as corrupt, rather than hidden.
            let row = sqlx::query(concat!(
                "SELECT tool, key_rest, generation, state, fingerprint, claimed_at, ",
                ends_and_completed!(),
                ", response FROM idempotency_records WHERE ref = $1 AND tenant = $2 AND (generation >= $3 OR generation < 1) \
                 AND (subject = '' OR subject = $4)"
            ))
            .bind(ref_value(&reference))
            .bind(tenant)
            .bind(i64::from(reference.generation()))
            .bind(subject)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
            let Some(row) = row else { return Ok(None) };
            let tool: String = row.try_get(0).map_err(db_error)?;
            RecordRow::read(&row, 1)
                .map_err(db_error)?
                .status(reference, tool)
                .map(Some)
        })
    }

    /// A flag on the record and a notice from the migration's trigger (see `notices.rs`).
    fn watch<'a>(
        &'a self,
        key: Key,
        reference: Reference,
        wake: Wake,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.notices.watch(&self.pool, key, reference, wake))
    }

    fn settle<'a>(
        &'a self,
        key: Key,
        token: Token,
        settlement: &'a Settlement,
        at: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (code, body, _) = sql::settlement_columns(settlement, at);
        let allowed = &[RecordState::InFlight, RecordState::Unknown];
        // Settled at the statement's clock (never before the claim). Completed keeps the
        // record's own window (the claim's); released stops answering at once, as a release
        // does; unknown keeps its lease end in `lease_or_settled_at`.
        Box::pin(self.fenced(key, token, (allowed, "the settlement"), move || {
            fenced_query(
                concat!(
                    "UPDATE idempotency_records SET token = token + 1, state = $4, response = $5, \
                     lease_or_settled_at = CASE WHEN $4 = 2 THEN lease_or_settled_at ELSE GREATEST(",
                    clock!("$6", "$7"),
                    ", claimed_at) END, \
                     window_s = CASE WHEN $4 = 3 THEN 0 ELSE window_s END \
                     WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state IN (0, 2)"
                ),
                &key,
                token,
            )
            .bind(code)
            .bind(body)
            .bind(at.as_millis())
            .bind(self.clock_offset)
        }))
    }
}
