//! A stub payment processor that honours the caller's reference as its own idempotency key (as
//! Stripe, Adyen and others do) and counts the charges it really makes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What the processor returns for a charge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The processor's charge id.
    pub charge_id: String,
    /// Amount in minor units.
    pub amount_cents: u64,
    /// ISO currency.
    pub currency: String,
    /// The idempotency reference the charge was made under.
    pub reference: String,
}

/// The stub processor.
#[derive(Debug, Default)]
pub struct Processor {
    charges: AtomicUsize,
    by_reference: Mutex<HashMap<String, Receipt>>,
    delay: Duration,
}

impl Processor {
    /// A processor that takes `delay` per charge (to make concurrent repeats visible).
    pub fn new(delay: Duration) -> Self {
        Processor {
            delay,
            ..Default::default()
        }
    }

    /// Charges once per reference: a second request with a known reference returns the first receipt.
    pub async fn charge(&self, reference: &str, amount_cents: u64, currency: &str) -> Receipt {
        tokio::time::sleep(self.delay).await;
        let mut known = self.by_reference.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = known.get(reference) {
            return r.clone();
        }
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        let receipt = Receipt {
            charge_id: format!("ch_{n:06}"),
            amount_cents,
            currency: currency.to_owned(),
            reference: reference.to_owned(),
        };
        known.insert(reference.to_owned(), receipt.clone());
        receipt
    }

    /// How many charges were really made.
    pub fn charges(&self) -> usize {
        self.charges.load(Ordering::SeqCst)
    }
}
