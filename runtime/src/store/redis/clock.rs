//! The server's clock, followed in this process: a claim written without a script (see
//! `claim.rs`) carries its times on the Redis server's clock without asking for `TIME` on each
//! call.
//!
//! A `TIME` answer read between two instants of this machine's monotonic clock bounds the
//! server's time at every later instant: no earlier than the answer plus the time since it came
//! back, no later than the answer (plus its sub-millisecond part) plus the time since it was
//! sent. A reading is used for [`FRESH`] and then taken again, so the bounds stay within the
//! round trip of the reading and a drift of the two clocks of at most 0.1% of that time. The
//! wall clock of this machine is never read: a step of it changes nothing. A step of the
//! server's clock is seen at the next reading, within [`FRESH`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::conn::{array, bad, int, Script};
use super::{RedisConnection, SHARDS};
use crate::store::StoreError;

/// How long a reading of the server's clock is used.
pub(super) const FRESH: Duration = Duration::from_secs(2);

/// The last reading of the server's clock: one for a single server; on a cluster, one per
/// shard, each read on the master that holds the shard (the masters' clocks may disagree, and
/// a shard's scripts read their master's).
pub(super) struct ServerClock {
    slots: Vec<Slot>,
    /// The script that reads a shard's master's clock on a cluster (`TIME` has no key to route
    /// by).
    time: Script,
}

/// One server's (or shard master's) last reading, and whether a new one is under way (see
/// [`ServerClock::now_or_read`]).
#[derive(Default)]
struct Slot {
    last: Mutex<Option<Reading>>,
    reading: AtomicBool,
}

#[derive(Clone, Copy)]
struct Reading {
    /// The server's time in ms (its `TIME`, microseconds cut).
    server_ms: i64,
    sent: Instant,
    answered: Instant,
}

/// A shard and the key a script routes by to the master that holds it (on a single server the
/// key is not used).
#[derive(Clone, Copy, Debug)]
pub(super) struct Route<'a> {
    pub shard: usize,
    pub key: &'a str,
}

/// The server's time now, as bounds in ms: `early` ≤ the server's clock ≤ `late`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Now {
    pub early: i64,
    pub late: i64,
}

fn ms_floor(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

impl Reading {
    /// Whether the reading may still be used at `at`.
    fn fresh(&self, at: Instant) -> bool {
        at.saturating_duration_since(self.sent) < FRESH
    }

    fn now(&self, at: Instant) -> Now {
        let since_answer = at.saturating_duration_since(self.answered);
        let since_sent = at.saturating_duration_since(self.sent);
        // A thousandth of the time since the reading for the two clocks' drift, rounded up,
        // and 1 ms for the microseconds `server_ms` dropped and for rounding `since_sent` up.
        let drift = ms_floor(since_sent) / 1000 + 1;
        Now {
            early: self.server_ms + ms_floor(since_answer) - drift,
            late: self.server_ms + ms_floor(since_sent) + 1 + drift,
        }
    }
}

impl ServerClock {
    /// A follower of one server's clock, or of each shard's master's on a cluster.
    pub(super) fn new(cluster: bool) -> Self {
        let n = if cluster { SHARDS } else { 1 };
        ServerClock {
            slots: (0..n).map(|_| Slot::default()).collect(),
            time: Script::new("return redis.call('TIME')"),
        }
    }

    fn slot(&self, shard: usize) -> &Slot {
        &self.slots[shard % self.slots.len()]
    }

    /// The server's time now for `shard` from a fresh reading, without starting one.
    #[cfg(test)]
    fn now(&self, shard: usize) -> Option<Now> {
        let at = Instant::now();
        self.last(shard).filter(|r| r.fresh(at)).map(|r| r.now(at))
    }

    fn last(&self, shard: usize) -> Option<Reading> {
        *self
            .slot(shard)
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the clock of the server holding the route's shard (`TIME`; on a cluster, a script
    /// on the route's key) and keeps the reading.
    pub(super) async fn read(
        &self,
        conn: &RedisConnection,
        route: Route<'_>,
    ) -> Result<(), StoreError> {
        let sent = Instant::now();
        let reply = if self.slots.len() == 1 {
            conn.query(&redis::cmd("TIME")).await?
        } else {
            conn.run(&self.time, &[route.key], &[], None).await?.0
        };
        let answered = Instant::now();
        let mut parts = array(reply)?.into_iter();
        let (Some(secs), Some(micros)) = (parts.next(), parts.next()) else {
            return Err(bad("TIME answered fewer than two numbers"));
        };
        let micros = int(&micros)?;
        let server_ms = int(&secs)?
            .checked_mul(1000)
            .and_then(|s| s.checked_add(micros / 1000))
            .ok_or_else(|| bad("TIME answered a time out of range"))?;
        *self
            .slot(route.shard)
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Reading {
            server_ms,
            sent,
            answered,
        });
        Ok(())
    }

    /// The server's time now for the route's shard from a fresh reading, or `None`. A reading
    /// older than half of [`FRESH`] (or none) starts a new one in the background (one at a time
    /// per slot), so a call never waits for one, and calls that come at least twice in
    /// [`FRESH`] always find one.
    pub(super) fn now_or_read(
        self: &Arc<Self>,
        conn: &RedisConnection,
        route: Route<'_>,
    ) -> Option<Now> {
        let reading = self.last(route.shard);
        let at = Instant::now();
        let age = reading.map(|r| at.saturating_duration_since(r.sent));
        if age.is_none_or(|age| age >= FRESH / 2) {
            self.read_in_background(conn, route);
        }
        reading.filter(|r| r.fresh(at)).map(|r| r.now(at))
    }

    /// The earliest the server's clock can read now for the route's shard: from the followed
    /// reading, or from a new one read now when there is none fresh.
    pub(super) async fn early(
        self: &Arc<Self>,
        conn: &RedisConnection,
        route: Route<'_>,
    ) -> Result<i64, StoreError> {
        if let Some(now) = self.now_or_read(conn, route) {
            return Ok(now.early);
        }
        self.read(conn, route).await?;
        self.now_or_read(conn, route)
            .map(|now| now.early)
            .ok_or_else(|| bad("the server's clock reading was not kept"))
    }

    fn read_in_background(self: &Arc<Self>, conn: &RedisConnection, route: Route<'_>) {
        let Route { shard, key } = route;
        let flag = &self.slot(shard).reading;
        if flag.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let (clock, conn, key) = (Arc::clone(self), conn.clone(), key.to_owned());
                runtime.spawn(async move {
                    // A failed reading changes nothing: the next call starts another.
                    let _ = clock.read(&conn, Route { shard, key: &key }).await;
                    clock.slot(shard).reading.store(false, Ordering::Release);
                });
            }
            Err(_) => flag.store(false, Ordering::Release),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bounds_hold_the_servers_time_and_widen_with_the_round_trip() {
        let sent = Instant::now();
        let answered = sent + Duration::from_micros(300);
        let r = Reading {
            server_ms: 1_000_000,
            sent,
            answered,
        };
        // At the answer: the server read its clock in [sent, answered], so it is now in
        // [1_000_000, 1_000_000 + 1 ms) plus up to 300 µs.
        let now = r.now(answered);
        assert!(now.early <= 1_000_000 && now.late >= 1_000_001, "{now:?}");
        // Half a second later, both bounds moved by half a second; still under 4 ms apart.
        let later = r.now(answered + Duration::from_millis(500));
        assert!(
            later.early <= 1_000_500 && later.late >= 1_000_501,
            "{later:?}"
        );
        assert!(later.late - later.early <= 4, "{later:?}");
    }

    #[test]
    fn a_reading_older_than_fresh_is_not_used() {
        let clock = ServerClock::new(false);
        assert_eq!(clock.now(0), None);
        let Some(sent) = Instant::now().checked_sub(FRESH + Duration::from_millis(1)) else {
            return;
        };
        *clock
            .slot(0)
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Reading {
            server_ms: 5,
            sent,
            answered: sent,
        });
        assert_eq!(clock.now(0), None);
    }
}
