//! The secret check: an engine runs nothing on a store whose records are keyed with a secret it
//! neither uses nor lists as previous (its keys would never meet them: every call would run
//! again). See [`IdempotencyBuilder::start`](crate::IdempotencyBuilder::start).

use tokio::sync::OnceCell;

use crate::key::{Secret, SecretFingerprint};
use crate::store::{Store, StoreError};

/// How often the check tries again when concurrent rotations keep changing the fingerprint
/// under it.
const ATTEMPTS: usize = 5;

/// An engine's check, made once: at [`start`](crate::IdempotencyBuilder::start), or at the
/// first call of an engine made with `build()`. A check that fails is made again at the next
/// call.
pub(super) struct SecretCheck {
    current: SecretFingerprint,
    previous: Vec<SecretFingerprint>,
    passed: OnceCell<()>,
}

impl SecretCheck {
    pub(super) fn new(current: &Secret, previous: &[Secret]) -> Self {
        SecretCheck {
            current: current.fingerprint(),
            previous: previous.iter().map(Secret::fingerprint).collect(),
            passed: OnceCell::new(),
        }
    }

    /// Whether the check has passed (then nothing more is asked of the store).
    pub(super) fn passed(&self) -> bool {
        self.passed.initialized()
    }

    /// Passes when the store keeps this engine's fingerprint (storing it if it keeps none), or
    /// one of its previous secrets' (then it stores this engine's: the rotation has begun, and
    /// an engine with only the previous secret is refused from now on).
    pub(super) async fn ensure(&self, store: &dyn Store) -> Result<(), StoreError> {
        self.passed
            .get_or_try_init(|| self.check(store))
            .await
            .map(|_| ())
    }

    async fn check(&self, store: &dyn Store) -> Result<(), StoreError> {
        let mut expected = None;
        for _ in 0..ATTEMPTS {
            match store
                .swap_secret(expected.clone(), self.current.clone())
                .await?
            {
                Some(found) if found == self.current => {
                    if let Some(previous) = &expected {
                        tracing::warn!(
                            secret = %self.current,
                            previous = %previous,
                            "idempotency: secret rotation: the store now keeps this engine's secret's fingerprint; \
                             an engine with only the previous secret is refused from now on"
                        );
                    }
                    return Ok(());
                }
                Some(found) if self.previous.contains(&found) => expected = Some(found),
                Some(found) => {
                    return Err(StoreError::SecretMismatch {
                        stored: found,
                        engine: self.current.clone(),
                    })
                }
                // Nothing stored after all (removed by hand meanwhile): store this one.
                None => expected = None,
            }
        }
        Err(StoreError::Contention {
            operation: "the secret check",
            attempts: ATTEMPTS,
        })
    }
}
