-- One row per key, stored in the primary-key b-tree itself (WITHOUT ROWID), no secondary index:
-- claims, completions and status lookups (a range scan of the key prefix) use the key; purge and
-- the reconciler's scan read the table and stop at their batch limit. Times are milliseconds
-- since the Unix epoch, states are RecordState::code (0 in flight, 1 completed, 2 unknown,
-- 3 released).
CREATE TABLE idempotency_records (
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
