//! A free function: context `&Ctx`, arguments by value, errors classified by `Classify`.

use idempotency::store::MemoryStore;
use idempotency::{
    idempotent, Call, Caller, Classify, Disposition, Error, Idempotency, IdempotencyContext,
};
use serde::{Deserialize, Serialize};

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
struct ChargeArgs {
    amount: u64,
}

#[derive(Serialize, Deserialize)]
struct Receipt {
    amount: u64,
    reference: String,
}

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
enum ChargeError {
    #[error("declined")]
    Declined,
    #[error("{0}")]
    #[serde(skip)]
    Wrapper(#[from] Error),
}

impl Classify for ChargeError {
    fn disposition(&self) -> Disposition {
        Disposition::Definitive
    }
}

/// Doc comments pass through.
#[idempotent(window = "15m")]
pub async fn charge_card(ctx: &Ctx, args: ChargeArgs) -> Result<Receipt, ChargeError> {
    if args.amount == 0 {
        return Err(ChargeError::Declined);
    }
    let reference = Call::current()
        .map(|c| c.reference().to_string())
        .unwrap_or_default();
    let _ = ctx;
    Ok(Receipt {
        amount: args.amount,
        reference,
    })
}

#[tokio::main]
pub(crate) async fn main() {
    assert_eq!(charge_card::TOOL.name(), "charge_card");
    assert_eq!(
        charge_card::TOOL.window(),
        std::time::Duration::from_secs(900)
    );
    let ctx = Ctx {
        engine: Idempotency::new(MemoryStore::new()),
    };
    let first = charge_card(&ctx, ChargeArgs { amount: 42 })
        .await
        .ok()
        .map(|r| (r.amount, r.reference));
    let again = charge_card(&ctx, ChargeArgs { amount: 42 })
        .await
        .ok()
        .map(|r| (r.amount, r.reference));
    assert_eq!(first, again);
    assert!(matches!(
        charge_card(&ctx, ChargeArgs { amount: 0 }).await,
        Err(ChargeError::Declined)
    ));
}
