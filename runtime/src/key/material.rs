//! What keys and fingerprints are derived from, before the secret: sha256 over a versioned,
//! domain-separated, length-prefixed encoding ([`KeyMaterial`], [`FingerprintMaterial`]), and
//! the [`Fingerprint`] of a call's full arguments.

use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::hex::write_hex;
use super::Scope;
use super::{Caller, ClientKey, Key, KeyError, Secret};
use crate::canonical::typed_canonical;

const KEY_DOMAIN: &[u8] = b"idempotency/key/v2\0";
const FINGERPRINT_DOMAIN: &[u8] = b"idempotency/fingerprint/v2\0";

struct Encoder(Sha256);

impl Encoder {
    fn new(domain: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update(domain);
        Encoder(h)
    }

    fn field(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update((bytes.len() as u64).to_be_bytes());
        self.0.update(bytes);
        self
    }

    fn finish(self) -> [u8; 32] {
        self.0.finalize().into()
    }
}

/// What a key is made from, before the secret: sha256 over the length-prefixed encoding of the
/// scope, the caller (the subject only for subject scope), the tool and the canonical arguments.
/// The engine turns it into the [`Key`] with its secret (and, while a secret is being rotated,
/// into the keys under the previous ones).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyMaterial(pub(super) [u8; 32]);

/// Whose record a key names: the caller (all of it, or only its tenant, as `scope` says) and the
/// tool.
#[derive(Clone, Copy, Debug)]
pub struct Owner<'a> {
    /// The caller.
    pub caller: &'a Caller,
    /// The tool's name.
    pub tool: &'a str,
    /// Who shares the record.
    pub scope: Scope,
}

impl KeyMaterial {
    /// Material of a call keyed by all its arguments (less the top-level members in `skip`).
    pub fn call<A: Serialize + ?Sized>(
        owner: Owner<'_>,
        args: &A,
        skip: &'static [&'static str],
    ) -> Result<KeyMaterial, KeyError> {
        owner.caller.validate()?;
        let canonical = typed_canonical(args, skip)?;
        Ok(Self::encode(b"call", owner, &canonical))
    }

    /// Material of a call keyed by a business-key value.
    pub fn business<V: Serialize + ?Sized>(
        owner: Owner<'_>,
        value: &V,
    ) -> Result<KeyMaterial, KeyError> {
        owner.caller.validate()?;
        let canonical = typed_canonical(value, &[])?;
        Ok(Self::encode(b"business", owner, &canonical))
    }

    /// Material of a call keyed by the client's own key: always within the caller's subject,
    /// whatever `owner.scope` says, so a key never crosses callers.
    pub fn client(owner: Owner<'_>, key: &ClientKey) -> Result<KeyMaterial, KeyError> {
        owner.caller.validate()?;
        let owner = Owner {
            scope: Scope::Subject,
            ..owner
        };
        Ok(Self::encode(b"client", owner, key.as_str()))
    }

    /// `kind`, whose record it is, and the canonical text.
    fn encode(
        kind: &[u8],
        Owner {
            caller,
            tool,
            scope,
        }: Owner<'_>,
        canonical: &str,
    ) -> Self {
        let mut e = Encoder::new(KEY_DOMAIN);
        e.field(kind);
        match scope {
            Scope::Tenant => e.field(b"tenant").field(caller.tenant.as_bytes()),
            Scope::Subject => e
                .field(b"subject")
                .field(caller.tenant.as_bytes())
                .field(caller.subject.as_bytes()),
        };
        e.field(tool.as_bytes()).field(canonical.as_bytes());
        KeyMaterial(e.finish())
    }

    /// The key under `secret`.
    pub fn key(&self, secret: &Secret) -> Key {
        Key(secret.hmac(KEY_DOMAIN, &self.0))
    }
}

impl fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyMaterial(…)")
    }
}

/// A digest of the full canonical arguments, under the secret. With a business key, a repeat
/// whose fingerprint differs is a payload mismatch, never silently the old answer.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// What a [`Fingerprint`] is made from, before the secret.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FingerprintMaterial([u8; 32]);

impl FingerprintMaterial {
    /// Material of some arguments (their typed canonical JSON less the top-level members in
    /// `skip`, hashed).
    pub fn of<A: Serialize + ?Sized>(
        args: &A,
        skip: &'static [&'static str],
    ) -> Result<FingerprintMaterial, KeyError> {
        let canonical = typed_canonical(args, skip)?;
        let mut e = Encoder::new(FINGERPRINT_DOMAIN);
        e.field(canonical.as_bytes());
        Ok(FingerprintMaterial(e.finish()))
    }

    /// The fingerprint under `secret`.
    pub fn fingerprint(&self, secret: &Secret) -> Fingerprint {
        Fingerprint(secret.hmac(FINGERPRINT_DOMAIN, &self.0))
    }
}

impl fmt::Debug for FingerprintMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FingerprintMaterial(…)")
    }
}

impl Fingerprint {
    /// The fingerprint of some arguments under `secret`.
    pub fn of<A: Serialize + ?Sized>(secret: &Secret, args: &A) -> Result<Fingerprint, KeyError> {
        Ok(FingerprintMaterial::of(args, &[])?.fingerprint(secret))
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A fingerprint from a byte slice; `None` unless it is exactly 32 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Option<Fingerprint> {
        <[u8; 32]>::try_from(bytes).ok().map(Fingerprint)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprint(")?;
        write_hex(f, &self.0)?;
        f.write_str(")")
    }
}
