-- One row per key, keyed by its reference: the same row as PostgreSQL's
-- (migrations/postgres/0001_records.sql), except that PostgreSQL keeps the window's length and
-- one time (`window_s`, `lease_or_settled_at`) where this row keeps `ends_at` and
-- `completed_at`, so that its completions leave its one index alone. Times are milliseconds
-- since the Unix epoch (the engine's clock).
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
--   completed at `t` answers repeats until `t + window_ms`, whoever settles it.
-- * `state`: 0 in flight, 1 completed with an Ok answer, 2 unknown, 3 released, 4 completed with
--   a definitive error (the answer's `ok` folded into the state).
-- * `fingerprint` is empty, not NULL, for call keys.
--
-- Claims, completions, fenced updates and status lookups use the primary key. The background
-- work uses two partial indexes, so a purge batch reads its batch and a reconciler round the
-- running calls, whatever the file's size. (PostgreSQL used the same two until a completion's
-- cost there, no longer a HOT update, made it change design; SQLite has no HOT updates.)
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

-- Completed and released records by the end of their window (purge, oldest first), and
-- in-flight and unknown ones by claim time (the reconciler). A query uses a partial index only
-- when its WHERE repeats the index's condition, term for term: keep them in step with
-- src/store/sqlite/background.rs. The settled condition is spelled with OR, not
-- `state IN (1, 3, 4)`: SQLite evaluates a constant IN list of more than two values through a
-- temporary b-tree it builds each time a statement runs it, and every claim and completion
-- evaluates this condition (for the row it writes, and a completion for the row it replaces).
CREATE INDEX idempotency_records_settled ON idempotency_records (ends_at)
    WHERE (state = 1 OR state = 3 OR state = 4);
CREATE INDEX idempotency_records_open ON idempotency_records (claimed_at) WHERE state IN (0, 2);

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
