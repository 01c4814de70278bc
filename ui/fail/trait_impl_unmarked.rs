//! A trait impl without #[idempotent_tools]: rustc refuses the descriptor (see pass/trait_impl.rs).
use idempotency::{idempotent, Caller, Error, Idempotency, IdempotencyContext};
use serde::Serialize;

struct Server {
    engine: Idempotency,
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
    async fn charge(&self, args: ChargeArgs) -> Result<u64, Error>;
}

impl Charger for Server {
    #[idempotent(on_error = "retryable")]
    async fn charge(&self, args: ChargeArgs) -> Result<u64, Error> {
        Ok(args.amount)
    }
}

fn main() {}
