//! The function must return `Result<T, E>`; and one arguments parameter only.
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

#[idempotent(on_error = "retryable")]
async fn charge(ctx: &Ctx, args: Args) -> u8 {
    let _ = (ctx, args);
    1
}

#[idempotent(on_error = "retryable")]
async fn two_args(ctx: &Ctx, args: Args, more: u8) -> Result<u8, Error> {
    let _ = (ctx, args, more);
    Ok(1)
}

fn main() {}
