//! What the engine's helpers (an attempt, its drop guard, a waiting repeat) need of it: the
//! store, the clock and the lease, and nothing else of the engine.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::store::Store;

/// The store, clock and lease every call of an engine shares. Cheap to clone.
#[derive(Clone)]
pub(super) struct Core {
    pub(super) store: Arc<dyn Store>,
    pub(super) clock: Arc<dyn Clock>,
    /// How long a claim's lease lasts unless renewed.
    pub(super) lease: Duration,
}
