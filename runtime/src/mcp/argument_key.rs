//! A client key read from the tool's own arguments
//! (`#[idempotent(client_key = "require", client_key_field = "meta.idempotency_key")]`), where
//! the commerce protocols put it: ACP's MCP binding in `meta.idempotency_key`, UCP's in
//! `meta["idempotency-key"]`. There the platform's software sets the key, beside a request id,
//! a timestamp and a signature that change on every retry (`ignore` leaves those out of the
//! fingerprint); the key's own field is left out too, so a retry with the same key and the same
//! payload replays, and the same key with another payload is a conflict.

use serde::Serialize;
use serde_json::Value;

use super::client_key::ClientKeys;
use crate::key::{ClientKey, ClientKeyError};

/// The client key at `field` (a dotted JSON path through objects, as the arguments serialise:
/// `meta.idempotency-key` for a field renamed by serde) of `args`: `None` when there is none
/// (absent, `null`, `""`) and the tool accepts that; why not when it is missing but required,
/// or unusable (the call refuses it as a key in `_meta` is refused).
pub(crate) fn argument_key<A: Serialize + ?Sized>(
    args: &A,
    mode: ClientKeys,
    field: &'static str,
) -> Result<Option<ClientKey>, ClientKeyError> {
    // Arguments that do not serialise are refused by the keying, which says why.
    let json = serde_json::to_value(args).unwrap_or(Value::Null);
    let found = field
        .split('.')
        .try_fold(&json, |v, name| v.get(name))
        .filter(|v| !v.is_null() && v.as_str() != Some(""));
    match found {
        Some(Value::String(text)) => ClientKey::new(text.as_str()).map(Some),
        Some(other) => Err(ClientKeyError::FieldNotAString {
            field,
            found: super::client_key::kind(other),
        }),
        None if mode == ClientKeys::Accept => Ok(None),
        None => Err(ClientKeyError::MissingField { field }),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const FIELD: &str = "meta.idempotency_key";

    fn text(got: Result<Option<ClientKey>, ClientKeyError>) -> Option<String> {
        got.ok().flatten().map(|k| k.as_str().to_owned())
    }

    #[test]
    fn a_key_is_read_at_its_json_path_as_the_arguments_serialise() {
        let key = "550e8400-e29b-41d4-a716-446655440000";
        let acp = json!({"meta": {"idempotency_key": key}, "id": "cs_1"});
        assert_eq!(
            text(argument_key(&acp, ClientKeys::Require, FIELD)),
            Some(key.to_owned())
        );
        // UCP's name is no Rust identifier: the path is the JSON one, whatever serde renamed.
        let ucp = json!({"meta": {"idempotency-key": key}});
        assert_eq!(
            text(argument_key(
                &ucp,
                ClientKeys::Require,
                "meta.idempotency-key"
            )),
            Some(key.to_owned())
        );
    }

    #[test]
    fn a_missing_key_is_refused_where_required_and_passed_where_accepted() {
        for args in [
            json!({"meta": {}}),
            json!({"meta": {"idempotency_key": null}}),
            json!({"meta": {"idempotency_key": ""}}),
            json!({}),
        ] {
            let e = argument_key(&args, ClientKeys::Require, FIELD).unwrap_err();
            assert_eq!(e, ClientKeyError::MissingField { field: FIELD }, "{args}");
            assert!(e.to_string().contains("`meta.idempotency_key`"), "{e}");
            assert!(matches!(
                argument_key(&args, ClientKeys::Accept, FIELD),
                Ok(None)
            ));
        }
    }

    #[test]
    fn an_unusable_key_is_refused_even_where_optional() {
        let short = json!({"meta": {"idempotency_key": "short"}});
        let e = argument_key(&short, ClientKeys::Accept, FIELD).unwrap_err();
        assert_eq!(e, ClientKeyError::Length { len: 5 });
        let number = json!({"meta": {"idempotency_key": 42}});
        let e = argument_key(&number, ClientKeys::Accept, FIELD).unwrap_err();
        assert!(e.to_string().contains("a number"), "{e}");
    }
}
