-- Version 2: a narrower record row (bytes per row after 100k completed calls with a 70-byte
-- answer: 302 with version 1). Existing records are carried over; nothing is dropped until the
-- copy has succeeded, and all of it runs in the migration's transaction.
--
-- * The primary key is the reference's 8 bytes as a BIGINT (`ref`, the key's first 8 bytes
--   read big-endian), with the key's other 24 bytes beside it (`key_rest`). Downstream systems
--   deduplicate on the reference, so two live calls must never share one: the primary key makes
--   that a rule (a claim whose reference is held by a different key is refused with
--   StoreError::ReferenceTaken, never answered with the other call's record), and it makes each
--   index entry 16 bytes instead of 48, and a status lookup an exact primary-key probe.
-- * `ends_at` is the lease's end while in flight or unknown, and the end of the replay window
--   once completed or released (a settled record's lease ended when it settled: `completed_at`).
-- * `ok` is folded into `state`: 0 in flight, 1 completed with an Ok answer, 2 unknown,
--   3 released, 4 completed with a definitive error.
-- * `fingerprint` is empty, not NULL, for call keys, so a completed row has no NULL and no null
--   bitmap.
--
-- Fixed-width columns come first, widest first, so the row needs no alignment padding. No
-- secondary index: claims, completions, fenced updates and status lookups use the primary key,
-- and with no other index a completion can stay a HOT update. Purge and the reconciler's scan
-- read the table sequentially and stop at their batch limit, in the background.
ALTER TABLE idempotency_records RENAME TO idempotency_records_v1;
ALTER INDEX idempotency_records_pkey RENAME TO idempotency_records_v1_pkey;

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
    tool         TEXT     NOT NULL,
    fingerprint  BYTEA    NOT NULL,
    response     TEXT
);

-- Two version-1 keys sharing their first 8 bytes would violate the new primary key: the
-- migration then fails and leaves version 1 as it was.
INSERT INTO idempotency_records
    (ref, token, claimed_at, ends_at, completed_at, generation, state, key_rest, tenant, tool,
     fingerprint, response)
SELECT ('x' || encode(substring(key FROM 1 FOR 8), 'hex'))::BIT(64)::BIGINT,
       token,
       claimed_at,
       CASE WHEN state IN (1, 3) THEN coalesce(expires_at, 0) ELSE lease_expires_at END,
       completed_at,
       generation,
       CASE WHEN state = 1 AND ok IS FALSE THEN 4 ELSE state END,
       substring(key FROM 9),
       tenant,
       tool,
       coalesce(fingerprint, ''::BYTEA),
       response
FROM idempotency_records_v1;

DROP TABLE idempotency_records_v1;
