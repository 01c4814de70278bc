//! A stub shipping carrier: the reference is its idempotency key, so the same reference always gets
//! the same tracking number.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// A label the carrier made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    /// The carrier's tracking number.
    pub tracking_number: String,
    /// The order it ships.
    pub order_id: String,
    /// The reference it was created under.
    pub reference: String,
}

/// The stub carrier.
#[derive(Debug, Default)]
pub struct Carrier {
    labels: AtomicUsize,
    by_reference: Mutex<HashMap<String, Label>>,
}

impl Carrier {
    /// Creates a label once per reference.
    pub fn create_label(&self, reference: &str, order_id: &str) -> Label {
        let mut known = self.by_reference.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = known.get(reference) {
            return l.clone();
        }
        let n = self.labels.fetch_add(1, Ordering::SeqCst) + 1;
        let label = Label {
            tracking_number: format!("1Z{n:010}"),
            order_id: order_id.to_owned(),
            reference: reference.to_owned(),
        };
        known.insert(reference.to_owned(), label.clone());
        label
    }

    /// The label created under `reference`, if any: what a reconciler asks after a crash.
    pub fn find(&self, reference: &str) -> Option<Label> {
        let known = self.by_reference.lock().unwrap_or_else(|p| p.into_inner());
        known.get(reference).cloned()
    }

    /// How many labels were really created.
    pub fn labels(&self) -> usize {
        self.labels.load(Ordering::SeqCst)
    }
}
