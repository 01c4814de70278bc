//! #[idempotent] wraps an async fn.
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

#[idempotent]
fn charge(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

fn main() {}
