//! The argument checks against the key, and the closed input schema.

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
