//! `transactional` leaves nothing unknown, so `recover` has nothing to say; and a task outlives
//! the request, which a transaction must not.
#![allow(dead_code)]
use idempotency::{idempotent, Caller, Error, Idempotency, IdempotencyContext};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Args {
    order_id: String,
}

struct Ctx {
    engine: Idempotency,
}

impl IdempotencyContext for Ctx {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, _: &()) -> Result<Caller, Error> {
        Ok(Caller::new("acme", "alice"))
    }
}

#[idempotent(transactional, recover = "rerun", on_error = "retryable")]
async fn place_order(_ctx: &Ctx, args: Args) -> Result<String, Error> {
    Ok(args.order_id)
}

#[idempotent(transactional, task, on_error = "retryable")]
async fn export(_ctx: &Ctx, args: Args) -> Result<String, Error> {
    Ok(args.order_id)
}

#[idempotent(transactional = "yes", on_error = "retryable")]
async fn valued(_ctx: &Ctx, args: Args) -> Result<String, Error> {
    Ok(args.order_id)
}

fn main() {}
