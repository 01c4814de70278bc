//! `missing_key`, `scope` and `ignore` together.
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
    sent_at: u64,
}

#[idempotent(business_key = "order_id", missing_key = "call_key", scope = "subject", ignore = "sent_at", on_error = "retryable")]
async fn ship(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

#[idempotent(business_key = "order_id", missing_key = "refuse", on_error = "retryable")]
async fn refuse_missing(ctx: &Ctx, args: Args) -> Result<u8, Error> {
    let _ = (ctx, args);
    Ok(1)
}

pub(crate) fn main() {
    assert_eq!(ship::TOOL.ignored(), &["sent_at"]);
}
