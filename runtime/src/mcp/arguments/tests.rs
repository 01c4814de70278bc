//! The argument checks against the key, and the closed input schema.

use super::*;
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::key::Caller;
use crate::tool::Prepared;

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
fn an_ignored_nested_member_passes_by_its_path_only() {
    // `ship` is typed with `city` only: a fresh `ship.stamp` passes when its path is ignored,
    // and `stamp` elsewhere (or at the top) is still refused.
    let spec = SPEC.ignoring(&["ship.stamp"]);
    let sent = json!({"amount": 5, "lines": [], "ship": {"city": "X", "stamp": 1}});
    assert!(check::<Charge>(sent, &spec).is_ok());
    let sent = json!({"amount": 5, "lines": [{"sku": "a", "stamp": 1}]});
    assert!(check::<Charge>(sent, &spec).is_err());
    let sent = json!({"amount": 5, "lines": [], "stamp": 1});
    assert!(check::<Charge>(sent, &spec).is_err());
    // Under its alias the member's path is the sent one, which is not ignored.
    let sent = json!({"amount": 5, "lines": [], "shipping": {"city": "X", "stamp": 1}});
    assert!(check::<Charge>(sent, &spec).is_err());
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
    let closed = Value::Object((*closed_input_schema(Arc::new(o), &[])).clone());
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

/// ACP's `meta`, as a tool types it: `api_version` read, other members not.
#[derive(Serialize, Deserialize)]
struct Meta {
    api_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "lang")]
    accept_language: Option<String>,
    #[serde(default, skip_serializing)]
    #[allow(dead_code)]
    secret: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Acp {
    meta: Meta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ship: Option<Address>,
}

const OPEN: ToolSpec = SPEC.ignoring(&["meta.request_id", "meta.*"]);

#[test]
fn an_open_object_accepts_the_members_its_type_does_not_read() {
    let sent = json!({"meta": {"api_version": "1", "risk_signals": {"score": 3}}});
    assert!(check::<Acp>(sent.clone(), &OPEN).is_ok());
    match check::<Acp>(sent, &SPEC) {
        Err(Error::Arguments {
            source: KeyError::NotKeyed { field },
            ..
        }) => assert_eq!(field, "meta.risk_signals"),
        other => panic!("{other:?}"),
    }
    // Only that object: the top level and other objects stay closed.
    let sent = json!({"meta": {"api_version": "1"}, "extra": 1});
    assert!(check::<Acp>(sent, &OPEN).is_err());
    let sent = json!({"meta": {"api_version": "1"}, "ship": {"city": "X", "zip": 1}});
    assert!(check::<Acp>(sent, &OPEN).is_err());
    // An alias of a field it reads is still that field.
    let sent = json!({"meta": {"api_version": "1", "lang": "fr", "x": 1}});
    assert!(check::<Acp>(sent, &OPEN).is_ok());
}

/// What `secret` says the handler sees; the key never would: so it is refused, open or not.
#[test]
fn an_open_object_still_refuses_a_member_its_type_reads_but_never_keys() {
    let sent = json!({"meta": {"api_version": "1", "secret": "s"}});
    assert!(check::<Acp>(sent, &OPEN).is_err());
    // A member called `*` is no exception.
    #[derive(Serialize, Deserialize)]
    struct Star {
        #[serde(rename = "*", default, skip_serializing)]
        #[allow(dead_code)]
        star: u8,
    }
    #[derive(Serialize, Deserialize)]
    struct Args {
        meta: Star,
    }
    assert!(check::<Args>(json!({"meta": {"*": 1}}), &OPEN).is_err());
}

#[test]
fn accepted_members_are_in_no_key_and_read_members_stay_keyed() {
    let alice = Caller::new("acme", "alice");
    let key = |sent: Value| {
        let args: Acp = serde_json::from_value(sent).unwrap();
        Prepared::call(&alice, &OPEN, &args).unwrap().key
    };
    let plain = key(json!({"meta": {"api_version": "1", "request_id": "a"}}));
    let extra = json!({"meta": {"api_version": "1", "request_id": "b", "risk": 1}});
    assert_eq!(key(extra), plain);
    assert_ne!(key(json!({"meta": {"api_version": "2"}})), plain);
    assert_ne!(
        key(json!({"meta": {"api_version": "1", "accept_language": "fr"}})),
        plain
    );
    // `meta.*` is no name: a member called `*` of a type that reads it is keyed.
    let value = |star| Prepared::call(&alice, &OPEN, &json!({"meta": {"*": star}})).unwrap();
    assert_ne!(value(1).key, value(2).key);
}

/// A `flatten` catch-all reads every member: each is serialised, so keyed, never accepted unread.
#[test]
fn a_catch_all_keeps_its_members_keyed() {
    #[derive(Serialize, Deserialize)]
    struct Kept {
        api_version: String,
        #[serde(flatten)]
        other: BTreeMap<String, Value>,
    }
    #[derive(Serialize, Deserialize)]
    struct Args {
        meta: Kept,
    }
    let alice = Caller::new("acme", "alice");
    let key = |sent: Value| {
        assert!(check::<Args>(sent.clone(), &OPEN).is_ok());
        let args: Args = serde_json::from_value(sent).unwrap();
        Prepared::call(&alice, &OPEN, &args).unwrap().key
    };
    assert_ne!(
        key(json!({"meta": {"api_version": "1", "risk": 1}})),
        key(json!({"meta": {"api_version": "1", "risk": 2}}))
    );
}

#[test]
fn open_objects_are_probed_within_the_bound() {
    let mut meta: JsonObject = (0..MAX_PROBES + 1)
        .map(|i| (format!("m{i:03}"), json!(i)))
        .collect();
    meta.insert("api_version".into(), json!("1"));
    let sent = json!({ "meta": meta });
    assert!(check::<Acp>(sent, &OPEN).is_err());
    // A name that collides with the probe's own placeholder is refused, not guessed at.
    let sent = json!({"meta": {"api_version": DUPLICATE, "x": 1}});
    assert!(check::<Acp>(sent, &OPEN).is_err());
    let sent = json!({"meta": {"api_version": "1", "x": 1}});
    assert!(check::<Acp>(sent, &OPEN).is_ok());
}

#[test]
fn the_listed_schema_leaves_open_objects_open() {
    let schema = json!({
        "type": "object",
        "properties": {
            "meta": {"$ref": "#/$defs/Meta"},
            "ship": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]},
            "tree": {"$ref": "#/$defs/Tree"},
        },
        "$defs": {
            "Meta": {"type": "object", "properties": {"api_version": {"type": "string"}}},
            "Address": {"type": "object", "properties": {"city": {"type": "string"}}},
            "Tree": {"anyOf": [{"$ref": "#/$defs/Tree"}, {"type": "object",
                     "properties": {"kids": {"$ref": "#/$defs/Tree"}}}]},
        },
    });
    let Value::Object(o) = schema else {
        unreachable!()
    };
    let listed = |ignored: &[&str]| {
        Value::Object((*closed_input_schema(Arc::new(o.clone()), ignored)).clone())
    };
    let closed = listed(&["meta.request_id"]);
    assert_eq!(
        closed["$defs"]["Meta"]["additionalProperties"],
        json!(false)
    );
    let open = listed(&["meta.*"]);
    assert_eq!(open["$defs"]["Meta"].get("additionalProperties"), None);
    assert_eq!(
        open["$defs"]["Address"]["additionalProperties"],
        json!(false)
    );
    assert_eq!(open["additionalProperties"], json!(false));
    // Through an `Option`'s `anyOf`; a path the schema does not have opens nothing.
    let open = listed(&["ship.*", "nowhere.*"]);
    assert_eq!(open["$defs"]["Address"].get("additionalProperties"), None);
    assert_eq!(open["$defs"]["Meta"]["additionalProperties"], json!(false));
    // A recursive type's schema is walked once, however its `$ref`s loop.
    let open = listed(&["tree.kids.kids.*"]);
    assert_eq!(
        open["$defs"]["Tree"]["anyOf"][1].get("additionalProperties"),
        None
    );
    assert_eq!(
        listed(&[])["$defs"]["Tree"]["anyOf"][1]["additionalProperties"],
        json!(false)
    );
}
