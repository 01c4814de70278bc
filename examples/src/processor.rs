//! A stub payment processor that honours the caller's reference as its own idempotency key (as
//! Stripe, Adyen and others do) and counts the charges it really makes.
//!
//! For tests it also tells when a charge request arrives ([`Processor::entered`]) and, built with
//! [`Processor::gated`], holds every request at the door until the test lets it through
//! ([`Processor::release`]), so a test waits for these events instead of guessing with sleeps.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use rmcp::schemars;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Semaphore};

/// What the processor returns for a charge (its schema is `charge_card`'s `outputSchema`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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

/// What the processor returns for a payout (its schema is `payout`'s `outputSchema`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Payout {
    /// The processor's payout id.
    pub payout_id: String,
    /// Amount in minor units.
    pub amount_cents: u64,
    /// ISO currency.
    pub currency: String,
    /// The idempotency reference the payout was made under.
    pub reference: String,
}

/// The stub processor.
#[derive(Debug)]
pub struct Processor {
    charges: AtomicUsize,
    by_reference: Mutex<HashMap<String, Receipt>>,
    payouts: Mutex<HashMap<String, Payout>>,
    delay: Duration,
    /// How many charge requests have arrived (before the gate and the delay).
    entered: watch::Sender<usize>,
    /// When set, each request waits here for a permit from [`Processor::release`].
    gate: Option<Semaphore>,
}

impl Default for Processor {
    /// An instant processor, never held.
    fn default() -> Self {
        Processor::new(Duration::ZERO)
    }
}

impl Processor {
    /// A processor that takes `delay` per charge (to make concurrent repeats visible by hand).
    pub fn new(delay: Duration) -> Self {
        Processor {
            charges: AtomicUsize::new(0),
            by_reference: Mutex::new(HashMap::new()),
            payouts: Mutex::new(HashMap::new()),
            delay,
            entered: watch::Sender::new(0),
            gate: None,
        }
    }

    /// A processor that holds every charge request until [`Processor::release`] lets it through
    /// (for tests: "the first call is inside the processor" for exactly as long as the test says).
    pub fn gated() -> Self {
        Processor {
            gate: Some(Semaphore::new(0)),
            ..Processor::default()
        }
    }

    /// Charges once per reference: a second request with a known reference returns the first receipt.
    pub async fn charge(&self, reference: &str, amount_cents: u64, currency: &str) -> Receipt {
        self.entered.send_modify(|n| *n += 1);
        if let Some(gate) = &self.gate {
            // The semaphore is never closed, so this only waits for a permit.
            if let Ok(permit) = gate.acquire().await {
                permit.forget();
            }
        }
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
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

    /// Pays out once per reference, taking ten times a charge's delay (a long job): a second
    /// request with a known reference returns the first payout.
    pub async fn payout(&self, reference: &str, amount_cents: u64, currency: &str) -> Payout {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay * 10).await;
        }
        let mut known = self.payouts.lock().unwrap_or_else(|p| p.into_inner());
        let n = known.len() + 1;
        known
            .entry(reference.to_owned())
            .or_insert_with(|| Payout {
                payout_id: format!("po_{n:06}"),
                amount_cents,
                currency: currency.to_owned(),
                reference: reference.to_owned(),
            })
            .clone()
    }

    /// How many payouts were really made.
    pub fn payouts(&self) -> usize {
        self.payouts.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Waits until at least `n` charge requests have arrived (held or not). A request arrives
    /// after the idempotency wrapper claimed its key, so this is also "the call has claimed".
    pub async fn entered(&self, n: usize) {
        let mut seen = self.entered.subscribe();
        // The sender lives in `self`, so the channel cannot close while we borrow it.
        let _ = seen.wait_for(|count| *count >= n).await;
    }

    /// Lets `n` held charge requests through (of a [`Processor::gated`] processor; no effect on
    /// one that is not gated).
    pub fn release(&self, n: usize) {
        if let Some(gate) = &self.gate {
            gate.add_permits(n);
        }
    }

    /// The charge made under `reference`, if any: what a reconciler asks after a crash
    /// (`GET /charges?idempotency_key=…` at a real processor).
    pub fn find(&self, reference: &str) -> Option<Receipt> {
        let known = self.by_reference.lock().unwrap_or_else(|p| p.into_inner());
        known.get(reference).cloned()
    }

    /// How many charges were really made.
    pub fn charges(&self) -> usize {
        self.charges.load(Ordering::SeqCst)
    }
}
