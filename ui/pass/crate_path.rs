//! `crate = "..."`: an absolute path, and a name brought in with `use` (as a renamed dependency
//! would be), also inside the generated descriptor module.

use idem::store::MemoryStore;
use idem::{idempotent, Caller, Error, Idempotency, IdempotencyContext};
use idempotency as idem;

struct Ctx(Idempotency);

impl IdempotencyContext for Ctx {
    fn idempotency(&self) -> &Idempotency {
        &self.0
    }
    fn caller(&self, _: &()) -> Result<Caller, Error> {
        Ok(Caller::new("acme", "alice"))
    }
}

#[idempotent(crate = "idem", on_error = "retryable")]
async fn relative(ctx: &Ctx, amount: u64) -> Result<u64, Error> {
    let _ = ctx;
    Ok(amount)
}

#[idempotent(crate = "::idempotency", on_error = "retryable")]
async fn absolute(ctx: &Ctx, amount: u64) -> Result<u64, Error> {
    let _ = ctx;
    Ok(amount)
}

impl Ctx {
    #[idempotent(crate = "idem", on_error = "retryable")]
    async fn method(&self, amount: u64) -> Result<u64, Error> {
        Ok(amount)
    }
}

#[tokio::main]
pub(crate) async fn main() {
    let ctx = Ctx(Idempotency::new(MemoryStore::new()));
    assert_eq!(relative(&ctx, 1).await.ok(), Some(1));
    assert_eq!(absolute(&ctx, 2).await.ok(), Some(2));
    assert_eq!(ctx.method(3).await.ok(), Some(3));
    assert_eq!(
        [
            relative::TOOL.name(),
            absolute::TOOL.name(),
            Ctx::METHOD_TOOL.name()
        ],
        ["relative", "absolute", "method"]
    );
}
