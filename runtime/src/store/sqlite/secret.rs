//! [`SqliteStore`]'s secret fingerprint: the one row of `idempotency_secret`.

use super::SqliteStore;
use crate::key::SecretFingerprint;
use crate::store::sql::{db_error, secret};
use crate::store::{BoxFuture, SecretStore, StoreError};

/// `$1` the fingerprint: stored when none is; answers the row as it is afterwards (the no-op
/// update makes a conflicting insert return the row it found).
const INSTALL: &str = "\
INSERT INTO idempotency_secret (one, fingerprint) VALUES (1, $1)
ON CONFLICT (one) DO UPDATE SET fingerprint = idempotency_secret.fingerprint
RETURNING fingerprint";

impl SecretStore for SqliteStore {
    fn swap_secret(
        &self,
        expected: Option<SecretFingerprint>,
        new: SecretFingerprint,
    ) -> BoxFuture<'_, Result<Option<SecretFingerprint>, StoreError>> {
        Box::pin(async move {
            let new = new.as_bytes().to_vec();
            let query = match expected {
                None => sqlx::query_scalar(INSTALL).bind(new),
                Some(e) => sqlx::query_scalar(secret::ROTATE)
                    .bind(e.as_bytes().to_vec())
                    .bind(new),
            };
            let found: Option<Vec<u8>> =
                query.fetch_optional(&self.pool).await.map_err(db_error)?;
            secret::stored(found)
        })
    }
}
