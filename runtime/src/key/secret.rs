//! The server's [`Secret`], its [`SecretFingerprint`] (what a store remembers of it), and the
//! HMAC-SHA256 that keys, references and fingerprints are made with.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::hex::write_hex;

/// What a [`SecretFingerprint`] is the HMAC of: a fixed label, no other input.
const SECRET_LABEL: &[u8] = b"idempotency/secret-fingerprint/v1\0";

/// The server's secret: keys, references and fingerprints are HMAC-SHA256 under it, so nobody
/// without it can recompute a reference from guessed arguments. Every replica sharing a store
/// must use the same one; `Debug` never shows it.
///
/// Read it from configuration (an environment variable, a secrets manager); at least 16 bytes,
/// 32 random bytes recommended. [`Secret::demo`] is a published constant for demos and tests.
///
/// ```
/// use idempotency::key::Secret;
/// let secret = Secret::new("a-long-random-value-from-config")?;
/// assert_eq!(format!("{secret:?}"), "Secret(…)");
/// assert!(Secret::new("short").is_err());
/// # Ok::<(), idempotency::key::SecretError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<[u8]>);

/// The shortest secret [`Secret::new`] accepts, in bytes.
const MIN_SECRET: usize = 16;

impl Secret {
    /// A secret from its bytes (at least 16).
    pub fn new(bytes: impl AsRef<[u8]>) -> Result<Secret, SecretError> {
        let bytes = bytes.as_ref();
        if bytes.len() < MIN_SECRET {
            return Err(SecretError { len: bytes.len() });
        }
        Ok(Secret(Arc::from(bytes)))
    }

    /// The published demo secret: what an engine uses when none is configured (it logs a warning
    /// then). Anyone can recompute references made with it; configure your own in production.
    pub fn demo() -> Secret {
        Secret(Arc::from(
            &b"idempotency demo secret: replace me in production"[..],
        ))
    }

    /// What a store remembers of this secret: HMAC-SHA256 under it of a fixed label, so two
    /// engines can tell whether they share a secret without either revealing it. See
    /// [`IdempotencyBuilder::start`](crate::IdempotencyBuilder::start).
    ///
    /// ```
    /// use idempotency::key::Secret;
    /// let a = Secret::new("a-long-random-value-from-config")?;
    /// assert_eq!(a.fingerprint(), a.clone().fingerprint());
    /// assert_ne!(a.fingerprint(), Secret::demo().fingerprint());
    /// # Ok::<(), idempotency::key::SecretError>(())
    /// ```
    pub fn fingerprint(&self) -> SecretFingerprint {
        SecretFingerprint(Box::new(hmac_sha256(&self.0, &[SECRET_LABEL])))
    }

    pub(super) fn hmac(&self, domain: &[u8], material: &[u8; 32]) -> [u8; 32] {
        #[cfg(test)]
        HMACS.with(|n| n.set(n.get() + 1));
        hmac_sha256(&self.0, &[domain, material])
    }
}

#[cfg(test)]
thread_local! {
    /// How many keys and fingerprints this thread has derived (tests count a call's HMACs).
    pub(crate) static HMACS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The fingerprint of a [`Secret`] ([`Secret::fingerprint`]): 32 bytes of HMAC-SHA256 under the
/// secret of a fixed label, never the secret itself. A store keeps one, so that an engine whose
/// secret differs from the others' is refused instead of running every call a second time.
///
/// `Display` shows the first 4 bytes in hex (enough to tell secrets apart in a message); `Debug`
/// all 32. (Boxed: it travels in [`StoreError`](crate::store::StoreError), which stays small.)
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SecretFingerprint(Box<[u8; 32]>);

impl SecretFingerprint {
    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A fingerprint from a byte slice (as read back from a store); `None` unless it is exactly
    /// 32 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Option<SecretFingerprint> {
        <[u8; 32]>::try_from(bytes)
            .ok()
            .map(|b| SecretFingerprint(Box::new(b)))
    }

    /// Whether this is the fingerprint of the published [`Secret::demo`].
    pub fn is_demo(&self) -> bool {
        *self == Secret::demo().fingerprint()
    }
}

impl fmt::Display for SecretFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0[..4])
    }
}

impl fmt::Debug for SecretFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretFingerprint(")?;
        write_hex(f, &self.0[..])?;
        f.write_str(")")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// A secret too short to be one. `Debug` (what `fn main() -> Result<(), Box<dyn Error>>`
/// prints) says it as `Display` does.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("the idempotency secret is {len} bytes long; it must be at least 16 (32 random bytes recommended)")]
pub struct SecretError {
    len: usize,
}

impl std::fmt::Debug for SecretError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// HMAC-SHA256 (RFC 2104, RustCrypto's `hmac`) of the concatenated `parts` under `key`.
pub(super) fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    use hmac::{KeyInit, Mac};
    // The key as HMAC uses it, one block (RFC 2104: a longer key is hashed first, a shorter one
    // padded with zeros), handed over whole: the infallible constructor, no error to handle.
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut mac = <hmac::Hmac<Sha256> as KeyInit>::new(&block.into());
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}
