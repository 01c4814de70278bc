//! Canonical JSON: RFC 8785 (JCS), with one deliberate deviation.
//!
//! [`canonical_json`] is a custom [`serde::Serializer`] that writes the canonical text straight
//! from any [`Serialize`] value (no detour through `serde_json::Value`):
//!
//! * object members (maps, structs, struct variants) are buffered and sorted by the UTF-16 code
//!   units of their names, as RFC 8785 §3.2.3 requires (this differs from Rust's byte order for
//!   names with characters above U+FFFF against U+E000..U+FFFF);
//! * there is no whitespace;
//! * strings use the minimal escaping of RFC 8785 §3.2.2.2: only `"`, `\` and control characters
//!   below U+0020 are escaped (`\b \t \n \f \r` in short form, the rest as `\u00xx`, lowercase);
//!   everything else, U+2028, U+2029 and DEL included, is literal UTF-8;
//! * floating-point numbers are written as ECMAScript's `Number.prototype.toString` writes them
//!   (`1.0` → `1`, `1e3` → `1000`, `-0.0` → `0`, `1e21` → `1e+21`, `1e-7` → `1e-7`). The
//!   formatting is done by the `ryu-js` crate: a maintained port of Ryū (shortest round-trip
//!   digits, proven correct) with the ECMAScript layout rules, tested against the ES6 vectors;
//!   writing that algorithm again here would be a risk for no gain. An `f32` is written with its
//!   own shortest digits (`0.1f32` → `0.1`, as serde_json does), not widened to `f64` first.
//!
//! **Deliberate deviation from RFC 8785:** integers (`i8`…`i128`, `u8`…`u128`) keep their exact
//! decimal digits, even outside ±(2^53−1). Pure JCS passes every number through an IEEE double,
//! so 9007199254740993 would become 9007199254740992 and two different charges would get one
//! key. For integers inside ±(2^53−1) (and for every float) the output is exactly JCS.
//!
//! Other shapes follow serde_json's conventions: `()`, `None` and unit structs are `null`; a unit
//! variant is its name as a string; newtype, tuple and struct variants are externally tagged
//! (`{"V":x}`, `{"V":[..]}`, `{"V":{..}}`); bytes are an array of numbers; integer and char map
//! keys are written as strings. serde_json's private number and raw-value tokens (features
//! `arbitrary_precision` / `raw_value`, should anything enable them) are understood too.
//!
//! The workspace enables serde_json's `float_roundtrip` feature: without it serde_json parses some
//! decimals to a neighbouring double (`333333333.33333329` came back as `…325`), which the RFC
//! vectors catch.
//!
//! NaN and infinities, non-string map keys, duplicate keys and nesting deeper than 512 levels are
//! errors ([`CanonicalError`]), never a panic and never a silent `null`.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::ops::Range;

use serde::ser::{self, Impossible, Serialize};

/// How deep values may nest before the arguments are refused. Each array, object, enum variant
/// with data, `Option::Some` and newtype wrapper counts one level. This bounds the recursion of
/// the serializer, so absurdly deep values cannot overflow the stack.
pub(crate) const MAX_DEPTH: usize = 512;

/// serde_json's private struct name for a `Number` under `arbitrary_precision`.
const SERDE_JSON_NUMBER_TOKEN: &str = "$serde_json::private::Number";
/// serde_json's private struct name for a `RawValue`.
const SERDE_JSON_RAW_TOKEN: &str = "$serde_json::private::RawValue";

/// Why a value has no canonical JSON form, so a call with it as arguments cannot be keyed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalError {
    /// A float is NaN or ±infinity: JSON has no way to write it.
    #[error(
        "a number in the arguments is NaN or infinite; JSON cannot carry it, so the call cannot \
         be keyed (validate or replace such values before the call)"
    )]
    NonFiniteNumber,
    /// A map key is neither a string nor something written as one (a char, an integer, a unit
    /// enum variant).
    #[error(
        "a map in the arguments has a {found} as a key; JSON object keys must be strings \
         (integers are accepted and written as strings), so the call cannot be keyed \
         (use string keys, or serialise the map as a list of pairs)"
    )]
    NonStringKey {
        /// What kind of value the key was, e.g. `"boolean"` or `"floating-point number"`.
        found: &'static str,
    },
    /// The same key twice in one object (possible with custom `Serialize` impls or
    /// `#[serde(flatten)]`); the canonical form would be ambiguous.
    #[error(
        "the key {0:?} appears twice in one object of the arguments, so there is no single \
         canonical form and the call cannot be keyed (check custom Serialize impls and \
         #[serde(flatten)] fields)"
    )]
    DuplicateKey(String),
    /// The value nests deeper than `limit` levels (arrays, objects, enum variants with data,
    /// `Option::Some` and newtype wrappers each count one).
    #[error(
        "the arguments nest deeper than {limit} levels, so the call cannot be keyed \
         (flatten the structure, or key the call on a smaller part of it)"
    )]
    TooDeep {
        /// The nesting limit (512).
        limit: usize,
    },
    /// A `Serialize` implementation reported an error of its own (`serde::ser::Error::custom`).
    #[error("the arguments could not be serialised, so the call cannot be keyed: {0}")]
    Custom(String),
}

impl ser::Error for CanonicalError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        CanonicalError::Custom(msg.to_string())
    }
}

/// The canonical JSON text (RFC 8785 / JCS) of `value`, used to key tool calls.
///
/// Members are sorted by UTF-16 code units, there is no whitespace, strings are minimally
/// escaped and floats are written as ECMAScript writes them (see the module documentation).
///
/// **Deviation from RFC 8785:** integers keep their exact digits even beyond ±(2^53−1), so
/// `9007199254740993` and `9007199254740992` stay different (pure JCS would round both to the
/// same double).
///
/// # Errors
///
/// [`CanonicalError`] for NaN/infinite floats, non-string map keys, duplicate keys in one
/// object, nesting deeper than 512 levels, or an error raised by the value's `Serialize` impl.
///
/// ```
/// let v = serde_json::json!({"b": [1.0, 1e3, -0.0], "a": "\u{20ac}", "big": 9007199254740993u64});
/// assert_eq!(
///     idempotency::canonical_json(&v)?,
///     r#"{"a":"€","b":[1,1000,0],"big":9007199254740993}"#
/// );
/// # Ok::<(), idempotency::key::CanonicalError>(())
/// ```
pub fn canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<String, CanonicalError> {
    let mut out = String::new();
    value.serialize(Ser {
        out: &mut out,
        depth: 0,
        mode: JCS,
    })?;
    Ok(out)
}

/// The text a key is hashed over: [`canonical_json`], except that it keeps what a handler can
/// tell apart and JCS merges, and leaves out the top-level members named in `skip`.
///
/// * A float keeps a mark that it is one: `1.0` is written `1.0`, not `1`, and `-0.0` is
///   `-0.0`, so an untagged `Int(1)` and `Float(1.0)`, or a `serde_json::Value` holding `100`
///   and one holding `100.0` (or `0` and `-0`), get different keys. A typed `f64` field is a
///   float whatever the client wrote (`100`, `100.0`, `1e2`), so its spellings still share one.
/// * serde_json's `arbitrary_precision` numbers: an integer written as digits keeps them exactly
///   (within 64 bits an integer, beyond them a float, as serde_json reads them back); a number
///   written with a fraction or exponent whose value is a whole number is written out exactly
///   (`1e21` and `1000000000000000000000` are one number); other fractions go through an `f64`.
/// * serde_json's `RawValue` is keyed by its text as the handler reads it: numbers keep their
///   digits exactly as written (`0.1` and `0.10000000000000000001` are two keys); only
///   whitespace, member order and string escapes are normalised, and a member name twice in one
///   object is refused (see the `raw` module).
pub(crate) fn typed_canonical<T: Serialize + ?Sized>(
    value: &T,
    skip: &'static [&'static str],
) -> Result<String, CanonicalError> {
    let mut out = String::new();
    value.serialize(Ser {
        out: &mut out,
        depth: 0,
        mode: Mode { typed: true, skip },
    })?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Writing scalars
// ---------------------------------------------------------------------------------------------

fn write_f64(out: &mut String, f: f64) -> Result<(), CanonicalError> {
    if !f.is_finite() {
        return Err(CanonicalError::NonFiniteNumber);
    }
    // ryu-js writes both zeros as "0", as ECMAScript does.
    out.push_str(ryu_js::Buffer::new().format_finite(f));
    Ok(())
}

fn write_f32(out: &mut String, f: f32) -> Result<(), CanonicalError> {
    if !f.is_finite() {
        return Err(CanonicalError::NonFiniteNumber);
    }
    out.push_str(ryu_js::Buffer::new().format_finite(f));
    Ok(())
}

fn write_int(out: &mut String, v: impl std::fmt::Display) {
    // Writing into a String cannot fail.
    let _ = write!(out, "{v}");
}

/// A number given as JSON text (serde_json's `arbitrary_precision` token): integers keep their
/// digits, anything else goes through an `f64` like every float.
fn write_number_text(out: &mut String, text: &str) -> Result<(), CanonicalError> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        let significant = digits.trim_start_matches('0');
        if significant.is_empty() {
            out.push('0');
        } else {
            if digits.len() != text.len() {
                out.push('-');
            }
            out.push_str(significant);
        }
        return Ok(());
    }
    let f: f64 = text
        .parse()
        .map_err(|_| CanonicalError::Custom(format!("{text:?} is not a JSON number")))?;
    write_f64(out, f)
}

/// Marks the float just written (its ECMAScript text is `out[start..]`) as a float: `.0` after
/// a whole number, and the sign of a negative zero (`-0.0`). Still valid JSON.
fn mark_float(out: &mut String, start: usize, negative: bool) {
    let text = &out[start..];
    if text == "0" && negative {
        out.insert(start, '-');
    }
    if !out[start..].contains(['.', 'e']) {
        out.push_str(".0");
    }
}

/// A number given as JSON text (serde_json's `arbitrary_precision` token), for a key: digits
/// within 64 bits are an integer; digits beyond, and any number with a fraction or exponent
/// whose value is whole, are written out exactly as a float (`…000.0`), as serde_json reads
/// them back as floats; other fractions go through an `f64`.
fn write_number_text_typed(out: &mut String, text: &str) -> Result<(), CanonicalError> {
    let bad = || CanonicalError::Custom(format!("{text:?} is not a JSON number"));
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    if !body.is_empty() && body.bytes().all(|b| b.is_ascii_digit()) {
        if text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok() {
            return write_number_text(out, text);
        }
        write_number_text(out, text)?;
        out.push_str(".0");
        return Ok(());
    }
    // mantissa digits and the power of ten that scales them
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], body[i + 1..].parse::<i64>().map_err(|_| bad())?),
        None => (body, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let digits = format!("{int}{frac}");
    let scale = exponent - frac.len() as i64;
    let significant = digits.trim_end_matches('0');
    let trailing = (digits.len() - significant.len()) as i64;
    let whole = significant.is_empty() || scale + trailing >= 0;
    if whole && scale <= 400 {
        let mut exact = significant.trim_start_matches('0').to_owned();
        if exact.is_empty() {
            out.push_str(if negative { "-0.0" } else { "0.0" });
            return Ok(());
        }
        exact.extend(std::iter::repeat_n(
            '0',
            usize::try_from(scale + trailing).unwrap_or(0),
        ));
        if negative {
            out.push('-');
        }
        out.push_str(&exact);
        out.push_str(".0");
        return Ok(());
    }
    let f: f64 = text.parse().map_err(|_| bad())?;
    let start = out.len();
    write_f64(out, f)?;
    mark_float(out, start, f.is_sign_negative());
    Ok(())
}

/// `s` as a JSON string with RFC 8785's minimal escaping.
fn write_str(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    let mut start = 0;
    for (i, &b) in s.as_bytes().iter().enumerate() {
        let short = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            b'\t' => "\\t",
            b'\n' => "\\n",
            0x0c => "\\f",
            b'\r' => "\\r",
            0x00..=0x1f => "",
            _ => continue,
        };
        // `b` is ASCII, so `i` is a char boundary.
        out.push_str(&s[start..i]);
        if short.is_empty() {
            out.push_str("\\u00");
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        } else {
            out.push_str(short);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

// ---------------------------------------------------------------------------------------------
// The serializer
// ---------------------------------------------------------------------------------------------

/// What the text is for: RFC 8785 for [`canonical_json`], or a key (see [`typed_canonical`]).
#[derive(Clone, Copy)]
struct Mode {
    /// Keys: floats keep a mark that they are floats (`1.0`, `-0.0`), serde_json's private
    /// number and raw-value tokens are read strictly.
    typed: bool,
    /// Top-level object members left out (volatile fields).
    skip: &'static [&'static str],
}

const JCS: Mode = Mode {
    typed: false,
    skip: &[],
};

/// Writes one value into `out`; `depth` is the number of levels around it.
struct Ser<'a> {
    out: &'a mut String,
    depth: usize,
    mode: Mode,
}

impl<'a> Ser<'a> {
    /// The depth of something nested one level inside the current value.
    fn inner_depth(&self) -> Result<usize, CanonicalError> {
        if self.depth >= MAX_DEPTH {
            Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
        } else {
            Ok(self.depth + 1)
        }
    }

    fn object(self, len: usize, close: &'static str) -> Result<Object<'a>, CanonicalError> {
        let depth = self.inner_depth()?;
        Ok(Object::new(self.out, depth, self.mode, len, close))
    }

    fn seq(self, close: &'static str) -> Result<Seq<'a>, CanonicalError> {
        let depth = self.inner_depth()?;
        self.out.push('[');
        Ok(Seq {
            out: self.out,
            depth,
            mode: self.mode,
            first: true,
            close,
        })
    }

    /// Writes `{"variant":` and returns the depth for the variant's content.
    fn open_variant(&mut self, variant: &str) -> Result<usize, CanonicalError> {
        let depth = self.inner_depth()?;
        self.out.push('{');
        write_str(self.out, variant);
        self.out.push(':');
        Ok(depth)
    }
}

impl<'a> ser::Serializer for Ser<'a> {
    type Ok = ();
    type Error = CanonicalError;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Seq<'a>;
    type SerializeTupleVariant = Seq<'a>;
    type SerializeMap = Object<'a>;
    type SerializeStruct = Struct<'a>;
    type SerializeStructVariant = Object<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), CanonicalError> {
        self.out.push_str(if v { "true" } else { "false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), CanonicalError> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i16(self, v: i16) -> Result<(), CanonicalError> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i32(self, v: i32) -> Result<(), CanonicalError> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i64(self, v: i64) -> Result<(), CanonicalError> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> Result<(), CanonicalError> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), CanonicalError> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u16(self, v: u16) -> Result<(), CanonicalError> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u32(self, v: u32) -> Result<(), CanonicalError> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u64(self, v: u64) -> Result<(), CanonicalError> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Result<(), CanonicalError> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<(), CanonicalError> {
        let start = self.out.len();
        write_f32(self.out, v)?;
        if self.mode.typed {
            mark_float(self.out, start, v.is_sign_negative());
        }
        Ok(())
    }
    fn serialize_f64(self, v: f64) -> Result<(), CanonicalError> {
        let start = self.out.len();
        write_f64(self.out, v)?;
        if self.mode.typed {
            mark_float(self.out, start, v.is_sign_negative());
        }
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), CanonicalError> {
        write_str(self.out, v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), CanonicalError> {
        write_str(self.out, v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), CanonicalError> {
        self.inner_depth()?;
        self.out.push('[');
        for (i, b) in v.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            write_int(self.out, b);
        }
        self.out.push(']');
        Ok(())
    }
    fn serialize_none(self) -> Result<(), CanonicalError> {
        self.out.push_str("null");
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), CanonicalError> {
        let depth = self.inner_depth()?;
        value.serialize(Ser {
            out: self.out,
            depth,
            mode: self.mode,
        })
    }
    fn serialize_unit(self) -> Result<(), CanonicalError> {
        self.serialize_none()
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), CanonicalError> {
        self.serialize_none()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), CanonicalError> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), CanonicalError> {
        self.serialize_some(value)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), CanonicalError> {
        let depth = self.open_variant(variant)?;
        value.serialize(Ser {
            out: &mut *self.out,
            depth,
            mode: self.mode,
        })?;
        self.out.push('}');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Seq<'a>, CanonicalError> {
        self.seq("]")
    }
    fn serialize_tuple(self, _len: usize) -> Result<Seq<'a>, CanonicalError> {
        self.seq("]")
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, CanonicalError> {
        self.seq("]")
    }
    fn serialize_tuple_variant(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, CanonicalError> {
        let depth = self.open_variant(variant)?;
        Ser {
            out: self.out,
            depth,
            mode: self.mode,
        }
        .seq("]}")
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Object<'a>, CanonicalError> {
        self.object(len.unwrap_or(0), "")
    }
    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Struct<'a>, CanonicalError> {
        match name {
            SERDE_JSON_NUMBER_TOKEN => Ok(Struct::Number(self.out, self.mode)),
            SERDE_JSON_RAW_TOKEN => Ok(Struct::Raw(self)),
            _ => Ok(Struct::Object(self.object(len, "")?)),
        }
    }
    fn serialize_struct_variant(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Object<'a>, CanonicalError> {
        let depth = self.open_variant(variant)?;
        Ser {
            out: self.out,
            depth,
            mode: self.mode,
        }
        .object(len, "}")
    }
}

/// An array being written: elements go straight to the output.
struct Seq<'a> {
    out: &'a mut String,
    /// Depth of the elements.
    depth: usize,
    mode: Mode,
    first: bool,
    /// `]`, or `]}` for a tuple variant.
    close: &'static str,
}

impl Seq<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonicalError> {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        value.serialize(Ser {
            out: &mut *self.out,
            depth: self.depth,
            mode: self.mode,
        })
    }

    fn finish(self) -> Result<(), CanonicalError> {
        self.out.push_str(self.close);
        Ok(())
    }
}

impl ser::SerializeSeq for Seq<'_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_element<T: Serialize + ?Sized>(
        &mut self,
        value: &T,
    ) -> Result<(), CanonicalError> {
        self.element(value)
    }
    fn end(self) -> Result<(), CanonicalError> {
        self.finish()
    }
}

impl ser::SerializeTuple for Seq<'_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_element<T: Serialize + ?Sized>(
        &mut self,
        value: &T,
    ) -> Result<(), CanonicalError> {
        self.element(value)
    }
    fn end(self) -> Result<(), CanonicalError> {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for Seq<'_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonicalError> {
        self.element(value)
    }
    fn end(self) -> Result<(), CanonicalError> {
        self.finish()
    }
}

impl ser::SerializeTupleVariant for Seq<'_> {
    type Ok = ();
    type Error = CanonicalError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonicalError> {
        self.element(value)
    }
    fn end(self) -> Result<(), CanonicalError> {
        self.finish()
    }
}

/// One buffered object member: its (unescaped) name and where its value's text lies in the
/// object's value buffer.
struct Member {
    key: Cow<'static, str>,
    value: Range<usize>,
}

/// An object being written. Member values are written to the end of the output as they come
/// (each value once, nested objects already sorted); `end` takes them off again, sorts the
/// members by name and writes `{"name":value,...}`. Each level copies its own text once.
struct Object<'a> {
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
    fn new(out: &'a mut String, depth: usize, mode: Mode, len: usize, close: &'static str) -> Self {
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
        if self.depth == 1 && self.mode.skip.contains(&&*key) {
            return Ok(());
        }
        let from = self.out.len() - self.start;
        value.serialize(Ser {
            out: &mut *self.out,
            depth: self.depth,
            mode: self.mode,
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
enum Struct<'a> {
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

/// A `RawValue` inside a key: keyed by its text as the handler reads it, less only what no JSON
/// reader can see.
///
/// A handler holds a `RawValue` to read the text itself, or to pass it on to a reader of its
/// own choosing, so the key may merge two texts only where every JSON reader reads them alike:
///
/// * whitespace between tokens is dropped and object members are sorted (RFC 8259 gives neither
///   a meaning); strings are decoded and written with RFC 8785's minimal escaping, so `"\u0041"`
///   and `"A"` are one string (a string whose escapes do not decode, such as a lone surrogate,
///   is kept as written);
/// * **numbers keep their text exactly as written**: RFC 8259 leaves their precision to the
///   reader, so `0.1` and `0.10000000000000000001` (one `f64`, two decimals), `1e2` and `100`,
///   or two integers beyond 64 bits that an `f64` would merge, are different keys. No number is
///   refused for its size;
/// * a member name twice in one object is refused: readers disagree on which one counts.
///
/// Through rmcp the handler's raw text is serde_json's compact rendering of the parsed
/// arguments, so its numbers are what `serde_json::Number` kept of the client's (every digit
/// under `arbitrary_precision`, an `f64` otherwise): the key follows that text either way.
mod raw {
    use super::{write_str, CanonicalError, MAX_DEPTH};

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
                    let number = self.take_while(|b| {
                        matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                    });
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
                (a.0.encode_utf16().cmp(b.0.encode_utf16()))
                    .then_with(|| a.2[..a.1].cmp(&b.2[..b.1]))
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
}

// ---------------------------------------------------------------------------------------------
// Map keys
// ---------------------------------------------------------------------------------------------

/// Map keys: strings and chars as they are; integers as their decimal digits and unit variants
/// as their names (as serde_json does); anything else is refused.
pub(crate) struct KeySer;

fn bad_key(found: &'static str) -> CanonicalError {
    CanonicalError::NonStringKey { found }
}

impl ser::Serializer for KeySer {
    type Ok = String;
    type Error = CanonicalError;
    type SerializeSeq = Impossible<String, CanonicalError>;
    type SerializeTuple = Impossible<String, CanonicalError>;
    type SerializeTupleStruct = Impossible<String, CanonicalError>;
    type SerializeTupleVariant = Impossible<String, CanonicalError>;
    type SerializeMap = Impossible<String, CanonicalError>;
    type SerializeStruct = Impossible<String, CanonicalError>;
    type SerializeStructVariant = Impossible<String, CanonicalError>;

    fn serialize_bool(self, _: bool) -> Result<String, CanonicalError> {
        Err(bad_key("boolean"))
    }
    fn serialize_i8(self, v: i8) -> Result<String, CanonicalError> {
        Ok(v.to_string())
    }
    fn serialize_i16(self, v: i16) -> Result<String, CanonicalError> {
        Ok(v.to_string())
    }
    fn serialize_i32(self, v: i32) -> Result<String, CanonicalError> {
        Ok(v.to_string())
    }
    fn serialize_i64(self, v: i64) -> Result<String, CanonicalError> {
        Ok(v.to_string())
    }
    fn serialize_i128(self, v: i128) -> Result<String, CanonicalError> {
        Ok(v.to_string())
    }
    fn serialize_u8(self, v: u8) -> Result<String, CanonicalError> {
        Ok(v.to_string())
    }
    fn serialize_u16(self, v: u16) -> Result<String, CanonicalError> {
        Ok(v.to_string())
    }
    fn serialize_u32(self, v: u32) -> Result<String, CanonicalError> {
        Ok(v.to_string())
    }
    fn serialize_u64(self, v: u64) -> Result<String, CanonicalError> {
        Ok(v.to_string())
    }
    fn serialize_u128(self, v: u128) -> Result<String, CanonicalError> {
        Ok(v.to_string())
    }
    fn serialize_f32(self, _: f32) -> Result<String, CanonicalError> {
        Err(bad_key("floating-point number"))
    }
    fn serialize_f64(self, _: f64) -> Result<String, CanonicalError> {
        Err(bad_key("floating-point number"))
    }
    fn serialize_char(self, v: char) -> Result<String, CanonicalError> {
        Ok(v.to_string())
    }
    fn serialize_str(self, v: &str) -> Result<String, CanonicalError> {
        Ok(v.to_owned())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<String, CanonicalError> {
        Err(bad_key("byte string"))
    }
    fn serialize_none(self) -> Result<String, CanonicalError> {
        Err(bad_key("None (null)"))
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<String, CanonicalError> {
        Err(bad_key("Option"))
    }
    fn serialize_unit(self) -> Result<String, CanonicalError> {
        Err(bad_key("unit (null)"))
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<String, CanonicalError> {
        Err(bad_key("unit struct (null)"))
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<String, CanonicalError> {
        Ok(variant.to_owned())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<String, CanonicalError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<String, CanonicalError> {
        Err(bad_key("enum variant with data"))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, CanonicalError> {
        Err(bad_key("sequence"))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, CanonicalError> {
        Err(bad_key("tuple"))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, CanonicalError> {
        Err(bad_key("tuple struct"))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, CanonicalError> {
        Err(bad_key("enum variant with data"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, CanonicalError> {
        Err(bad_key("map"))
    }
    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, CanonicalError> {
        Err(bad_key("struct"))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, CanonicalError> {
        Err(bad_key("enum variant with data"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};
    use std::collections::{BTreeMap, HashMap};

    macro_rules! vector {
        ($name:literal) => {
            (
                $name,
                include_str!(concat!("../tests/jcs/input/", $name, ".json")),
                include_str!(concat!("../tests/jcs/output/", $name, ".json")),
            )
        };
    }

    #[test]
    fn rfc8785_vectors() {
        let vectors = [
            vector!("arrays"),
            vector!("french"),
            vector!("structures"),
            vector!("unicode"),
            vector!("values"),
            vector!("weird"),
        ];
        for (name, input, expected) in vectors {
            assert!(
                !expected.ends_with('\n'),
                "vector {name} has a trailing newline"
            );
            let v: Value = serde_json::from_str(input).unwrap();
            assert_eq!(
                canonical_json(&v).unwrap().as_bytes(),
                expected.as_bytes(),
                "vector {name}"
            );
        }
    }

    #[test]
    fn floats_follow_es6() {
        let v = json!([1.0, 1e3, -0.0, 1e21, 1e-7, 5e-324, 0.1, 123.456, -1.5, 1e20, 1e-6]);
        assert_eq!(
            canonical_json(&v).unwrap(),
            "[1,1000,0,1e+21,1e-7,5e-324,0.1,123.456,-1.5,100000000000000000000,0.000001]"
        );
        assert_eq!(canonical_json(&-0.0f64).unwrap(), "0");
        assert_eq!(
            canonical_json(&f64::MAX).unwrap(),
            "1.7976931348623157e+308"
        );
        assert_eq!(canonical_json(&0.1f32).unwrap(), "0.1");
        assert_eq!(canonical_json(&-0.0f32).unwrap(), "0");
        // serde_json parses `1.0` and `1e3` as f64.
        let parsed: Value = serde_json::from_str("[1.0, 1e3, 1E-7, -0]").unwrap();
        assert_eq!(canonical_json(&parsed).unwrap(), "[1,1000,1e-7,0]");
    }

    #[test]
    fn integers_stay_exact() {
        assert_eq!(
            canonical_json(&9007199254740993u64).unwrap(),
            "9007199254740993"
        );
        assert_ne!(
            canonical_json(&json!({"amount": 9007199254740993u64})).unwrap(),
            canonical_json(&json!({"amount": 9007199254740992u64})).unwrap()
        );
        assert_eq!(canonical_json(&u64::MAX).unwrap(), "18446744073709551615");
        assert_eq!(canonical_json(&i64::MIN).unwrap(), "-9223372036854775808");
        assert_eq!(canonical_json(&u128::MAX).unwrap(), u128::MAX.to_string());
        assert_eq!(canonical_json(&i128::MIN).unwrap(), i128::MIN.to_string());
        assert_eq!(canonical_json(&[-1i8, 0, 7]).unwrap(), "[-1,0,7]");
    }

    #[test]
    fn non_finite_numbers_are_errors() {
        assert_eq!(
            canonical_json(&f64::NAN),
            Err(CanonicalError::NonFiniteNumber)
        );
        assert_eq!(
            canonical_json(&vec![f64::INFINITY]),
            Err(CanonicalError::NonFiniteNumber)
        );
        assert_eq!(
            canonical_json(&f32::NEG_INFINITY),
            Err(CanonicalError::NonFiniteNumber)
        );
        let msg = CanonicalError::NonFiniteNumber.to_string();
        assert!(msg.contains("NaN or infinite"), "{msg}");
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // U+1F600 is D83D DE00 in UTF-16, so it sorts before U+FB33; in UTF-8 (and in a
        // BTreeMap<String, _>) it sorts after.
        let mut m = BTreeMap::new();
        m.insert("\u{FB33}", 1);
        m.insert("\u{1F600}", 2);
        m.insert("a", 3);
        m.insert("\u{E000}", 4);
        m.insert("", 5);
        assert_eq!(
            canonical_json(&m).unwrap(),
            "{\"\":5,\"a\":3,\"\u{1F600}\":2,\"\u{E000}\":4,\"\u{FB33}\":1}"
        );
        let h: HashMap<_, _> = m.into_iter().collect();
        assert_eq!(
            canonical_json(&h).unwrap(),
            "{\"\":5,\"a\":3,\"\u{1F600}\":2,\"\u{E000}\":4,\"\u{FB33}\":1}"
        );
    }

    #[test]
    fn strings_use_minimal_escaping() {
        assert_eq!(
            canonical_json("\"\\\u{8}\t\n\u{c}\r\u{0}\u{1}\u{1f}\u{7f}\u{2028}\u{2029}é/€😂</")
                .unwrap(),
            "\"\\\"\\\\\\b\\t\\n\\f\\r\\u0000\\u0001\\u001f\u{7f}\u{2028}\u{2029}é/€😂</\""
        );
        assert_eq!(canonical_json(&'\n').unwrap(), r#""\n""#);
        assert_eq!(canonical_json(&'\u{1b}').unwrap(), r#""\u001b""#);
        // Keys are escaped the same way.
        assert_eq!(
            canonical_json(&json!({"a\"\n": 1})).unwrap(),
            r#"{"a\"\n":1}"#
        );
    }

    #[test]
    fn map_keys_must_be_strings() {
        let mut ints = BTreeMap::new();
        ints.insert(10u32, "a");
        ints.insert(9u32, "b");
        ints.insert(100u32, "c");
        assert_eq!(
            canonical_json(&ints).unwrap(),
            r#"{"10":"a","100":"c","9":"b"}"#
        );
        let chars: BTreeMap<char, u8> = [('b', 1), ('a', 2)].into();
        assert_eq!(canonical_json(&chars).unwrap(), r#"{"a":2,"b":1}"#);
        let seqs: BTreeMap<Vec<u8>, u8> = [(vec![1], 1)].into();
        assert_eq!(
            canonical_json(&seqs),
            Err(CanonicalError::NonStringKey { found: "sequence" })
        );
        let bools: BTreeMap<bool, u8> = [(true, 1)].into();
        assert_eq!(
            canonical_json(&bools),
            Err(CanonicalError::NonStringKey { found: "boolean" })
        );
        let opts: BTreeMap<Option<u8>, u8> = [(None, 1)].into();
        assert!(matches!(
            canonical_json(&opts),
            Err(CanonicalError::NonStringKey { .. })
        ));
        let unit: BTreeMap<(), u8> = [((), 1)].into();
        assert!(matches!(
            canonical_json(&unit),
            Err(CanonicalError::NonStringKey { .. })
        ));
        let floats = FloatKey;
        assert_eq!(
            canonical_json(&floats),
            Err(CanonicalError::NonStringKey {
                found: "floating-point number"
            })
        );
    }

    struct FloatKey;
    impl Serialize for FloatKey {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(Some(1))?;
            m.serialize_entry(&1.5f64, &1)?;
            m.end()
        }
    }

    #[derive(serde::Serialize)]
    struct Args {
        b: u32,
        a: Option<String>,
        c: Shape,
        d: Meters,
    }

    #[derive(serde::Serialize)]
    struct Meters(f64);

    #[derive(serde::Serialize)]
    struct Marker;

    #[derive(serde::Serialize)]
    enum Shape {
        Point,
        Circle(f64),
        Rect { w: u8, h: u8 },
        Pair(u8, u8),
    }

    #[test]
    fn structs_and_maps_agree() {
        let a = Args {
            b: 1,
            a: None,
            c: Shape::Rect { w: 2, h: 1 },
            d: Meters(2.0),
        };
        let expected = r#"{"a":null,"b":1,"c":{"Rect":{"h":1,"w":2}},"d":2}"#;
        assert_eq!(canonical_json(&a).unwrap(), expected);
        let as_map = json!({"d": 2.0, "b": 1, "a": null, "c": {"Rect": {"w": 2, "h": 1}}});
        assert_eq!(canonical_json(&as_map).unwrap(), expected);
        // The same as going through serde_json::Value.
        assert_eq!(
            canonical_json(&serde_json::to_value(&a).unwrap()).unwrap(),
            expected
        );
    }

    #[test]
    fn enum_and_unit_shapes() {
        let shapes = [
            Shape::Point,
            Shape::Circle(1.5),
            Shape::Pair(1, 2),
            Shape::Rect { w: 3, h: 4 },
        ];
        assert_eq!(
            canonical_json(&shapes).unwrap(),
            r#"["Point",{"Circle":1.5},{"Pair":[1,2]},{"Rect":{"h":4,"w":3}}]"#
        );
        assert_eq!(canonical_json(&()).unwrap(), "null");
        assert_eq!(canonical_json(&Marker).unwrap(), "null");
        assert_eq!(canonical_json(&None::<u8>).unwrap(), "null");
        assert_eq!(canonical_json(&Some(3u8)).unwrap(), "3");
        assert_eq!(
            canonical_json(&(1u8, "x", true)).unwrap(),
            r#"[1,"x",true]"#
        );
        assert_eq!(canonical_json(&Vec::<u8>::new()).unwrap(), "[]");
        assert_eq!(
            canonical_json(&BTreeMap::<String, u8>::new()).unwrap(),
            "{}"
        );
        let unit_keys: BTreeMap<&str, Shape> = [("z", Shape::Point)].into();
        assert_eq!(canonical_json(&unit_keys).unwrap(), r#"{"z":"Point"}"#);
    }

    struct Bytes(&'static [u8]);
    impl Serialize for Bytes {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    #[test]
    fn bytes_are_arrays_of_numbers() {
        assert_eq!(
            canonical_json(&Bytes(b"\x00\x7f\xff")).unwrap(),
            "[0,127,255]"
        );
        assert_eq!(canonical_json(&Bytes(b"")).unwrap(), "[]");
    }

    struct Dup;
    impl Serialize for Dup {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(None)?;
            m.serialize_entry("k", &1)?;
            m.serialize_entry("j", &1)?;
            m.serialize_entry("k", &2)?;
            m.end()
        }
    }

    #[test]
    fn duplicate_keys_are_errors() {
        assert_eq!(
            canonical_json(&Dup),
            Err(CanonicalError::DuplicateKey("k".into()))
        );
        assert_eq!(
            canonical_json(&[Dup]),
            Err(CanonicalError::DuplicateKey("k".into()))
        );
    }

    struct Failing;
    impl Serialize for Failing {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no thanks"))
        }
    }

    #[test]
    fn custom_errors_pass_through() {
        assert_eq!(
            canonical_json(&[Failing]),
            Err(CanonicalError::Custom("no thanks".into()))
        );
    }

    /// What serde_json's `Number` serialises as under `arbitrary_precision`.
    struct PreciseNumber(&'static str);
    impl Serialize for PreciseNumber {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeStruct;
            let mut st = s.serialize_struct(SERDE_JSON_NUMBER_TOKEN, 1)?;
            st.serialize_field(SERDE_JSON_NUMBER_TOKEN, self.0)?;
            st.end()
        }
    }

    /// What serde_json's `RawValue` serialises as.
    struct Raw(&'static str);
    impl Serialize for Raw {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeStruct;
            let mut st = s.serialize_struct(SERDE_JSON_RAW_TOKEN, 1)?;
            st.serialize_field(SERDE_JSON_RAW_TOKEN, self.0)?;
            st.end()
        }
    }

    fn keyed<T: Serialize + ?Sized>(v: &T) -> String {
        typed_canonical(v, &[]).unwrap()
    }

    #[test]
    fn keys_mark_floats_and_keep_the_sign_of_zero() {
        assert_eq!(keyed(&1.0f64), "1.0");
        assert_eq!(keyed(&1u8), "1");
        assert_eq!(keyed(&-0.0f64), "-0.0");
        assert_eq!(keyed(&0.0f64), "0.0");
        assert_eq!(keyed(&1.5f64), "1.5");
        assert_eq!(keyed(&1e21f64), "1e+21");
        assert_eq!(keyed(&0.1f32), "0.1");
        assert_eq!(keyed(&[1.0f64, 2.5]), "[1.0,2.5]");
        assert_eq!(
            keyed(&serde_json::json!({"b": 100.0, "a": -0.0})),
            r#"{"a":-0.0,"b":100.0}"#
        );
        // canonical_json stays RFC 8785.
        assert_eq!(canonical_json(&[1.0f64, -0.0]).unwrap(), "[1,0]");
    }

    #[test]
    fn keys_read_arbitrary_precision_numbers_by_value() {
        // One number, two spellings.
        assert_eq!(
            keyed(&PreciseNumber("1e21")),
            keyed(&PreciseNumber("1000000000000000000000"))
        );
        assert_eq!(keyed(&PreciseNumber("1e21")), "1000000000000000000000.0");
        assert_eq!(
            keyed(&PreciseNumber("12.50e1")),
            keyed(&PreciseNumber("125.0"))
        );
        // What serde_json reads back as an integer and as a float stay apart.
        assert_eq!(keyed(&PreciseNumber("100")), "100");
        assert_ne!(keyed(&PreciseNumber("100")), keyed(&PreciseNumber("1e2")));
        // Neighbours beyond 64 bits stay apart; fractions go through an f64.
        assert_ne!(
            keyed(&PreciseNumber("18446744073709551616")),
            keyed(&PreciseNumber("18446744073709551617"))
        );
        assert_eq!(keyed(&PreciseNumber("0.5")), "0.5");
        assert_eq!(keyed(&PreciseNumber("-0")), "0");
        assert_eq!(keyed(&PreciseNumber("-0.0")), "-0.0");
    }

    #[test]
    fn keys_read_raw_values_by_their_text() {
        // Numbers keep the digits the handler reads, whatever an f64 would make of them.
        assert_eq!(
            keyed(&Raw("0.10000000000000000001")),
            "0.10000000000000000001"
        );
        assert_ne!(keyed(&Raw("0.1")), keyed(&Raw("0.10000000000000000001")));
        assert_ne!(keyed(&Raw("1e2")), keyed(&Raw("100")));
        assert_ne!(keyed(&Raw("1.0")), keyed(&Raw("1")));
        assert_ne!(keyed(&Raw("-0")), keyed(&Raw("0")));
        assert_ne!(
            keyed(&Raw("[18446744073709551616]")),
            keyed(&Raw("[18446744073709551617]"))
        );
        // What no JSON reader sees: whitespace, member order, escapes.
        assert_eq!(
            keyed(&Raw(" { \"b\" : 1.0 ,\n \"a\" : [ 2 , {} , [ ] ] } ")),
            r#"{"a":[2,{},[]],"b":1.0}"#
        );
        assert_eq!(keyed(&Raw(r#""\u0041\/\u00e9""#)), r#""A/é""#);
        assert_eq!(
            keyed(&Raw(r#"["\u001F",true,false,null]"#)),
            r#"["\u001f",true,false,null]"#
        );
        assert_eq!(
            keyed(&Raw(r#"{"\u0061":1,"b":2}"#)),
            keyed(&Raw(r#"{"b":2,"a":1}"#))
        );
        // A lone surrogate is kept as written, apart from any decodable string.
        assert_eq!(keyed(&Raw(r#""\ud800""#)), r#""\ud800""#);
        assert_ne!(keyed(&Raw(r#""\ud800""#)), keyed(&Raw(r#""\\ud800""#)));
        // Duplicate members (whatever their spelling) are refused; so is text that is not JSON.
        for dup in [
            r#"{"a":1,"a":2}"#,
            r#"{"a":1,"\u0061":1}"#,
            r#"[{"b":{"a":1,"a":1}}]"#,
        ] {
            let e = typed_canonical(&Raw(dup), &[]).unwrap_err();
            assert!(e.to_string().contains("twice"), "{dup}: {e}");
        }
        for bad in ["", "[1,]", "{\"a\" 1}", "tru", "[1] 2", "\"open"] {
            assert!(typed_canonical(&Raw(bad), &[]).is_err(), "{bad:?}");
        }
        // Nesting counts against the same limit as typed values.
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(
            typed_canonical(&Raw(Box::leak(deep.into_boxed_str())), &[]),
            Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
        );
        // RFC 8785 output is unchanged: a raw value there is read as a value.
        assert_eq!(canonical_json(&Raw("1.0")).unwrap(), "1");
    }

    #[test]
    fn keys_leave_out_only_top_level_ignored_members() {
        let v = serde_json::json!({"a": 1, "t": 2, "n": {"t": 3}});
        assert_eq!(
            typed_canonical(&v, &["t"]).unwrap(),
            r#"{"a":1,"n":{"t":3}}"#
        );
    }

    #[test]
    fn serde_json_private_tokens() {
        let nums = [
            PreciseNumber("123456789012345678901234567890"),
            PreciseNumber("-0"),
            PreciseNumber("1.0"),
            PreciseNumber("1E3"),
            PreciseNumber("-12"),
        ];
        assert_eq!(
            canonical_json(&nums).unwrap(),
            "[123456789012345678901234567890,0,1,1000,-12]"
        );
        assert_eq!(
            canonical_json(&PreciseNumber("1e400")),
            Err(CanonicalError::NonFiniteNumber)
        );
        assert!(matches!(
            canonical_json(&PreciseNumber("x")),
            Err(CanonicalError::Custom(_))
        ));
        assert_eq!(
            canonical_json(&Raw(r#" { "b" : 1.0 , "a" : [ ] } "#)).unwrap(),
            r#"{"a":[],"b":1}"#
        );
    }

    struct Deep(usize);
    impl Serialize for Deep {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeSeq;
            let mut seq = s.serialize_seq(Some(1))?;
            if self.0 > 1 {
                seq.serialize_element(&Deep(self.0 - 1))?;
            }
            seq.end()
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        // Deep(n) is n nested arrays.
        let ok = canonical_json(&Deep(MAX_DEPTH)).unwrap();
        assert_eq!(ok.len(), 2 * MAX_DEPTH);
        assert_eq!(
            canonical_json(&Deep(MAX_DEPTH + 1)),
            Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
        );
        assert_eq!(
            canonical_json(&Deep(100_000)),
            Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
        );

        let nested = |depth: usize| {
            let mut v = Value::Null;
            for i in 0..depth {
                v = if i % 2 == 0 {
                    Value::Array(vec![v])
                } else {
                    json!({ "k": v })
                };
            }
            v
        };
        assert!(canonical_json(&nested(MAX_DEPTH)).is_ok());
        let mut v = Value::Null;
        for i in 0..1000 {
            v = if i % 2 == 0 {
                Value::Array(vec![v])
            } else {
                json!({ "k": v })
            };
        }
        assert_eq!(
            canonical_json(&v),
            Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
        );
    }

    // ----- properties ------------------------------------------------------------------------

    /// Strings with controls, quotes, backslashes, astral and private-use characters.
    const TEXT: &str =
        r#"([\x00-\x1f"\\\x7f\u{2028}\u{E000}\u{FB33}\u{FFFF}\u{10000}\u{1F600}]|\PC){0,8}"#;

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            TEXT.prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec((TEXT, inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// Equal as JSON data: numbers compare by value (`1.0` comes back as the integer `1`).
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => {
                match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                    (Some(p), Some(q), _, _) => p == q,
                    (_, _, Some(p), Some(q)) => p == q,
                    _ => x.as_f64() == y.as_f64(),
                }
            }
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
            }
            _ => a == b,
        }
    }

    /// An object whose members are serialised in exactly the given order.
    struct Ordered(Vec<(String, Value)>);
    impl Serialize for Ordered {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
        }
    }

    proptest! {
        #[test]
        fn parse_of_canonical_is_the_value(v in json_value()) {
            let c = canonical_json(&v).unwrap();
            let back: Value = serde_json::from_str(&c).unwrap();
            prop_assert!(same(&v, &back), "{v} -> {c} -> {back}");
        }

        #[test]
        fn canonical_is_idempotent(v in json_value()) {
            let c = canonical_json(&v).unwrap();
            let back: Value = serde_json::from_str(&c).unwrap();
            prop_assert_eq!(canonical_json(&back).unwrap(), c);
        }

        #[test]
        fn member_order_does_not_matter(
            (members, shuffled) in proptest::collection::btree_map(TEXT, json_value(), 0..8)
                .prop_flat_map(|m| {
                    let v: Vec<(String, Value)> = m.into_iter().collect();
                    (Just(v.clone()), Just(v).prop_shuffle())
                })
        ) {
            let object = Value::Object(members.iter().cloned().collect());
            let c = canonical_json(&Ordered(members)).unwrap();
            prop_assert_eq!(&canonical_json(&Ordered(shuffled)).unwrap(), &c);
            prop_assert_eq!(canonical_json(&object).unwrap(), c);
        }

        /// With BMP keys (where UTF-16 order is byte order) and no floats, the output is exactly
        /// serde_json's compact output: same escaping, same sorted BTreeMap order.
        #[test]
        fn matches_serde_json_without_floats(
            v in {
                let leaf = prop_oneof![
                    Just(Value::Null),
                    any::<bool>().prop_map(Value::Bool),
                    any::<i64>().prop_map(Value::from),
                    any::<u64>().prop_map(Value::from),
                    TEXT.prop_map(Value::String),
                ];
                leaf.prop_recursive(3, 32, 5, |inner| prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                    proptest::collection::vec(("[\\x00-\\x7f\u{e9}\u{20ac}\u{d7ff}]{0,4}", inner), 0..5)
                        .prop_map(|kv| Value::Object(kv.into_iter().collect())),
                ])
            }
        ) {
            prop_assert_eq!(canonical_json(&v).unwrap(), serde_json::to_string(&v).unwrap());
        }
    }
}
