//! Compile-time behaviour of `#[idempotent]` and `#[idempotent_tools]`: the message and span of
//! every rejection (`fail/`; `TRYBUILD=overwrite cargo test -p idempotency-ui` re-blesses: read
//! the diff). What must compile and run is `tests/pass.rs`: with no pass case here, trybuild only
//! checks, its dependencies included, and generates no code.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("fail/*.rs");
}
