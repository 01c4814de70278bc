//! An error type without `Classify` and without `on_error`.
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

#[derive(Debug, thiserror::Error, Serialize, serde::Deserialize)]
#[error("declined")]
struct Declined;

impl From<Error> for Declined {
    fn from(_: Error) -> Self {
        Declined
    }
}

#[idempotent]
async fn charge(ctx: &Ctx, args: Args) -> Result<u8, Declined> {
    let _ = (ctx, args);
    Ok(1)
}

fn main() {}
