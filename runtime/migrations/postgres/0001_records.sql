-- One row per key, keyed by its reference. Times are milliseconds since the Unix epoch (the
-- engine's clock, or the server's shifted into it). The SQLite store keeps the same columns up
-- to `window_s` and `lease_or_settled_at` (migrations/sqlite/0001_records.sql keeps `ends_at`
-- and `completed_at` instead, with two partial indexes: SQLite has no HOT updates to keep).
--
-- * The primary key is the reference's 8 bytes as a BIGINT (`ref`, the key's first 8 bytes
--   read big-endian), with the key's other 24 bytes beside it (`key_rest`). Downstream systems
--   deduplicate on the reference, so two live calls must never share one: the primary key makes
--   that a rule (a claim whose reference is held by a different key is refused with
--   StoreError::ReferenceTaken, never answered with the other call's record), and it makes each
--   index entry 16 bytes instead of 48, and a status lookup an exact primary-key probe.
-- * `window_s`: the replay window's length in whole seconds (a window that is not is rounded
--   up), set by the claim (the tool's window) and kept by the completion; 0 once released. An
--   INTEGER, not a BIGINT: with it the row's fixed part is 42 bytes and a row with a 70-byte
--   answer 184 bytes, not 192 (rows are 8-byte aligned).
-- * `lease_or_settled_at`: the lease's end while in flight or unknown; when the record settled
--   once completed or released. The window ends at `lease_or_settled_at + 1000 * window_s`.
-- * `state`: 0 in flight, 1 completed with an Ok answer, 2 unknown, 3 released, 4 completed with
--   a definitive error (the answer's `ok` folded into the state).
-- * `watched`: a repeat on some replica waits for this call (`wait`); when the record then
--   leaves flight, `idempotency_records_settled` tells the replicas listening (below). False
--   for a new claim, so a call nobody waits on pays nothing for it.
-- * `fingerprint` is empty, not NULL, for call keys, so a completed row has no NULL and no null
--   bitmap.
--
-- Fixed-width columns come first, widest first, so the row needs no alignment padding. Claims,
-- completions, fenced updates and status lookups use the primary key.
CREATE TABLE idempotency_records (
    ref                 BIGINT   NOT NULL PRIMARY KEY,
    token               BIGINT   NOT NULL,
    claimed_at          BIGINT   NOT NULL,
    lease_or_settled_at BIGINT   NOT NULL,
    window_s            INTEGER  NOT NULL,
    generation          INTEGER  NOT NULL,
    state               SMALLINT NOT NULL,
    watched             BOOLEAN  NOT NULL DEFAULT false,
    key_rest            BYTEA    NOT NULL,
    tenant              TEXT     NOT NULL,
    subject             TEXT     NOT NULL,
    tool                TEXT     NOT NULL,
    fingerprint         BYTEA    NOT NULL,
    response            TEXT
);

-- The one index beyond the primary key, on two columns a completion does not change, so a
-- completion stays a HOT update (PostgreSQL 15 makes an update non-HOT when it changes any
-- column an index reads, including a partial index's condition). A tool's window is fixed, so
-- the index holds a few runs, one per window length, each in claim order, and a record's window
-- ends no earlier than `claimed_at + 1000 * window_s`:
--
-- * purge reads each run from its oldest end up to `cutoff - 1000 * window_s` (a recursive query
--   visits the runs, one index probe each) and stops after its batch: its cost is its batch
--   whatever the table's size, plus the few records in that range that are not settled yet;
-- * the reconciler reads each run from a mark (`idempotency_reconciler`), so a round reads what
--   was claimed since the last one, and remembers the claims it found unsettled in
--   `idempotency_watch` until they settle; a round reads that table (the running and stuck
--   calls) and the records it names by primary key.
--
-- Two partial indexes (on the state) served the same reads until this change: each completion
-- then changed their columns, so none was a HOT update (32-client throughput 0.78-0.87x the raw
-- SQL's, 291-299 bytes a row filled by calls). The alternatives weighed are in BENCHMARKS.md.
CREATE INDEX idempotency_records_window ON idempotency_records (window_s, claimed_at);

-- Settlement notices for repeats that wait on another replica: when a watched record leaves
-- flight, a NOTIFY on channel `idempotency_settled` whose payload is the schema, a space, and
-- the key (hex). The notice is sent at commit; the trigger's condition keeps every unwatched
-- update (nearly all) free of it, and of NOTIFY's commit-time lock.
CREATE FUNCTION idempotency_records_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idempotency_settled',
        TG_TABLE_SCHEMA || ' ' || encode(int8send(NEW.ref) || NEW.key_rest, 'hex'));
    RETURN NULL;
END
$$;
CREATE TRIGGER idempotency_records_settled AFTER UPDATE ON idempotency_records
    FOR EACH ROW WHEN (OLD.watched AND OLD.state = 0 AND NEW.state <> 0)
    EXECUTE FUNCTION idempotency_records_settled();

-- Claims a reconciler round found in flight or unknown, until they settle.
CREATE TABLE idempotency_watch (
    ref BIGINT NOT NULL PRIMARY KEY
);

-- Every claim made at or after `mark` (on the records' clock) is yet to be read by a round.
CREATE TABLE idempotency_reconciler (
    one  BOOLEAN NOT NULL PRIMARY KEY DEFAULT true CHECK (one),
    mark BIGINT  NOT NULL
);
INSERT INTO idempotency_reconciler (mark) VALUES (-9223372036854775808);

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

-- The fingerprint of the secret this schema's keys are made with (an HMAC of a fixed label under
-- it, never the secret): at most one row, written by the first engine that starts on the schema
-- and changed by a rotation (`previous_secrets`). An engine whose secret does not match it is
-- refused: with another secret, its keys would never meet these records, and every call would
-- run again. See src/store/postgres/secret.rs.
CREATE TABLE idempotency_secret (
    one         BOOLEAN NOT NULL PRIMARY KEY DEFAULT true CHECK (one),
    fingerprint BYTEA   NOT NULL
);
