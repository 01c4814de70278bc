//! A call's [`Key`] (32 bytes) and the [`Reference`] of one operation on it (its short name).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::hex::{hex_val, write_hex};
use super::Scope;
use super::{Caller, KeyError, KeyMaterial, Owner, Secret};

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
pub struct Key(pub(super) [u8; 32]);

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
        Ok(KeyMaterial::call(
            Owner {
                caller,
                tool,
                scope: Scope::Subject,
            },
            args,
            &[],
        )?
        .key(secret))
    }

    /// The key of a call identified by a business key (an order id; tenant scope, the default
    /// for business keys): tenant, tool name and the canonical JSON of `value`, under `secret`.
    /// The subject is left out: an order id is unique in its tenant whoever sends it. Keep a
    /// [`Fingerprint`](super::Fingerprint) of the full arguments beside it to detect a repeat of the same order with
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
        Ok(KeyMaterial::business(
            Owner {
                caller,
                tool,
                scope: Scope::Tenant,
            },
            value,
        )?
        .key(secret))
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
        let (hex, generation_digits) = s_trim.split_once('-').ok_or_else(err)?;
        if hex.len() != 16 || generation_digits.is_empty() || generation_digits.len() > 10 {
            return Err(err());
        }
        let mut prefix = [0u8; 8];
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            let hi = hex_val(pair[0]).ok_or_else(err)?;
            let lo = hex_val(pair[1]).ok_or_else(err)?;
            prefix[i] = (hi << 4) | lo;
        }
        if !generation_digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let generation: u32 = generation_digits.parse().map_err(|_| err())?;
        if generation == 0 {
            return Err(err());
        }
        Ok(Reference { prefix, generation })
    }
}
