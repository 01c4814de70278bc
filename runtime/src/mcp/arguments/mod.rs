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
//!
//! An `ignore` entry ending in `.*` (`meta.*`) accepts the members of the object at that path
//! that the arguments' type does not read, and leaves that object open in the listed schema
//! (ACP asks servers to ignore `meta` members a later version may add). That is safe because
//! what the type does not read the handler cannot see in its typed arguments: the call it runs
//! is the same with or without the member, so the key need not tell them apart. A member the
//! type does read is keyed as any other: a declared field or a `#[serde(flatten)]` catch-all
//! holds it in the serialised form, so the check never reaches it. A member the type reads but
//! never serialises (`skip_serializing`) would escape the key, so before accepting a member the
//! check asks serde: with the member sent twice, a struct that reads it refuses a duplicate
//! field, one that does not read it accepts the call; anything but acceptance (or no probe left)
//! refuses it as before.

use std::cell::Cell;

use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::JsonObject;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::error::Error;
use crate::key::KeyError;
use crate::tool::ToolSpec;

use shape::{Object, Shape};

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
/// not a member the tool ignores (by path: `sent_at`, `meta.request_id`), not one the type does
/// not read inside an object the tool opens (`meta.*`), not left out by `skip_serializing_if`,
/// and not an alias of a field it holds (see the module documentation).
pub(crate) fn check_arguments<A: Serialize + DeserializeOwned>(
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
    let Shape::Object(typed) = &typed else {
        return Ok(());
    };
    let check = Check {
        sent,
        ignored: spec.ignored(),
        probes: Cell::new(0),
        reads: &|probe| serde_json::from_value::<A>(Value::Object(probe)).map(drop),
        reads_text: &|text| serde_json::from_str::<A>(text).map(drop),
    };
    check
        .object(&mut Vec::new(), sent, typed, "")
        .map_err(|field| refused(KeyError::NotKeyed { field }))
}

/// One step from an object or array to a value inside it.
enum Step<'s> {
    Member(&'s str),
    Item(usize),
}

/// Deserialises the arguments type from a probe, as the handler's `Parameters<T>` would.
type Reads<'r> = &'r dyn Fn(JsonObject) -> Result<(), serde_json::Error>;

/// Deserialises the arguments type from JSON text (which, unlike a [`JsonObject`], can hold a
/// member twice).
type ReadsText<'r> = &'r dyn Fn(&str) -> Result<(), serde_json::Error>;

/// The name a probe's duplicate member is written under before it is renamed in the text; a
/// control character no client sends in a name by accident (if one does, the probe refuses).
const DUPLICATE: &str = "\u{1}idempotency-duplicate\u{1}";

/// The objects, by path, whose undeclared members `ignored` accepts (`meta` for `meta.*`).
pub(crate) fn open_objects<'i>(ignored: &'i [&'i str]) -> impl Iterator<Item = &'i str> {
    ignored
        .iter()
        .filter_map(|path| path.strip_suffix(".*"))
        .filter(|object| !object.is_empty())
}

struct Check<'r, 's> {
    sent: &'s JsonObject,
    /// The paths of the members the tool ignores (not looked at): `sent_at`, `meta.request_id`;
    /// and the objects whose unread members it accepts: `meta.*`.
    ignored: &'r [&'r str],
    /// Deserialisations spent so far (at most [`MAX_PROBES`]).
    probes: Cell<usize>,
    reads: Reads<'r>,
    reads_text: ReadsText<'r>,
}

impl<'s> Check<'_, 's> {
    /// Whether everything in the object `sent` (at `at`, printed `path`) is seen by the key
    /// (its `typed` members, less the skipped ones; the `ignored` members are not looked at);
    /// the path of what is not.
    fn object(
        &self,
        at: &mut Vec<Step<'s>>,
        sent: &'s JsonObject,
        typed: &Object,
        path: &str,
    ) -> Result<(), String> {
        let Object { members, skipped } = typed;
        let open = open_objects(self.ignored).any(|object| object == path);
        for (name, value) in sent {
            let here = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            // An array item's path has a `[i]` step, never in an ignored path; `meta.*` names
            // no member (one called `*` is checked as any other).
            if self.ignored.contains(&here.as_str()) && !here.ends_with(".*") {
                continue;
            }
            let typed = match members.get(name) {
                Some(typed) => Some(typed),
                None if value.is_null() || skipped.contains(&name.as_str()) => continue,
                None if open && self.unread(at, name) => continue,
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
            (Value::Object(s), Shape::Object(typed)) => self.object(at, s, typed, path),
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

impl Check<'_, '_> {
    /// Whether the arguments' type does not read `member` of the object at `at`: sent twice, it
    /// is still accepted (a struct that reads it refuses a duplicate field).
    fn unread(&self, at: &[Step<'_>], member: &str) -> bool {
        let spent = self.probes.get();
        if spent >= MAX_PROBES {
            return false;
        }
        self.probes.set(spent + 1);
        let mut probe = self.sent.clone();
        let Some(object) = object_at(&mut probe, at) else {
            return false;
        };
        let Some(value) = object.get(member).cloned() else {
            return false;
        };
        object.insert(DUPLICATE.to_owned(), value);
        let (Ok(text), Ok(placeholder), Ok(name)) = (
            serde_json::to_string(&probe),
            serde_json::to_string(DUPLICATE),
            serde_json::to_string(member),
        ) else {
            return false;
        };
        if text.matches(&placeholder).count() != 1 {
            return false;
        }
        (self.reads_text)(&text.replacen(&placeholder, &name, 1)).is_ok()
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

mod schema;
mod shape;

pub(crate) use schema::closed_input_schema;

#[cfg(test)]
mod tests;
