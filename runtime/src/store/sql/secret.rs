//! The secret fingerprint both SQL stores keep: one row of `idempotency_secret` (see the
//! migrations). Each swap is one statement, so atomic: an insert when none is expected, a
//! conditional update otherwise, each answering the row as it is afterwards.

use crate::key::SecretFingerprint;
use crate::store::StoreError;

/// `$1` the expected fingerprint, `$2` the new one: replaces the stored fingerprint when it is
/// `$1`, and answers the row as it is afterwards (no row: none is stored). On PostgreSQL a
/// concurrent swap's committed row is the one compared (the update waits for its lock and
/// evaluates the `CASE` on the row it then finds).
pub(crate) const ROTATE: &str = "\
UPDATE idempotency_secret
SET fingerprint = CASE WHEN fingerprint = $1 THEN $2 ELSE fingerprint END
RETURNING fingerprint";

/// A stored fingerprint read back.
pub(crate) fn stored(bytes: Option<Vec<u8>>) -> Result<Option<SecretFingerprint>, StoreError> {
    bytes
        .map(|b| {
            SecretFingerprint::from_slice(&b).ok_or_else(|| {
                StoreError::corrupt(format!(
                    "the stored secret fingerprint is {} bytes long, not 32",
                    b.len()
                ))
            })
        })
        .transpose()
}
