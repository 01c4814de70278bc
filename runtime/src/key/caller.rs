//! Who is calling ([`Caller`]) and why a call could not be keyed ([`KeyError`]).

use super::CanonicalError;
pub use idempotency_options::Scope;

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

    pub(super) fn validate(&self) -> Result<(), KeyError> {
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
