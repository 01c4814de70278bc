//! The outline of the typed arguments' serialised form: which members each object has, and
//! which fields a struct skipped because `skip_serializing_if` held (serde reports those through
//! `SerializeStruct::skip_field`; a `skip_serializing` field is never mentioned at all).

use std::collections::BTreeMap;
use std::fmt;

use serde::ser::{self, Serialize};

use crate::canonical::KeySer;

/// serde_json's private struct names for a `Number` and a `RawValue`: leaves, whatever text
/// they carry.
const SERDE_JSON_TOKENS: [&str; 2] = [
    "$serde_json::private::Number",
    "$serde_json::private::RawValue",
];

pub(super) enum Shape {
    /// A scalar, `null`, or raw JSON text.
    Leaf,
    Array(Vec<Shape>),
    Object(Object),
}

/// An object's outline: its members, and the struct fields it left out.
pub(super) struct Object {
    pub(super) members: BTreeMap<String, Shape>,
    /// Struct fields left out because their `skip_serializing_if` held.
    pub(super) skipped: Vec<&'static str>,
}

impl Shape {
    fn object(members: BTreeMap<String, Shape>) -> Shape {
        Shape::Object(Object {
            members,
            skipped: Vec::new(),
        })
    }

    /// `{"variant": inner}`, as serde_json writes an externally tagged variant.
    fn variant(variant: &str, inner: Shape) -> Shape {
        Shape::object(BTreeMap::from([(variant.to_owned(), inner)]))
    }
}

/// Why the outline could not be taken (the arguments' `Serialize` failed).
#[derive(Debug)]
pub(super) struct ShapeError(pub(super) String);

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShapeError {}

impl ser::Error for ShapeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        ShapeError(msg.to_string())
    }
}

pub(super) fn of<T: Serialize + ?Sized>(value: &T) -> Result<Shape, ShapeError> {
    value.serialize(ShapeSer)
}

struct ShapeSer;

type Res = Result<Shape, ShapeError>;

impl ser::Serializer for ShapeSer {
    type Ok = Shape;
    type Error = ShapeError;
    type SerializeSeq = Seq;
    type SerializeTuple = Seq;
    type SerializeTupleStruct = Seq;
    type SerializeTupleVariant = Seq;
    type SerializeMap = Map;
    type SerializeStruct = Struct;
    type SerializeStructVariant = Struct;

    fn serialize_bool(self, _: bool) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_i8(self, _: i8) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_i16(self, _: i16) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_i32(self, _: i32) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_i64(self, _: i64) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_i128(self, _: i128) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_u8(self, _: u8) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_u16(self, _: u16) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_u32(self, _: u32) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_u64(self, _: u64) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_u128(self, _: u128) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_f32(self, _: f32) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_f64(self, _: f64) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_char(self, _: char) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_str(self, _: &str) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_bytes(self, v: &[u8]) -> Res {
        Ok(Shape::Array(v.iter().map(|_| Shape::Leaf).collect()))
    }
    fn serialize_none(self) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Res {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Res {
        Ok(Shape::Leaf)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Res {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Res {
        Ok(Shape::variant(variant, value.serialize(self)?))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Seq, ShapeError> {
        Ok(Seq {
            items: Vec::with_capacity(len.unwrap_or(0).min(256)),
            variant: None,
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<Seq, ShapeError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Seq, ShapeError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Seq, ShapeError> {
        let mut seq = self.serialize_seq(Some(len))?;
        seq.variant = Some(variant);
        Ok(seq)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Map, ShapeError> {
        Ok(Map {
            members: BTreeMap::new(),
            key: None,
        })
    }
    fn serialize_struct(self, name: &'static str, _: usize) -> Result<Struct, ShapeError> {
        Ok(Struct {
            members: BTreeMap::new(),
            skipped: Vec::new(),
            variant: None,
            leaf: SERDE_JSON_TOKENS.contains(&name),
        })
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Struct, ShapeError> {
        Ok(Struct {
            members: BTreeMap::new(),
            skipped: Vec::new(),
            variant: Some(variant),
            leaf: false,
        })
    }
}

pub(super) struct Seq {
    items: Vec<Shape>,
    variant: Option<&'static str>,
}

impl Seq {
    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ShapeError> {
        self.items.push(value.serialize(ShapeSer)?);
        Ok(())
    }
    fn finish(self) -> Res {
        let array = Shape::Array(self.items);
        Ok(match self.variant {
            Some(variant) => Shape::variant(variant, array),
            None => array,
        })
    }
}

impl ser::SerializeSeq for Seq {
    type Ok = Shape;
    type Error = ShapeError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), ShapeError> {
        self.push(v)
    }
    fn end(self) -> Res {
        self.finish()
    }
}

impl ser::SerializeTuple for Seq {
    type Ok = Shape;
    type Error = ShapeError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), ShapeError> {
        self.push(v)
    }
    fn end(self) -> Res {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for Seq {
    type Ok = Shape;
    type Error = ShapeError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), ShapeError> {
        self.push(v)
    }
    fn end(self) -> Res {
        self.finish()
    }
}

impl ser::SerializeTupleVariant for Seq {
    type Ok = Shape;
    type Error = ShapeError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), ShapeError> {
        self.push(v)
    }
    fn end(self) -> Res {
        self.finish()
    }
}

pub(super) struct Map {
    members: BTreeMap<String, Shape>,
    key: Option<String>,
}

impl ser::SerializeMap for Map {
    type Ok = Shape;
    type Error = ShapeError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), ShapeError> {
        let key = key
            .serialize(KeySer)
            .map_err(|e| ShapeError(e.to_string()))?;
        self.key = Some(key);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), ShapeError> {
        let key = self
            .key
            .take()
            .ok_or_else(|| ShapeError("a map value was serialised without its key".into()))?;
        self.members.insert(key, v.serialize(ShapeSer)?);
        Ok(())
    }
    fn end(self) -> Res {
        Ok(Shape::object(self.members))
    }
}

pub(super) struct Struct {
    members: BTreeMap<String, Shape>,
    skipped: Vec<&'static str>,
    variant: Option<&'static str>,
    /// One of serde_json's private token structs: a leaf.
    leaf: bool,
}

impl Struct {
    fn field<T: Serialize + ?Sized>(&mut self, key: &'static str, v: &T) -> Result<(), ShapeError> {
        if !self.leaf {
            self.members.insert(key.to_owned(), v.serialize(ShapeSer)?);
        }
        Ok(())
    }
    fn finish(self) -> Res {
        if self.leaf {
            return Ok(Shape::Leaf);
        }
        let object = Shape::Object(Object {
            members: self.members,
            skipped: self.skipped,
        });
        Ok(match self.variant {
            Some(variant) => Shape::variant(variant, object),
            None => object,
        })
    }
}

impl ser::SerializeStruct for Struct {
    type Ok = Shape;
    type Error = ShapeError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        v: &T,
    ) -> Result<(), ShapeError> {
        self.field(key, v)
    }
    fn skip_field(&mut self, key: &'static str) -> Result<(), ShapeError> {
        self.skipped.push(key);
        Ok(())
    }
    fn end(self) -> Res {
        self.finish()
    }
}

impl ser::SerializeStructVariant for Struct {
    type Ok = Shape;
    type Error = ShapeError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        v: &T,
    ) -> Result<(), ShapeError> {
        self.field(key, v)
    }
    fn skip_field(&mut self, key: &'static str) -> Result<(), ShapeError> {
        self.skipped.push(key);
        Ok(())
    }
    fn end(self) -> Res {
        self.finish()
    }
}
