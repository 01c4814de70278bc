-- One row per key. Fixed-width columns first, so the row needs no alignment padding; then the
-- variable ones. Times are milliseconds since the Unix epoch (the engine's clock), states are
-- RecordState::code (0 in flight, 1 completed, 2 unknown, 3 released).
--
-- No secondary index on purpose: claims, completions and fenced updates go through the primary
-- key, a status lookup by reference is a range scan of the key prefix, and with no other index a
-- completion can stay a HOT update. Purge and the reconciler's scan read the table sequentially
-- and stop at their batch limit; they run in the background, not per request.
CREATE TABLE idempotency_records (
    token            BIGINT   NOT NULL,
    claimed_at       BIGINT   NOT NULL,
    lease_expires_at BIGINT   NOT NULL,
    completed_at     BIGINT,
    expires_at       BIGINT,
    generation       INTEGER  NOT NULL,
    state            SMALLINT NOT NULL,
    ok               BOOLEAN,
    key              BYTEA    NOT NULL PRIMARY KEY,
    tenant           TEXT     NOT NULL,
    tool             TEXT     NOT NULL,
    fingerprint      BYTEA,
    response         TEXT
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
