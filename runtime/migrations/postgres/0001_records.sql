-- One row per key, keyed by its reference. Times are milliseconds since the Unix epoch (the
-- engine's clock). The SQLite store keeps the same row (migrations/sqlite/0001_records.sql).
--
-- * The primary key is the reference's 8 bytes as a BIGINT (`ref`, the key's first 8 bytes
--   read big-endian), with the key's other 24 bytes beside it (`key_rest`). Downstream systems
--   deduplicate on the reference, so two live calls must never share one: the primary key makes
--   that a rule (a claim whose reference is held by a different key is refused with
--   StoreError::ReferenceTaken, never answered with the other call's record), and it makes each
--   index entry 16 bytes instead of 48, and a status lookup an exact primary-key probe.
-- * `ends_at` is the lease's end while in flight or unknown, and the end of the replay window
--   once completed or released (a settled record's lease ended when it settled: `completed_at`).
-- * `state`: 0 in flight, 1 completed with an Ok answer, 2 unknown, 3 released, 4 completed with
--   a definitive error (the answer's `ok` folded into the state).
-- * `fingerprint` is empty, not NULL, for call keys, so a completed row has no NULL and no null
--   bitmap.
--
-- Fixed-width columns come first, widest first, so the row needs no alignment padding. No
-- secondary index: claims, completions, fenced updates and status lookups use the primary key,
-- and with no other index a completion can stay a HOT update. Purge and the reconciler's scan
-- read the table sequentially and stop at their batch limit, in the background.
CREATE TABLE idempotency_records (
    ref          BIGINT   NOT NULL PRIMARY KEY,
    token        BIGINT   NOT NULL,
    claimed_at   BIGINT   NOT NULL,
    ends_at      BIGINT   NOT NULL,
    completed_at BIGINT,
    generation   INTEGER  NOT NULL,
    state        SMALLINT NOT NULL,
    key_rest     BYTEA    NOT NULL,
    tenant       TEXT     NOT NULL,

    subject      TEXT     NOT NULL,
    tool         TEXT     NOT NULL,
    fingerprint  BYTEA    NOT NULL,
    response     TEXT
);

-- Follow-on messages written with a completion, keyed by the operation (key + generation).
-- Identities are never reused, so a late acknowledgement cannot delete another message.
CREATE TABLE idempotency_outbox (
    id          BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    visible_at  BIGINT  NOT NULL,
    generation  INTEGER NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    key         BYTEA   NOT NULL,
    topic       TEXT    NOT NULL,
    payload     TEXT    NOT NULL
);
