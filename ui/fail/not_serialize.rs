//! Arguments that are not `Serialize`: rustc reports it at the argument type.
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
    order_id: String,
}

struct Plain {
    amount: u64,
}

#[idempotent(on_error = "retryable")]
async fn charge(ctx: &Ctx, args: Plain) -> Result<u64, Error> {
    let _ = ctx;
    Ok(args.amount)
}

fn main() {}
