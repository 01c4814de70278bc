//! [`SqliteStore`]'s secret fingerprint: the one row of `idempotency_secret`.

use super::SqliteStore;

/// `$1` the fingerprint: stored when none is; answers the row as it is afterwards (the no-op
/// update makes a conflicting insert return the row it found).
const INSTALL: &str = "\
INSERT INTO idempotency_secret (one, fingerprint) VALUES (1, $1)
ON CONFLICT (one) DO UPDATE SET fingerprint = idempotency_secret.fingerprint
RETURNING fingerprint";

crate::store::sql::sql_secret!(SqliteStore);
