//! A client key read from the tool's own arguments
//! (`#[idempotent(client_key = "require", client_key_field = "meta.idempotency_key")]`), where
//! the commerce protocols put it: ACP's MCP binding in `meta.idempotency_key`, UCP's in
//! `meta["idempotency-key"]`. There the platform's software sets the key, beside a request id,
//! a timestamp and a signature that change on every retry (`ignore` leaves those out of the
//! fingerprint); the key's own field is left out too, so a retry with the same key and the same
//! payload replays, and the same key with another payload is a conflict.

use rmcp::ErrorData;

use super::client_key::{refusal, ClientKeys};
use crate::key::{ClientKey, ClientKeyError};
use crate::tool::ToolSpec;

/// A field that holds a client key: a string, or an optional one. An empty string is no key.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot hold an idempotency key",
    label = "the `client_key_field` must be a `String` or `&str`, or an `Option` of one",
    note = "a key the client software sends is text: 8 to 255 printable ASCII characters (a UUID has 36)"
)]
pub trait KeyField {
    /// The key's text, if the field holds one.
    fn key_text(&self) -> Option<&str>;
}

impl KeyField for str {
    fn key_text(&self) -> Option<&str> {
        Some(self).filter(|s| !s.is_empty())
    }
}

impl KeyField for String {
    fn key_text(&self) -> Option<&str> {
        self.as_str().key_text()
    }
}

impl<T: KeyField + ?Sized> KeyField for &T {
    fn key_text(&self) -> Option<&str> {
        (**self).key_text()
    }
}

impl<T: KeyField> KeyField for Option<T> {
    fn key_text(&self) -> Option<&str> {
        self.as_ref().and_then(KeyField::key_text)
    }
}

/// The client key in the arguments' `field` (its value `value`) for the tool `spec`: `None`
/// when there is none and the tool accepts that; the same refusals as a key in `_meta` (invalid
/// params, `data.type` `idempotency_key_missing` or `idempotency_key_invalid`) when it is
/// missing but required, or unusable.
#[doc(hidden)]
pub fn argument_key<F: KeyField + ?Sized>(
    value: &F,
    mode: ClientKeys,
    spec: &ToolSpec,
    field: &'static str,
) -> Result<Option<ClientKey>, ErrorData> {
    match value.key_text() {
        Some(text) => ClientKey::new(text).map(Some).map_err(|e| refusal(spec, e)),
        None if mode == ClientKeys::Accept => Ok(None),
        None => Err(refusal(spec, ClientKeyError::MissingField { field })),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::Value;

    use super::*;
    use crate::mcp::{KEY_INVALID, KEY_MISSING};

    const SPEC: ToolSpec = ToolSpec::new("complete_checkout_session", Duration::from_secs(60));
    const FIELD: &str = "meta.idempotency_key";

    fn kind(e: &ErrorData) -> Option<&str> {
        e.data
            .as_ref()
            .and_then(|d| d.get("type"))
            .and_then(Value::as_str)
    }

    #[test]
    fn a_key_in_the_arguments_is_read_whatever_the_fields_type() {
        let key = "550e8400-e29b-41d4-a716-446655440000";
        let owned = key.to_owned();
        for got in [
            argument_key(&owned, ClientKeys::Require, &SPEC, FIELD),
            argument_key(key, ClientKeys::Require, &SPEC, FIELD),
            argument_key(&Some(owned.clone()), ClientKeys::Require, &SPEC, FIELD),
        ] {
            assert_eq!(
                got.ok().flatten().map(|k| k.as_str().to_owned()),
                Some(owned.clone())
            );
        }
    }

    #[test]
    fn a_missing_key_is_refused_where_required_and_passed_where_accepted() {
        for none in [None, Some(String::new())] {
            let e = argument_key(&none, ClientKeys::Require, &SPEC, FIELD).unwrap_err();
            assert_eq!(kind(&e), Some(KEY_MISSING));
            assert!(
                e.message.contains("`meta.idempotency_key`"),
                "{}",
                e.message
            );
            assert!(matches!(
                argument_key(&none, ClientKeys::Accept, &SPEC, FIELD),
                Ok(None)
            ));
        }
    }

    #[test]
    fn an_unusable_key_is_refused_even_where_optional() {
        let e = argument_key("short", ClientKeys::Accept, &SPEC, FIELD).unwrap_err();
        assert_eq!(kind(&e), Some(KEY_INVALID));
        assert!(e.message.contains("5 characters"), "{}", e.message);
    }
}
