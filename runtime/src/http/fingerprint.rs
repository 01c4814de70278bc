//! What a request's fingerprint is made of: by default its method, path (and query) and body —
//! the body's JSON for a JSON body (canonicalised with the rest by the key's encoding, so member
//! order and whitespace do not matter; `null` and an absent member differ), a SHA-256 of its
//! bytes otherwise — or the value a route computes ([`IdempotencyLayer::fingerprint`]), e.g. the
//! arguments an MCP tool of the same operation takes.
//!
//! [`IdempotencyLayer::fingerprint`]: super::IdempotencyLayer::fingerprint

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Method, Uri};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// A route's fingerprint function: the JSON value its requests are compared by.
pub(super) type Fingerprinter =
    dyn Fn(&FingerprintInput<'_>) -> Result<Value, String> + Send + Sync;

/// What a route's fingerprint function sees of a request: its head, its body (whole, within the
/// layer's bound) and the body's JSON when it is a JSON body.
///
/// ```
/// use idempotency::http::FingerprintInput;
/// use serde_json::{json, Value};
/// // `POST /orders/{id}/capture` with `{"amount": 5}`, compared as an MCP tool's arguments
/// // `{"order_id": …, "amount": …}` would be.
/// fn capture(req: &FingerprintInput<'_>) -> Result<Value, String> {
///     let id = req.path().rsplit('/').nth(1).ok_or("no order id in the path")?;
///     let amount = req.json().and_then(|b| b.get("amount")).cloned().unwrap_or(Value::Null);
///     Ok(json!({"order_id": id, "amount": amount}))
/// }
/// # let _ = capture;
/// ```
#[derive(Debug)]
pub struct FingerprintInput<'a> {
    parts: &'a Parts,
    body: &'a Bytes,
    json: Option<&'a Value>,
}

impl<'a> FingerprintInput<'a> {
    /// The request's method.
    pub fn method(&self) -> &'a Method {
        &self.parts.method
    }

    /// The request's URI.
    pub fn uri(&self) -> &'a Uri {
        &self.parts.uri
    }

    /// The request's path (without the query).
    pub fn path(&self) -> &'a str {
        self.parts.uri.path()
    }

    /// The request's headers.
    pub fn headers(&self) -> &'a HeaderMap {
        &self.parts.headers
    }

    /// The request's head, extensions included (a router's path parameters are there).
    pub fn parts(&self) -> &'a Parts {
        self.parts
    }

    /// The body's bytes.
    pub fn body(&self) -> &'a Bytes {
        self.body
    }

    /// The body as JSON, when its `Content-Type` is JSON (`application/json`, `…+json`) and it
    /// parses.
    pub fn json(&self) -> Option<&'a Value> {
        self.json
    }
}

/// The value a request is fingerprinted by: `custom`'s, or the default one.
pub(super) fn value(
    custom: Option<&Fingerprinter>,
    parts: &Parts,
    body: &Bytes,
) -> Result<Value, String> {
    let json = if is_json(&parts.headers) && !body.is_empty() {
        serde_json::from_slice::<Value>(body).ok()
    } else {
        None
    };
    match custom {
        Some(f) => f(&FingerprintInput {
            parts,
            body,
            json: json.as_ref(),
        }),
        None => Ok(default(parts, body, json)),
    }
}

/// `{"method", "path", "query"?, "body"? | "body_sha256"?}`: no body member for an empty body.
fn default(parts: &Parts, body: &Bytes, json: Option<Value>) -> Value {
    let mut m = Map::new();
    m.insert("method".into(), Value::String(parts.method.as_str().into()));
    m.insert("path".into(), Value::String(parts.uri.path().into()));
    if let Some(q) = parts.uri.query() {
        m.insert("query".into(), Value::String(q.into()));
    }
    match json {
        Some(v) => {
            m.insert("body".into(), v);
        }
        None if !body.is_empty() => {
            m.insert("body_sha256".into(), Value::String(sha256_hex(body)));
        }
        None => {}
    }
    Value::Object(m)
}

/// Whether `headers` say the body is JSON: `application/json` or a `+json` type.
pub(super) fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

/// The SHA-256 of `bytes`, in lowercase hex.
pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in digest.iter() {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parts(method: &str, uri: &str, ct: Option<&str>) -> Parts {
        let mut b = http::Request::builder().method(method).uri(uri);
        if let Some(ct) = ct {
            b = b.header("content-type", ct);
        }
        b.body(()).expect("a request").into_parts().0
    }

    #[test]
    fn the_default_value_is_method_path_and_body() {
        let p = parts(
            "POST",
            "/orders?x=1",
            Some("application/json; charset=utf-8"),
        );
        let v = value(None, &p, &Bytes::from_static(br#"{"b": 1, "a": null}"#));
        assert_eq!(
            v,
            Ok(
                json!({"method": "POST", "path": "/orders", "query": "x=1", "body": {"a": null, "b": 1}})
            )
        );
        let p = parts("POST", "/upload", Some("application/octet-stream"));
        let v = value(None, &p, &Bytes::from_static(b"abc")).expect("a value");
        assert_eq!(
            v["body_sha256"],
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let v = value(None, &parts("POST", "/x", None), &Bytes::new()).expect("a value");
        assert_eq!(v, json!({"method": "POST", "path": "/x"}));
        assert!(is_json(
            &parts("POST", "/", Some("application/merge-patch+JSON")).headers
        ));
        assert!(!is_json(&parts("POST", "/", Some("text/plain")).headers));
    }
}
