//! [`Wake`]: how a store tells an engine's waiting repeats that a record they wait on may have
//! left flight, when the store can hear of settlements made by other processes
//! ([`RecordStore::watch`](super::RecordStore::watch)).

use std::sync::{Arc, Weak};

use tokio::sync::Notify;

/// A handle on the repeats of one engine waiting on one record. Waking it makes them read the
/// record again; a wake for nothing costs them one read. It does not keep them alive: once they
/// are gone (answered, or their caller left), [`Wake::is_gone`] is true and waking does nothing,
/// so a store may drop it.
#[derive(Clone, Debug)]
pub struct Wake(Weak<Notify>);

impl Wake {
    pub(crate) fn new(notify: &Arc<Notify>) -> Self {
        Wake(Arc::downgrade(notify))
    }

    /// Wakes the waiting repeats, if any are left.
    pub fn wake(&self) {
        if let Some(notify) = self.0.upgrade() {
            notify.notify_waiters();
        }
    }

    /// Whether no repeat waits on this handle any more.
    pub fn is_gone(&self) -> bool {
        self.0.strong_count() == 0
    }
}
