//! One call, keyed once: its arguments, and its key and fingerprint under the engine's current
//! secret, each derived (one HMAC) when the call starts. Every stage of the call reads them
//! from here; only while secrets are rotated are the keys under previous secrets derived too.

use crate::key::{Fingerprint, Key, Secret};
use crate::tool::{Prepared, ToolSpec};

/// A call's arguments with its key and fingerprint under the current secret.
pub(super) struct Keyed {
    pub(super) prepared: Prepared,
    /// What the call claims under `secret`.
    pub(super) current: Claiming,
}

/// A key and the fingerprint stored beside it, both under one secret.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Claiming {
    pub(super) key: Key,
    pub(super) fingerprint: Option<Fingerprint>,
}

impl Keyed {
    /// `prepared`, keyed under `secret` (the engine's current one).
    pub(super) fn new(prepared: Prepared, secret: &Secret) -> Self {
        let current = Claiming::under(&prepared, secret);
        Keyed { prepared, current }
    }

    /// The call's key under the current secret.
    pub(super) fn key(&self) -> Key {
        self.current.key
    }

    /// The call's fingerprint under the current secret (business keys).
    pub(super) fn fingerprint(&self) -> Option<Fingerprint> {
        self.current.fingerprint
    }

    /// The tool's spec.
    pub(super) fn spec(&self) -> &ToolSpec {
        &self.prepared.spec
    }

    /// The tool's name.
    pub(super) fn tool(&self) -> &'static str {
        self.prepared.spec.name
    }
}

impl Claiming {
    /// What `prepared` claims under `secret`: one HMAC for the key, one for the fingerprint.
    pub(super) fn under(prepared: &Prepared, secret: &Secret) -> Self {
        Claiming {
            key: prepared.key.key(secret),
            fingerprint: prepared.fingerprint.as_ref().map(|f| f.fingerprint(secret)),
        }
    }
}
