//! `#[idempotent_tools]` on the impl block: a method of a trait impl (its descriptor stays in its
//! body: a trait impl holds only the trait's items) and an associated fn of an inherent impl
//! taking its context as a parameter (its descriptor is an associated const).

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotency::store::MemoryStore;
use idempotency::{idempotent, idempotent_tools, Caller, Error, Idempotency, IdempotencyContext};
use serde::Serialize;

struct Server {
    engine: Idempotency,
    charges: AtomicUsize,
}

impl IdempotencyContext for Server {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, _: &()) -> Result<Caller, Error> {
        Ok(Caller::new("acme", "alice"))
    }
}

#[derive(Serialize)]
struct ChargeArgs {
    amount: u64,
}

trait Charger {
    async fn charge(&self, args: ChargeArgs) -> Result<usize, Error>;
}

#[idempotent_tools]
impl Charger for Server {
    #[idempotent(window = "1h", on_error = "retryable")]
    async fn charge(&self, args: ChargeArgs) -> Result<usize, Error> {
        let _ = args.amount;
        Ok(self.charges.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

#[idempotent_tools]
impl Server {
    #[idempotent(name = "refund_v1", on_error = "retryable")]
    async fn refund(ctx: &Server, args: ChargeArgs) -> Result<usize, Error> {
        let _ = args.amount;
        Ok(ctx.charges.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

#[tokio::main]
pub(crate) async fn main() {
    assert_eq!(Server::REFUND_TOOL.name(), "refund_v1");
    let s = Server {
        engine: Idempotency::new(MemoryStore::new()),
        charges: AtomicUsize::new(0),
    };
    let first = s.charge(ChargeArgs { amount: 5 }).await.ok();
    let again = s.charge(ChargeArgs { amount: 5 }).await.ok();
    assert_eq!((first, again), (Some(1), Some(1)));
    let r1 = Server::refund(&s, ChargeArgs { amount: 5 }).await.ok();
    let r2 = Server::refund(&s, ChargeArgs { amount: 5 }).await.ok();
    assert_eq!((r1, r2), (Some(2), Some(2)));
    assert_eq!(s.charges.load(Ordering::SeqCst), 2);
}
