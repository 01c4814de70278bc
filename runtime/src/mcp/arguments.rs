//! What the client sent, against what the key is made of.
//!
//! The key hashes the typed arguments' serialised form: what the handler reads, after defaults,
//! whatever the member order, whitespace or escapes. A field the client sent that this form does
//! not carry — an unknown field, or one the type reads but never serialises
//! (`#[serde(skip_serializing)]`, `skip_serializing_if` on a value the client set) — would let
//! two calls that differ in it share a key, so the second silently replays the first. Wrapped
//! tools therefore refuse such a call before anything is claimed, naming the field, and list an
//! input schema that says so (`additionalProperties: false`).

use std::sync::Arc;

use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::JsonObject;
use serde::Serialize;
use serde_json::Value;

use crate::error::Error;
use crate::key::KeyError;
use crate::tool::ToolSpec;

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
/// the typed arguments' serialised form lacks, unless it is `null` (an absent optional) or a
/// top-level field the tool ignores.
pub fn check_arguments<A: Serialize + ?Sized>(
    raw: &RawArguments,
    args: &A,
    spec: &ToolSpec,
) -> Result<(), Error> {
    let Some(sent) = &raw.0 else { return Ok(()) };
    let refused = |source| Error::Arguments {
        tool: spec.name().to_owned(),
        source,
    };
    let typed = serde_json::to_value(args).map_err(|e| {
        refused(KeyError::Unchecked {
            reason: e.to_string(),
        })
    })?;
    let Value::Object(typed) = &typed else {
        return Ok(());
    };
    for (name, value) in sent {
        if spec.ignored().contains(&name.as_str()) {
            continue;
        }
        covered(value, typed.get(name), name)
            .map_err(|field| refused(KeyError::NotKeyed { field }))?;
    }
    Ok(())
}

/// Whether everything in `sent` (at `path`) survives in `typed`; the path of what does not.
fn covered(sent: &Value, typed: Option<&Value>, path: &str) -> Result<(), String> {
    let Some(typed) = typed else {
        return if sent.is_null() {
            Ok(())
        } else {
            Err(path.to_owned())
        };
    };
    match (sent, typed) {
        (Value::Object(s), Value::Object(t)) => {
            for (name, value) in s {
                covered(value, t.get(name), &format!("{path}.{name}"))?;
            }
            Ok(())
        }
        (Value::Array(s), Value::Array(t)) if s.len() == t.len() => {
            for (i, (a, b)) in s.iter().zip(t).enumerate() {
                covered(a, Some(b), &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        // A type that reads one shape and writes another (a string parsed into a struct, a
        // list into a set) is its own business: the handler reads the typed value, which is
        // what is keyed.
        _ => Ok(()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    const SPEC: ToolSpec = ToolSpec::new("charge", Duration::from_secs(60));

    fn raw(v: Value) -> RawArguments {
        match v {
            Value::Object(o) => RawArguments(Some(o)),
            _ => RawArguments(None),
        }
    }

    #[derive(Serialize)]
    struct Charge {
        amount: u64,
        #[serde(skip_serializing)]
        #[allow(dead_code)]
        dry_run: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<String>,
        lines: Vec<Line>,
    }

    #[derive(Serialize)]
    struct Line {
        sku: String,
    }

    fn charge(dry_run: bool) -> Charge {
        Charge {
            amount: 5,
            dry_run,
            note: None,
            lines: vec![Line { sku: "a".into() }],
        }
    }

    fn field(e: Error) -> String {
        match e {
            Error::Arguments {
                source: KeyError::NotKeyed { field },
                ..
            } => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_field_the_key_cannot_see_is_refused_by_name() {
        let sent = raw(json!({"amount": 5, "dry_run": true, "lines": [{"sku": "a"}]}));
        let e = check_arguments(&sent, &charge(true), &SPEC).unwrap_err();
        assert_eq!(field(e), "dry_run");
        let sent = raw(json!({"amount": 5, "lines": [{"sku": "a", "qty": 2}]}));
        assert_eq!(
            field(check_arguments(&sent, &charge(false), &SPEC).unwrap_err()),
            "lines[0].qty"
        );
        let sent = raw(json!({"amount": 5, "lines": [{"sku": "a"}], "coupon": "FREE"}));
        assert_eq!(
            field(check_arguments(&sent, &charge(false), &SPEC).unwrap_err()),
            "coupon"
        );
    }

    #[test]
    fn defaults_nulls_and_ignored_fields_pass() {
        // Omitted fields (defaults), an explicit null for a skipped None, a volatile field.
        let sent = raw(json!({"amount": 5, "note": null, "lines": [{"sku": "a"}], "sent_at": 1}));
        assert!(check_arguments(&sent, &charge(false), &SPEC.ignoring(&["sent_at"])).is_ok());
        assert!(check_arguments(&sent, &charge(false), &SPEC).is_err());
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
