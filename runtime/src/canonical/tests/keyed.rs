//! The key's form ([`typed_canonical`]): floats keep their mark, serde_json's
//! `arbitrary_precision` numbers and `RawValue` text are read by value and by text, and
//! top-level members can be left out.

use serde::Serialize;

use crate::canonical::{
    canonical_json, typed_canonical, CanonicalError, MAX_DEPTH, SERDE_JSON_NUMBER_TOKEN,
    SERDE_JSON_RAW_TOKEN,
};

/// What serde_json's `Number` serialises as under `arbitrary_precision`.
struct PreciseNumber(&'static str);
impl Serialize for PreciseNumber {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct(SERDE_JSON_NUMBER_TOKEN, 1)?;
        st.serialize_field(SERDE_JSON_NUMBER_TOKEN, self.0)?;
        st.end()
    }
}

/// What serde_json's `RawValue` serialises as.
struct Raw(&'static str);
impl Serialize for Raw {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct(SERDE_JSON_RAW_TOKEN, 1)?;
        st.serialize_field(SERDE_JSON_RAW_TOKEN, self.0)?;
        st.end()
    }
}

fn keyed<T: Serialize + ?Sized>(v: &T) -> String {
    typed_canonical(v, &[]).unwrap()
}

#[test]
fn keys_mark_floats_and_keep_the_sign_of_zero() {
    assert_eq!(keyed(&1.0f64), "1.0");
    assert_eq!(keyed(&1u8), "1");
    assert_eq!(keyed(&-0.0f64), "-0.0");
    assert_eq!(keyed(&0.0f64), "0.0");
    assert_eq!(keyed(&1.5f64), "1.5");
    assert_eq!(keyed(&1e21f64), "1e+21");
    assert_eq!(keyed(&0.1f32), "0.1");
    assert_eq!(keyed(&[1.0f64, 2.5]), "[1.0,2.5]");
    assert_eq!(
        keyed(&serde_json::json!({"b": 100.0, "a": -0.0})),
        r#"{"a":-0.0,"b":100.0}"#
    );
    // canonical_json stays RFC 8785.
    assert_eq!(canonical_json(&[1.0f64, -0.0]).unwrap(), "[1,0]");
}

#[test]
fn keys_read_arbitrary_precision_numbers_by_value() {
    // One number, two spellings.
    assert_eq!(
        keyed(&PreciseNumber("1e21")),
        keyed(&PreciseNumber("1000000000000000000000"))
    );
    assert_eq!(keyed(&PreciseNumber("1e21")), "1000000000000000000000.0");
    assert_eq!(
        keyed(&PreciseNumber("12.50e1")),
        keyed(&PreciseNumber("125.0"))
    );
    // What serde_json reads back as an integer and as a float stay apart.
    assert_eq!(keyed(&PreciseNumber("100")), "100");
    assert_ne!(keyed(&PreciseNumber("100")), keyed(&PreciseNumber("1e2")));
    // Neighbours beyond 64 bits stay apart; fractions go through an f64.
    assert_ne!(
        keyed(&PreciseNumber("18446744073709551616")),
        keyed(&PreciseNumber("18446744073709551617"))
    );
    assert_eq!(keyed(&PreciseNumber("0.5")), "0.5");
    assert_eq!(keyed(&PreciseNumber("-0")), "0");
    assert_eq!(keyed(&PreciseNumber("-0.0")), "-0.0");
}

#[test]
fn keys_read_raw_values_by_their_text() {
    // Numbers keep the digits the handler reads, whatever an f64 would make of them.
    assert_eq!(
        keyed(&Raw("0.10000000000000000001")),
        "0.10000000000000000001"
    );
    assert_ne!(keyed(&Raw("0.1")), keyed(&Raw("0.10000000000000000001")));
    assert_ne!(keyed(&Raw("1e2")), keyed(&Raw("100")));
    assert_ne!(keyed(&Raw("1.0")), keyed(&Raw("1")));
    assert_ne!(keyed(&Raw("-0")), keyed(&Raw("0")));
    assert_ne!(
        keyed(&Raw("[18446744073709551616]")),
        keyed(&Raw("[18446744073709551617]"))
    );
    // What no JSON reader sees: whitespace, member order, escapes.
    assert_eq!(
        keyed(&Raw(" { \"b\" : 1.0 ,\n \"a\" : [ 2 , {} , [ ] ] } ")),
        r#"{"a":[2,{},[]],"b":1.0}"#
    );
    assert_eq!(keyed(&Raw(r#""\u0041\/\u00e9""#)), r#""A/é""#);
    assert_eq!(
        keyed(&Raw(r#"["\u001F",true,false,null]"#)),
        r#"["\u001f",true,false,null]"#
    );
    assert_eq!(
        keyed(&Raw(r#"{"\u0061":1,"b":2}"#)),
        keyed(&Raw(r#"{"b":2,"a":1}"#))
    );
    // A lone surrogate is kept as written, apart from any decodable string.
    assert_eq!(keyed(&Raw(r#""\ud800""#)), r#""\ud800""#);
    assert_ne!(keyed(&Raw(r#""\ud800""#)), keyed(&Raw(r#""\\ud800""#)));
    // Duplicate members (whatever their spelling) are refused; so is text that is not JSON.
    for dup in [
        r#"{"a":1,"a":2}"#,
        r#"{"a":1,"\u0061":1}"#,
        r#"[{"b":{"a":1,"a":1}}]"#,
    ] {
        let e = typed_canonical(&Raw(dup), &[]).unwrap_err();
        assert!(e.to_string().contains("twice"), "{dup}: {e}");
    }
    for bad in ["", "[1,]", "{\"a\" 1}", "tru", "[1] 2", "\"open"] {
        assert!(typed_canonical(&Raw(bad), &[]).is_err(), "{bad:?}");
    }
    // Nesting counts against the same limit as typed values.
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    assert_eq!(
        typed_canonical(&Raw(Box::leak(deep.into_boxed_str())), &[]),
        Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
    );
    // RFC 8785 output is unchanged: a raw value there is read as a value.
    assert_eq!(canonical_json(&Raw("1.0")).unwrap(), "1");
}

#[test]
fn keys_leave_out_only_top_level_ignored_members() {
    let v = serde_json::json!({"a": 1, "t": 2, "n": {"t": 3}});
    assert_eq!(
        typed_canonical(&v, &["t"]).unwrap(),
        r#"{"a":1,"n":{"t":3}}"#
    );
}

#[test]
fn keys_leave_out_nested_ignored_members_by_path() {
    // ACP's arguments: the retry's request id, timestamp and signature are fresh each time.
    let v = serde_json::json!({
        "meta": {"idempotency_key": "k1", "request_id": "r1", "timestamp": "t1", "api_version": "2026-01-30"},
        "id": "cs_1",
        "payload": {"request_id": "kept", "items": [{"request_id": "kept too"}]},
        "request_id": "kept at the top"
    });
    let skip = &["meta.idempotency_key", "meta.request_id", "meta.timestamp"];
    assert_eq!(
        typed_canonical(&v, skip).unwrap(),
        r#"{"id":"cs_1","meta":{"api_version":"2026-01-30"},"payload":{"items":[{"request_id":"kept too"}],"request_id":"kept"},"request_id":"kept at the top"}"#
    );
    // Deeper paths; a path that does not exist leaves everything in; paths share a prefix.
    let v = serde_json::json!({"a": {"b": {"c": 1, "d": 2}, "bb": 3}, "ab": 4});
    assert_eq!(
        typed_canonical(&v, &["a.b.c", "a.x", "a.bb"]).unwrap(),
        r#"{"a":{"b":{"d":2}},"ab":4}"#
    );
    assert_eq!(
        typed_canonical(&v, &["a.b"]).unwrap(),
        r#"{"a":{"bb":3},"ab":4}"#
    );
    // Paths go through objects, not arrays.
    let v = serde_json::json!({"a": [{"b": 1}]});
    assert_eq!(typed_canonical(&v, &["a.b"]).unwrap(), r#"{"a":[{"b":1}]}"#);
}

#[test]
fn nested_ignored_members_of_typed_structs_and_options() {
    #[derive(serde::Serialize)]
    struct Meta {
        idempotency_key: String,
        request_id: Option<String>,
    }
    #[derive(serde::Serialize)]
    struct Args {
        meta: Option<Meta>,
        id: String,
    }
    let a = |r: &str| Args {
        meta: Some(Meta {
            idempotency_key: "k".into(),
            request_id: Some(r.into()),
        }),
        id: "cs_1".into(),
    };
    let skip = &["meta.request_id"];
    assert_eq!(
        typed_canonical(&a("r1"), skip).unwrap(),
        typed_canonical(&a("r2"), skip).unwrap()
    );
    assert_eq!(
        typed_canonical(&a("r1"), skip).unwrap(),
        r#"{"id":"cs_1","meta":{"idempotency_key":"k"}}"#
    );
}

#[test]
fn serde_json_private_tokens() {
    let nums = [
        PreciseNumber("123456789012345678901234567890"),
        PreciseNumber("-0"),
        PreciseNumber("1.0"),
        PreciseNumber("1E3"),
        PreciseNumber("-12"),
    ];
    assert_eq!(
        canonical_json(&nums).unwrap(),
        "[123456789012345678901234567890,0,1,1000,-12]"
    );
    assert_eq!(
        canonical_json(&PreciseNumber("1e400")),
        Err(CanonicalError::NonFiniteNumber)
    );
    assert!(matches!(
        canonical_json(&PreciseNumber("x")),
        Err(CanonicalError::Custom(_))
    ));
    assert_eq!(
        canonical_json(&Raw(r#" { "b" : 1.0 , "a" : [ ] } "#)).unwrap(),
        r#"{"a":[],"b":1}"#
    );
}
