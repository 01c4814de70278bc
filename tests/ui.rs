//! Compile-time behaviour of `#[idempotent]` and `#[idempotent_tools]`: what compiles, and the
//! message and span of every rejection (`TRYBUILD=overwrite` re-blesses; read the diff).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
    t.compile_fail("ui/fail/*.rs");
}
