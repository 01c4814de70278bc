//! What is not a function with a body keeps a precise error at the item.
#![allow(dead_code)]
use idempotency::{idempotent, Error};

#[idempotent]
struct Charge;

trait Charger {
    #[idempotent]
    async fn charge(&self, amount: u64) -> Result<u64, Error>;
}

fn main() {}
