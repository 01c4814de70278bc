//! The generated locals are hygienic: parameters and body locals that happen to use the macro's
//! `__idem_` names are the user's own, and the body sees its parameters as written.

use idempotency::store::MemoryStore;
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
async fn charge(__idem_engine: &Ctx, __idem_args: Args) -> Result<u64, Error> {
    let Ctx(_) = __idem_engine;
    let __idem_caller = __idem_args.amount;
    let __idem_prepared = __idem_caller + 1;
    Ok(__idem_prepared)
}

#[idempotent(on_error = "retryable", business_key = "amount")]
async fn destructured(ctx: &Ctx, Args { amount }: Args) -> Result<u64, Error> {
    let Ctx(_) = ctx;
    Ok(amount)
}

#[tokio::main]
pub(crate) async fn main() {
    let ctx = Ctx(Idempotency::new(MemoryStore::new()));
    assert_eq!(charge(&ctx, Args { amount: 1 }).await.ok(), Some(2));
    assert_eq!(destructured(&ctx, Args { amount: 3 }).await.ok(), Some(3));
}
