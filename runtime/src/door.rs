//! The doors an operation is reached by — a wrapped tool (or function) and the HTTP layer — the
//! form each stores its answers in, and how each reads the other's, so that one client key names
//! one record whichever door it came through.
//!
//! A tool stores the JSON text of its answer `T` (`ok`) or of its definitive error `E`. The HTTP
//! layer stores a response as an [`Envelope`] behind the marker [`HTTP_MARK`]:
//! `http {"status":201,"headers":[["content-type","application/json"]],"body":{"json":{…}}}`,
//! `ok` unless its status is `4xx`. No JSON text begins with the marker and a tool's answer is
//! always JSON text, so a record's form is never in doubt: a tool whose `T` is
//! `serde_json::Value` is never handed an envelope.
//!
//! Across the doors: a tool reads a `2xx` response's JSON body as its `T` (an empty body as
//! `null`) and a `4xx` response's as its `E`; anything else it cannot read is an error that says
//! what the response was. The HTTP layer reads a tool's answer as [`HttpAnswer::Tool`] and
//! replays it as a JSON response of the route's choosing.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::record::StoredResponse;

/// What begins the stored text of a response the HTTP layer recorded (no JSON text does).
pub(crate) const HTTP_MARK: &str = "http ";

/// The most of a response's body a message about it quotes.
const QUOTED: usize = 300;

/// Which door a call came through: the form its answers are stored in and read as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) enum Door {
    /// A wrapped tool or function: answers are the JSON of `T` or `E`.
    #[default]
    Tool,
    /// The HTTP layer: answers are [`Envelope`]s, read back as [`HttpAnswer`]s.
    Http,
}

/// A response as the HTTP layer stores it: its status, the headers the route chose, its body.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Envelope {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Content,
}

/// A stored body: `"empty"`, `{"json": …}` (its exact text), `{"text": …}` or `{"base64": …}`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Content {
    Empty,
    Json(Box<RawValue>),
    Text(String),
    Base64(String),
}

/// What the HTTP layer reads from a record, `{"response": …}` or `{"tool": …}`: a response it
/// recorded, or a tool's answer. It stores a response as the envelope alone.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) enum HttpAnswer {
    /// A response the layer recorded.
    Response(Envelope),
    /// An answer a tool of the operation recorded: its `T` (`ok`) or its definitive `E`.
    Tool(ToolAnswer),
}

impl Serialize for HttpAnswer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            HttpAnswer::Response(envelope) => envelope.serialize(s),
            HttpAnswer::Tool(_) => Err(serde::ser::Error::custom(
                "a tool's answer is stored by its tool, not by the HTTP layer",
            )),
        }
    }
}

/// A tool's stored answer, as the HTTP layer reads it.
#[derive(Debug, Deserialize)]
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) struct ToolAnswer {
    pub(crate) ok: bool,
    pub(crate) answer: Box<RawValue>,
}

/// The JSON a call decodes from a stored answer.
#[derive(Debug)]
pub(crate) struct Read<'a> {
    /// The JSON text.
    pub(crate) json: Cow<'a, str>,
    /// Whether it is the error's (`E`), not the answer's (`T`).
    pub(crate) error: bool,
    /// For a response the HTTP layer recorded, read by a tool: what it was, for messages.
    http: Option<String>,
}

impl Read<'_> {
    /// Why the JSON is not what this call's type reads, `why` being the decoder's words.
    pub(crate) fn unreadable(&self, why: &str) -> String {
        match &self.http {
            None => why.to_owned(),
            Some(response) => format!(
                "it was answered over HTTP with {response}, which is not this tool's {}: {why}",
                if self.error { "error" } else { "answer" }
            ),
        }
    }
}

impl Door {
    /// The stored text of an answer whose JSON is `json`.
    pub(crate) fn store(self, json: String) -> String {
        match self {
            Door::Tool => json,
            Door::Http => format!("{HTTP_MARK}{json}"),
        }
    }

    /// What a call through this door decodes from `stored`; an error when it can be nothing
    /// this door's calls answer.
    pub(crate) fn read(self, stored: &StoredResponse) -> Result<Read<'_>, String> {
        let response = stored.body.strip_prefix(HTTP_MARK);
        fn read(json: Cow<'_, str>, error: bool) -> Read<'_> {
            Read {
                json,
                error,
                http: None,
            }
        }
        // Each text is checked to be one JSON value before it is placed inside another.
        let one = |text: &str, what: &str| {
            serde_json::from_str::<&RawValue>(text)
                .map(|_| ())
                .map_err(|e| format!("{what} is not JSON ({e})"))
        };
        match (self, response) {
            (Door::Tool, None) => Ok(read(Cow::Borrowed(&stored.body), !stored.ok)),
            (Door::Tool, Some(text)) => envelope(text)?.for_tool(),
            (Door::Http, Some(text)) => {
                one(text, "the recorded HTTP response")?;
                Ok(read(Cow::Owned(format!(r#"{{"response":{text}}}"#)), false))
            }
            (Door::Http, None) => {
                one(&stored.body, "the tool's stored answer")?;
                let json = format!(
                    r#"{{"tool":{{"ok":{},"answer":{}}}}}"#,
                    stored.ok, stored.body
                );
                Ok(read(Cow::Owned(json), false))
            }
        }
    }
}

fn envelope(text: &str) -> Result<Envelope, String> {
    serde_json::from_str(text)
        .map_err(|e| format!("the recorded HTTP response cannot be read ({e})"))
}

impl Envelope {
    /// The envelope as a tool reads it: a `2xx`'s body is its answer, a `4xx`'s its error.
    fn for_tool(self) -> Result<Read<'static>, String> {
        let status = self.status;
        let error = match status {
            200..=299 => false,
            400..=499 => true,
            _ => {
                return Err(format!(
                "it was answered over HTTP with status {status}, which is no answer a tool gives"
            ))
            }
        };
        let json = match self.body {
            Content::Json(raw) => String::from(Box::<str>::from(raw)),
            Content::Empty => "null".to_owned(),
            Content::Text(t) => {
                return Err(format!(
                    "it was answered over HTTP with status {status} and a body that is text, not JSON: {}",
                    quoted(&t)
                ))
            }
            Content::Base64(_) => {
                return Err(format!(
                    "it was answered over HTTP with status {status} and a body that is bytes, not JSON"
                ))
            }
        };
        let http = Some(format!("status {status} and the body {}", quoted(&json)));
        Ok(Read {
            json: Cow::Owned(json),
            error,
            http,
        })
    }
}

/// At most [`QUOTED`] bytes of `text`, cut at a character boundary.
fn quoted(text: &str) -> Cow<'_, str> {
    if text.len() <= QUOTED {
        return Cow::Borrowed(text);
    }
    let mut end = QUOTED;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…", &text[..end]))
}

/// A stored answer as the status lookup shows it: a tool's JSON as it is; a response the HTTP
/// layer recorded as `{"http_response": {"status", "headers", "body"}}`; text that is neither as
/// a string.
#[cfg_attr(not(feature = "rmcp"), allow(dead_code))]
pub(crate) fn shown(stored: &str) -> Value {
    let parsed = match stored.strip_prefix(HTTP_MARK) {
        Some(text) => {
            serde_json::from_str::<Value>(text).map(|v| serde_json::json!({ "http_response": v }))
        }
        None => serde_json::from_str::<Value>(stored),
    };
    parsed.unwrap_or_else(|_| Value::String(stored.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(ok: bool, body: &str) -> StoredResponse {
        StoredResponse {
            ok,
            body: body.to_owned(),
        }
    }

    fn http(status: u16, body: &str) -> StoredResponse {
        let text = format!(r#"{{"status":{status},"headers":[],"body":{body}}}"#);
        stored(status < 400, &Door::Http.store(text))
    }

    /// The layer's stored form is no JSON text, so no tool's answer is ever taken for it.
    #[test]
    fn a_recorded_response_is_not_json() {
        let envelope = r#"{"status":201,"headers":[],"body":"empty"}"#;
        assert!(serde_json::from_str::<Value>(&Door::Http.store(envelope.into())).is_err());
        assert_eq!(Door::Tool.store(envelope.into()), envelope);
        // A tool's answer shaped like an envelope is read as the tool's answer it is.
        let answer = stored(true, envelope);
        let read = Door::Http.read(&answer).expect("readable");
        assert!(read.json.starts_with(r#"{"tool":"#), "{}", read.json);
    }

    /// A tool reads a 2xx's JSON body as its answer, a 4xx's as its error; what it cannot read
    /// says what the response was.
    #[test]
    fn a_tool_reads_a_response_body() {
        let ok = http(201, r#"{"json":{"order":1}}"#);
        let read = Door::Tool.read(&ok).expect("readable");
        assert_eq!((read.json.as_ref(), read.error), (r#"{"order":1}"#, false));
        let declined = http(402, r#"{"json":{"code":"card_declined"}}"#);
        let read = Door::Tool.read(&declined).expect("readable");
        assert_eq!(
            (read.json.as_ref(), read.error),
            (r#"{"code":"card_declined"}"#, true)
        );
        let why = read.unreadable("unknown variant");
        assert!(
            why.contains("status 402") && why.contains("card_declined") && why.contains("error"),
            "{why}"
        );
        let no_content = http(204, r#""empty""#);
        let empty = Door::Tool.read(&no_content).expect("readable");
        assert_eq!(empty.json, "null");
        for (status, body, says) in [
            (201, r#"{"text":"created"}"#, "text, not JSON: created"),
            (200, r#"{"base64":"AAE="}"#, "bytes, not JSON"),
            (303, r#""empty""#, "status 303"),
        ] {
            let e = Door::Tool
                .read(&http(status, body))
                .expect_err("unreadable");
            assert!(e.contains(says), "{e}");
        }
        let long = "x".repeat(2 * QUOTED);
        let e = Door::Tool
            .read(&http(400, &format!(r#"{{"text":"{long}"}}"#)))
            .expect_err("text");
        assert!(e.len() < QUOTED + 200, "{e}");
    }

    /// The HTTP layer reads its own envelope as it is, and a tool's answer tagged `tool`.
    #[test]
    fn the_layer_reads_both_forms() {
        let own = http(201, r#"{"json":{"order":1}}"#);
        let read = Door::Http.read(&own).expect("readable");
        assert!(matches!(
            serde_json::from_str::<HttpAnswer>(&read.json),
            Ok(HttpAnswer::Response(Envelope { status: 201, .. }))
        ));
        for (ok, body) in [(true, r#"{"order":1}"#), (false, r#"{"Declined":{}}"#)] {
            let answer = stored(ok, body);
            let read = Door::Http.read(&answer).expect("readable");
            match serde_json::from_str::<HttpAnswer>(&read.json) {
                Ok(HttpAnswer::Tool(tool)) => {
                    assert_eq!((tool.ok, tool.answer.get()), (ok, body));
                }
                other => panic!("{other:?}"),
            }
        }
        // A damaged answer is refused, never spliced into another value.
        assert!(Door::Http.read(&stored(true, r#"1},"x":{"#)).is_err());
    }

    #[test]
    fn the_status_lookup_shows_both_forms() {
        assert_eq!(shown(r#"{"a":1}"#), serde_json::json!({"a": 1}));
        let own = http(201, r#"{"json":{"order":1}}"#);
        assert_eq!(
            shown(&own.body)["http_response"]["body"]["json"]["order"],
            1
        );
        assert_eq!(shown("not json"), Value::String("not json".into()));
    }
}
