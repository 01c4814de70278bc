//! Bad durations are reported at the string, with the valid forms.
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

#[idempotent(window = "15x", on_error = "retryable")]
async fn unknown_unit(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

#[idempotent(window = "0s", on_error = "retryable")]
async fn zero(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

#[idempotent(timeout = "99999999999999999999d", on_error = "retryable")]
async fn overflow(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

#[idempotent(window = "", timeout = "30", on_error = "retryable")]
async fn empty_and_unitless(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

fn main() {}
