//! What the client sent, against what the key is made of.
//!
//! The key hashes the typed arguments' serialised form: what the handler reads, after defaults,
//! whatever the member order, whitespace or escapes. A member the client sent that the handler
//! could read but this form does not carry — an unknown field, or one the type reads but never
//! serialises (`#[serde(skip_serializing)]`) — would let two calls that differ in it share a
//! key, so the second silently replays the first. Wrapped tools therefore refuse such a call
//! before anything is claimed, naming the member, and list an input schema that says so
//! (`additionalProperties: false`).
//!
//! A member missing from the serialised form is not refused when the key sees what the handler
//! reads from it:
//!
//! * `null` (an absent optional);
//! * a field that `skip_serializing_if` left out: serde reports it to the serializer
//!   (`SerializeStruct::skip_field`), which a `skip_serializing` field never is. The predicate
//!   held for the value sent, so the key is that of the call that omits it (`"dry_run": false`
//!   under `skip_serializing_if = "std::ops::Not::not"` is the call without it). A predicate
//!   that holds for several values the handler tells apart merges them; make it hold for the
//!   default alone;
//! * a serde `alias` (or a `rename(deserialize = ..)` other than the serialised name) of a field
//!   the client did not also send under its own name: the typed value holds it under that name,
//!   so `{"amt": 5}` keys as `{"amount": 5}`. That the member is read as that field is checked
//!   by deserialising the arguments again: with the field's own name added beside it serde must
//!   refuse a duplicate field, and with the member renamed to it, accept. An alias whose target
//!   does not say so (inside an untagged enum, a flattened struct) stays refused, as do aliases
//!   beyond the first [`MAX_PROBES`] checks of one call.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::JsonObject;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::error::Error;
use crate::key::KeyError;
use crate::tool::ToolSpec;

use shape::Shape;

/// How many deserialisations one call may spend on recognising aliases; a member that needs
/// more is refused like an unknown one. Each alias costs one or two, and each costs a copy of
/// the arguments, so a call with thousands of aliased members cannot make the check quadratic.
const MAX_PROBES: usize = 64;

/// The arguments exactly as the client sent them (rmcp extractor; it copies them and leaves them
/// for `Parameters<T>`). `#[idempotent]` adds it to wrapped rmcp tools.
#[derive(Clone, Debug, Default)]
pub struct RawArguments(Option<JsonObject>);

impl<S> FromContextPart<ToolCallContext<'_, S>> for RawArguments {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, rmcp::ErrorData> {
        Ok(RawArguments(context.arguments.clone()))
    }
}

/// Refuses the call when the client sent a member (at any depth inside objects and arrays) that
/// the handler could read and the typed arguments' serialised form does not show: not `null`,
/// not a top-level field the tool ignores, not left out by `skip_serializing_if`, and not an
/// alias of a field it holds (see the module documentation).
pub fn check_arguments<A: Serialize + DeserializeOwned>(
    raw: &RawArguments,
    args: &A,
    spec: &ToolSpec,
) -> Result<(), Error> {
    let Some(sent) = &raw.0 else { return Ok(()) };
    let refused = |source| Error::Arguments {
        tool: spec.name().to_owned(),
        source,
    };
    let typed = shape::of(args).map_err(|e| {
        refused(KeyError::Unchecked {
            reason: e.to_string(),
        })
    })?;
    let Shape::Object { members, skipped } = &typed else {
        return Ok(());
    };
    let check = Check {
        sent,
        probes: Cell::new(0),
        reads: &|probe| serde_json::from_value::<A>(Value::Object(probe)).map(drop),
    };
    check
        .object(
            &mut Vec::new(),
            sent,
            (members, skipped),
            ("", spec.ignored()),
        )
        .map_err(|field| refused(KeyError::NotKeyed { field }))
}

/// One step from an object or array to a value inside it.
enum Step<'s> {
    Member(&'s str),
    Item(usize),
}

/// Deserialises the arguments type from a probe, as the handler's `Parameters<T>` would.
type Reads<'r> = &'r dyn Fn(JsonObject) -> Result<(), serde_json::Error>;

struct Check<'r, 's> {
    sent: &'s JsonObject,
    /// Deserialisations spent so far (at most [`MAX_PROBES`]).
    probes: Cell<usize>,
    reads: Reads<'r>,
}

impl<'s> Check<'_, 's> {
    /// Whether everything in the object `sent` (at `at`, printed `path`) is seen by the key
    /// (its typed `members`, less the `skipped` ones; `ignored` members are not looked at); the
    /// path of what is not.
    fn object(
        &self,
        at: &mut Vec<Step<'s>>,
        sent: &'s JsonObject,
        (members, skipped): (&BTreeMap<String, Shape>, &[&'static str]),
        (path, ignored): (&str, &[&str]),
    ) -> Result<(), String> {
        for (name, value) in sent {
            if ignored.contains(&name.as_str()) {
                continue;
            }
            let here = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            let typed = match members.get(name) {
                Some(typed) => Some(typed),
                None if value.is_null() || skipped.contains(&name.as_str()) => continue,
                None => {
                    let field = members
                        .keys()
                        .map(String::as_str)
                        .chain(skipped.iter().copied())
                        .filter(|field| !sent.contains_key(*field))
                        .find(|field| self.same_field(at, name, field))
                        .ok_or_else(|| here.clone())?;
                    // A skipped field's value is the one its `skip_serializing_if` drops.
                    members.get(field)
                }
            };
            if let Some(typed) = typed {
                at.push(Step::Member(name));
                self.value(at, value, typed, &here)?;
                at.pop();
            }
        }
        Ok(())
    }

    fn value(
        &self,
        at: &mut Vec<Step<'s>>,
        sent: &'s Value,
        typed: &Shape,
        path: &str,
    ) -> Result<(), String> {
        match (sent, typed) {
            (Value::Object(s), Shape::Object { members, skipped }) => {
                self.object(at, s, (members, skipped), (path, &[]))
            }
            (Value::Array(s), Shape::Array(t)) if s.len() == t.len() => {
                for (i, (a, b)) in s.iter().zip(t).enumerate() {
                    at.push(Step::Item(i));
                    self.value(at, a, b, &format!("{path}[{i}]"))?;
                    at.pop();
                }
                Ok(())
            }
            // A type that reads one shape and writes another (a string parsed into a struct, a
            // list into a set) is its own business: the handler reads the typed value, which is
            // what is keyed.
            _ => Ok(()),
        }
    }

    /// Whether serde reads `member` of the object at `at` as `field`: with `field` added
    /// beside it (same value) the arguments are refused for a duplicate field, and with
    /// `member` renamed to `field` they are read. The second rules out a duplicate between
    /// `field` and some other member.
    fn same_field(&self, at: &[Step<'_>], member: &str, field: &str) -> bool {
        let probe = |rename: bool| {
            let spent = self.probes.get();
            if spent >= MAX_PROBES {
                return None;
            }
            self.probes.set(spent + 1);
            let mut probe = self.sent.clone();
            let object = object_at(&mut probe, at)?;
            let value = if rename {
                object.remove(member)?
            } else {
                object.get(member)?.clone()
            };
            object.insert(field.to_owned(), value);
            Some((self.reads)(probe))
        };
        let duplicate = matches!(probe(false), Some(Err(e))
            if e.to_string().starts_with("duplicate field `"));
        duplicate && matches!(probe(true), Some(Ok(())))
    }
}

/// The object at `at` inside `root`.
fn object_at<'v>(root: &'v mut JsonObject, at: &[Step<'_>]) -> Option<&'v mut JsonObject> {
    let mut object = root;
    let mut steps = at.iter().peekable();
    while let Some(Step::Member(name)) = steps.next() {
        let mut value = object.get_mut(*name)?;
        while let Some(Step::Item(i)) = steps.peek() {
            value = value.as_array_mut()?.get_mut(*i)?;
            steps.next();
        }
        object = value.as_object_mut()?;
    }
    Some(object)
}

/// `schema` (rmcp's input schema for the arguments type) with `additionalProperties: false` on
/// every object schema that lists its properties and says nothing about others: the tool's
/// listing tells clients what [`check_arguments`] enforces.
pub fn closed_input_schema(schema: Arc<JsonObject>) -> Arc<JsonObject> {
    let mut schema = (*schema).clone();
    close(&mut schema);
    Arc::new(schema)
}

fn close(object: &mut JsonObject) {
    if object.contains_key("properties") && !object.contains_key("additionalProperties") {
        object.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (name, value) in object.iter_mut() {
        // The parts of an `allOf` each see only some of the properties: closing them would
        // refuse what the others allow.
        if name == "allOf" {
            continue;
        }
        close_value(value);
    }
}

fn close_value(value: &mut Value) {
    match value {
        Value::Object(o) => close(o),
        Value::Array(items) => items.iter_mut().for_each(close_value),
        _ => {}
    }
}

/// The outline of the typed arguments' serialised form: which members each object has, and
/// which fields a struct skipped because `skip_serializing_if` held (serde reports those through
/// `SerializeStruct::skip_field`; a `skip_serializing` field is never mentioned at all).
mod shape {
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
        Object {
            members: BTreeMap<String, Shape>,
            /// Struct fields left out because their `skip_serializing_if` held.
            skipped: Vec<&'static str>,
        },
    }

    impl Shape {
        fn object(members: BTreeMap<String, Shape>) -> Shape {
            Shape::Object {
                members,
                skipped: Vec::new(),
            }
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
        fn serialize_newtype_struct<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            value: &T,
        ) -> Res {
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
        fn field<T: Serialize + ?Sized>(
            &mut self,
            key: &'static str,
            v: &T,
        ) -> Result<(), ShapeError> {
            if !self.leaf {
                self.members.insert(key.to_owned(), v.serialize(ShapeSer)?);
            }
            Ok(())
        }
        fn finish(self) -> Res {
            if self.leaf {
                return Ok(Shape::Leaf);
            }
            let object = Shape::Object {
                members: self.members,
                skipped: self.skipped,
            };
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;
    use std::time::Duration;

    const SPEC: ToolSpec = ToolSpec::new("charge", Duration::from_secs(60));

    #[derive(Serialize, Deserialize)]
    struct Charge {
        #[serde(alias = "amt")]
        amount: u64,
        #[serde(default, skip_serializing)]
        #[allow(dead_code)]
        dry_run: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        quiet: bool,
        #[serde(default, skip_serializing_if = "String::is_empty", alias = "comment")]
        memo: String,
        lines: Vec<Line>,
        #[serde(default, skip_serializing_if = "Option::is_none", alias = "shipping")]
        ship: Option<Address>,
    }

    #[derive(Serialize, Deserialize)]
    struct Line {
        #[serde(alias = "code")]
        sku: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        gift: bool,
    }

    #[derive(Serialize, Deserialize)]
    struct Address {
        city: String,
    }

    /// The arguments read from `sent` (as `Parameters<T>` reads them), then checked against it.
    fn check<A: Serialize + DeserializeOwned>(sent: Value, spec: &ToolSpec) -> Result<(), Error> {
        let Value::Object(sent) = sent else {
            unreachable!("arguments are an object")
        };
        let args: A = serde_json::from_value(Value::Object(sent.clone())).unwrap();
        check_arguments(&RawArguments(Some(sent)), &args, spec)
    }

    /// The member a refusal names.
    fn refused<A: Serialize + DeserializeOwned>(sent: Value) -> String {
        match check::<A>(sent, &SPEC) {
            Err(Error::Arguments {
                source: KeyError::NotKeyed { field },
                ..
            }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_field_the_key_cannot_see_is_refused_by_name() {
        let line = json!([{"sku": "a"}]);
        // Never serialised, whatever its value: `false` is refused as well as `true`.
        for dry_run in [true, false] {
            let sent = json!({"amount": 5, "dry_run": dry_run, "lines": line});
            assert_eq!(refused::<Charge>(sent), "dry_run");
        }
        let sent = json!({"amount": 5, "lines": [{"sku": "a", "qty": 2}]});
        assert_eq!(refused::<Charge>(sent), "lines[0].qty");
        let sent = json!({"amount": 5, "lines": line, "coupon": "FREE"});
        assert_eq!(refused::<Charge>(sent), "coupon");
        // Inside a member sent under an alias, too.
        let sent = json!({"amount": 5, "lines": line, "shipping": {"city": "X", "zip": 1}});
        assert_eq!(refused::<Charge>(sent), "shipping.zip");
    }

    #[test]
    fn defaults_nulls_and_ignored_fields_pass() {
        // Omitted fields (defaults), an explicit null for a skipped None, a volatile field.
        let sent = json!({"amount": 5, "note": null, "lines": [{"sku": "a"}], "sent_at": 1});
        assert!(check::<Charge>(sent.clone(), &SPEC.ignoring(&["sent_at"])).is_ok());
        assert!(check::<Charge>(sent, &SPEC).is_err());
    }

    #[test]
    fn an_explicit_value_that_skip_serializing_if_drops_passes() {
        let sent = json!({
            "amount": 5, "quiet": false, "memo": "",
            "lines": [{"sku": "a", "gift": false}, {"sku": "b", "gift": true}],
        });
        assert!(check::<Charge>(sent, &SPEC).is_ok());
    }

    #[test]
    fn an_alias_passes_as_the_field_it_names() {
        let sent = json!({
            "amt": 5, "comment": "", "shipping": {"city": "X"},
            "lines": [{"code": "a"}, {"sku": "b"}],
        });
        assert!(check::<Charge>(sent, &SPEC).is_ok());
    }

    /// `secret` is read but never serialised; `amount` is sent under its alias. Adding
    /// `amount` beside `secret` is refused as a duplicate field — of `amt`, not of `secret`.
    #[test]
    fn a_duplicate_caused_by_another_alias_proves_nothing() {
        #[derive(Serialize, Deserialize)]
        struct Sealed {
            #[serde(alias = "amt")]
            amount: u64,
            #[serde(default, skip_serializing)]
            #[allow(dead_code)]
            secret: u64,
        }
        assert_eq!(refused::<Sealed>(json!({"amt": 5, "secret": 9})), "secret");
        assert_eq!(refused::<Sealed>(json!({"amt": 5, "other": 9})), "other");
    }

    #[test]
    fn alias_checks_are_bounded() {
        let lines: Vec<Value> = (0..200).map(|i| json!({"code": i.to_string()})).collect();
        let field = refused::<Charge>(json!({"amount": 5, "lines": lines}));
        assert_eq!(field, format!("lines[{}].code", MAX_PROBES / 2));
    }

    #[test]
    fn the_listed_schema_is_closed() {
        let schema = json!({
            "type": "object",
            "properties": {"line": {"$ref": "#/$defs/Line"}},
            "$defs": {"Line": {"type": "object", "properties": {"sku": {"type": "string"}}},
                      "Map": {"type": "object", "additionalProperties": {"type": "string"}}},
        });
        let Value::Object(o) = schema else {
            unreachable!()
        };
        let closed = Value::Object((*closed_input_schema(Arc::new(o))).clone());
        assert_eq!(closed["additionalProperties"], json!(false));
        assert_eq!(
            closed["$defs"]["Line"]["additionalProperties"],
            json!(false)
        );
        assert_eq!(
            closed["$defs"]["Map"]["additionalProperties"],
            json!({"type": "string"})
        );
    }
}
