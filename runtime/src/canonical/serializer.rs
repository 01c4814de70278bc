//! The serializer: `Ser` (its state is in `writer.rs`) writes one value of any [`Serialize`]
//! type, scalars and arrays ([`Seq`]) straight to the output and objects through
//! [`Object`](super::object::Object).

use serde::ser::{self, Serialize};

use super::numbers::{mark_float, write_f32, write_f64, write_int};
use super::object::{Object, Struct};
use super::strings::write_str;
use super::writer::{Mode, Ser};
use super::{CanonicalError, SERDE_JSON_NUMBER_TOKEN, SERDE_JSON_RAW_TOKEN};

impl<'a> Ser<'a> {
    fn object(self, len: usize, close: &'static str) -> Result<Object<'a>, CanonicalError> {
        let depth = self.inner_depth()?;
        let members = Ser {
            out: self.out,
            depth,
            mode: self.mode,
        };
        Ok(Object::new(members, len, close))
    }

    fn seq(self, close: &'static str) -> Result<Seq<'a>, CanonicalError> {
        let depth = self.inner_depth()?;
        self.out.push('[');
        Ok(Seq {
            out: self.out,
            depth,
            mode: self.mode.unnamed(),
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
            mode: self.mode.unnamed(),
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
            mode: self.mode.unnamed(),
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
            mode: self.mode.unnamed(),
        }
        .object(len, "}")
    }
}

/// An array being written: elements go straight to the output.
pub(super) struct Seq<'a> {
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
