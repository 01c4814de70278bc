//! Properties over generated JSON values: the text parses back to the value, is idempotent,
//! ignores member order, and is serde_json's own compact output where the two agree.

use proptest::prelude::*;
use serde::Serialize;
use serde_json::Value;

use crate::canonical::canonical_json;

/// Strings with controls, quotes, backslashes, astral and private-use characters.
const TEXT: &str =
    r#"([\x00-\x1f"\\\x7f\u{2028}\u{E000}\u{FB33}\u{FFFF}\u{10000}\u{1F600}]|\PC){0,8}"#;

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        TEXT.prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((TEXT, inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Equal as JSON data: numbers compare by value (`1.0` comes back as the integer `1`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(p), Some(q), _, _) => p == q,
                (_, _, Some(p), Some(q)) => p == q,
                _ => x.as_f64() == y.as_f64(),
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// An object whose members are serialised in exactly the given order.
struct Ordered(Vec<(String, Value)>);
impl Serialize for Ordered {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

proptest! {
    #[test]
    fn parse_of_canonical_is_the_value(v in json_value()) {
        let c = canonical_json(&v).unwrap();
        let back: Value = serde_json::from_str(&c).unwrap();
        prop_assert!(same(&v, &back), "{v} -> {c} -> {back}");
    }

    #[test]
    fn canonical_is_idempotent(v in json_value()) {
        let c = canonical_json(&v).unwrap();
        let back: Value = serde_json::from_str(&c).unwrap();
        prop_assert_eq!(canonical_json(&back).unwrap(), c);
    }

    #[test]
    fn member_order_does_not_matter(
        (members, shuffled) in proptest::collection::btree_map(TEXT, json_value(), 0..8)
            .prop_flat_map(|m| {
                let v: Vec<(String, Value)> = m.into_iter().collect();
                (Just(v.clone()), Just(v).prop_shuffle())
            })
    ) {
        let object = Value::Object(members.iter().cloned().collect());
        let c = canonical_json(&Ordered(members)).unwrap();
        prop_assert_eq!(&canonical_json(&Ordered(shuffled)).unwrap(), &c);
        prop_assert_eq!(canonical_json(&object).unwrap(), c);
    }

    /// With BMP keys (where UTF-16 order is byte order) and no floats, the output is exactly
    /// serde_json's compact output: same escaping, same sorted BTreeMap order.
    #[test]
    fn matches_serde_json_without_floats(
        v in {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                TEXT.prop_map(Value::String),
            ];
            leaf.prop_recursive(3, 32, 5, |inner| prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::vec(("[\\x00-\\x7f\u{e9}\u{20ac}\u{d7ff}]{0,4}", inner), 0..5)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ])
        }
    ) {
        prop_assert_eq!(canonical_json(&v).unwrap(), serde_json::to_string(&v).unwrap());
    }
}
