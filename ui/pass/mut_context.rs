//! `ctx: &mut Ctx`: the engine and the caller are read through a shared reborrow before the body
//! runs, so the body has the context to itself, mutably.

use idempotency::store::MemoryStore;
use idempotency::{idempotent, Caller, Error, Idempotency, IdempotencyContext};
use serde::Serialize;

struct Ctx {
    engine: Idempotency,
    runs: u64,
}

impl IdempotencyContext for Ctx {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
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
async fn count(ctx: &mut Ctx, args: Args) -> Result<u64, Error> {
    ctx.runs += 1;
    Ok(args.amount + ctx.runs)
}

#[tokio::main]
pub(crate) async fn main() {
    let mut ctx = Ctx {
        engine: Idempotency::new(MemoryStore::new()),
        runs: 0,
    };
    assert_eq!(count(&mut ctx, Args { amount: 10 }).await.ok(), Some(11));
    // A repeat is answered from the record: the body does not run again.
    assert_eq!(count(&mut ctx, Args { amount: 10 }).await.ok(), Some(11));
    assert_eq!(ctx.runs, 1);
}
