//! A JSON Schema validator for exactly the keywords ACP's checkout request schemas use (see
//! `examples/acp/SOURCE.md`): a schema with any other keyword is refused when it is loaded, so no
//! part of a schema is silently skipped.

use std::collections::HashSet;

use serde_json::{Map, Value};

/// The request schemas this example keeps (`examples/acp/schema.checkout_requests.json`).
pub const CHECKOUT_REQUESTS: &str = include_str!("../../acp/schema.checkout_requests.json");

/// The keywords a schema may use. The last four are annotations: read, never asserted (JSON
/// Schema 2020-12 makes `format` an annotation unless a validator opts in).
const KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "uniqueItems",
    "enum",
    "minimum",
    "maxLength",
    "anyOf",
    "$ref",
    "title",
    "description",
    "$comment",
    "format",
];

/// The members of the bundle itself.
const BUNDLE: &[&str] = &["$schema", "$comment", "title", "$defs"];

const TYPES: &[&str] = &[
    "object", "array", "string", "integer", "number", "boolean", "null",
];

/// Why a schema bundle cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the schema at {at} cannot be used: {why}")]
pub struct SchemaError {
    /// Where in the bundle (`$defs.Item.properties.id`).
    pub at: String,
    /// What is wrong with it.
    pub why: String,
}

/// Why a value does not match its schema.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
#[error("{path}: {message}")]
pub struct Invalid {
    /// The JSONPath of the offending value (`$.line_items[0].id`), as ACP's `param`.
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

/// A bundle of schemas under `$defs`, every keyword checked.
#[derive(Debug, Clone)]
pub struct Schemas {
    defs: Map<String, Value>,
}

impl Schemas {
    /// Loads a bundle, refusing any keyword the validator does not know and any `$ref` that
    /// points nowhere.
    pub fn load(text: &str) -> Result<Schemas, SchemaError> {
        let bundle: Value = serde_json::from_str(text).map_err(|e| SchemaError {
            at: "the bundle".into(),
            why: format!("not JSON ({e})"),
        })?;
        let Value::Object(bundle) = bundle else {
            return Err(error("the bundle", "not an object"));
        };
        if let Some(k) = bundle.keys().find(|k| !BUNDLE.contains(&k.as_str())) {
            return Err(error("the bundle", &format!("unknown member `{k}`")));
        }
        let Some(Value::Object(defs)) = bundle.get("$defs") else {
            return Err(error("the bundle", "no `$defs` object"));
        };
        let schemas = Schemas { defs: defs.clone() };
        for (name, schema) in defs {
            schemas.check(schema, &format!("$defs.{name}"))?;
        }
        Ok(schemas)
    }

    /// The definitions, by name.
    pub fn defs(&self) -> &Map<String, Value> {
        &self.defs
    }

    /// Checks `value` against the definition `def`; `root` is the path the value is at
    /// (`$` for a REST body, `$.payload` for an MCP tool's payload).
    pub fn validate(&self, def: &str, value: &Value, root: &str) -> Result<(), Invalid> {
        let schema = self.defs.get(def).ok_or_else(|| Invalid {
            path: root.to_owned(),
            message: format!("no schema named {def}"),
        })?;
        self.matches(schema, value, root)
    }

    /// Checks one schema position of the bundle.
    fn check(&self, schema: &Value, at: &str) -> Result<(), SchemaError> {
        let map = match schema {
            Value::Bool(_) => return Ok(()),
            Value::Object(map) => map,
            _ => return Err(error(at, "a schema is an object or a boolean")),
        };
        for (k, v) in map {
            let here = format!("{at}.{k}");
            match k.as_str() {
                "type" => check_type(v, &here)?,
                "properties" => {
                    let Value::Object(props) = v else {
                        return Err(error(&here, "not an object"));
                    };
                    for (name, s) in props {
                        self.check(s, &format!("{here}.{name}"))?;
                    }
                }
                "additionalProperties" | "items" => self.check(v, &here)?,
                "anyOf" => {
                    let Some(list) = v.as_array().filter(|l| !l.is_empty()) else {
                        return Err(error(&here, "not a non-empty array"));
                    };
                    for (i, s) in list.iter().enumerate() {
                        self.check(s, &format!("{here}[{i}]"))?;
                    }
                }
                "required" => {
                    if !v.as_array().is_some_and(|l| l.iter().all(Value::is_string)) {
                        return Err(error(&here, "not an array of names"));
                    }
                }
                "enum" => {
                    if !v.is_array() {
                        return Err(error(&here, "not an array"));
                    }
                }
                "minItems" | "maxLength" => {
                    if v.as_u64().is_none() {
                        return Err(error(&here, "not a non-negative integer"));
                    }
                }
                "uniqueItems" => {
                    if !v.is_boolean() {
                        return Err(error(&here, "not a boolean"));
                    }
                }
                "minimum" => {
                    if !v.is_number() {
                        return Err(error(&here, "not a number"));
                    }
                }
                "$ref" => {
                    self.target(v).map_err(|why| error(&here, &why))?;
                }
                "title" | "description" | "$comment" | "format" => {
                    if !v.is_string() {
                        return Err(error(&here, "not a string"));
                    }
                }
                _ => {
                    return Err(error(
                        at,
                        &format!(
                            "the keyword `{k}` is not one this validator knows ({}); teach it the keyword rather than dropping it",
                            KEYWORDS.join(", ")
                        ),
                    ))
                }
            }
        }
        Ok(())
    }

    /// The definition a `$ref` names (`#/$defs/Name`).
    fn target(&self, reference: &Value) -> Result<&Value, String> {
        let text = reference.as_str().ok_or("`$ref` is not a string")?;
        let name = text
            .strip_prefix("#/$defs/")
            .ok_or_else(|| format!("`{text}` is not a reference to `#/$defs/…`"))?;
        self.defs
            .get(name)
            .ok_or_else(|| format!("`{text}` names no definition"))
    }

    fn matches(&self, schema: &Value, value: &Value, path: &str) -> Result<(), Invalid> {
        let map = match schema {
            Value::Bool(true) => return Ok(()),
            Value::Bool(false) => return Err(invalid(path, "no value is allowed here")),
            Value::Object(map) => map,
            // `load` checked every schema position.
            _ => return Ok(()),
        };
        if let Some(r) = map.get("$ref") {
            let target = self.target(r).map_err(|why| invalid(path, &why))?;
            self.matches(target, value, path)?;
        }
        if let Some(t) = map.get("type") {
            match_type(t, value, path)?;
        }
        if let Some(Value::Array(options)) = map.get("enum")
            && !options.contains(value)
        {
            let list: Vec<String> = options.iter().map(Value::to_string).collect();
            return Err(invalid(
                path,
                &format!("must be one of {}", list.join(", ")),
            ));
        }
        if let (Some(min), Some(n)) = (map.get("minimum").and_then(Value::as_f64), value.as_f64())
            && n < min
        {
            return Err(invalid(path, &format!("must be at least {min}")));
        }
        if let (Some(max), Some(s)) = (map.get("maxLength").and_then(Value::as_u64), value.as_str())
            && s.chars().count() as u64 > max
        {
            return Err(invalid(
                path,
                &format!("must be at most {max} characters long"),
            ));
        }
        if let Value::Object(members) = value {
            self.object(map, members, path)?;
        }
        if let Value::Array(items) = value {
            self.array(map, items, path)?;
        }
        if let Some(Value::Array(options)) = map.get("anyOf") {
            let mut why = Vec::new();
            for option in options {
                match self.matches(option, value, path) {
                    Ok(()) => return Ok(()),
                    Err(e) => why.push(e.message),
                }
            }
            return Err(invalid(
                path,
                &format!("matches none of its allowed shapes ({})", why.join("; or ")),
            ));
        }
        Ok(())
    }

    fn object(
        &self,
        map: &Map<String, Value>,
        members: &Map<String, Value>,
        path: &str,
    ) -> Result<(), Invalid> {
        if let Some(Value::Array(required)) = map.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !members.contains_key(name) {
                    return Err(invalid(path, &format!("`{name}` is required")));
                }
            }
        }
        let props = map.get("properties").and_then(Value::as_object);
        for (name, v) in members {
            let here = format!("{path}.{name}");
            match props.and_then(|p| p.get(name)) {
                Some(s) => self.matches(s, v, &here)?,
                None => match map.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        let known: Vec<&str> = props
                            .map(|p| p.keys().map(String::as_str).collect())
                            .unwrap_or_default();
                        return Err(invalid(
                            &here,
                            &format!(
                                "is not a member this merchant takes here (it takes: {})",
                                known.join(", ")
                            ),
                        ));
                    }
                    Some(s) => self.matches(s, v, &here)?,
                    None => {}
                },
            }
        }
        Ok(())
    }

    fn array(&self, map: &Map<String, Value>, items: &[Value], path: &str) -> Result<(), Invalid> {
        if let Some(min) = map.get("minItems").and_then(Value::as_u64)
            && (items.len() as u64) < min
        {
            return Err(invalid(path, &format!("must have at least {min} item(s)")));
        }
        if map.get("uniqueItems") == Some(&Value::Bool(true)) {
            let mut seen = HashSet::new();
            for item in items {
                if !seen.insert(item.to_string()) {
                    return Err(invalid(path, &format!("has {item} twice")));
                }
            }
        }
        if let Some(schema) = map.get("items") {
            for (i, item) in items.iter().enumerate() {
                self.matches(schema, item, &format!("{path}[{i}]"))?;
            }
        }
        Ok(())
    }
}

fn check_type(v: &Value, at: &str) -> Result<(), SchemaError> {
    let known = |t: &Value| t.as_str().is_some_and(|t| TYPES.contains(&t));
    let ok = match v {
        Value::Array(list) => !list.is_empty() && list.iter().all(known),
        other => known(other),
    };
    if ok {
        Ok(())
    } else {
        Err(error(
            at,
            &format!("not a type name or a list of them ({})", TYPES.join(", ")),
        ))
    }
}

fn match_type(t: &Value, value: &Value, path: &str) -> Result<(), Invalid> {
    let names: Vec<&str> = match t {
        Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
        other => other.as_str().into_iter().collect(),
    };
    if names.iter().any(|n| is(n, value)) {
        return Ok(());
    }
    Err(invalid(
        path,
        &format!("must be {} (not {})", names.join(" or "), kind(value)),
    ))
}

fn is(name: &str, value: &Value) -> bool {
    match name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        // JSON Schema: a number whose fraction is zero is an integer (`1.0` is).
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn error(at: &str, why: &str) -> SchemaError {
    SchemaError {
        at: at.to_owned(),
        why: why.to_owned(),
    }
}

fn invalid(path: &str, message: &str) -> Invalid {
    Invalid {
        path: path.to_owned(),
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schemas(defs: Value) -> Result<Schemas, SchemaError> {
        Schemas::load(&json!({"$defs": defs}).to_string())
    }

    fn check(defs: Value, value: Value) -> Result<(), Invalid> {
        schemas(defs)
            .expect("a usable bundle")
            .validate("T", &value, "$")
    }

    #[test]
    fn the_kept_acp_schemas_load() {
        let s = Schemas::load(CHECKOUT_REQUESTS).expect("the kept ACP schemas load");
        for def in [
            "CheckoutSessionCreateRequest",
            "CheckoutSessionUpdateRequest",
            "CheckoutSessionCompleteRequest",
            "CancelSessionRequest",
        ] {
            assert!(s.defs.contains_key(def), "{def}");
        }
    }

    #[test]
    fn an_unknown_keyword_is_refused_at_load_wherever_it_is() {
        for (defs, at) in [
            (json!({"T": {"type": "string", "pattern": "^a"}}), "$defs.T"),
            (
                json!({"T": {"properties": {"a": {"if": {}, "then": {}}}}}),
                "$defs.T.properties.a",
            ),
            (
                json!({"T": {"anyOf": [{"required": ["a"]}, {"oneOf": []}]}}),
                "$defs.T.anyOf[1]",
            ),
        ] {
            let e = schemas(defs).unwrap_err();
            assert_eq!(e.at, at);
            assert!(e.why.contains("is not one this validator knows"), "{e}");
        }
        let e = Schemas::load(r#"{"$defs": {}, "$id": "x"}"#).unwrap_err();
        assert!(e.why.contains("`$id`"), "{e}");
    }

    #[test]
    fn a_malformed_keyword_or_a_dangling_ref_is_refused_at_load() {
        for defs in [
            json!({"T": {"type": "text"}}),
            json!({"T": {"required": "a"}}),
            json!({"T": {"minItems": -1}}),
            json!({"T": {"anyOf": []}}),
            json!({"T": {"$ref": "#/$defs/Nowhere"}}),
            json!({"T": {"$ref": "https://example.com/x.json"}}),
            json!({"T": 3}),
        ] {
            assert!(schemas(defs.clone()).is_err(), "{defs}");
        }
    }

    #[test]
    fn types_including_lists_and_whole_floats_as_integers() {
        let defs = json!({"T": {"type": ["string", "integer"]}});
        assert_eq!(check(defs.clone(), json!("a")), Ok(()));
        assert_eq!(check(defs.clone(), json!(3)), Ok(()));
        assert_eq!(check(defs.clone(), json!(3.0)), Ok(()));
        let e = check(defs, json!(3.5)).unwrap_err();
        assert_eq!(e.message, "must be string or integer (not a number)");
        assert!(check(json!({"T": {"type": "null"}}), json!(null)).is_ok());
        assert!(check(json!({"T": {"type": "boolean"}}), json!(0)).is_err());
    }

    #[test]
    fn objects_required_and_additional_members() {
        let defs = json!({"T": {
            "type": "object",
            "additionalProperties": false,
            "properties": {"a": {"type": "string"}, "m": {"type": "object", "additionalProperties": {"type": "number"}}},
            "required": ["a"]
        }});
        assert_eq!(
            check(defs.clone(), json!({"a": "x", "m": {"k": 1}})),
            Ok(())
        );
        let e = check(defs.clone(), json!({})).unwrap_err();
        assert_eq!(
            (e.path.as_str(), e.message.as_str()),
            ("$", "`a` is required")
        );
        let e = check(defs.clone(), json!({"a": "x", "b": 1})).unwrap_err();
        assert_eq!(e.path, "$.b");
        assert!(e.message.contains("it takes: a, m"), "{e}");
        let e = check(defs.clone(), json!({"a": "x", "m": {"k": "one"}})).unwrap_err();
        assert_eq!(e.path, "$.m.k");
        // Without `additionalProperties`, other members are allowed.
        let open = json!({"T": {"type": "object", "properties": {"a": {"type": "string"}}}});
        assert_eq!(check(open, json!({"b": [1]})), Ok(()));
    }

    #[test]
    fn arrays_items_min_items_and_unique_items() {
        let defs = json!({"T": {"type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": true}});
        assert_eq!(check(defs.clone(), json!(["a", "b"])), Ok(()));
        assert_eq!(
            check(defs.clone(), json!([])).unwrap_err().message,
            "must have at least 1 item(s)"
        );
        assert_eq!(
            check(defs.clone(), json!(["a", "a"])).unwrap_err().message,
            "has \"a\" twice"
        );
        assert_eq!(check(defs, json!(["a", 2])).unwrap_err().path, "$[1]");
    }

    #[test]
    fn enums_minimums_and_max_lengths() {
        let e = check(json!({"T": {"enum": ["x", "y"]}}), json!("z")).unwrap_err();
        assert_eq!(e.message, "must be one of \"x\", \"y\"");
        assert!(check(json!({"T": {"minimum": 1}}), json!(0)).is_err());
        assert!(check(json!({"T": {"minimum": 1}}), json!(1)).is_ok());
        // Counted in characters, not bytes.
        assert!(check(json!({"T": {"maxLength": 2}}), json!("éé")).is_ok());
        assert!(check(json!({"T": {"maxLength": 2}}), json!("abc")).is_err());
    }

    #[test]
    fn any_of_refs_and_annotations() {
        let defs = json!({
            "A": {"type": "object", "properties": {"n": {"type": "integer", "description": "d", "format": "int"}}},
            "T": {"$ref": "#/$defs/A", "anyOf": [{"required": ["n"]}, {"required": ["po"]}]}
        });
        assert_eq!(check(defs.clone(), json!({"n": 1})), Ok(()));
        assert_eq!(check(defs.clone(), json!({"po": "x"})), Ok(()));
        let e = check(defs.clone(), json!({})).unwrap_err();
        assert!(
            e.message.contains("`n` is required; or `po` is required"),
            "{e}"
        );
        assert_eq!(check(defs, json!({"n": "1"})).unwrap_err().path, "$.n");
    }

    #[test]
    fn acp_requests_valid_and_not() {
        let s = Schemas::load(CHECKOUT_REQUESTS).expect("loads");
        let create = json!({"line_items": [{"id": "sku_1", "unit_amount": 1500}], "currency": "usd", "capabilities": {}});
        assert_eq!(
            s.validate("CheckoutSessionCreateRequest", &create, "$"),
            Ok(())
        );
        let e = s
            .validate(
                "CheckoutSessionCreateRequest",
                &json!({"line_items": [], "currency": "usd", "capabilities": {}}),
                "$.payload",
            )
            .unwrap_err();
        assert_eq!(e.path, "$.payload.line_items");
        let by_card = json!({"payment_data": {"handler_id": "h", "instrument": {"type": "card", "credential": {"type": "spt", "token": "spt_1"}}}});
        assert_eq!(
            s.validate("CheckoutSessionCompleteRequest", &by_card, "$"),
            Ok(())
        );
        let by_po = json!({"payment_data": {"purchase_order_number": "PO-1"}});
        assert_eq!(
            s.validate("CheckoutSessionCompleteRequest", &by_po, "$"),
            Ok(())
        );
        let neither = json!({"payment_data": {"handler_id": "h"}});
        let e = s
            .validate("CheckoutSessionCompleteRequest", &neither, "$")
            .unwrap_err();
        assert_eq!(e.path, "$.payment_data");
        let trace =
            json!({"intent_trace": {"reason_code": "something_new", "metadata": {"k": [1]}}});
        let e = s.validate("CancelSessionRequest", &trace, "$").unwrap_err();
        assert_eq!(e.path, "$.intent_trace.metadata.k");
    }
}
