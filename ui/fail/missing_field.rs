//! A business key naming a field the arguments lack: rustc reports it at the string (followed by the
//! business-key check, which cannot tell a missing field from an `Option` one).
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

#[idempotent(business_key = "order_idx", on_error = "retryable")]
async fn by_field(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

#[idempotent(business_key = ["order_id", "order.id"], on_error = "retryable")]
async fn nested(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

fn main() {}
