//! Keys, fingerprints and references: who called which tool with what, reduced to 32 bytes.
//!
//! A key is sha256 over a versioned, domain-separated encoding in which every field is prefixed
//! by its length (8 bytes, big-endian). No byte inside a tenant, subject or tool name — `|`, `\0`,
//! anything — can move a boundary, so two different callers never share a key, unlike a key
//! built as `format!("{tenant}|{subject}|{tool}|{args}")`.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::canonical::canonical_json;
pub use crate::canonical::CanonicalError;

const KEY_DOMAIN: &[u8] = b"idempotency/key/v1\0";
const FINGERPRINT_DOMAIN: &[u8] = b"idempotency/fingerprint/v1\0";

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

/// The identity of a call: 32 bytes of sha256. `Display` gives the 64 lowercase hex characters.
///
/// ```
/// use idempotency::{key::Key, Caller};
/// let caller = Caller::new("acme", "user-42");
/// let a = Key::for_call(&caller, "charge_card", &serde_json::json!({"amount": 100, "currency": "EUR"}))?;
/// let b = Key::for_call(&caller, "charge_card", &serde_json::json!({"currency": "EUR", "amount": 100.0}))?;
/// assert_eq!(a, b);
/// assert_eq!(a.to_string().len(), 64);
/// # Ok::<(), idempotency::key::KeyError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key([u8; 32]);

impl Key {
    /// The key of a call: tenant, subject, tool name and the canonical JSON of the typed arguments.
    ///
    /// Pass the arguments *after* deserialising them into their type, so optional fields filled
    /// by defaults hash the same as when sent explicitly.
    pub fn for_call<A: Serialize + ?Sized>(
        caller: &Caller,
        tool: &str,
        args: &A,
    ) -> Result<Key, KeyError> {
        caller.validate()?;
        let canonical = canonical_json(args)?;
        Ok(Self::call_from_canonical(caller, tool, &canonical))
    }

    pub(crate) fn call_from_canonical(caller: &Caller, tool: &str, canonical: &str) -> Key {
        let mut e = Encoder::new(KEY_DOMAIN);
        e.field(b"call")
            .field(caller.tenant.as_bytes())
            .field(caller.subject.as_bytes())
            .field(tool.as_bytes())
            .field(canonical.as_bytes());
        Key(e.finish())
    }

    /// The key of a call identified by a business key (an order id): tenant, tool name and the
    /// canonical JSON of `value`. The subject is left out on purpose: an order id is unique in its
    /// tenant whoever sends it. Keep a [`Fingerprint`] of the full arguments beside it to detect a
    /// repeat of the same order with different arguments.
    ///
    /// ```
    /// use idempotency::{key::Key, Caller};
    /// let alice = Caller::new("acme", "alice");
    /// let bob = Caller::new("acme", "bob");
    /// assert_eq!(
    ///     Key::for_business_key(&alice, "create_shipment", "order-7")?,
    ///     Key::for_business_key(&bob, "create_shipment", "order-7")?,
    /// );
    /// # Ok::<(), idempotency::key::KeyError>(())
    /// ```
    pub fn for_business_key<V: Serialize + ?Sized>(
        caller: &Caller,
        tool: &str,
        value: &V,
    ) -> Result<Key, KeyError> {
        caller.validate()?;
        let canonical = canonical_json(value)?;
        let mut e = Encoder::new(KEY_DOMAIN);
        e.field(b"business")
            .field(caller.tenant.as_bytes())
            .field(tool.as_bytes())
            .field(canonical.as_bytes());
        Ok(Key(e.finish()))
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

/// A digest of the full canonical arguments. With a business key, a repeat whose fingerprint
/// differs is a payload mismatch, never silently the old answer.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of some arguments (their canonical JSON, hashed).
    pub fn of<A: Serialize + ?Sized>(args: &A) -> Result<Fingerprint, KeyError> {
        Ok(Self::of_canonical(&canonical_json(args)?))
    }

    pub(crate) fn of_canonical(canonical: &str) -> Fingerprint {
        let mut e = Encoder::new(FINGERPRINT_DOMAIN);
        e.field(canonical.as_bytes());
        Fingerprint(e.finish())
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
            Key::for_call(&a, "t", &json!({})).unwrap(),
            Key::for_call(&b, "t", &json!({})).unwrap()
        );
        // A boundary moved between subject and tool.
        let c = Caller::new("acme", "alice\0charge");
        let d = Caller::new("acme", "alice");
        assert_ne!(
            Key::for_call(&c, "card", &json!({})).unwrap(),
            Key::for_call(&d, "charge\0card", &json!({})).unwrap()
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
            let k1 = Key::for_call(&Caller::new(t1, s1), &n1, &json!(1)).unwrap();
            let k2 = Key::for_call(&Caller::new(t2, s2), &n2, &json!(1)).unwrap();
            prop_assert_ne!(k1, k2);
        }

        #[test]
        fn separators_inside_fields_never_collide(
            parts in proptest::collection::vec("[a|\\x00]{0,4}", 6)
        ) {
            prop_assume!(!parts[0].is_empty() && !parts[3].is_empty());
            let k1 = Key::for_call(&Caller::new(&*parts[0], &*parts[1]), &parts[2], &json!(0)).unwrap();
            let k2 = Key::for_call(&Caller::new(&*parts[3], &*parts[4]), &parts[5], &json!(0)).unwrap();
            prop_assert_eq!(k1 == k2, parts[..3] == parts[3..]);
        }
    }

    #[test]
    fn key_order_and_number_spelling_do_not_matter() {
        let c = Caller::new("acme", "alice");
        let a: serde_json::Value =
            serde_json::from_str(r#"{"amount":100,"currency":"EUR"}"#).unwrap();
        let b: serde_json::Value =
            serde_json::from_str(" {\n \"currency\" : \"EUR\", \"amount\": 1e2 }").unwrap();
        assert_eq!(
            Key::for_call(&c, "charge", &a).unwrap(),
            Key::for_call(&c, "charge", &b).unwrap()
        );
        assert_ne!(
            Key::for_call(&c, "charge", &json!({"amount": 101, "currency": "EUR"})).unwrap(),
            Key::for_call(&c, "charge", &a).unwrap()
        );
    }

    #[test]
    fn call_and_business_keys_live_apart() {
        let c = Caller::new("acme", "alice");
        let other = Caller::new("acme", "bob");
        let foreign = Caller::new("globex", "alice");
        let bk = Key::for_business_key(&c, "ship", "o-1").unwrap();
        assert_eq!(bk, Key::for_business_key(&other, "ship", "o-1").unwrap());
        assert_ne!(bk, Key::for_business_key(&foreign, "ship", "o-1").unwrap());
        assert_ne!(bk, Key::for_call(&c, "ship", "o-1").unwrap());
    }

    #[test]
    fn empty_tenant_is_refused() {
        let err = Key::for_call(&Caller::new("", "alice"), "t", &json!({})).unwrap_err();
        assert!(err.to_string().contains("tenant"), "{err}");
    }

    #[test]
    fn display_is_64_lowercase_hex() {
        let k = Key::for_call(&Caller::new("a", "b"), "t", &json!({})).unwrap();
        let s = k.to_string();
        assert_eq!(s.len(), 64);
        assert!(s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }

    #[test]
    fn references_round_trip_and_fit_processor_limits() {
        let k = Key::for_call(&Caller::new("a", "b"), "t", &json!({})).unwrap();
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
