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
//!
//! The module is split by shape: [`numbers`] and [`strings`] write scalars, [`serializer`] is the
//! serializer and its arrays, [`object`] buffers and orders object members, [`keys`] writes map
//! keys, and [`raw`] reads serde_json's `RawValue` text for a key.

mod keys;
mod numbers;
mod object;
mod raw;
mod serializer;
mod strings;
#[cfg(test)]
mod tests;
mod writer;

use serde::ser::{self, Serialize};

// The MCP arguments' shape check writes map keys as the key does.
#[cfg(feature = "rmcp")]
pub(crate) use keys::KeySer;
use writer::{Mode, Ser, JCS};

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
/// tell apart and JCS merges, and leaves out the members whose paths are in `skip` (`sent_at`
/// at the top, `meta.request_id` inside the top-level object `meta`; paths go through objects
/// only, not arrays or enum variants).
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
        mode: Mode {
            typed: true,
            skip,
            at: (!skip.is_empty()).then_some(""),
        },
    })?;
    Ok(out)
}
