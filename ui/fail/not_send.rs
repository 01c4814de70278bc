//! The body runs on the engine's task machinery: it must be `Send`.
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

#[idempotent(on_error = "retryable")]
async fn not_send(ctx: &Ctx, args: Args) -> Result<u64, Error> {
    let _ = ctx;
    let held = std::rc::Rc::new(args.amount);
    tokio::task::yield_now().await;
    Ok(*held)
}

fn main() {}
