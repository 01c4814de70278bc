//! `ignore` globs: `.*` stands only as the last segment of an object's path (`"meta.*"`), and a
//! bare `"*"` (every undeclared argument, a misspelt one too) is refused. Both are reported, each
//! at its own string.
#![allow(dead_code)]
use idempotency::{idempotent, Caller, Error, Idempotency, IdempotencyContext};
use serde::Serialize;

struct Ctx(Idempotency);

impl IdempotencyContext for Ctx {
    fn idempotency(&self) -> &Idempotency {
        &self.0
    }
    fn caller(&self, _: &()) -> Result<Caller, Error> {
        Ok(Caller::new("acme", "alice"))
    }
}

#[derive(Serialize)]
struct Args {
    line: u32,
}

#[idempotent(ignore = ["meta.*", "meta.*.id", "*"], on_error = "retryable")]
async fn globs(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

fn main() {}
