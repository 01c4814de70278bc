//! RFC 8785 output: the published vectors, numbers, strings, member order, map keys, enum
//! shapes, bytes, and the errors (duplicates, custom errors, nesting too deep).

use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};

use crate::canonical::{canonical_json, CanonicalError, MAX_DEPTH};

macro_rules! vector {
    ($name:literal) => {
        (
            $name,
            include_str!(concat!("../../../tests/jcs/input/", $name, ".json")),
            include_str!(concat!("../../../tests/jcs/output/", $name, ".json")),
        )
    };
}

#[test]
fn rfc8785_vectors() {
    let vectors = [
        vector!("arrays"),
        vector!("french"),
        vector!("structures"),
        vector!("unicode"),
        vector!("values"),
        vector!("weird"),
    ];
    for (name, input, expected) in vectors {
        assert!(
            !expected.ends_with('\n'),
            "vector {name} has a trailing newline"
        );
        let v: Value = serde_json::from_str(input).unwrap();
        assert_eq!(
            canonical_json(&v).unwrap().as_bytes(),
            expected.as_bytes(),
            "vector {name}"
        );
    }
}

#[test]
fn floats_follow_es6() {
    let v = json!([1.0, 1e3, -0.0, 1e21, 1e-7, 5e-324, 0.1, 123.456, -1.5, 1e20, 1e-6]);
    assert_eq!(
        canonical_json(&v).unwrap(),
        "[1,1000,0,1e+21,1e-7,5e-324,0.1,123.456,-1.5,100000000000000000000,0.000001]"
    );
    assert_eq!(canonical_json(&-0.0f64).unwrap(), "0");
    assert_eq!(
        canonical_json(&f64::MAX).unwrap(),
        "1.7976931348623157e+308"
    );
    assert_eq!(canonical_json(&0.1f32).unwrap(), "0.1");
    assert_eq!(canonical_json(&-0.0f32).unwrap(), "0");
    // serde_json parses `1.0` and `1e3` as f64.
    let parsed: Value = serde_json::from_str("[1.0, 1e3, 1E-7, -0]").unwrap();
    assert_eq!(canonical_json(&parsed).unwrap(), "[1,1000,1e-7,0]");
}

#[test]
fn integers_stay_exact() {
    assert_eq!(
        canonical_json(&9007199254740993u64).unwrap(),
        "9007199254740993"
    );
    assert_ne!(
        canonical_json(&json!({"amount": 9007199254740993u64})).unwrap(),
        canonical_json(&json!({"amount": 9007199254740992u64})).unwrap()
    );
    assert_eq!(canonical_json(&u64::MAX).unwrap(), "18446744073709551615");
    assert_eq!(canonical_json(&i64::MIN).unwrap(), "-9223372036854775808");
    assert_eq!(canonical_json(&u128::MAX).unwrap(), u128::MAX.to_string());
    assert_eq!(canonical_json(&i128::MIN).unwrap(), i128::MIN.to_string());
    assert_eq!(canonical_json(&[-1i8, 0, 7]).unwrap(), "[-1,0,7]");
}

#[test]
fn non_finite_numbers_are_errors() {
    assert_eq!(
        canonical_json(&f64::NAN),
        Err(CanonicalError::NonFiniteNumber)
    );
    assert_eq!(
        canonical_json(&vec![f64::INFINITY]),
        Err(CanonicalError::NonFiniteNumber)
    );
    assert_eq!(
        canonical_json(&f32::NEG_INFINITY),
        Err(CanonicalError::NonFiniteNumber)
    );
    let msg = CanonicalError::NonFiniteNumber.to_string();
    assert!(msg.contains("NaN or infinite"), "{msg}");
}

#[test]
fn keys_sort_by_utf16_code_units() {
    // U+1F600 is D83D DE00 in UTF-16, so it sorts before U+FB33; in UTF-8 (and in a
    // BTreeMap<String, _>) it sorts after.
    let mut m = BTreeMap::new();
    m.insert("\u{FB33}", 1);
    m.insert("\u{1F600}", 2);
    m.insert("a", 3);
    m.insert("\u{E000}", 4);
    m.insert("", 5);
    assert_eq!(
        canonical_json(&m).unwrap(),
        "{\"\":5,\"a\":3,\"\u{1F600}\":2,\"\u{E000}\":4,\"\u{FB33}\":1}"
    );
    let h: HashMap<_, _> = m.into_iter().collect();
    assert_eq!(
        canonical_json(&h).unwrap(),
        "{\"\":5,\"a\":3,\"\u{1F600}\":2,\"\u{E000}\":4,\"\u{FB33}\":1}"
    );
}

#[test]
fn strings_use_minimal_escaping() {
    assert_eq!(
        canonical_json("\"\\\u{8}\t\n\u{c}\r\u{0}\u{1}\u{1f}\u{7f}\u{2028}\u{2029}é/€😂</")
            .unwrap(),
        "\"\\\"\\\\\\b\\t\\n\\f\\r\\u0000\\u0001\\u001f\u{7f}\u{2028}\u{2029}é/€😂</\""
    );
    assert_eq!(canonical_json(&'\n').unwrap(), r#""\n""#);
    assert_eq!(canonical_json(&'\u{1b}').unwrap(), r#""\u001b""#);
    // Keys are escaped the same way.
    assert_eq!(
        canonical_json(&json!({"a\"\n": 1})).unwrap(),
        r#"{"a\"\n":1}"#
    );
}

#[test]
fn map_keys_must_be_strings() {
    let mut ints = BTreeMap::new();
    ints.insert(10u32, "a");
    ints.insert(9u32, "b");
    ints.insert(100u32, "c");
    assert_eq!(
        canonical_json(&ints).unwrap(),
        r#"{"10":"a","100":"c","9":"b"}"#
    );
    let chars: BTreeMap<char, u8> = [('b', 1), ('a', 2)].into();
    assert_eq!(canonical_json(&chars).unwrap(), r#"{"a":2,"b":1}"#);
    let seqs: BTreeMap<Vec<u8>, u8> = [(vec![1], 1)].into();
    assert_eq!(
        canonical_json(&seqs),
        Err(CanonicalError::NonStringKey { found: "sequence" })
    );
    let bools: BTreeMap<bool, u8> = [(true, 1)].into();
    assert_eq!(
        canonical_json(&bools),
        Err(CanonicalError::NonStringKey { found: "boolean" })
    );
    let opts: BTreeMap<Option<u8>, u8> = [(None, 1)].into();
    assert!(matches!(
        canonical_json(&opts),
        Err(CanonicalError::NonStringKey { .. })
    ));
    let unit: BTreeMap<(), u8> = [((), 1)].into();
    assert!(matches!(
        canonical_json(&unit),
        Err(CanonicalError::NonStringKey { .. })
    ));
    let floats = FloatKey;
    assert_eq!(
        canonical_json(&floats),
        Err(CanonicalError::NonStringKey {
            found: "floating-point number"
        })
    );
}

struct FloatKey;
impl Serialize for FloatKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry(&1.5f64, &1)?;
        m.end()
    }
}

#[derive(serde::Serialize)]
struct Args {
    b: u32,
    a: Option<String>,
    c: Shape,
    d: Meters,
}

#[derive(serde::Serialize)]
struct Meters(f64);

#[derive(serde::Serialize)]
struct Marker;

#[derive(serde::Serialize)]
enum Shape {
    Point,
    Circle(f64),
    Rect { w: u8, h: u8 },
    Pair(u8, u8),
}

#[test]
fn structs_and_maps_agree() {
    let a = Args {
        b: 1,
        a: None,
        c: Shape::Rect { w: 2, h: 1 },
        d: Meters(2.0),
    };
    let expected = r#"{"a":null,"b":1,"c":{"Rect":{"h":1,"w":2}},"d":2}"#;
    assert_eq!(canonical_json(&a).unwrap(), expected);
    let as_map = json!({"d": 2.0, "b": 1, "a": null, "c": {"Rect": {"w": 2, "h": 1}}});
    assert_eq!(canonical_json(&as_map).unwrap(), expected);
    // The same as going through serde_json::Value.
    assert_eq!(
        canonical_json(&serde_json::to_value(&a).unwrap()).unwrap(),
        expected
    );
}

#[test]
fn enum_and_unit_shapes() {
    let shapes = [
        Shape::Point,
        Shape::Circle(1.5),
        Shape::Pair(1, 2),
        Shape::Rect { w: 3, h: 4 },
    ];
    assert_eq!(
        canonical_json(&shapes).unwrap(),
        r#"["Point",{"Circle":1.5},{"Pair":[1,2]},{"Rect":{"h":4,"w":3}}]"#
    );
    assert_eq!(canonical_json(&()).unwrap(), "null");
    assert_eq!(canonical_json(&Marker).unwrap(), "null");
    assert_eq!(canonical_json(&None::<u8>).unwrap(), "null");
    assert_eq!(canonical_json(&Some(3u8)).unwrap(), "3");
    assert_eq!(
        canonical_json(&(1u8, "x", true)).unwrap(),
        r#"[1,"x",true]"#
    );
    assert_eq!(canonical_json(&Vec::<u8>::new()).unwrap(), "[]");
    assert_eq!(
        canonical_json(&BTreeMap::<String, u8>::new()).unwrap(),
        "{}"
    );
    let unit_keys: BTreeMap<&str, Shape> = [("z", Shape::Point)].into();
    assert_eq!(canonical_json(&unit_keys).unwrap(), r#"{"z":"Point"}"#);
}

struct Bytes(&'static [u8]);
impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

#[test]
fn bytes_are_arrays_of_numbers() {
    assert_eq!(
        canonical_json(&Bytes(b"\x00\x7f\xff")).unwrap(),
        "[0,127,255]"
    );
    assert_eq!(canonical_json(&Bytes(b"")).unwrap(), "[]");
}

struct Dup;
impl Serialize for Dup {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("k", &1)?;
        m.serialize_entry("j", &1)?;
        m.serialize_entry("k", &2)?;
        m.end()
    }
}

#[test]
fn duplicate_keys_are_errors() {
    assert_eq!(
        canonical_json(&Dup),
        Err(CanonicalError::DuplicateKey("k".into()))
    );
    assert_eq!(
        canonical_json(&[Dup]),
        Err(CanonicalError::DuplicateKey("k".into()))
    );
}

struct Failing;
impl Serialize for Failing {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("no thanks"))
    }
}

#[test]
fn custom_errors_pass_through() {
    assert_eq!(
        canonical_json(&[Failing]),
        Err(CanonicalError::Custom("no thanks".into()))
    );
}

struct Deep(usize);
impl Serialize for Deep {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(1))?;
        if self.0 > 1 {
            seq.serialize_element(&Deep(self.0 - 1))?;
        }
        seq.end()
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    // Deep(n) is n nested arrays.
    let ok = canonical_json(&Deep(MAX_DEPTH)).unwrap();
    assert_eq!(ok.len(), 2 * MAX_DEPTH);
    assert_eq!(
        canonical_json(&Deep(MAX_DEPTH + 1)),
        Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
    );
    assert_eq!(
        canonical_json(&Deep(100_000)),
        Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
    );

    let nested = |depth: usize| {
        let mut v = Value::Null;
        for i in 0..depth {
            v = if i % 2 == 0 {
                Value::Array(vec![v])
            } else {
                json!({ "k": v })
            };
        }
        v
    };
    assert!(canonical_json(&nested(MAX_DEPTH)).is_ok());
    let mut v = Value::Null;
    for i in 0..1000 {
        v = if i % 2 == 0 {
            Value::Array(vec![v])
        } else {
            json!({ "k": v })
        };
    }
    assert_eq!(
        canonical_json(&v),
        Err(CanonicalError::TooDeep { limit: MAX_DEPTH })
    );
}
