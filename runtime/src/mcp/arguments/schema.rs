//! The input schema a wrapped tool lists: closed where the check refuses what it cannot key,
//! open where `ignore` accepts undeclared members (`meta.*`).

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde_json::Value;

use super::open_objects;

/// `schema` (rmcp's input schema for the arguments type) with `additionalProperties: false` on
/// every object schema that lists its properties and says nothing about others: the tool's
/// listing tells clients what `check_arguments` enforces. The objects `ignored` opens
/// (`meta.*`) stay open: their schema, found through `properties`, local `$ref`s and the parts
/// of an `anyOf`, `oneOf` or `allOf`, is left as rmcp wrote it (a definition shared with another
/// place is then open there too; the check still refuses what it cannot key there).
pub(crate) fn closed_input_schema(schema: Arc<JsonObject>, ignored: &[&str]) -> Arc<JsonObject> {
    let mut schema = (*schema).clone();
    let open: Vec<Pointer> = open_objects(ignored)
        .flat_map(|object| schema_at(&schema, object))
        .collect();
    close(&mut schema, &mut Vec::new(), &open);
    Arc::new(schema)
}

/// A place in a schema: the member names and array indexes (as text) from its root.
type Pointer = Vec<String>;

/// The object schemas at the dotted `path` (through `properties`) inside `root`.
fn schema_at(root: &JsonObject, path: &str) -> Vec<Pointer> {
    let mut here = Vec::new();
    objects(root, Vec::new(), &mut here);
    for name in path.split('.') {
        let mut next = Vec::new();
        for mut at in here {
            let has = node(root, &at)
                .and_then(|node| node.get("properties")?.as_object()?.get(name))
                .is_some();
            if has {
                at.extend(["properties".to_owned(), name.to_owned()]);
                objects(root, at, &mut next);
            }
        }
        here = next;
    }
    here
}

/// Adds to `found` the schemas that `at` stands for: itself, what its local `$ref` names, and
/// the parts of its `anyOf`, `oneOf` and `allOf` (an `Option<T>`'s schema is `T`'s or `null`);
/// each once, so a recursive type's schema is walked once.
fn objects(root: &JsonObject, at: Pointer, found: &mut Vec<Pointer>) {
    if found.contains(&at) {
        return;
    }
    let Some(node) = node(root, &at) else {
        return;
    };
    let mut inner = Vec::new();
    let local = node.get("$ref").and_then(Value::as_str);
    if let Some(target) = local.and_then(|r| r.strip_prefix("#/")) {
        let pointer = target
            .split('/')
            .map(|s| s.replace("~1", "/").replace("~0", "~"));
        inner.push(pointer.collect());
    }
    for part in ["anyOf", "oneOf", "allOf"] {
        let n = node.get(part).and_then(Value::as_array).map_or(0, Vec::len);
        for i in 0..n {
            let mut part_at = at.clone();
            part_at.extend([part.to_owned(), i.to_string()]);
            inner.push(part_at);
        }
    }
    found.push(at);
    for at in inner {
        objects(root, at, found);
    }
}

/// The object schema at `at` inside `root`.
fn node<'v>(root: &'v JsonObject, at: &[String]) -> Option<&'v JsonObject> {
    let mut object = root;
    let mut array: Option<&Vec<Value>> = None;
    for step in at {
        let value = match array.take() {
            Some(items) => items.get(step.parse::<usize>().ok()?)?,
            None => object.get(step)?,
        };
        match value {
            Value::Object(o) => object = o,
            Value::Array(items) => array = Some(items),
            _ => return None,
        }
    }
    array.is_none().then_some(object)
}

fn close(object: &mut JsonObject, at: &mut Pointer, open: &[Pointer]) {
    if object.contains_key("properties")
        && !object.contains_key("additionalProperties")
        && !open.contains(at)
    {
        object.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (name, value) in object.iter_mut() {
        // The parts of an `allOf` each see only some of the properties: closing them would
        // refuse what the others allow.
        if name == "allOf" {
            continue;
        }
        at.push(name.clone());
        close_value(value, at, open);
        at.pop();
    }
}

fn close_value(value: &mut Value, at: &mut Pointer, open: &[Pointer]) {
    match value {
        Value::Object(o) => close(o, at, open),
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                at.push(i.to_string());
                close_value(item, at, open);
                at.pop();
            }
        }
        _ => {}
    }
}
