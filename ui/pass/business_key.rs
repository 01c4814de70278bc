//! Business keys: one field, a nested field, several fields; `context = "..."` picks the context.

use idempotency::store::MemoryStore;
use idempotency::{idempotent, Caller, Error, Idempotency, IdempotencyContext};
use serde::Serialize;

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

#[derive(Serialize)]
struct Order {
    id: String,
}

#[derive(Serialize)]
struct ShipArgs {
    order_id: String,
    order: Order,
    line: u32,
    pair: (u8, u8),
}

#[idempotent(business_key = "order_id", on_error = "retryable")]
async fn by_field(ctx: &Ctx, args: ShipArgs) -> Result<u32, Error> {
    let _ = ctx;
    Ok(args.line)
}

#[idempotent(business_key = "order.id", on_error = "retryable")]
async fn by_nested_field(ctx: &Ctx, args: ShipArgs) -> Result<u32, Error> {
    let _ = ctx;
    Ok(args.line)
}

#[idempotent(business_key = ["order_id", "line", "pair.1"], on_error = "retryable", context = "ctx")]
async fn by_several(args: &ShipArgs, ctx: &Ctx) -> Result<u32, Error> {
    let _ = ctx;
    Ok(args.line)
}

fn args() -> ShipArgs {
    ShipArgs {
        order_id: "o-1".into(),
        order: Order { id: "o-1".into() },
        line: 1,
        pair: (1, 2),
    }
}

#[tokio::main]
pub(crate) async fn main() {
    let ctx = Ctx {
        engine: Idempotency::new(MemoryStore::new()),
    };
    assert_eq!(by_field(&ctx, args()).await.ok(), Some(1));
    assert_eq!(by_nested_field(&ctx, args()).await.ok(), Some(1));
    assert_eq!(by_several(&args(), &ctx).await.ok(), Some(1));
}
