-- One row per key, keyed by its reference: the same row as PostgreSQL's
-- (migrations/postgres/0001_records.sql), except that PostgreSQL keeps the window's length and
-- one time (`window_s`, `lease_or_settled_at`) where this row keeps `ends_at`, `window_ms` and
-- `completed_at`. Times are milliseconds since the Unix epoch (the engine's clock).
--
-- * `ref` is the reference's 8 bytes (the key's first 8, read big-endian as a signed 64-bit
--   integer), with the key's other 24 bytes beside it (`key_rest`). As the primary key it makes
--   "two live calls never share a reference" a rule (a claim whose reference is held by a
--   different key is refused with StoreError::ReferenceTaken), and a status lookup a probe.
--   `INTEGER PRIMARY KEY` makes it the rowid itself: the table is one b-tree keyed by it, its
--   interior pages hold only rowids, and the row stores no second copy of it. (Measured with
--   the store bench, 100k completed calls with a 70-byte answer: 185 bytes per row; 186 as
--   WITHOUT ROWID, whose interior pages hold whole rows (dbstat on the same fill, simulated:
--   198 interior pages against 19); 193 for the earlier row keyed by the 32-byte key.)
-- * `ends_at` is the lease's end while in flight or unknown, and the end of the replay window
--   once completed or released (a settled record's lease ended when it settled: `completed_at`).
-- * `window_ms` is the tool's replay window, from the claim: a completion or a settlement as
--   completed at `t` answers repeats until `t + window_ms`, whoever settles it. 0 once released
--   (a released record's window ended when it was released), as PostgreSQL's `window_s`.
-- * `state`: 0 in flight, 1 completed with an Ok answer, 2 unknown, 3 released, 4 completed with
--   a definitive error (the answer's `ok` folded into the state).
-- * `fingerprint` is empty, not NULL, for call keys.
--
-- Claims, completions, fenced updates and status lookups use the primary key.
CREATE TABLE idempotency_records (
    ref          INTEGER NOT NULL PRIMARY KEY,
    token        INTEGER NOT NULL,
    claimed_at   INTEGER NOT NULL,
    ends_at      INTEGER NOT NULL,
    window_ms    INTEGER NOT NULL,
    completed_at INTEGER,
    generation   INTEGER NOT NULL,
    state        INTEGER NOT NULL,
    key_rest     BLOB    NOT NULL,
    tenant       TEXT    NOT NULL,

    subject      TEXT    NOT NULL,
    tool         TEXT    NOT NULL,
    fingerprint  BLOB    NOT NULL,
    response     TEXT
);

-- The one index beyond the primary key, on two columns a completion does not change, as
-- PostgreSQL's: SQLite writes an index only when an UPDATE changes one of its columns, so a
-- completion writes the table's page alone. A tool's window is fixed, so the index holds a few
-- runs, one per window length, each in claim order, and a record's window ends no earlier than
-- `claimed_at + window_ms` (the engine never records a completion before its claim, and one
-- recorded earlier is purged late, never early; a release sets `window_ms` to 0):
--
-- * purge reads each run from its oldest end up to `cutoff - window_ms` (a recursive query
--   visits the runs, one index probe each) and stops after its batch: its cost is its batch
--   whatever the file's size, plus the few records in that range that are not settled yet or
--   whose call ran long;
-- * the reconciler reads each run from a mark (`idempotency_reconciler`), so a round reads what
--   was claimed since the last one, and remembers the claims it found in flight or unknown in
--   `idempotency_watch` until they settle; a round reads that table (the running and stuck
--   calls) and the records it names by primary key; it reads the new claims before it takes
--   the write lock, and writes the watch and the mark. The mark trails the round's clock by the
--   busy timeout and 5 s (a claim takes its time before it waits for the write lock); a claim
--   that waited more than a second for a connection adds itself to the watch before it commits.
--
-- Two partial indexes served the same reads until this change (`idempotency_records_settled`
-- on `ends_at` of settled records, `idempotency_records_open` on `claimed_at` of unsettled
-- ones): a claim wrote the open index's page and a completion both indexes', 5 pages into the
-- WAL a fresh call against raw SQL's 2, 1.34x its instructions (BENCHMARKS.md, "SQLite: where a
-- fresh call's time went").
CREATE INDEX idempotency_records_window ON idempotency_records (window_ms, claimed_at);

-- Claims a reconciler round found in flight or unknown, until they settle.
CREATE TABLE idempotency_watch (
    ref INTEGER NOT NULL PRIMARY KEY
);

-- Every claim made at or after `mark` (on the engine's clock) is yet to be read by a round.
CREATE TABLE idempotency_reconciler (
    one  INTEGER NOT NULL PRIMARY KEY CHECK (one = 1),
    mark INTEGER NOT NULL
);
INSERT INTO idempotency_reconciler (one, mark) VALUES (1, -9223372036854775807 - 1);

-- Follow-on messages written with a completion. AUTOINCREMENT: ids are never reused, so a late
-- acknowledgement cannot delete another message.
CREATE TABLE idempotency_outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    key         BLOB    NOT NULL,
    generation  INTEGER NOT NULL,
    topic       TEXT    NOT NULL,
    payload     TEXT    NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    visible_at  INTEGER NOT NULL
);

-- The fingerprint of the secret this file's keys are made with (an HMAC of a fixed label under
-- it, never the secret): at most one row, written by the first engine that starts on the file
-- and changed by a rotation (`previous_secrets`). An engine whose secret does not match it is
-- refused: with another secret, its keys would never meet these records, and every call would
-- run again. See src/store/sqlite/secret.rs.
CREATE TABLE idempotency_secret (
    one         INTEGER NOT NULL PRIMARY KEY CHECK (one = 1),
    fingerprint BLOB    NOT NULL
);
