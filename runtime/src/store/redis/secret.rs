//! [`RedisStore`]'s secret fingerprint: the string `<ns>:secret`, swapped by one script.

use std::sync::LazyLock;

use super::conn::{bytes, Script};
use super::{Inner, RedisStore};
use crate::key::SecretFingerprint;
use crate::store::{BoxFuture, SecretStore, StoreError};

static SWAP: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/secret.lua")));

impl SecretStore for RedisStore {
    /// One script on the key's node, followed by `WAIT` like the other writes when they wait
    /// (see [Durability](super::RedisStore#durability)).
    fn swap_secret(
        &self,
        expected: Option<SecretFingerprint>,
        new: SecretFingerprint,
    ) -> BoxFuture<'_, Result<Option<SecretFingerprint>, StoreError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let key = format!("{}:secret", inner.namespace);
            let expected = expected.as_ref().map_or(&[][..], |e| &e.as_bytes()[..]);
            let wait = inner.wait();
            let (found, acked) = inner
                .conn_for(wait)
                .await?
                .run(&SWAP, &[&key], &[expected, &new.as_bytes()[..]], wait)
                .await?;
            Inner::replicated(wait, acked)?;
            match found {
                redis::Value::Nil => Ok(None),
                v => {
                    let b = bytes(v)?;
                    SecretFingerprint::from_slice(&b).map(Some).ok_or_else(|| {
                        StoreError::corrupt(format!(
                            "the stored secret fingerprint ({key}) is {} bytes long, not 32",
                            b.len()
                        ))
                    })
                }
            }
        })
    }
}
