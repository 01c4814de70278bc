//! Canonical JSON: RFC 8785 (JCS), with one deliberate deviation.
//!
//! Object members are sorted by the UTF-16 code units of their names, there is no whitespace,
//! strings use the minimal escaping of RFC 8785 §3.2.2.2, and floating-point numbers are written
//! as ECMAScript's `Number.prototype.toString` writes them (`1.0` → `1`, `1e3` → `1000`,
//! `-0.0` → `0`, `1e21` → `1e+21`). The number formatting is done by the `ryu-js` crate: a small,
//! well-kept port of Ryū that is exact and tested against the ECMAScript rules, where writing
//! the shortest-round-trip algorithm again would be a risk for no gain.
//!
//! **Deviation:** integers (`i8`…`i128`, `u8`…`u128`) keep their exact decimal digits, even
//! outside ±(2^53−1). Pure JCS passes every number through an IEEE double, so 9007199254740993
//! would become 9007199254740992 and two different charges would share one key.
//!
//! The workspace enables serde_json's `float_roundtrip` feature: without it serde_json parses some
//! decimals to a neighbouring double (`333333333.33333329` came back as `…325`), which the
//! RFC vectors catch.
//!
//! NaN and infinities, non-string map keys, duplicate keys and absurd nesting are errors
//! ([`CanonicalError`]), never a panic and never a silent `null`.

use std::fmt::Write as _;

use serde::ser::{self, Serialize};

/// How deep arrays and objects may nest before the arguments are refused.
pub const MAX_DEPTH: usize = 512;

/// Why a value has no canonical JSON form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalError {
    /// A float is NaN or infinite.
    #[error("a number in the arguments is NaN or infinite; JSON cannot carry it, so the call cannot be keyed")]
    NonFiniteNumber,
    /// A map key is not a string (or a number, which is written as a string).
    #[error("a map key in the arguments is a {found}; JSON object keys must be strings")]
    NonStringKey {
        /// What kind of value the key was.
        found: &'static str,
    },
    /// The same key twice in one object.
    #[error("the key {0:?} appears twice in one object of the arguments")]
    DuplicateKey(String),
    /// Nesting deeper than [`MAX_DEPTH`].
    #[error("the arguments nest deeper than {limit} levels")]
    TooDeep {
        /// The limit.
        limit: usize,
    },
    /// A `Serialize` implementation reported an error.
    #[error("the arguments could not be serialised: {0}")]
    Custom(String),
}

impl ser::Error for CanonicalError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        CanonicalError::Custom(msg.to_string())
    }
}

/// The canonical JSON text of `value` (see the module documentation).
///
/// ```
/// let v = serde_json::json!({"b": [1.0, 1e3, -0.0], "a": "\u{20ac}", "big": 9007199254740993u64});
/// assert_eq!(
///     idempotency::canonical_json(&v)?,
///     r#"{"a":"€","b":[1,1000,0],"big":9007199254740993}"#
/// );
/// # Ok::<(), idempotency::CanonicalError>(())
/// ```
pub fn canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<String, CanonicalError> {
    let node = value.serialize(NodeSer { depth: 0 })?;
    let mut out = String::new();
    write_node(&node, &mut out);
    Ok(out)
}

enum Node {
    Null,
    Bool(bool),
    /// Exact integer digits.
    Int(String),
    Float(f64),
    Str(String),
    Arr(Vec<Node>),
    /// Members, sorted by UTF-16 code units when finished.
    Obj(Vec<(String, Node)>),
}

fn finish_object(mut members: Vec<(String, Node)>) -> Result<Node, CanonicalError> {
    members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    for w in members.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(CanonicalError::DuplicateKey(w[0].0.clone()));
        }
    }
    Ok(Node::Obj(members))
}

fn write_node(node: &Node, out: &mut String) {
    match node {
        Node::Null => out.push_str("null"),
        Node::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Node::Int(digits) => out.push_str(digits),
        Node::Float(f) => {
            if *f == 0.0 {
                out.push('0');
            } else {
                out.push_str(ryu_js::Buffer::new().format_finite(*f));
            }
        }
        Node::Str(s) => write_str(s, out),
        Node::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_node(item, out);
            }
            out.push(']');
        }
        Node::Obj(members) => {
            out.push('{');
            for (i, (k, v)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(k, out);
                out.push(':');
                write_node(v, out);
            }
            out.push('}');
        }
    }
}

fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[derive(Clone, Copy)]
struct NodeSer {
    depth: usize,
}

impl NodeSer {
    fn nested(self) -> Result<NodeSer, CanonicalError> {
        if self.depth >= MAX_DEPTH {
            return Err(CanonicalError::TooDeep { limit: MAX_DEPTH });
        }
        Ok(NodeSer { depth: self.depth + 1 })
    }
}

fn float(f: f64) -> Result<Node, CanonicalError> {
    if f.is_finite() {
        Ok(Node::Float(f))
    } else {
        Err(CanonicalError::NonFiniteNumber)
    }
}

impl ser::Serializer for NodeSer {
    type Ok = Node;
    type Error = CanonicalError;
    type SerializeSeq = SeqSer;
    type SerializeTuple = SeqSer;
    type SerializeTupleStruct = SeqSer;
    type SerializeTupleVariant = VariantSeqSer;
    type SerializeMap = MapSer;
    type SerializeStruct = MapSer;
    type SerializeStructVariant = VariantMapSer;

    fn serialize_bool(self, v: bool) -> Result<Node, CanonicalError> {
        Ok(Node::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<Node, CanonicalError> {
        Ok(Node::Int(v.to_string()))
    }
    fn serialize_i16(self, v: i16) -> Result<Node, CanonicalError> {
        Ok(Node::Int(v.to_string()))
    }
    fn serialize_i32(self, v: i32) -> Result<Node, CanonicalError> {
        Ok(Node::Int(v.to_string()))
    }
    fn serialize_i64(self, v: i64) -> Result<Node, CanonicalError> {
        Ok(Node::Int(v.to_string()))
    }
    fn serialize_i128(self, v: i128) -> Result<Node, CanonicalError> {
        Ok(Node::Int(v.to_string()))
    }
    fn serialize_u8(self, v: u8) -> Result<Node, CanonicalError> {
        Ok(Node::Int(v.to_string()))
    }
    fn serialize_u16(self, v: u16) -> Result<Node, CanonicalError> {
        Ok(Node::Int(v.to_string()))
    }
    fn serialize_u32(self, v: u32) -> Result<Node, CanonicalError> {
        Ok(Node::Int(v.to_string()))
    }
    fn serialize_u64(self, v: u64) -> Result<Node, CanonicalError> {
        Ok(Node::Int(v.to_string()))
    }
    fn serialize_u128(self, v: u128) -> Result<Node, CanonicalError> {
        Ok(Node::Int(v.to_string()))
    }
    fn serialize_f32(self, v: f32) -> Result<Node, CanonicalError> {
        // Through the shortest decimal of the f32, so 0.1f32 is 0.1, not 0.10000000149011612.
        if !v.is_finite() {
            return Err(CanonicalError::NonFiniteNumber);
        }
        let shortest: f64 = v.to_string().parse().unwrap_or(v as f64);
        float(shortest)
    }
    fn serialize_f64(self, v: f64) -> Result<Node, CanonicalError> {
        float(v)
    }
    fn serialize_char(self, v: char) -> Result<Node, CanonicalError> {
        Ok(Node::Str(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Result<Node, CanonicalError> {
        Ok(Node::Str(v.to_owned()))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Node, CanonicalError> {
        Ok(Node::Arr(v.iter().map(|b| Node::Int(b.to_string())).collect()))
    }
    fn serialize_none(self) -> Result<Node, CanonicalError> {
        Ok(Node::Null)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Node, CanonicalError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Node, CanonicalError> {
        Ok(Node::Null)
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<Node, CanonicalError> {
        Ok(Node::Null)
    }
    fn serialize_unit_variant(self, _n: &'static str, _i: u32, variant: &'static str) -> Result<Node, CanonicalError> {
        Ok(Node::Str(variant.to_owned()))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Result<Node, CanonicalError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _n: &'static str,
        _i: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<Node, CanonicalError> {
        let inner = value.serialize(self.nested()?)?;
        Ok(Node::Obj(vec![(variant.to_owned(), inner)]))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<SeqSer, CanonicalError> {
        Ok(SeqSer { ser: self.nested()?, items: Vec::with_capacity(len.unwrap_or(0).min(1024)) })
    }
    fn serialize_tuple(self, len: usize) -> Result<SeqSer, CanonicalError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<SeqSer, CanonicalError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _n: &'static str,
        _i: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<VariantSeqSer, CanonicalError> {
        let inner = self.nested()?.serialize_seq(Some(len))?;
        Ok(VariantSeqSer { variant, inner })
    }
    fn serialize_map(self, len: Option<usize>) -> Result<MapSer, CanonicalError> {
        Ok(MapSer {
            ser: self.nested()?,
            members: Vec::with_capacity(len.unwrap_or(0).min(1024)),
            key: None,
        })
    }
    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<MapSer, CanonicalError> {
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _n: &'static str,
        _i: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<VariantMapSer, CanonicalError> {
        let inner = self.nested()?.serialize_map(Some(len))?;
        Ok(VariantMapSer { variant, inner })
    }
}

struct SeqSer {
    ser: NodeSer,
    items: Vec<Node>,
}

impl SeqSer {
    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonicalError> {
        self.items.push(value.serialize(self.ser)?);
        Ok(())
    }
}

impl ser::SerializeSeq for SeqSer {
    type Ok = Node;
    type Error = CanonicalError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonicalError> {
        self.push(value)
    }
    fn end(self) -> Result<Node, CanonicalError> {
        Ok(Node::Arr(self.items))
    }
}

impl ser::SerializeTuple for SeqSer {
    type Ok = Node;
    type Error = CanonicalError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonicalError> {
        self.push(value)
    }
    fn end(self) -> Result<Node, CanonicalError> {
        Ok(Node::Arr(self.items))
    }
}

impl ser::SerializeTupleStruct for SeqSer {
    type Ok = Node;
    type Error = CanonicalError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonicalError> {
        self.push(value)
    }
    fn end(self) -> Result<Node, CanonicalError> {
        Ok(Node::Arr(self.items))
    }
}

struct VariantSeqSer {
    variant: &'static str,
    inner: SeqSer,
}

impl ser::SerializeTupleVariant for VariantSeqSer {
    type Ok = Node;
    type Error = CanonicalError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonicalError> {
        self.inner.push(value)
    }
    fn end(self) -> Result<Node, CanonicalError> {
        Ok(Node::Obj(vec![(self.variant.to_owned(), Node::Arr(self.inner.items))]))
    }
}

struct MapSer {
    ser: NodeSer,
    members: Vec<(String, Node)>,
    key: Option<String>,
}

impl ser::SerializeMap for MapSer {
    type Ok = Node;
    type Error = CanonicalError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), CanonicalError> {
        self.key = Some(key.serialize(KeySer)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), CanonicalError> {
        let key = self
            .key
            .take()
            .ok_or_else(|| CanonicalError::Custom("a map value was serialised without its key".into()))?;
        self.members.push((key, value.serialize(self.ser)?));
        Ok(())
    }
    fn end(self) -> Result<Node, CanonicalError> {
        finish_object(self.members)
    }
}

impl ser::SerializeStruct for MapSer {
    type Ok = Node;
    type Error = CanonicalError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), CanonicalError> {
        self.members.push((key.to_owned(), value.serialize(self.ser)?));
        Ok(())
    }
    fn end(self) -> Result<Node, CanonicalError> {
        finish_object(self.members)
    }
}

struct VariantMapSer {
    variant: &'static str,
    inner: MapSer,
}

impl ser::SerializeStructVariant for VariantMapSer {
    type Ok = Node;
    type Error = CanonicalError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), CanonicalError> {
        ser::SerializeStruct::serialize_field(&mut self.inner, key, value)
    }
    fn end(self) -> Result<Node, CanonicalError> {
        let inner = finish_object(self.inner.members)?;
        Ok(Node::Obj(vec![(self.variant.to_owned(), inner)]))
    }
}

/// Map keys: strings and chars as they are; integers as their decimal digits (as serde_json
/// does); anything else is refused.
struct KeySer;

fn bad_key(found: &'static str) -> CanonicalError {
    CanonicalError::NonStringKey { found }
}

impl ser::Serializer for KeySer {
    type Ok = String;
    type Error = CanonicalError;
    type SerializeSeq = ser::Impossible<String, CanonicalError>;
    type SerializeTuple = ser::Impossible<String, CanonicalError>;
    type SerializeTupleStruct = ser::Impossible<String, CanonicalError>;
    type SerializeTupleVariant = ser::Impossible<String, CanonicalError>;
    type SerializeMap = ser::Impossible<String, CanonicalError>;
    type SerializeStruct = ser::Impossible<String, CanonicalError>;
    type SerializeStructVariant = ser::Impossible<String, CanonicalError>;

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
        Err(bad_key("float"))
    }
    fn serialize_f64(self, _: f64) -> Result<String, CanonicalError> {
        Err(bad_key("float"))
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
        Err(bad_key("null"))
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<String, CanonicalError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<String, CanonicalError> {
        Err(bad_key("null"))
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<String, CanonicalError> {
        Err(bad_key("unit struct"))
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<String, CanonicalError> {
        Ok(variant.to_owned())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<String, CanonicalError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(self, _: &'static str, _: u32, _: &'static str, _: &T) -> Result<String, CanonicalError> {
        Err(bad_key("enum variant with data"))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, CanonicalError> {
        Err(bad_key("sequence"))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, CanonicalError> {
        Err(bad_key("tuple"))
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, CanonicalError> {
        Err(bad_key("tuple struct"))
    }
    fn serialize_tuple_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Self::SerializeTupleVariant, CanonicalError> {
        Err(bad_key("enum variant with data"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, CanonicalError> {
        Err(bad_key("map"))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, CanonicalError> {
        Err(bad_key("struct"))
    }
    fn serialize_struct_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Self::SerializeStructVariant, CanonicalError> {
        Err(bad_key("enum variant with data"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};
    use std::collections::BTreeMap;

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
            let v: Value = serde_json::from_str(input).unwrap();
            assert_eq!(canonical_json(&v).unwrap(), expected.trim_end_matches('\n'), "vector {name}");
        }
    }

    #[test]
    fn numbers_follow_es6_except_integers_stay_exact() {
        assert_eq!(canonical_json(&json!([1.0, 1e3, -0.0, 1e21, 1e-7, 5e-324, 0.1, 123.456])).unwrap(),
            "[1,1000,0,1e+21,1e-7,5e-324,0.1,123.456]");
        assert_ne!(canonical_json(&9007199254740993u64).unwrap(), canonical_json(&9007199254740992u64).unwrap());
        assert_eq!(canonical_json(&9007199254740993u64).unwrap(), "9007199254740993");
        assert_eq!(canonical_json(&u128::MAX).unwrap(), u128::MAX.to_string());
        assert_eq!(canonical_json(&i128::MIN).unwrap(), i128::MIN.to_string());
        assert_eq!(canonical_json(&0.1f32).unwrap(), "0.1");
    }

    #[test]
    fn non_finite_numbers_are_errors() {
        assert_eq!(canonical_json(&f64::NAN), Err(CanonicalError::NonFiniteNumber));
        assert_eq!(canonical_json(&vec![f64::INFINITY]), Err(CanonicalError::NonFiniteNumber));
        assert_eq!(canonical_json(&f32::NEG_INFINITY), Err(CanonicalError::NonFiniteNumber));
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // U+1F600 (surrogates D83D DE00) sorts before U+FB33 in UTF-16, after it in UTF-8.
        let mut m = BTreeMap::new();
        m.insert("\u{FB33}", 1);
        m.insert("\u{1F600}", 2);
        m.insert("a", 3);
        assert_eq!(canonical_json(&m).unwrap(), "{\"a\":3,\"\u{1F600}\":2,\"\u{FB33}\":1}");
    }

    #[test]
    fn strings_use_minimal_escaping() {
        assert_eq!(
            canonical_json("\"\\\u{8}\t\n\u{c}\r\u{1}\u{1f}\u{7f}\u{2028}é/").unwrap(),
            "\"\\\"\\\\\\b\\t\\n\\f\\r\\u0001\\u001f\u{7f}\u{2028}é/\""
        );
    }

    #[test]
    fn map_keys_must_be_strings() {
        let mut m = BTreeMap::new();
        m.insert(vec![1u8], 1);
        assert!(matches!(canonical_json(&m), Err(CanonicalError::NonStringKey { .. })));
        let mut ints = BTreeMap::new();
        ints.insert(10u32, "a");
        ints.insert(9u32, "b");
        assert_eq!(canonical_json(&ints).unwrap(), r#"{"10":"a","9":"b"}"#);
        let mut bools = BTreeMap::new();
        bools.insert(true, 1);
        assert_eq!(canonical_json(&bools), Err(CanonicalError::NonStringKey { found: "boolean" }));
    }

    #[derive(serde::Serialize)]
    struct Args {
        b: u32,
        a: Option<String>,
        c: Shape,
    }

    #[derive(serde::Serialize)]
    enum Shape {
        Point,
        Circle(f64),
        Rect { w: u8, h: u8 },
        Pair(u8, u8),
    }

    #[test]
    fn structs_enums_and_options() {
        let a = Args { b: 1, a: None, c: Shape::Rect { w: 2, h: 1 } };
        assert_eq!(canonical_json(&a).unwrap(), r#"{"a":null,"b":1,"c":{"Rect":{"h":1,"w":2}}}"#);
        assert_eq!(canonical_json(&json!({"b": 1, "a": null, "c": {"Rect": {"w": 2, "h": 1}}})).unwrap(), canonical_json(&a).unwrap());
        assert_eq!(canonical_json(&[Shape::Point, Shape::Circle(1.5), Shape::Pair(1, 2)]).unwrap(), r#"["Point",{"Circle":1.5},{"Pair":[1,2]}]"#);
    }

    struct Dup;
    impl serde::Serialize for Dup {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(None)?;
            m.serialize_entry("k", &1)?;
            m.serialize_entry("k", &2)?;
            m.end()
        }
    }

    #[test]
    fn duplicate_keys_are_errors() {
        assert_eq!(canonical_json(&Dup), Err(CanonicalError::DuplicateKey("k".into())));
    }

    struct Deep(usize);
    impl serde::Serialize for Deep {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeSeq;
            let mut seq = s.serialize_seq(Some(1))?;
            if self.0 > 0 {
                seq.serialize_element(&Deep(self.0 - 1))?;
            }
            seq.end()
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        assert!(canonical_json(&Deep(MAX_DEPTH - 1)).is_ok());
        assert_eq!(canonical_json(&Deep(100_000)), Err(CanonicalError::TooDeep { limit: MAX_DEPTH }));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|i| json!(i)),
            any::<u64>().prop_map(|u| json!(u)),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
            "\\PC{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec(("\\PC{0,6}", inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// Equal as JSON data: numbers compare by value (`1.0` comes back as the integer `1`).
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(p), Some(q), _, _) => p == q,
                (_, _, Some(p), Some(q)) => p == q,
                _ => x.as_f64() == y.as_f64(),
            },
            (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q)),
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
            }
            _ => a == b,
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
        fn member_order_and_whitespace_do_not_matter(
            (kv, shuffled) in proptest::collection::btree_map("[a-z\u{e9}\u{1F600}]{0,3}", any::<i32>(), 0..8)
                .prop_flat_map(|m| {
                    let v: Vec<(String, i32)> = m.into_iter().collect();
                    (Just(v.clone()), Just(v).prop_shuffle())
                })
        ) {
            let text = |members: &[(String, i32)], ws: &str| {
                let body: Vec<String> = members.iter().map(|(k, v)| format!("{ws}{}{ws}:{ws}{v}", serde_json::to_string(k).unwrap())).collect();
                format!("{{{}{ws}}}", body.join(","))
            };
            let a: Value = serde_json::from_str(&text(&kv, "")).unwrap();
            let b: Value = serde_json::from_str(&text(&shuffled, " \n\t")).unwrap();
            prop_assert_eq!(canonical_json(&a).unwrap(), canonical_json(&b).unwrap());
        }
    }
}
