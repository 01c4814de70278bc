//! Map keys: an object member's name from a map key of any [`Serialize`] type, as serde_json
//! writes them (strings, chars, integers, unit variants); anything else is refused.

use serde::ser::{self, Impossible, Serialize};

use super::CanonicalError;

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
