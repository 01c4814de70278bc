//! Objects: members are buffered and ordered by the UTF-16 code units of their names (RFC 8785
//! §3.2.3), a name twice in one object is an error, and serde_json's private number and
//! raw-value structs are read as the JSON text they carry.

use std::borrow::Cow;
use std::ops::Range;

use serde::ser::{self, Serialize};

use super::keys::KeySer;
use super::numbers::{write_number_text, write_number_text_typed};
use super::raw;
use super::strings::write_str;
use super::writer::{Mode, Ser};
use super::CanonicalError;

/// One buffered object member: its (unescaped) name and where its value's text lies in the
/// object's value buffer.
struct Member {
    key: Cow<'static, str>,
    value: Range<usize>,
}

/// An object being written. Member values are written to the end of the output as they come
/// (each value once, nested objects already sorted); `end` takes them off again, sorts the
/// members by name and writes `{"name":value,...}`. Each level copies its own text once.
pub(super) struct Object<'a> {
    out: &'a mut String,
    /// Depth of the member values.
    depth: usize,
    mode: Mode,
    /// Where this object's buffered values begin in `out`.
    start: usize,
    members: Vec<Member>,
    key: Option<String>,
    /// Written after the closing brace: `}` for a struct variant.
    close: &'static str,
}

impl<'a> Object<'a> {
    /// An object written to `members.out`, its member values at `members.depth`.
    pub(super) fn new(members: Ser<'a>, len: usize, close: &'static str) -> Self {
        let Ser { out, depth, mode } = members;
        let start = out.len();
        Object {
            out,
            depth,
            mode,
            start,
            members: Vec::with_capacity(len.min(256)),
            key: None,
            close,
        }
    }

    fn member<T: Serialize + ?Sized>(
        &mut self,
        key: Cow<'static, str>,
        value: &T,
    ) -> Result<(), CanonicalError> {
        let Some(mode) = self.mode.member(&key) else {
            return Ok(());
        };
        let from = self.out.len() - self.start;
        value.serialize(Ser {
            out: &mut *self.out,
            depth: self.depth,
            mode,
        })?;
        let to = self.out.len() - self.start;
        self.members.push(Member {
            key,
            value: from..to,
        });
        Ok(())
    }

    fn finish(mut self) -> Result<(), CanonicalError> {
        let values = self.out.split_off(self.start);
        let members = &mut self.members;
        members.sort_unstable_by(|a, b| a.key.encode_utf16().cmp(b.key.encode_utf16()));
        if let Some(pair) = members.windows(2).find(|pair| pair[0].key == pair[1].key) {
            return Err(CanonicalError::DuplicateKey(
                pair[0].key.clone().into_owned(),
            ));
        }
        let keys: usize = members.iter().map(|m| m.key.len() + 4).sum();
        self.out.reserve(values.len() + keys + 2 + self.close.len());
        self.out.push('{');
        for (i, m) in members.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            write_str(self.out, &m.key);
            self.out.push(':');
            self.out.push_str(&values[m.value.clone()]);
        }
        self.out.push('}');
        self.out.push_str(self.close);
        Ok(())
    }
}

impl ser::SerializeMap for Object<'_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), CanonicalError> {
        self.key = Some(key.serialize(KeySer)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonicalError> {
        let key = self.key.take().ok_or_else(|| {
            CanonicalError::Custom("a map value was serialised without its key".into())
        })?;
        self.member(Cow::Owned(key), value)
    }
    fn end(self) -> Result<(), CanonicalError> {
        self.finish()
    }
}

impl ser::SerializeStructVariant for Object<'_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), CanonicalError> {
        self.member(Cow::Borrowed(key), value)
    }
    fn end(self) -> Result<(), CanonicalError> {
        self.finish()
    }
}

/// A struct being written: normally an object; serde_json's private number and raw-value
/// structs carry JSON text in their one field instead.
pub(super) enum Struct<'a> {
    Object(Object<'a>),
    Number(&'a mut String, Mode),
    Raw(Ser<'a>),
}

impl ser::SerializeStruct for Struct<'_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), CanonicalError> {
        match self {
            Struct::Object(object) => object.member(Cow::Borrowed(key), value),
            Struct::Number(out, mode) if mode.typed => {
                write_number_text_typed(out, &token_text(value)?)
            }
            Struct::Number(out, _) => write_number_text(out, &token_text(value)?),
            Struct::Raw(ser) if ser.mode.typed => {
                let text = token_text(value)?;
                raw::write_keyed(ser.out, &text, ser.depth)
            }
            Struct::Raw(ser) => {
                let raw: serde_json::Value = serde_json::from_str(&token_text(value)?)
                    .map_err(|e| CanonicalError::Custom(format!("invalid raw JSON value: {e}")))?;
                raw.serialize(Ser {
                    out: &mut *ser.out,
                    depth: ser.depth,
                    mode: ser.mode,
                })
            }
        }
    }
    fn end(self) -> Result<(), CanonicalError> {
        match self {
            Struct::Object(object) => object.finish(),
            Struct::Number(..) | Struct::Raw(_) => Ok(()),
        }
    }
}

/// The JSON text inside one of serde_json's private token structs.
fn token_text<T: Serialize + ?Sized>(value: &T) -> Result<String, CanonicalError> {
    value
        .serialize(KeySer)
        .map_err(|_| CanonicalError::Custom("malformed serde_json number or raw value".into()))
}
