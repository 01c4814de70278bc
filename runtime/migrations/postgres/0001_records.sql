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
-- Fixed-width columns come first, widest first, so the row needs no alignment padding. Claims,
-- completions, fenced updates and status lookups use the primary key. The background work uses
-- two partial indexes, so its cost is its batch, not the table (see below).
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

-- What the background work reads, and nothing else:
--
-- * `idempotency_records_settled`: completed and released records by the end of their window,
--   for purge. A batch reads the index from its oldest end and stops after its limit, so it costs
--   its 1,000 rows whatever the table's size or how rare expired rows are. 16-byte entries,
--   appended in time order (so packed at the b-tree's 90 % right-edge fill): about 22 bytes a
--   row.
-- * `idempotency_records_open`: in-flight and unknown records by claim time, for the reconciler.
--   It holds only the calls running now (plus entries of finished ones until vacuum), so a round
--   reads a few pages, oldest claim first.
--
-- The price: a completion changes `state` and `ends_at`, which these indexes use, so it is no
-- longer a HOT update: it adds a primary-key entry (the old one goes with vacuum or b-tree
-- bottom-up deletion) and one settled entry. Measured (README, Benchmarks): fresh calls about
-- 1.10x the raw SQL's latency and 0.85-0.87x its throughput, against 1.05x and 0.95x with HOT.
-- Any index that finds expired records has this cost on PostgreSQL 15: the window's end is only
-- known at completion. The alternatives weighed (the claim-time index and the side table
-- measured): an index on the claim time alone (keeps HOT, but a purge must pass every record
-- claimed within a window of the cutoff), BRIN (on PostgreSQL 15 it blocks HOT too, and at steady
-- state vacuum's reuse of free space leaves no time order in the heap for it to summarise), a
-- side table of in-flight claims (two more writes per call, measured slower than the open index,
-- and it does nothing for purge), and time partitions (a claim must see every partition to keep
-- keys unique).
CREATE INDEX idempotency_records_settled ON idempotency_records (ends_at) WHERE state IN (1, 3, 4);
CREATE INDEX idempotency_records_open ON idempotency_records (claimed_at) WHERE state IN (0, 2);

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
