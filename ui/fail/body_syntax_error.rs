//! A syntax error in the body is rustc's own, at the bad token: the macro keeps the body as
//! tokens and does not replace the error with its own.
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
    amount: u64,
}

#[idempotent(on_error = "retryable")]
async fn charge(ctx: &Ctx, args: Args) -> Result<u64, Error> {
    let _ = ctx;
    let amount = args.amount +;
    Ok(amount)
}

fn main() {}
