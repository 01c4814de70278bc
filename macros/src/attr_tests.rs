//! Tests of `attr.rs`.

use super::*;
use quote::quote;

fn parse(ts: TokenStream) -> (Options, Option<String>) {
    let mut cx = Ctxt::new();
    let o = Options::parse(&mut cx, ts);
    (
        o,
        cx.check().err().map(|e| {
            e.into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(" | ")
        }),
    )
}

#[test]
fn recover_takes_one_of_three_words() {
    let (o, err) = parse(quote::quote!(recover = "rerun"));
    assert_eq!(err, None);
    assert_eq!(o.recover.map(|r| r.value), Some(Recover::Rerun));
    let (o, _) = parse(quote::quote!(recover = "reconcile"));
    assert_eq!(o.recover.map(|r| r.value), Some(Recover::Reconcile));
    let (o, err) = parse(quote::quote!(recover = "retry"));
    assert!(o.recover.is_none());
    let err = err.expect("an error");
    assert!(err.contains("`retry` is not a recovery"), "{err}");
    let (_, err) = parse(quote::quote!(recover = "rerun", recover = "unknown"));
    assert!(err
        .expect("an error")
        .contains("duplicate option `recover`"));
}

#[test]
fn client_key_takes_accept_or_require() {
    let (o, err) = parse(quote!(client_key = "accept"));
    assert_eq!(err, None);
    assert_eq!(o.client_key.map(|k| k.value), Some(ClientKey::Accept));
    let (o, _) = parse(quote!(client_key = "require"));
    assert_eq!(o.client_key.map(|k| k.value), Some(ClientKey::Require));
    let (o, err) = parse(quote!(client_key = "required"));
    assert!(o.client_key.is_none());
    let err = err.expect("an error");
    assert!(
        err.contains("`required` is not a client-key mode: expected \"accept\"")
            && err.contains("or \"require\""),
        "{err}"
    );
}

#[test]
fn options() {
    let (o, e) = parse(quote!(
        window = "2h",
        business_key = ["a", "b.c"],
        name = "n",
        on_error = "definitive",
        timeout = "30s",
        wait = "3s",
        context = "ctx",
        crate = "::idem"
    ));
    assert!(e.is_none(), "{e:?}");
    assert_eq!(o.window_ms(), 7_200_000);
    assert_eq!(o.business_key.map(|b| b.value.len()), Some(2));
    assert_eq!(o.on_error.map(|o| o.value), Some(OnError::Definitive));
    assert_eq!(o.timeout.map(|t| t.value), Some(30_000));
    assert_eq!(o.wait.map(|t| t.value), Some(3_000));
    let (o, e) = parse(quote!());
    assert!(e.is_none());
    assert_eq!(o.window_ms(), DEFAULT_WINDOW_MS);
}

#[test]
fn errors_are_all_reported() {
    let (_, e) = parse(quote!(
        window = "15x",
        colour = "red",
        window = "1m",
        business_key = "a, b",
        on_error = "maybe"
    ));
    let e = e.unwrap_or_default();
    assert!(e.contains("`15x` has no valid unit"), "{e}");
    assert!(e.contains("unknown option `colour`"), "{e}");
    assert!(e.contains("duplicate option `window`"), "{e}");
    assert!(e.contains("written as a list"), "{e}");
    assert!(e.contains("`maybe` is not a disposition"), "{e}");
    let (_, e) = parse(quote!(window = 15));
    assert!(e.unwrap_or_default().contains("`window` takes a string"));
}

proptest::proptest! {
    #[test]
    fn option_parser_never_panics(s in "[a-z_=\", \\[\\]0-9.:]{0,40}") {
        let mut cx = Ctxt::new();
        if let Ok(ts) = s.parse::<TokenStream>() {
            let _ = Options::parse(&mut cx, ts);
        }
        let _ = cx.check();
    }
}

#[test]
fn ignore_takes_an_object_glob_as_the_last_segment_only() {
    let (o, err) = parse(quote!(ignore = ["meta.*", "meta.request_id", "a.b.*"]));
    assert_eq!(err, None);
    assert_eq!(o.ignore.expect("ignore").value.len(), 3);
    let (o, err) = parse(quote!(ignore = "*"));
    assert!(o.ignore.is_none());
    let err = err.expect("an error");
    assert!(err.contains("`*` alone would accept"), "{err}");
    let (_, err) = parse(quote!(ignore = "meta.*.id"));
    let err = err.expect("an error");
    assert!(err.contains("only as the whole last segment"), "{err}");
}

#[test]
fn ignore_takes_field_paths_through_objects() {
    let (o, err) = parse(quote!(
        ignore = ["sent_at", "meta.request_id", "meta.idempotency-key"]
    ));
    assert_eq!(err, None);
    let paths: Vec<String> = o
        .ignore
        .expect("ignore")
        .value
        .iter()
        .map(LitStr::value)
        .collect();
    assert_eq!(
        paths,
        ["sent_at", "meta.request_id", "meta.idempotency-key"]
    );
    for bad in [
        "meta.",
        ".meta",
        "meta..id",
        "lines[0].sku",
        "sent at",
        "",
        "meta.*.id",
        "*.id",
        "meta.req*",
        ".*",
        "meta.**",
        "meta..*",
    ] {
        let (o, err) = parse(quote!(ignore = #bad));
        assert!(o.ignore.is_none(), "{bad:?}");
        let err = err.expect("an error");
        assert!(err.contains("is not a field path"), "{bad:?}: {err}");
    }
}
