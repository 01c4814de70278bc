//! What the layer stores of a response: its status, the headers the route chose and its body —
//! a JSON body as JSON (its exact text), other text as text, other bytes in base64 — so the
//! stored answer is readable in the store and can be replayed over HTTP, and to an MCP tool of
//! the same operation (the envelope and its stored form are in `door.rs`, which both read).
//!
//! Stored as `http {"status": 201, "headers": [["content-type", "application/json"]], "body":
//! {"json": {…}}}`; the body is `"empty"`, `{"json": …}`, `{"text": "…"}` or `{"base64": "…"}`.

use bytes::Bytes;
use http::response::Parts;
use http::{HeaderName, HeaderValue, Response, StatusCode};
use serde_json::value::RawValue;

use super::fingerprint::is_json;
use super::header::IDEMPOTENT_REPLAYED;
use crate::door::Content;
pub(super) use crate::door::Envelope;

impl Envelope {
    /// The envelope of a response: its status, those of its headers named in `keep` (a header
    /// whose value is not visible ASCII is left out) and its body.
    pub(super) fn of(parts: &Parts, body: &Bytes, keep: &[HeaderName]) -> Self {
        let headers = keep
            .iter()
            .flat_map(|name| {
                parts.headers.get_all(name).iter().filter_map(move |v| {
                    v.to_str()
                        .ok()
                        .map(|v| (name.as_str().to_owned(), v.to_owned()))
                })
            })
            .collect();
        Envelope {
            status: parts.status.as_u16(),
            headers,
            body: Content::of(&parts.headers, body),
        }
    }

    /// The stored response, marked `Idempotent-Replayed: true`; an error when what is stored
    /// is not a response (written by something else, or damaged).
    pub(super) fn replay<B: From<Bytes>>(&self) -> Result<Response<B>, String> {
        let status = StatusCode::from_u16(self.status).map_err(|e| e.to_string())?;
        let body = match &self.body {
            Content::Empty => Bytes::new(),
            Content::Json(raw) => Bytes::copy_from_slice(raw.get().as_bytes()),
            Content::Text(t) => Bytes::copy_from_slice(t.as_bytes()),
            Content::Base64(b) => Bytes::from(base64::decode(b)?),
        };
        let mut response = Response::new(B::from(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        for (name, value) in &self.headers {
            let name = HeaderName::try_from(name.as_str()).map_err(|e| e.to_string())?;
            let value = HeaderValue::try_from(value.as_str()).map_err(|e| e.to_string())?;
            headers.append(name, value);
        }
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        Ok(response)
    }
}

/// An MCP tool's stored answer (or definitive error) `answer`, replayed as a response: its JSON
/// as the body, `status`, `Content-Type: application/json` and `Idempotent-Replayed: true`.
pub(super) fn tool_answer<B: From<Bytes>>(answer: &RawValue, status: StatusCode) -> Response<B> {
    let mut response = Response::new(B::from(Bytes::copy_from_slice(answer.get().as_bytes())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

impl Content {
    fn of(headers: &http::HeaderMap, body: &Bytes) -> Content {
        if body.is_empty() {
            return Content::Empty;
        }
        let Ok(text) = std::str::from_utf8(body) else {
            return Content::Base64(base64::encode(body));
        };
        if is_json(headers) {
            // Kept as JSON only when its exact text is: a replay gives back the same bytes.
            match RawValue::from_string(text.to_owned()) {
                Ok(raw) if raw.get().len() == text.len() => return Content::Json(raw),
                _ => {}
            }
        }
        Content::Text(text.to_owned())
    }
}

/// Standard base64 (RFC 4648 §4, padded), for the bodies that are not text.
mod base64 {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub(super) fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    pub(super) fn decode(text: &str) -> Result<Vec<u8>, String> {
        let bad = || "the stored body is not base64".to_owned();
        let text = text.as_bytes();
        if !text.len().is_multiple_of(4) {
            return Err(bad());
        }
        let mut out = Vec::with_capacity(text.len() / 4 * 3);
        for chunk in text.chunks(4) {
            let pad = chunk.iter().rev().take_while(|c| **c == b'=').count();
            if pad > 2 {
                return Err(bad());
            }
            let mut n = 0u32;
            for (i, c) in chunk[..4 - pad].iter().enumerate() {
                let v = ALPHABET.iter().position(|a| a == c).ok_or_else(bad)?;
                n |= (v as u32) << (18 - 6 * i);
            }
            for i in 0..3 - pad {
                out.push((n >> (16 - 8 * i)) as u8);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(ct: &str) -> Parts {
        Response::builder()
            .status(201)
            .header("content-type", ct)
            .header("location", "/orders/1")
            .header("set-cookie", "s=1")
            .body(())
            .expect("a response")
            .into_parts()
            .0
    }

    #[test]
    fn a_json_body_is_stored_as_json_and_replayed_byte_for_byte() {
        let body = Bytes::from_static(br#"{"z":1,"a":[1.50,"x"]}"#);
        let keep = [http::header::CONTENT_TYPE, http::header::LOCATION];
        let e = Envelope::of(&parts("application/json"), &body, &keep);
        let stored = serde_json::to_string(&e).expect("stored");
        assert_eq!(
            stored,
            r#"{"status":201,"headers":[["content-type","application/json"],["location","/orders/1"]],"body":{"json":{"z":1,"a":[1.50,"x"]}}}"#
        );
        let back: Envelope = serde_json::from_str(&stored).expect("read back");
        let r: Response<Bytes> = back.replay().expect("a response");
        assert_eq!(r.status(), 201);
        assert_eq!(r.headers()[IDEMPOTENT_REPLAYED], "true");
        assert!(r.headers().get("set-cookie").is_none());
        assert_eq!(r.into_body(), body);
    }

    #[test]
    fn other_bodies_are_text_or_base64() {
        for (ct, body) in [
            ("text/plain", &b"hello"[..]),
            ("application/octet-stream", &[0u8, 255, 1, 2, 3][..]),
            ("application/json", &b"{not json"[..]),
            ("application/json", &b"{}\n"[..]),
            ("text/plain", &b""[..]),
        ] {
            let body = Bytes::copy_from_slice(body);
            let e = Envelope::of(&parts(ct), &body, &[]);
            let back: Envelope =
                serde_json::from_str(&serde_json::to_string(&e).expect("stored")).expect("back");
            let r: Response<Bytes> = back.replay().expect("a response");
            assert_eq!(r.into_body(), body, "{ct}");
        }
        for n in 0..10 {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 37 + 200) as u8).collect();
            assert_eq!(base64::decode(&base64::encode(&bytes)), Ok(bytes));
        }
        assert_eq!(base64::encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64::encode(b"fo"), "Zm8=");
    }
}
