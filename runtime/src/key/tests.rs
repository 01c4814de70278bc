//! Tests of keys, secrets, fingerprints and references.

use proptest::prelude::*;
use serde_json::json;

use super::secret::hmac_sha256;
use super::*;
use crate::key::Scope;

static S: std::sync::LazyLock<Secret> = std::sync::LazyLock::new(Secret::demo);

fn naive(tenant: &str, subject: &str, tool: &str, args: &str) -> String {
    format!("{tenant}|{subject}|{tool}|{args}")
}

#[test]
fn separator_bytes_cannot_merge_callers() {
    // The seed's encoding lets these two different callers collide.
    let a = Caller::new("acme|alice", "x");
    let b = Caller::new("acme", "alice|x");
    assert_eq!(
        naive(&a.tenant, &a.subject, "t", "{}"),
        naive(&b.tenant, &b.subject, "t", "{}")
    );
    assert_ne!(
        Key::for_call(&S, &a, "t", &json!({})).unwrap(),
        Key::for_call(&S, &b, "t", &json!({})).unwrap()
    );
    // A boundary moved between subject and tool.
    let c = Caller::new("acme", "alice\0charge");
    let d = Caller::new("acme", "alice");
    assert_ne!(
        Key::for_call(&S, &c, "card", &json!({})).unwrap(),
        Key::for_call(&S, &d, "charge\0card", &json!({})).unwrap()
    );
}

proptest! {
    #[test]
    fn distinct_fields_give_distinct_keys(
        (t1, s1, n1) in (".{0,6}", ".{0,6}", ".{0,6}"),
        (t2, s2, n2) in (".{0,6}", ".{0,6}", ".{0,6}"),
    ) {
        prop_assume!(!t1.is_empty() && !t2.is_empty());
        prop_assume!((&t1, &s1, &n1) != (&t2, &s2, &n2));
        let k1 = Key::for_call(&S, &Caller::new(t1, s1), &n1, &json!(1)).unwrap();
        let k2 = Key::for_call(&S, &Caller::new(t2, s2), &n2, &json!(1)).unwrap();
        prop_assert_ne!(k1, k2);
    }

    #[test]
    fn separators_inside_fields_never_collide(
        parts in proptest::collection::vec("[a|\\x00]{0,4}", 6)
    ) {
        prop_assume!(!parts[0].is_empty() && !parts[3].is_empty());
        let k1 = Key::for_call(&S, &Caller::new(&*parts[0], &*parts[1]), &parts[2], &json!(0)).unwrap();
        let k2 = Key::for_call(&S, &Caller::new(&*parts[3], &*parts[4]), &parts[5], &json!(0)).unwrap();
        prop_assert_eq!(k1 == k2, parts[..3] == parts[3..]);
    }
}

#[test]
fn key_order_and_number_spelling_do_not_matter() {
    let c = Caller::new("acme", "alice");
    #[derive(serde::Deserialize, serde::Serialize)]
    struct Typed {
        amount: f64,
        currency: String,
    }
    let a: Typed = serde_json::from_str(r#"{"amount":100,"currency":"EUR"}"#).unwrap();
    let b: Typed = serde_json::from_str(" {\n \"currency\" : \"EUR\", \"amount\": 1e2 }").unwrap();
    assert_eq!(
        Key::for_call(&S, &c, "charge", &a).unwrap(),
        Key::for_call(&S, &c, "charge", &b).unwrap()
    );
    // Held as a `Value`, `100` and `1e2` are what the handler sees: an integer and a float.
    let (x, y): (serde_json::Value, serde_json::Value) = (
        serde_json::from_str(r#"{"amount":100}"#).unwrap(),
        serde_json::from_str(r#"{"amount":1e2}"#).unwrap(),
    );
    assert_ne!(
        Key::for_call(&S, &c, "charge", &x).unwrap(),
        Key::for_call(&S, &c, "charge", &y).unwrap()
    );
    let a = json!({"amount": 100, "currency": "EUR"});
    assert_ne!(
        Key::for_call(&S, &c, "charge", &json!({"amount": 101, "currency": "EUR"})).unwrap(),
        Key::for_call(&S, &c, "charge", &a).unwrap()
    );
}

#[test]
fn call_and_business_keys_live_apart() {
    let c = Caller::new("acme", "alice");
    let other = Caller::new("acme", "bob");
    let foreign = Caller::new("globex", "alice");
    let bk = Key::for_business_key(&S, &c, "ship", "o-1").unwrap();
    assert_eq!(
        bk,
        Key::for_business_key(&S, &other, "ship", "o-1").unwrap()
    );
    assert_ne!(
        bk,
        Key::for_business_key(&S, &foreign, "ship", "o-1").unwrap()
    );
    assert_ne!(bk, Key::for_call(&S, &c, "ship", "o-1").unwrap());
}

/// A client key is always the caller's own (tenant and subject, whatever the scope), one
/// tool's, and never the key of a call or business key spelled like it.
#[test]
fn client_keys_never_cross_callers_tools_or_kinds() {
    let k = ClientKey::new("6f1c2a7e-7d55-4c1e").unwrap();
    let key = |caller: &Caller, tool, scope| {
        KeyMaterial::client(
            Owner {
                caller,
                tool,
                scope,
            },
            &k,
        )
        .unwrap()
        .key(&S)
    };
    let (alice, bob) = (Caller::new("acme", "alice"), Caller::new("acme", "bob"));
    let foreign = Caller::new("globex", "alice");
    let mine = key(&alice, "pay", Scope::Subject);
    assert_eq!(mine, key(&alice, "pay", Scope::Tenant));
    assert_ne!(mine, key(&bob, "pay", Scope::Tenant));
    assert_ne!(mine, key(&foreign, "pay", Scope::Subject));
    assert_ne!(mine, key(&alice, "refund", Scope::Subject));
    let owner = Owner {
        caller: &alice,
        tool: "pay",
        scope: Scope::Subject,
    };
    let business = KeyMaterial::business(owner, k.as_str()).unwrap().key(&S);
    assert_ne!(mine, business);
    assert!(KeyMaterial::client(
        Owner {
            caller: &Caller::new("", "alice"),
            ..owner
        },
        &k
    )
    .is_err());
}

#[test]
fn client_keys_are_bounded_printable_ascii() {
    assert_eq!(
        ClientKey::new("1234567"),
        Err(ClientKeyError::Length { len: 7 })
    );
    assert!(ClientKey::new("12345678").is_ok());
    assert!(ClientKey::new("k".repeat(255)).is_ok());
    assert_eq!(
        ClientKey::new("k".repeat(256)),
        Err(ClientKeyError::Length { len: 256 })
    );
    assert_eq!(
        ClientKey::new("clé-12345"),
        Err(ClientKeyError::Character { at: 3 })
    );
    assert_eq!(
        ClientKey::new("tab\there-1"),
        Err(ClientKeyError::Character { at: 4 })
    );
    let e = ClientKeyError::Length { len: 300 }.to_string();
    assert!(e.contains("300") && e.contains("8 to 255"), "{e}");
    // The key is the client's: Debug never prints it.
    let k = ClientKey::new("secret-request-1").unwrap();
    assert!(!format!("{k:?}").contains("secret"));
}

#[test]
fn hmac_matches_rfc_4231() {
    // RFC 4231 test case 2.
    let mac = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
    // Test case 6: a key longer than the block is hashed first.
    let mac = hmac_sha256(
        &[0xaa; 131],
        &[b"Test Using Larger Than Block-Size Key - Hash Key First"],
    );
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
    );
}

#[test]
fn without_the_secret_the_reference_cannot_be_recomputed() {
    let c = Caller::new("acme", "alice");
    let args = json!({"amount": 100, "currency": "EUR"});
    let mine = Secret::new("a secret only the server knows").unwrap();
    let k = Key::for_call(&mine, &c, "charge_card", &args).unwrap();
    // Someone who knows the tenant and guesses the arguments, with the published demo secret,
    // with no secret at all (plain sha256 of the same encoding), or with another secret.
    let guessed = [
        Key::for_call(&S, &c, "charge_card", &args).unwrap(),
        Key::from_bytes(
            KeyMaterial::call(
                Owner {
                    caller: &c,
                    tool: "charge_card",
                    scope: Scope::Subject,
                },
                &args,
                &[],
            )
            .unwrap()
            .0,
        ),
        Key::for_call(
            &Secret::new("another secret, not ours").unwrap(),
            &c,
            "charge_card",
            &args,
        )
        .unwrap(),
    ];
    for g in guessed {
        assert_ne!(g.reference(1), k.reference(1));
    }
    assert_eq!(Key::for_call(&mine, &c, "charge_card", &args).unwrap(), k);
}

#[test]
fn scope_decides_whether_the_subject_is_in_the_key() {
    let (alice, bob) = (Caller::new("acme", "alice"), Caller::new("acme", "bob"));
    let key = |c: &Caller, scope| {
        KeyMaterial::business(
            Owner {
                caller: c,
                tool: "ship",
                scope,
            },
            "o-1",
        )
        .unwrap()
        .key(&S)
    };
    assert_eq!(key(&alice, Scope::Tenant), key(&bob, Scope::Tenant));
    assert_ne!(key(&alice, Scope::Subject), key(&bob, Scope::Subject));
    assert_ne!(key(&alice, Scope::Subject), key(&alice, Scope::Tenant));
    // A subject scope cannot collide with a tenant named like tenant + subject.
    let joined = Caller::new("acmealice", "");
    assert_ne!(key(&alice, Scope::Subject), key(&joined, Scope::Tenant));
}

/// The fingerprint a store keeps is the plain HMAC-SHA256 of the fixed label (pinned: a
/// change would make every store refuse every engine), never the secret, and tells secrets
/// apart.
#[test]
fn a_secret_fingerprint_is_the_hmac_of_a_fixed_label() {
    let demo = Secret::demo().fingerprint();
    assert_eq!(
        format!("{demo:?}"),
        "SecretFingerprint(3ad9acc959c3d2a68907b7a760a75d38f2d24a08dbbde1caf4fd2f872dfa8c18)"
    );
    assert_eq!(demo.to_string(), "3ad9acc9");
    assert!(demo.is_demo());
    let mine = Secret::new("a secret only the server knows").unwrap();
    assert_ne!(mine.fingerprint(), demo);
    assert!(!mine.fingerprint().is_demo());
    assert_eq!(
        SecretFingerprint::from_slice(mine.fingerprint().as_bytes()),
        Some(mine.fingerprint())
    );
    assert_eq!(SecretFingerprint::from_slice(&[0; 31]), None);
}

#[test]
fn empty_tenant_is_refused() {
    let err = Key::for_call(&S, &Caller::new("", "alice"), "t", &json!({})).unwrap_err();
    assert!(err.to_string().contains("tenant"), "{err}");
}

#[test]
fn display_is_64_lowercase_hex() {
    let k = Key::for_call(&S, &Caller::new("a", "b"), "t", &json!({})).unwrap();
    let s = k.to_string();
    assert_eq!(s.len(), 64);
    assert!(s
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
}

#[test]
fn references_round_trip_and_fit_processor_limits() {
    let k = Key::for_call(&S, &Caller::new("a", "b"), "t", &json!({})).unwrap();
    let r = k.reference(u32::MAX);
    let s = r.to_string();
    assert!(s.len() <= 40 && s.len() >= 12, "{s}");
    assert_eq!(s.parse::<Reference>().unwrap(), r);
    assert!(r.matches(&k));
    assert_eq!(&k.to_string()[..16], &s[..16]);
    for bad in [
        "",
        "abc",
        "3f9a0c1b2d4e5f60",
        "3f9a0c1b2d4e5f60-",
        "3f9a0c1b2d4e5f6g-1",
        "3f9a0c1b2d4e5f60-0",
        "3f9a0c1b2d4e5f60-x",
        "3f9a0c1b2d4e5f60-99999999999",
    ] {
        assert!(bad.parse::<Reference>().is_err(), "{bad}");
    }
    let (lo, hi) = r.key_range();
    assert!(lo <= *k.as_bytes() && *k.as_bytes() <= hi);
}

#[test]
fn a_short_secret_says_its_length_and_the_minimum_in_debug_too() {
    let e = Secret::new("short").unwrap_err();
    for text in [e.to_string(), format!("{e:?}")] {
        assert!(
            text.contains("5 bytes long") && text.contains("at least 16"),
            "{text}"
        );
    }
}
