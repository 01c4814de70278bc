//! Keys, fingerprints and references: who called which tool with what, reduced to 32 bytes.
//!
//! A key is HMAC-SHA256, under the server's [`Secret`], of sha256 over a versioned,
//! domain-separated encoding in which every field is prefixed by its length (8 bytes,
//! big-endian). No byte inside a tenant, subject or tool name — `|`, `\0`, anything — can move a
//! boundary, so two different callers never share a key, unlike a key built as
//! `format!("{tenant}|{subject}|{tool}|{args}")`. The secret makes the reference (the key's first
//! 8 bytes) worthless to whoever sees it — a processor, a log reader — for confirming a guess
//! about the arguments: without the secret it cannot be recomputed from them.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::canonical::typed_canonical;
pub use crate::canonical::CanonicalError;
use crate::tool::Scope;

const KEY_DOMAIN: &[u8] = b"idempotency/key/v2\0";
const FINGERPRINT_DOMAIN: &[u8] = b"idempotency/fingerprint/v2\0";
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

    fn hmac(&self, domain: &[u8], material: &[u8; 32]) -> [u8; 32] {
        hmac_sha256(&self.0, &[domain, material])
    }
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

/// A secret too short to be one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the idempotency secret is {len} bytes long; it must be at least 16 (32 random bytes recommended)")]
pub struct SecretError {
    len: usize,
}

/// HMAC-SHA256 (RFC 2104, RustCrypto's `hmac`) of the concatenated `parts` under `key`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
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

/// Who is calling: the tenant (the account the data belongs to) and the subject (the user or
/// service acting in it). Both come from the server's authentication, never from the model.
///
/// ```
/// let caller = idempotency::Caller::new("acme", "user-42");
/// assert_eq!(caller.tenant, "acme");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Caller {
    /// The tenant (organisation, account). Must not be empty.
    pub tenant: String,
    /// The subject acting inside the tenant (user id, service name).
    pub subject: String,
}

impl Caller {
    /// A caller from a tenant and a subject.
    pub fn new(tenant: impl Into<String>, subject: impl Into<String>) -> Self {
        Caller {
            tenant: tenant.into(),
            subject: subject.into(),
        }
    }

    fn validate(&self) -> Result<(), KeyError> {
        if self.tenant.is_empty() {
            return Err(KeyError::EmptyTenant);
        }
        Ok(())
    }
}

/// Why a call could not be keyed. Nothing was claimed and nothing ran.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The caller's tenant is empty: the server has not established who is calling.
    #[error("the caller's tenant is empty; the server must establish who is calling before an idempotent tool runs")]
    EmptyTenant,
    /// The business key is missing (`null`, `""`, or a composite whose parts all are): such calls
    /// cannot be told apart, so none is keyed.
    #[error("the business key `{field}` is missing (null or empty): send it, so this call can be told apart from others")]
    MissingBusinessKey {
        /// The business-key field(s), as the attribute names them.
        field: String,
    },
    /// The client sent an argument that the arguments' serialised form — what the key is made
    /// of — does not carry: an unknown field, or one the type reads but does not serialise. Two
    /// calls differing in it would share a key, so neither is keyed.
    #[error(
        "the argument `{field}` is not part of this tool's arguments as the server keys them (an unknown \
         field, or one its type does not serialise), so calls differing in it could not be told apart: \
         send only the fields the tool's input schema lists (server authors: serialise every field the \
         handler reads, or name a volatile one in `ignore`)"
    )]
    NotKeyed {
        /// The field's path, e.g. `dry_run` or `lines[0].qty`.
        field: String,
    },
    /// The typed arguments could not be compared with what the client sent.
    #[error("the arguments could not be checked against what the client sent: {reason}")]
    Unchecked {
        /// Why (serde_json's message).
        reason: String,
    },
    /// The value cannot be written as canonical JSON (NaN, a non-string map key...).
    #[error("the value cannot be written as canonical JSON")]
    Canonical(#[from] CanonicalError),
}

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

/// The identity of a call: 32 bytes of HMAC-SHA256. `Display` gives the 64 lowercase hex
/// characters.
///
/// ```
/// use idempotency::{key::{Key, Secret}, Caller};
/// let (secret, caller) = (Secret::demo(), Caller::new("acme", "user-42"));
/// let a = Key::for_call(&secret, &caller, "charge_card", &serde_json::json!({"amount": 100, "currency": "EUR"}))?;
/// let b = Key::for_call(&secret, &caller, "charge_card", &serde_json::json!({"currency": "EUR", "amount": 100}))?;
/// assert_eq!(a, b);
/// assert_eq!(a.to_string().len(), 64);
/// # Ok::<(), idempotency::key::KeyError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key([u8; 32]);

impl Key {
    /// The key of a call (subject scope, the default for call keys): tenant, subject, tool name
    /// and the canonical JSON of the typed arguments, under `secret`.
    ///
    /// Pass the arguments *after* deserialising them into their type, so optional fields filled
    /// by defaults hash the same as when sent explicitly.
    pub fn for_call<A: Serialize + ?Sized>(
        secret: &Secret,
        caller: &Caller,
        tool: &str,
        args: &A,
    ) -> Result<Key, KeyError> {
        Ok(KeyMaterial::call(caller, tool, Scope::Subject, args, &[])?.key(secret))
    }

    /// The key of a call identified by a business key (an order id; tenant scope, the default
    /// for business keys): tenant, tool name and the canonical JSON of `value`, under `secret`.
    /// The subject is left out: an order id is unique in its tenant whoever sends it. Keep a
    /// [`Fingerprint`] of the full arguments beside it to detect a repeat of the same order with
    /// different arguments.
    ///
    /// ```
    /// use idempotency::{key::{Key, Secret}, Caller};
    /// let (secret, alice, bob) = (Secret::demo(), Caller::new("acme", "alice"), Caller::new("acme", "bob"));
    /// assert_eq!(
    ///     Key::for_business_key(&secret, &alice, "create_shipment", "order-7")?,
    ///     Key::for_business_key(&secret, &bob, "create_shipment", "order-7")?,
    /// );
    /// # Ok::<(), idempotency::key::KeyError>(())
    /// ```
    pub fn for_business_key<V: Serialize + ?Sized>(
        secret: &Secret,
        caller: &Caller,
        tool: &str,
        value: &V,
    ) -> Result<Key, KeyError> {
        Ok(KeyMaterial::business(caller, tool, Scope::Tenant, value)?.key(secret))
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A key from its 32 bytes (as read back from a store).
    pub fn from_bytes(bytes: [u8; 32]) -> Key {
        Key(bytes)
    }

    /// A key from a byte slice; `None` unless it is exactly 32 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Option<Key> {
        <[u8; 32]>::try_from(bytes).ok().map(Key)
    }

    /// The reference of the `generation`-th operation on this key.
    pub fn reference(&self, generation: u32) -> Reference {
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(&self.0[..8]);
        Reference { prefix, generation }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 64];
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = HEX[(b >> 4) as usize];
        out[2 * i + 1] = HEX[(b & 15) as usize];
    }
    f.write_str(std::str::from_utf8(&out[..2 * bytes.len()]).map_err(|_| fmt::Error)?)
}

/// What a key is made from, before the secret: sha256 over the length-prefixed encoding of the
/// scope, the caller (the subject only for subject scope), the tool and the canonical arguments.
/// The engine turns it into the [`Key`] with its secret (and, while a secret is being rotated,
/// into the keys under the previous ones).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyMaterial([u8; 32]);

impl KeyMaterial {
    /// Material of a call keyed by all its arguments (less the top-level members in `skip`).
    pub fn call<A: Serialize + ?Sized>(
        caller: &Caller,
        tool: &str,
        scope: Scope,
        args: &A,
        skip: &'static [&'static str],
    ) -> Result<KeyMaterial, KeyError> {
        caller.validate()?;
        let canonical = typed_canonical(args, skip)?;
        Ok(Self::encode(b"call", caller, tool, scope, &canonical))
    }

    /// Material of a call keyed by a business-key value.
    pub fn business<V: Serialize + ?Sized>(
        caller: &Caller,
        tool: &str,
        scope: Scope,
        value: &V,
    ) -> Result<KeyMaterial, KeyError> {
        caller.validate()?;
        let canonical = typed_canonical(value, &[])?;
        Ok(Self::encode(b"business", caller, tool, scope, &canonical))
    }

    fn encode(kind: &[u8], caller: &Caller, tool: &str, scope: Scope, canonical: &str) -> Self {
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

/// The short name of one operation (a claim and its repeats), e.g. `3f9a0c1b2d4e5f60-1`:
/// 16 hex characters from the key, a dash, and the operation's generation on that key.
///
/// Users, models, the status tool and downstream processors see it; pass it to a payment
/// processor or carrier as *their* idempotency reference. It is at most 27 characters (processors
/// cap their keys at 40 or more). A repeat after the window is a new operation with the next
/// generation, so yesterday's reference never blocks today's intended purchase.
///
/// ```
/// use idempotency::Reference;
/// let r: Reference = "3f9a0c1b2d4e5f60-1".parse()?;
/// assert_eq!(r.to_string(), "3f9a0c1b2d4e5f60-1");
/// # Ok::<(), idempotency::key::ReferenceParseError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reference {
    prefix: [u8; 8],
    generation: u32,
}

impl Reference {
    /// The first 8 bytes of the key this reference belongs to.
    pub fn prefix(&self) -> &[u8; 8] {
        &self.prefix
    }

    /// The operation's generation on its key (1 for the first).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The reference of generation `generation` on the same key.
    pub(crate) fn with_generation(self, generation: u32) -> Reference {
        Reference {
            prefix: self.prefix,
            generation,
        }
    }

    /// Whether `key` is the key this reference was taken from (prefix match).
    pub fn matches(&self, key: &Key) -> bool {
        key.0[..8] == self.prefix
    }

    /// The inclusive range of keys whose prefix is this reference's: the memory store resolves a
    /// reference by a range scan of its ordered map (the SQL stores' primary key is the prefix
    /// itself).
    pub(crate) fn key_range(&self) -> ([u8; 32], [u8; 32]) {
        let mut lo = [0u8; 32];
        let mut hi = [0xffu8; 32];
        lo[..8].copy_from_slice(&self.prefix);
        hi[..8].copy_from_slice(&self.prefix);
        (lo, hi)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.prefix)?;
        write!(f, "-{}", self.generation)
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reference({self})")
    }
}

/// A string that is not a reference of this library.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not an idempotency reference: expected 16 lowercase hex characters, a dash and a generation number, like `3f9a0c1b2d4e5f60-1`")]
pub struct ReferenceParseError {
    input: String,
}

impl FromStr for Reference {
    type Err = ReferenceParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ReferenceParseError {
            input: s.chars().take(64).collect(),
        };
        let s_trim = s.trim();
        let (hex, gen) = s_trim.split_once('-').ok_or_else(err)?;
        if hex.len() != 16 || gen.is_empty() || gen.len() > 10 {
            return Err(err());
        }
        let mut prefix = [0u8; 8];
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            let hi = hex_val(pair[0]).ok_or_else(err)?;
            let lo = hex_val(pair[1]).ok_or_else(err)?;
            prefix[i] = (hi << 4) | lo;
        }
        if !gen.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let generation: u32 = gen.parse().map_err(|_| err())?;
        if generation == 0 {
            return Err(err());
        }
        Ok(Reference { prefix, generation })
    }
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    static S: std::sync::LazyLock<Secret> = std::sync::LazyLock::new(Secret::demo);

    fn naive(tenant: &str, subject: &str, tool: &str, args: &str) -> String {
        format!("{tenant}|{subject}|{tool}|{args}")
    }

    #[test]
    fn separator_bytes_cannot_merge_callers() {
        // The seed's encoding lets these two different callers collide.
        let a = Caller::new("acme|alice", "x");
        let b = Caller::new("acme", "alice|x");
        assert_eq!(
            naive(&a.tenant, &a.subject, "t", "{}"),
            naive(&b.tenant, &b.subject, "t", "{}")
        );
        assert_ne!(
            Key::for_call(&S, &a, "t", &json!({})).unwrap(),
            Key::for_call(&S, &b, "t", &json!({})).unwrap()
        );
        // A boundary moved between subject and tool.
        let c = Caller::new("acme", "alice\0charge");
        let d = Caller::new("acme", "alice");
        assert_ne!(
            Key::for_call(&S, &c, "card", &json!({})).unwrap(),
            Key::for_call(&S, &d, "charge\0card", &json!({})).unwrap()
        );
    }

    proptest! {
        #[test]
        fn distinct_fields_give_distinct_keys(
            t1 in ".{0,6}", s1 in ".{0,6}", n1 in ".{0,6}",
            t2 in ".{0,6}", s2 in ".{0,6}", n2 in ".{0,6}",
        ) {
            prop_assume!(!t1.is_empty() && !t2.is_empty());
            prop_assume!((&t1, &s1, &n1) != (&t2, &s2, &n2));
            let k1 = Key::for_call(&S, &Caller::new(t1, s1), &n1, &json!(1)).unwrap();
            let k2 = Key::for_call(&S, &Caller::new(t2, s2), &n2, &json!(1)).unwrap();
            prop_assert_ne!(k1, k2);
        }

        #[test]
        fn separators_inside_fields_never_collide(
            parts in proptest::collection::vec("[a|\\x00]{0,4}", 6)
        ) {
            prop_assume!(!parts[0].is_empty() && !parts[3].is_empty());
            let k1 = Key::for_call(&S, &Caller::new(&*parts[0], &*parts[1]), &parts[2], &json!(0)).unwrap();
            let k2 = Key::for_call(&S, &Caller::new(&*parts[3], &*parts[4]), &parts[5], &json!(0)).unwrap();
            prop_assert_eq!(k1 == k2, parts[..3] == parts[3..]);
        }
    }

    #[test]
    fn key_order_and_number_spelling_do_not_matter() {
        let c = Caller::new("acme", "alice");
        #[derive(serde::Deserialize, serde::Serialize)]
        struct Typed {
            amount: f64,
            currency: String,
        }
        let a: Typed = serde_json::from_str(r#"{"amount":100,"currency":"EUR"}"#).unwrap();
        let b: Typed =
            serde_json::from_str(" {\n \"currency\" : \"EUR\", \"amount\": 1e2 }").unwrap();
        assert_eq!(
            Key::for_call(&S, &c, "charge", &a).unwrap(),
            Key::for_call(&S, &c, "charge", &b).unwrap()
        );
        // Held as a `Value`, `100` and `1e2` are what the handler sees: an integer and a float.
        let (x, y): (serde_json::Value, serde_json::Value) = (
            serde_json::from_str(r#"{"amount":100}"#).unwrap(),
            serde_json::from_str(r#"{"amount":1e2}"#).unwrap(),
        );
        assert_ne!(
            Key::for_call(&S, &c, "charge", &x).unwrap(),
            Key::for_call(&S, &c, "charge", &y).unwrap()
        );
        let a = json!({"amount": 100, "currency": "EUR"});
        assert_ne!(
            Key::for_call(&S, &c, "charge", &json!({"amount": 101, "currency": "EUR"})).unwrap(),
            Key::for_call(&S, &c, "charge", &a).unwrap()
        );
    }

    #[test]
    fn call_and_business_keys_live_apart() {
        let c = Caller::new("acme", "alice");
        let other = Caller::new("acme", "bob");
        let foreign = Caller::new("globex", "alice");
        let bk = Key::for_business_key(&S, &c, "ship", "o-1").unwrap();
        assert_eq!(
            bk,
            Key::for_business_key(&S, &other, "ship", "o-1").unwrap()
        );
        assert_ne!(
            bk,
            Key::for_business_key(&S, &foreign, "ship", "o-1").unwrap()
        );
        assert_ne!(bk, Key::for_call(&S, &c, "ship", "o-1").unwrap());
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // RFC 4231 test case 2.
        let mac = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block is hashed first.
        let mac = hmac_sha256(
            &[0xaa; 131],
            &[b"Test Using Larger Than Block-Size Key - Hash Key First"],
        );
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn without_the_secret_the_reference_cannot_be_recomputed() {
        let c = Caller::new("acme", "alice");
        let args = json!({"amount": 100, "currency": "EUR"});
        let mine = Secret::new("a secret only the server knows").unwrap();
        let k = Key::for_call(&mine, &c, "charge_card", &args).unwrap();
        // Someone who knows the tenant and guesses the arguments, with the published demo secret,
        // with no secret at all (plain sha256 of the same encoding), or with another secret.
        let guessed = [
            Key::for_call(&S, &c, "charge_card", &args).unwrap(),
            Key::from_bytes(
                KeyMaterial::call(&c, "charge_card", Scope::Subject, &args, &[])
                    .unwrap()
                    .0,
            ),
            Key::for_call(
                &Secret::new("another secret, not ours").unwrap(),
                &c,
                "charge_card",
                &args,
            )
            .unwrap(),
        ];
        for g in guessed {
            assert_ne!(g.reference(1), k.reference(1));
        }
        assert_eq!(Key::for_call(&mine, &c, "charge_card", &args).unwrap(), k);
    }

    #[test]
    fn scope_decides_whether_the_subject_is_in_the_key() {
        let (alice, bob) = (Caller::new("acme", "alice"), Caller::new("acme", "bob"));
        let key = |c: &Caller, scope| {
            KeyMaterial::business(c, "ship", scope, "o-1")
                .unwrap()
                .key(&S)
        };
        assert_eq!(key(&alice, Scope::Tenant), key(&bob, Scope::Tenant));
        assert_ne!(key(&alice, Scope::Subject), key(&bob, Scope::Subject));
        assert_ne!(key(&alice, Scope::Subject), key(&alice, Scope::Tenant));
        // A subject scope cannot collide with a tenant named like tenant + subject.
        let joined = Caller::new("acmealice", "");
        assert_ne!(key(&alice, Scope::Subject), key(&joined, Scope::Tenant));
    }

    /// The fingerprint a store keeps is the plain HMAC-SHA256 of the fixed label (pinned: a
    /// change would make every store refuse every engine), never the secret, and tells secrets
    /// apart.
    #[test]
    fn a_secret_fingerprint_is_the_hmac_of_a_fixed_label() {
        let demo = Secret::demo().fingerprint();
        assert_eq!(
            format!("{demo:?}"),
            "SecretFingerprint(3ad9acc959c3d2a68907b7a760a75d38f2d24a08dbbde1caf4fd2f872dfa8c18)"
        );
        assert_eq!(demo.to_string(), "3ad9acc9");
        assert!(demo.is_demo());
        let mine = Secret::new("a secret only the server knows").unwrap();
        assert_ne!(mine.fingerprint(), demo);
        assert!(!mine.fingerprint().is_demo());
        assert_eq!(
            SecretFingerprint::from_slice(mine.fingerprint().as_bytes()),
            Some(mine.fingerprint())
        );
        assert_eq!(SecretFingerprint::from_slice(&[0; 31]), None);
    }

    #[test]
    fn empty_tenant_is_refused() {
        let err = Key::for_call(&S, &Caller::new("", "alice"), "t", &json!({})).unwrap_err();
        assert!(err.to_string().contains("tenant"), "{err}");
    }

    #[test]
    fn display_is_64_lowercase_hex() {
        let k = Key::for_call(&S, &Caller::new("a", "b"), "t", &json!({})).unwrap();
        let s = k.to_string();
        assert_eq!(s.len(), 64);
        assert!(s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }

    #[test]
    fn references_round_trip_and_fit_processor_limits() {
        let k = Key::for_call(&S, &Caller::new("a", "b"), "t", &json!({})).unwrap();
        let r = k.reference(u32::MAX);
        let s = r.to_string();
        assert!(s.len() <= 40 && s.len() >= 12, "{s}");
        assert_eq!(s.parse::<Reference>().unwrap(), r);
        assert!(r.matches(&k));
        assert_eq!(&k.to_string()[..16], &s[..16]);
        for bad in [
            "",
            "abc",
            "3f9a0c1b2d4e5f60",
            "3f9a0c1b2d4e5f60-",
            "3f9a0c1b2d4e5f6g-1",
            "3f9a0c1b2d4e5f60-0",
            "3f9a0c1b2d4e5f60-x",
            "3f9a0c1b2d4e5f60-99999999999",
        ] {
            assert!(bad.parse::<Reference>().is_err(), "{bad}");
        }
        let (lo, hi) = r.key_range();
        assert!(lo <= *k.as_bytes() && *k.as_bytes() <= hi);
    }
}
