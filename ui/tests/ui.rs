//! Compile-time behaviour of `#[idempotent]` and `#[idempotent_tools]`: what compiles, and the
//! message and span of every rejection (`TRYBUILD=overwrite cargo test -p idempotency-ui`
//! re-blesses; read the diff).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("pass/*.rs");
    t.compile_fail("fail/*.rs");
}
