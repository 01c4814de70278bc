-- idempotency records: one row per key, clustered on the key (WITHOUT ROWID), no secondary index.
CREATE TABLE IF NOT EXISTS idempotency_records (
    key              BLOB    NOT NULL PRIMARY KEY,
    tenant           TEXT    NOT NULL,
    tool             TEXT    NOT NULL,
    generation       INTEGER NOT NULL,
    state            INTEGER NOT NULL,
    fingerprint      BLOB,
    token            INTEGER NOT NULL,
    claimed_at       INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    completed_at     INTEGER,
    expires_at       INTEGER,
    ok               INTEGER,
    response         TEXT
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS idempotency_outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    key         BLOB    NOT NULL,
    generation  INTEGER NOT NULL,
    topic       TEXT    NOT NULL,
    payload     TEXT    NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    visible_at  INTEGER NOT NULL
);
