//! The example merchant's stub payment processor. It takes the operation's reference as its own
//! idempotency key (a second charge under a known reference returns the first one), and prints
//! one line per charge it really makes on stderr, `charged <order id> ref=<reference>`, so a test
//! counts the effects at the far side.
//!
//! Two switches let a test drive it without sleeping:
//!
//! - `ACP_PROCESSOR_GATE=1`: every charge prints `processor holding ref=<reference>` and waits
//!   until `POST /_processor/release` (a route mounted only then) lets one through: a call is "in
//!   flight" for exactly as long as the test says.
//! - `ACP_PROCESSOR_FAILURES=N`: the first `N` charges fail as "unavailable" (printing
//!   `processor unavailable ref=<reference>`) before charging anything: the merchant answers
//!   `503`, which the idempotency layer never stores, so a retry runs again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use tokio::sync::Semaphore;

/// A charge the processor made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Charge {
    /// The merchant's order this charge pays for (`ord_…`).
    pub order_id: String,
    /// The idempotency reference it was made under.
    pub reference: String,
    /// Amount in minor units.
    pub amount: i64,
}

/// The processor could not be reached; nothing was charged.
#[derive(Debug, thiserror::Error)]
#[error("the payment processor is unavailable; nothing was charged")]
pub struct Unavailable;

/// The stub processor.
#[derive(Debug, Default)]
pub struct Processor {
    by_reference: Mutex<HashMap<String, Charge>>,
    orders: AtomicU64,
    failures: AtomicUsize,
    gate: Option<Semaphore>,
}

impl Processor {
    /// A processor configured by `ACP_PROCESSOR_GATE` and `ACP_PROCESSOR_FAILURES` (above).
    pub fn from_env() -> Result<Processor, String> {
        let failures = match std::env::var("ACP_PROCESSOR_FAILURES") {
            Ok(n) => n.trim().parse().map_err(|_| {
                format!("ACP_PROCESSOR_FAILURES={n:?} is not a count: give a whole number, e.g. 1")
            })?,
            Err(_) => 0,
        };
        let gate = match std::env::var("ACP_PROCESSOR_GATE").as_deref() {
            Ok("1") => Some(Semaphore::new(0)),
            Ok("0") | Err(_) => None,
            Ok(other) => {
                return Err(format!(
                    "ACP_PROCESSOR_GATE={other:?}: give 1 (hold every charge until POST /_processor/release) or 0"
                ))
            }
        };
        Ok(Processor {
            failures: AtomicUsize::new(failures),
            gate,
            ..Processor::default()
        })
    }

    /// Whether charges wait for [`Processor::release`].
    pub fn gated(&self) -> bool {
        self.gate.is_some()
    }

    /// Lets `n` held charges through.
    pub fn release(&self, n: usize) {
        if let Some(gate) = &self.gate {
            gate.add_permits(n);
        }
    }

    /// Charges `amount` for a new order once per `reference`.
    pub async fn charge(&self, reference: &str, amount: i64) -> Result<Charge, Unavailable> {
        if let Some(known) = self.find(reference) {
            return Ok(known);
        }
        if let Some(gate) = &self.gate {
            eprintln!("processor holding ref={reference}");
            // The semaphore is never closed: this only waits for a permit.
            if let Ok(permit) = gate.acquire().await {
                permit.forget();
            }
        }
        let failing = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            eprintln!("processor unavailable ref={reference}");
            return Err(Unavailable);
        }
        let mut known = self.by_reference.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(charge) = known.get(reference) {
            return Ok(charge.clone());
        }
        let n = self.orders.fetch_add(1, Ordering::SeqCst) + 1;
        let charge = Charge {
            order_id: format!("ord_{:x}_{n}", std::process::id()),
            reference: reference.to_owned(),
            amount,
        };
        eprintln!("charged {} ref={reference}", charge.order_id);
        known.insert(reference.to_owned(), charge.clone());
        Ok(charge)
    }

    /// The charge made under `reference`, if any.
    pub fn find(&self, reference: &str) -> Option<Charge> {
        let known = self.by_reference.lock().unwrap_or_else(|p| p.into_inner());
        known.get(reference).cloned()
    }
}
