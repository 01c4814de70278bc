//! An `Option` business-key field without `missing_key`: a compile error at the field's string,
//! naming the two ways to say what a call without it means. `missing_key` without a business key
//! and a field both keyed and ignored are refused too.
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
    order_id: Option<String>,
    line: u32,
    sent_at: u64,
}

#[idempotent(business_key = "order_id", on_error = "retryable")]
async fn optional(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

#[idempotent(business_key = ["line", "order_id"], on_error = "retryable")]
async fn composite(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

#[idempotent(missing_key = "refuse", on_error = "retryable")]
async fn no_business_key(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

#[idempotent(business_key = "line", ignore = ["sent_at", "line"], scope = "team", on_error = "retryable")]
async fn ignored_key(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

fn main() {}
