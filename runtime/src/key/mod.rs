//! Keys, fingerprints and references: who called which tool with what, reduced to 32 bytes.
//!
//! A key is HMAC-SHA256, under the server's [`Secret`], of sha256 over a versioned,
//! domain-separated encoding in which every field is prefixed by its length (8 bytes,
//! big-endian). No byte inside a tenant, subject or tool name — `|`, `\0`, anything — can move a
//! boundary, so two different callers never share a key, unlike a key built as
//! `format!("{tenant}|{subject}|{tool}|{args}")`. The secret makes the reference (the key's first
//! 8 bytes) worthless to whoever sees it — a processor, a log reader — for confirming a guess
//! about the arguments: without the secret it cannot be recomputed from them.
//!
//! The module is split by concept: [`Secret`] and its fingerprint (with the HMAC), the
//! [`Caller`] and why a call cannot be keyed, the material a key or fingerprint is derived from
//! (the length-prefixed encoding), and the [`Key`] and its [`Reference`].

mod caller;
mod client;
mod hex;
mod identity;
mod material;
mod secret;
#[cfg(test)]
mod tests;

pub use crate::canonical::CanonicalError;
pub use caller::{Caller, KeyError, Scope};
#[cfg(any(feature = "rmcp", feature = "http"))]
pub(crate) use client::header_key;
pub use client::{ClientKey, ClientKeyError};
pub use identity::{Key, Reference, ReferenceParseError};
pub use material::{Fingerprint, FingerprintMaterial, KeyMaterial, Owner};
#[cfg(test)]
pub(crate) use secret::HMACS;
pub use secret::{Secret, SecretError, SecretFingerprint};
