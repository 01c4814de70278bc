//! A key chosen by the client software ([`ClientKey`]), as Stripe's `Idempotency-Key` and the
//! closed MCP proposal SEP-3182 have one: the client sends the same key with every retry of one
//! request. It is validated here; it scopes a call only together with the caller and the tool,
//! and it reaches the store only through the HMAC, like every key.

use std::fmt;

/// The fewest characters a client key may have: a shorter one is likely a counter that restarts,
/// and would meet an earlier request's record.
const CLIENT_KEY_MIN: usize = 8;
/// The most characters a client key may have (Stripe's and the IETF draft's bound).
const CLIENT_KEY_MAX: usize = 255;

/// An idempotency key sent by the client software (never by the model): 8 to 255 printable
/// ASCII characters (`!` to `~`), e.g. a UUID.
///
/// ```
/// use idempotency::key::{ClientKey, ClientKeyError};
/// let key = ClientKey::new("6f1c2a7e-7d55-4c1e-9a53-0b5e3c2f9a10")?;
/// assert_eq!(key.as_str().len(), 36);
/// assert!(matches!(ClientKey::new("short"), Err(ClientKeyError::Length { len: 5 })));
/// assert!(matches!(ClientKey::new("with space"), Err(ClientKeyError::Character { at: 5 })));
/// # Ok::<(), ClientKeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClientKey(String);

impl ClientKey {
    /// A client key, if `key` is one: 8 to 255 characters, each printable ASCII without the
    /// space.
    pub fn new(key: impl Into<String>) -> Result<ClientKey, ClientKeyError> {
        let key = key.into();
        if let Some(at) = key.chars().position(|c| !c.is_ascii_graphic()) {
            return Err(ClientKeyError::Character { at: at + 1 });
        }
        if !(CLIENT_KEY_MIN..=CLIENT_KEY_MAX).contains(&key.len()) {
            return Err(ClientKeyError::Length { len: key.len() });
        }
        Ok(ClientKey(key))
    }

    /// The key as the client sent it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The key is the client's: it is never printed whole (logs, panics).
impl fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientKey({} characters)", self.0.len())
    }
}

/// Why a request's client key cannot be used; the call is refused and nothing is done.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientKeyError {
    /// The tool requires a client key and the request carries none.
    #[error("this tool requires an idempotency key from the client software: send one in the request's `_meta` as \"idempotency/key\" (over HTTP, the `Idempotency-Key` header also works); a key in the tool's arguments is not read")]
    Missing,
    /// Too short or too long.
    #[error("the idempotency key has {len} characters: it must have 8 to 255 (a UUID has 36)")]
    Length {
        /// How many it has.
        len: usize,
    },
    /// A character that is not printable ASCII (a space, a control character, non-ASCII).
    #[error("character {at} of the idempotency key is not printable ASCII: use only `!` to `~` (letters, digits, punctuation; no spaces)")]
    Character {
        /// Its position, counted from 1.
        at: usize,
    },
    /// `_meta` carries the key as something other than a string.
    #[error("`_meta` \"idempotency/key\" must be a string, not {found}")]
    NotAString {
        /// What it is (`a number`, `an object`...).
        found: &'static str,
    },
    /// The tool reads its key from a field of its arguments (`client_key_field`), and the
    /// request's arguments have none there (absent, `null` or `""`).
    #[error("this tool requires an idempotency key in its arguments, at `{field}`: the client software (not the model) puts one key there and sends it again with every retry of one request")]
    MissingField {
        /// The field's path in the arguments (`meta.idempotency_key`).
        field: &'static str,
    },
    /// The tool reads its key from a field of its arguments, which holds something other than a
    /// string.
    #[error("the idempotency key at `{field}` in the arguments must be a string, not {found}")]
    FieldNotAString {
        /// The field's path in the arguments.
        field: &'static str,
        /// What it is (`a number`, `an object`...).
        found: &'static str,
    },
    /// The request carries two different keys: one in `_meta`, another in the header, or the
    /// header more than once.
    #[error("the request carries more than one idempotency key (in `_meta` \"idempotency/key\" and in `Idempotency-Key` headers) and they differ: send one")]
    Conflicting,
}

/// The key in one `Idempotency-Key` header value: its text, or the content of a structured-field
/// string (`"…"`, as the IETF draft writes it). Only printable ASCII is taken; [`ClientKey::new`]
/// checks the rest.
#[cfg(any(feature = "rmcp", feature = "http"))]
pub(crate) fn header_key(bytes: &[u8]) -> Result<&str, ClientKeyError> {
    if let Some(at) = bytes
        .iter()
        .position(|b| !b.is_ascii_graphic() && *b != b' ')
    {
        return Err(ClientKeyError::Character { at: at + 1 });
    }
    let text = std::str::from_utf8(bytes).map_err(|e| ClientKeyError::Character {
        at: e.valid_up_to() + 1,
    })?;
    Ok(text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text))
}
