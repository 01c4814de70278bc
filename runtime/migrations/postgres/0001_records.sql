-- idempotency records: one row per key. Fixed-width columns first (alignment), then the
-- variable ones. No secondary index: claims, completions and status lookups all go through the
-- primary key (status by reference is a range scan on its prefix), and a completion can stay a
-- HOT update. Purge and the reconciler scan in bounded batches.
CREATE TABLE IF NOT EXISTS idempotency_records (
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

CREATE TABLE IF NOT EXISTS idempotency_outbox (
    id          BIGSERIAL PRIMARY KEY,
    visible_at  BIGINT  NOT NULL,
    generation  INTEGER NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    key         BYTEA   NOT NULL,
    topic       TEXT    NOT NULL,
    payload     TEXT    NOT NULL
);
