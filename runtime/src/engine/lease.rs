//! A worker's own view of its claim's lease: when it must stop acting, counted on this process's
//! monotonic clock so that no wall clock (this one's or the store's) and no pause can stretch it.
//!
//! The store ends a lease `lease` after it executed the claim or the last renewal, on its own
//! clock. The worker cannot see that clock, but it knows when it *sent* each of them: the store
//! executed it no earlier. So the worker's lease ends [`Lease::MARGIN`] of the lease before
//! `sent + lease` for the last claim or renewal the store accepted, whenever its answer arrived
//! (a renewal answered late extends nothing beyond what its sending allows). Past that instant
//! the body is not polled again: dropped at its next await, it cannot reach the processor after
//! the store's rounds may have decided the call was lost. A pause of the whole process
//! (SIGSTOP, a VM pause) moves the monotonic clock on, so a resumed worker sees its lease passed
//! before its body runs another step.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// One claim's lease as its worker counts it.
#[derive(Debug)]
pub(super) struct Lease {
    /// What every end is counted from.
    base: Instant,
    /// The lease less the margin: how long after a claim or renewal was sent it still holds.
    holds: Duration,
    /// Its end, in nanoseconds after `base`.
    ends: AtomicU64,
}

impl Lease {
    /// The share of the lease a worker gives up at its end: it stops a tenth of the lease (3 s
    /// of the default 30 s) before the store's lease can end, which covers a request to the
    /// processor already on its way when the worker stops.
    pub(super) const MARGIN: u32 = 10;

    /// The lease of a claim (or takeover) sent at `sent`, lasting `lease` on the store.
    pub(super) fn new(sent: Instant, lease: Duration) -> Self {
        let holds = lease.saturating_sub(lease / Self::MARGIN);
        Lease {
            base: sent,
            holds,
            ends: AtomicU64::new(nanos(holds)),
        }
    }

    /// When the worker must stop.
    pub(super) fn ends(&self) -> Instant {
        self.base + Duration::from_nanos(self.ends.load(Ordering::Acquire))
    }

    /// Whether it has passed.
    pub(super) fn passed(&self) -> bool {
        Instant::now() >= self.ends()
    }

    /// A renewal sent at `sent` was accepted by the store. Never moves the end back, and never
    /// revives a lease that already passed: by then the body was stopped.
    pub(super) fn renewed(&self, sent: Instant) {
        if self.passed() {
            return;
        }
        let end = nanos(sent.saturating_duration_since(self.base) + self.holds);
        self.ends.fetch_max(end, Ordering::AcqRel);
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_lease_ends_a_tenth_early_and_only_a_renewal_sent_in_time_extends_it() {
        let sent = Instant::now();
        let lease = Lease::new(sent, Duration::from_secs(30));
        assert_eq!(lease.ends(), sent + Duration::from_secs(27));
        tokio::time::advance(Duration::from_secs(10)).await;
        lease.renewed(Instant::now());
        assert_eq!(lease.ends(), sent + Duration::from_secs(37));
        // An older renewal's answer arriving late moves nothing back.
        lease.renewed(sent + Duration::from_secs(5));
        assert_eq!(lease.ends(), sent + Duration::from_secs(37));
        tokio::time::advance(Duration::from_secs(27)).await;
        assert!(lease.passed());
        // Once passed, a renewal answered now does not revive it.
        lease.renewed(sent + Duration::from_secs(30));
        assert!(lease.passed());
        assert_eq!(lease.ends(), sent + Duration::from_secs(37));
    }
}
