//! The two headers of the protocol: the client's `Idempotency-Key`, and `Idempotent-Replayed`
//! on a stored answer.

use http::HeaderMap;

use crate::key::{header_key, ClientKey, ClientKeyError};

/// The request header that carries the client's idempotency key (IETF draft, ACP, Stripe).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The response header set to `true` on a stored answer replayed (ACP SEP #120): the inner
/// service did not run for this request.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The request's key: `None` without the header; an error when a value is unusable or two
/// values differ.
pub(super) fn read(headers: &HeaderMap) -> Result<Option<ClientKey>, ClientKeyError> {
    let mut found: Option<&str> = None;
    for value in headers.get_all(IDEMPOTENCY_KEY) {
        let text = header_key(value.as_bytes())?;
        match found {
            Some(earlier) if earlier != text => return Err(ClientKeyError::Conflicting),
            _ => found = Some(text),
        }
    }
    found.map(ClientKey::new).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(IDEMPOTENCY_KEY, v.parse().expect("a header value"));
        }
        h
    }

    #[test]
    fn the_key_is_read_once_whatever_its_spelling() {
        assert_eq!(read(&headers(&[])), Ok(None));
        let key = read(&headers(&["\"order-12345\"", "order-12345"])).expect("one key");
        assert_eq!(
            key.map(|k| k.as_str().to_owned()).as_deref(),
            Some("order-12345")
        );
        assert_eq!(
            read(&headers(&["order-12345", "order-67890"])),
            Err(ClientKeyError::Conflicting)
        );
        assert!(matches!(
            read(&headers(&["short"])),
            Err(ClientKeyError::Length { len: 5 })
        ));
    }
}
