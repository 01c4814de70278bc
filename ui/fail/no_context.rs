//! No context parameter and no `&self`.
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
async fn charge(args: Args) -> Result<u8, Error> {
    let _ = args;
    Ok(1)
}

#[idempotent(on_error = "retryable", context = "ctx")]
async fn named(context: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (context, args);
    Ok(1)
}

fn main() {}
