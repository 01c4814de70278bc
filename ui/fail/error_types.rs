//! The handler's types: `E` must carry the wrapper's answers (`From<idempotency::Error>`) and
//! display; `T` must be stored and replayed (`Serialize + DeserializeOwned`).
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
    amount: u64,
}

#[derive(Debug)]
struct Bare;

#[idempotent(on_error = "retryable")]
async fn no_from(ctx: &Ctx, args: Args) -> Result<u64, Bare> {
    let _ = ctx;
    Ok(args.amount)
}

struct Receipt;

#[idempotent(on_error = "retryable")]
async fn unstorable(ctx: &Ctx, args: Args) -> Result<Receipt, Error> {
    let _ = (ctx, args.amount);
    Ok(Receipt)
}

fn main() {}
