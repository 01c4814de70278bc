//! Generic functions and `impl Trait` arguments are rejected.
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
async fn generic<A: Serialize + Send>(ctx: &Ctx, args: A) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

#[idempotent(on_error = "retryable")]
async fn impl_trait(ctx: &Ctx, args: impl Serialize + Send) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

fn main() {}
