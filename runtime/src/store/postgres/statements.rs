//! The PostgreSQL store's per-call statements: the clock macros every statement builds on, the
//! claim and its takeover, the completions, and the fenced updates' row read.

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
pub(super) use {ends_and_completed, ends_at};

/// The claim, in one statement: insert the record, or, when the reference's row exists, return
/// it as it was. A fresh call is a bare primary-key insert (and its entry in
/// `idempotency_records_window`); a repeat writes nothing, so it takes no row lock and no
/// transaction id (a lock would cost the repeat a WAL flush at commit).
///
/// Parameters: `$1` ref, `$2` key_rest, `$3` tenant, `$4` tool, `$5` fingerprint, `$6` now,
/// `$7` lease end, `$8` token, `$9` subject (`''` for a tenant-scoped record), `$10` the clock
/// offset ([`clock!`]), `$11` the window's length in seconds (shared with [`TAKEOVER`]).
///
/// No row comes back when the insert won. Otherwise one row of two columns: the row found, whole
/// (`r`, of the table's row type, read by [`found_row`](super::found_row)), and the statement's
/// clock, by which the caller judges whether a found record's window has ended. The row is read by
/// a scalar subquery, evaluated only when the insert found the key taken. The found row is one
/// column rather than one column each because PostgreSQL builds every column's projection on each
/// execution, the branch that did not run included; and the shape (no `UNION ALL` with a row from
/// the insert) because it is the plan with the fewest nodes to start. In pgbench, one client,
/// without the commit's flush, the claim and completion took 0.353 ms with eight columns under a
/// `UNION ALL`, 0.341 ms with the row whole, 0.336 ms in this shape, and a bare insert 0.328 ms
/// (`tests/benches/pg_claim_shapes.sh`, BENCHMARKS.md).
///
/// The found row is NULL when a conflicting row was committed after the statement's snapshot
/// (READ COMMITTED: the insert waited on another replica's claim of the key): the claim runs
/// again, and never takes that for a win.
pub(super) const CLAIM: &str = claim_sql!(
    clock: clock!("$6", "$10"),
    lease_end: concat!(clock!("$6", "$10"), " + ($7 - $6)"),
    token: "$8",
    subject: "$9",
    window: "$11"
);

/// [`CLAIM`] on the server's clock alone ([`server_clock!`]), for a store with no clock offset:
/// `$1` … `$5` as [`CLAIM`], `$6` the lease's length in ms, `$7` token, `$8` subject, `$9` the
/// window's length in seconds.
pub(super) const CLAIM_ON_SERVER_CLOCK: &str = claim_sql!(
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

/// The rare second statement of a claim that found a released or window-expired record of its
/// own key: take it over (the request's token; generation + 1 only for an expired window; a claim
/// time later than the record's last, whatever the clock did), if it still qualifies. Same
/// parameters as [`CLAIM`].
pub(super) const TAKEOVER: &str = concat!(
    "\
UPDATE idempotency_records SET
    token = $8,
    claimed_at = GREATEST(",
    clock!("$6", "$10"),
    ", claimed_at + 1),
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
pub(super) const COMPLETE: &str = complete_sql!(clock!("$6", "$7"));

/// [`COMPLETE`] on the server's clock alone ([`server_clock!`]), for a store with no clock
/// offset: `$1` … `$5` as [`COMPLETE`].
pub(super) const COMPLETE_ON_SERVER_CLOCK: &str = complete_sql!(server_clock!());

/// The text of [`COMPLETE`] and [`COMPLETE_ON_SERVER_CLOCK`].
macro_rules! complete_sql {
    ($clock:expr) => {
        concat!(
            "UPDATE idempotency_records SET state = $4, response = $5, lease_or_settled_at = GREATEST(",
            $clock,
            ", claimed_at) WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state IN (0, 2)"
        )
    };
}
use complete_sql;

/// A completion with outbox messages: one statement, so one transaction and one round trip. It
/// inserts as many rows as there are messages, or none when the update was fenced. Parameters
/// as [`COMPLETE`], then `$8` topics and `$9` payloads.
pub(super) const COMPLETE_WITH_OUTBOX: &str = concat!(
    "\
WITH done AS (
    UPDATE idempotency_records SET state = $4, response = $5,
        lease_or_settled_at = GREATEST(",
    clock!("$6", "$7"),
    ", claimed_at)
    WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state IN (0, 2)
    RETURNING generation, lease_or_settled_at
)
INSERT INTO idempotency_outbox (visible_at, generation, key, topic, payload)
SELECT done.lease_or_settled_at, done.generation, int8send($1) || $2, m.topic, m.payload
FROM done CROSS JOIN unnest($8::TEXT[], $9::TEXT[]) WITH ORDINALITY AS m(topic, payload, n)
ORDER BY m.n"
);
