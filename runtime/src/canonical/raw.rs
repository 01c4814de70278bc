//! A `RawValue` inside a key: keyed by its text as the handler reads it, less only what no JSON
//! reader can see.
//!
//! A handler holds a `RawValue` to read the text itself, or to pass it on to a reader of its
//! own choosing, so the key may merge two texts only where every JSON reader reads them alike:
//!
//! * whitespace between tokens is dropped and object members are sorted (RFC 8259 gives neither
//!   a meaning); strings are decoded and written with RFC 8785's minimal escaping, so `"\u0041"`
//!   and `"A"` are one string (a string whose escapes do not decode, such as a lone surrogate,
//!   is kept as written);
//! * **numbers keep their text exactly as written**: RFC 8259 leaves their precision to the
//!   reader, so `0.1` and `0.10000000000000000001` (one `f64`, two decimals), `1e2` and `100`,
//!   or two integers beyond 64 bits that an `f64` would merge, are different keys. No number is
//!   refused for its size;
//! * a member name twice in one object is refused: readers disagree on which one counts.
//!
//! Through rmcp the handler's raw text is serde_json's compact rendering of the parsed
//! arguments, so its numbers are what `serde_json::Number` kept of the client's (every digit
//! under `arbitrary_precision`, an `f64` otherwise): the key follows that text either way.

use super::strings::write_str;
use super::{CanonicalError, MAX_DEPTH};

/// Writes the key's form of the raw JSON `text`, nested `depth` levels deep, into `out`.
pub(super) fn write_keyed(
    out: &mut String,
    text: &str,
    depth: usize,
) -> Result<(), CanonicalError> {
    let mut reader = Reader { text, at: 0 };
    reader.value(out, depth)?;
    reader.skip_whitespace();
    if reader.at != text.len() {
        return Err(invalid("text after the value"));
    }
    Ok(())
}

fn invalid(what: &str) -> CanonicalError {
    CanonicalError::Custom(format!("invalid raw JSON value: {what}"))
}

struct Reader<'t> {
    text: &'t str,
    /// Byte offset of the next unread character.
    at: usize,
}

impl<'t> Reader<'t> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), CanonicalError> {
        self.skip_whitespace();
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(invalid(&format!("expected `{}`", char::from(byte))))
        }
    }

    /// The bytes from `self.at` while `keep` holds; ASCII only, so a char boundary.
    fn take_while(&mut self, keep: impl Fn(u8) -> bool) -> &'t str {
        let start = self.at;
        while self.peek().is_some_and(&keep) {
            self.at += 1;
        }
        &self.text[start..self.at]
    }

    fn value(&mut self, out: &mut String, depth: usize) -> Result<(), CanonicalError> {
        self.skip_whitespace();
        match self.peek() {
            Some(b'{') => self.object(out, depth),
            Some(b'[') => self.array(out, depth),
            Some(b'"') => {
                let token = self.string_token()?;
                write_string_token(out, token);
                Ok(())
            }
            Some(b'-' | b'0'..=b'9') => {
                let number = self
                    .take_while(|b| matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'));
                out.push_str(number);
                Ok(())
            }
            Some(b'a'..=b'z') => {
                let word = self.take_while(|b| b.is_ascii_lowercase());
                match word {
                    "true" | "false" | "null" => {
                        out.push_str(word);
                        Ok(())
                    }
                    _ => Err(invalid(&format!("unexpected `{word}`"))),
                }
            }
            _ => Err(invalid("expected a value")),
        }
    }

    /// A string token, quotes included.
    fn string_token(&mut self) -> Result<&'t str, CanonicalError> {
        let start = self.at;
        self.at += 1;
        loop {
            match self.peek() {
                None => return Err(invalid("unterminated string")),
                Some(b'"') => {
                    self.at += 1;
                    return Ok(&self.text[start..self.at]);
                }
                Some(b'\\') => self.at += 2,
                Some(_) => self.at += 1,
            }
        }
    }

    fn array(&mut self, out: &mut String, depth: usize) -> Result<(), CanonicalError> {
        let inner = nested(depth)?;
        self.at += 1;
        out.push('[');
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            out.push(']');
            return Ok(());
        }
        loop {
            self.value(out, inner)?;
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => {
                    self.at += 1;
                    out.push(',');
                }
                Some(b']') => {
                    self.at += 1;
                    out.push(']');
                    return Ok(());
                }
                _ => return Err(invalid("expected `,` or `]`")),
            }
        }
    }

    fn object(&mut self, out: &mut String, depth: usize) -> Result<(), CanonicalError> {
        let inner = nested(depth)?;
        self.at += 1;
        // (decoded name, length of the written name, the member's text `"name":value`)
        let mut members: Vec<(String, usize, String)> = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
        } else {
            loop {
                self.skip_whitespace();
                if self.peek() != Some(b'"') {
                    return Err(invalid("expected a member name"));
                }
                let token = self.string_token()?;
                let mut member = String::new();
                let name = write_string_token(&mut member, token);
                let written = member.len();
                self.expect(b':')?;
                member.push(':');
                self.value(&mut member, inner)?;
                members.push((name, written, member));
                self.skip_whitespace();
                match self.peek() {
                    Some(b',') => self.at += 1,
                    Some(b'}') => {
                        self.at += 1;
                        break;
                    }
                    _ => return Err(invalid("expected `,` or `}`")),
                }
            }
        }
        members.sort_unstable_by(|a, b| {
            (a.0.encode_utf16().cmp(b.0.encode_utf16())).then_with(|| a.2[..a.1].cmp(&b.2[..b.1]))
        });
        let same =
            |a: &(String, usize, String), b: &(String, usize, String)| a.2[..a.1] == b.2[..b.1];
        if let Some(pair) = members.windows(2).find(|pair| same(&pair[0], &pair[1])) {
            return Err(CanonicalError::Custom(format!(
                "a raw JSON value has the member {:?} twice in one object; a handler reading \
                 the raw text could see either, so the call cannot be keyed",
                pair[0].0
            )));
        }
        out.push('{');
        for (i, (_, _, member)) in members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(member);
        }
        out.push('}');
        Ok(())
    }
}

fn nested(depth: usize) -> Result<usize, CanonicalError> {
    if depth >= MAX_DEPTH {
        Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
    } else {
        Ok(depth + 1)
    }
}

/// Writes a string token with minimal escaping and returns its decoded text (the order of
/// member names); a token whose escapes do not decode (a lone surrogate) is written as it
/// is. A minimally escaped string never holds `\u` but for a control character, so the
/// written forms of two different strings never meet.
fn write_string_token(out: &mut String, token: &str) -> String {
    match serde_json::from_str::<String>(token) {
        Ok(decoded) => {
            write_str(out, &decoded);
            decoded
        }
        Err(_) => {
            out.push_str(token);
            token.to_owned()
        }
    }
}
