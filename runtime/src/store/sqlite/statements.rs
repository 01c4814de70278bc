//! The SQLite store's per-call statements: the claim (an upsert and the row it found), the
//! completions, and the fenced updates' row read.

/// The text of [`CLAIM`], for [`CLAIM_WATCHED`] too.
macro_rules! claim {
    () => {
        "\
INSERT INTO idempotency_records
    (ref, token, claimed_at, ends_at, window_ms, generation, state, key_rest, tenant, subject, tool, fingerprint)
VALUES (?, ?, ?, ?, ?, 1, 0, ?, ?, ?, ?, ?)
ON CONFLICT (ref) DO UPDATE SET
    token = excluded.token,
    claimed_at = MAX(excluded.claimed_at, claimed_at + 1),
    ends_at = excluded.ends_at,
    window_ms = excluded.window_ms,
    generation = CASE WHEN state = 3 THEN generation ELSE generation + 1 END,
    state = 0,
    tenant = excluded.tenant,
    subject = excluded.subject,
    tool = excluded.tool,
    fingerprint = excluded.fingerprint,
    completed_at = NULL,
    response = NULL
WHERE key_rest = excluded.key_rest AND (state = 3 OR (state IN (1, 4) AND ends_at <= excluded.claimed_at))
RETURNING 1, generation, token;
SELECT 0, key_rest, generation, state, fingerprint, claimed_at, ends_at, completed_at, response
FROM idempotency_records WHERE ref = ? AND changes() = 0"
    };
}

/// The claim, in one call to sqlx's SQLite worker, two statements. First an upsert: insert, or take
/// over a released / window-expired record of this key (same `key_rest`; its claim time later than
/// the record's last, whatever the clock did), returning a row only when this claim won. Then, only when the upsert changed nothing (`changes() = 0`), the row it found
/// under the reference. The first column says which: `1` a won claim (`generation, token`), `0` the
/// existing record (a [`RecordRow`](super::super::sql::RecordRow) from column 1 on; another key's
/// when its `key_rest` differs).
///
/// Parameters, anonymous (`?`) and so bound in the text's order (sqlx binds a `$N` by looking its
/// name up and parsing it, about 140 instructions a parameter): ref, token, now, lease end, the
/// tool's window in ms (kept on the record for its completion and settlements), key_rest,
/// tenant, subject (`''` for a tenant-scoped record), tool, fingerprint, then ref again for the
/// second statement. [`claim_query`](super::record_store::claim_query) binds them.
pub(super) const CLAIM: &str = claim!();

/// [`CLAIM`] after adding the reference to the reconciler's watch (`idempotency_watch`), for a
/// claim that waited long for its connection (see `SqliteStore::claim`): its time may be older
/// than the reconciler's mark by the time it commits, and watched, it is listed once its lease
/// ends whatever the mark. The watch's row is written first, so the claim never commits
/// without it; a watched record that is not (or no longer) in flight or unknown is dropped from
/// the watch by the next round. Its first parameter is the ref, then [`CLAIM`]'s.
pub(super) const CLAIM_WATCHED: &str = concat!(
    "INSERT OR IGNORE INTO idempotency_watch (ref) VALUES (?);\n",
    claim!()
);

/// Parameters, anonymous as [`CLAIM`]'s: state, response, now, now again, ref, key_rest, token:
/// replayed for the record's own window (the claim's) from then.
pub(super) const COMPLETE: &str = "\
UPDATE idempotency_records SET state = ?, response = ?, completed_at = ?, ends_at = ? + window_ms
WHERE ref = ? AND key_rest = ? AND token = ? AND state IN (0, 2)";

/// [`COMPLETE`], for a completion that writes outbox messages with the row's generation.
pub(super) const COMPLETE_RETURNING: &str = "\
UPDATE idempotency_records SET state = $4, response = $5, completed_at = $6, ends_at = $6 + window_ms
WHERE ref = $1 AND key_rest = $2 AND token = $3 AND state IN (0, 2) RETURNING generation";

/// The runs of `idempotency_records_window`: each window length in the file, found by one
/// index probe per length (a recursive query; SQLite's own skip-scan needs `ANALYZE` figures).
/// The tail of a statement that starts `WITH RECURSIVE`; its rows' `s` is NULL past the last.
macro_rules! windows {
    () => {
        "w(s) AS ( \
             SELECT (SELECT min(window_ms) FROM idempotency_records) \
           UNION ALL \
             SELECT (SELECT min(window_ms) FROM idempotency_records WHERE window_ms > w.s) \
             FROM w WHERE w.s IS NOT NULL)"
    };
}
pub(super) use windows;
