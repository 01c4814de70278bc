//! The engine's local cache of completed answers. A completed answer is immutable until its
//! record's window ends, so each process keeps the ones it recorded recently and replays them
//! with no store round trip.
//!
//! What it never does:
//! - serve an answer after its record's window ended on the clock the store ends windows by
//!   ([`WindowClock`]): on the engine's clock, the exact instant the store uses; on a store's own
//!   clock, this process's monotonic clock from before the completion was sent, less 0.1% (twice
//!   the most NTP slews a clock), so the store's window ends no earlier in real time;
//! - serve another caller: entries are found by the call's key, which already separates
//!   tenants, subjects (for subject-scoped tools), tools and arguments;
//! - serve a business-key call whose full arguments differ (its fingerprint is compared; the
//!   store then answers "mismatch");
//! - hold a call in flight or unknown: only answers this engine recorded are kept;
//! - grow without bound: at most `entries` answers, each at most `max_answer` bytes of JSON
//!   (a larger one is not kept), the oldest going first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::clock::Timestamp;
use crate::key::{Fingerprint, Key, Reference};
use crate::record::StoredResponse;
use crate::store::WindowClock;

/// Shards of the cache, each behind its own lock, so that concurrent calls rarely meet.
const SHARDS: usize = 16;

/// How much shorter than the window an entry ended by this process's monotonic clock lives:
/// 1/1000 of it (1,000 ppm, twice the 500 ppm NTP slews a clock at most).
const SLEW: u32 = 1_000;

/// The cache (shared by an engine's clones).
pub(crate) struct AnswerCache {
    shards: Box<[Mutex<Shard>]>,
    /// Entries per shard.
    per_shard: usize,
    max_answer: usize,
}

#[derive(Default)]
struct Shard {
    entries: HashMap<Key, Entry>,
    /// Keys in the order they were put, with the number each was put under (a key put again
    /// later is found here twice; only its newest number evicts it).
    order: VecDeque<(Key, u64)>,
    next: u64,
}

struct Entry {
    reference: Reference,
    response: Arc<StoredResponse>,
    fingerprint: Option<Fingerprint>,
    until: Until,
    number: u64,
}

/// When an entry stops being served.
#[derive(Clone, Copy, Debug)]
pub(super) enum Until {
    /// On the engine's clock: served while `now < at`.
    Engine(Timestamp),
    /// On this process's monotonic clock.
    Local(tokio::time::Instant),
}

impl Until {
    /// The end of a record `completed` now with `window`, for a store that ends windows by
    /// `clock`. `None`: nothing may be kept for this store.
    pub(super) fn of(clock: WindowClock, window: Duration, completed: Completed) -> Option<Until> {
        match clock {
            WindowClock::Engine => Some(Until::Engine(completed.at.saturating_add(window))),
            WindowClock::Own => Some(Until::Local(completed.sent + (window - window / SLEW))),
            _ => None,
        }
    }

    fn passed(self, now: Timestamp) -> bool {
        match self {
            Until::Engine(at) => now >= at,
            Until::Local(at) => tokio::time::Instant::now() >= at,
        }
    }
}

/// What a claimed call keeps of its answer once recorded.
pub(super) struct Keep {
    pub(super) cache: Arc<AnswerCache>,
    /// The clock the store ends windows by.
    pub(super) clock: WindowClock,
    /// The call's full arguments' fingerprint (business keys).
    pub(super) fingerprint: Option<Fingerprint>,
    pub(super) tool: &'static str,
    /// The record's window.
    pub(super) window: Duration,
}

/// When an answer was recorded: the engine's time its completion carried, and this process's
/// monotonic instant before the completion was sent.
#[derive(Clone, Copy, Debug)]
pub(super) struct Completed {
    pub(super) at: Timestamp,
    pub(super) sent: tokio::time::Instant,
}

/// An answer the cache keeps for a key.
pub(super) struct Answer {
    pub(super) reference: Reference,
    pub(super) response: StoredResponse,
    /// The fingerprint of the arguments it answered (business keys).
    pub(super) fingerprint: Option<Fingerprint>,
}

impl Keep {
    /// Keeps `response`, just recorded for `key` under `reference` by a completion made
    /// `completed`, for the record's window.
    pub(super) fn put(
        &self,
        key: Key,
        reference: Reference,
        response: StoredResponse,
        completed: Completed,
    ) {
        let Some(until) = Until::of(self.clock, self.window, completed) else {
            return;
        };
        let answer = Answer {
            reference,
            response,
            fingerprint: self.fingerprint,
        };
        let evicted = self.cache.put(key, answer, until);
        if evicted > 0 {
            crate::metrics::cache_evicted(self.tool, evicted);
        }
    }
}

/// What a lookup found.
pub(super) enum Found {
    /// The answer to replay.
    Hit(Reference, Arc<StoredResponse>),
    /// Nothing to serve: ask the store.
    Miss,
}

impl AnswerCache {
    /// A cache of at most `entries` answers of at most `max_answer` bytes each; `None` when
    /// `entries` is 0 (off).
    pub(super) fn new(entries: usize, max_answer: usize) -> Option<Self> {
        if entries == 0 {
            return None;
        }
        let shards = SHARDS.min(entries);
        Some(AnswerCache {
            shards: (0..shards).map(|_| Mutex::default()).collect(),
            per_shard: entries.div_ceil(shards),
            max_answer,
        })
    }

    fn shard(&self, key: &Key) -> &Mutex<Shard> {
        let b = key.as_bytes();
        let n = usize::from(b[0]) | usize::from(b[1]) << 8;
        &self.shards[n % self.shards.len()]
    }

    /// The answer kept for `key` if it may be served now to a call with `fingerprint`.
    pub(super) fn get(&self, key: &Key, fingerprint: Option<Fingerprint>, now: Timestamp) -> Found {
        let mut shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(entry) = shard.entries.get(key) else {
            return Found::Miss;
        };
        if entry.until.passed(now) {
            shard.entries.remove(key);
            return Found::Miss;
        }
        if entry.fingerprint != fingerprint {
            return Found::Miss;
        }
        Found::Hit(entry.reference, entry.response.clone())
    }

    /// Keeps `answer`, the answer recorded for `key`, until `until`. Returns how many entries
    /// went to make room (0 or 1); an answer over the size limit is not kept.
    pub(super) fn put(&self, key: Key, answer: Answer, until: Until) -> u64 {
        let Answer {
            reference,
            response,
            fingerprint,
        } = answer;
        if response.body.len() > self.max_answer {
            return 0;
        }
        let response = Arc::new(response);
        let mut shard = self
            .shard(&key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let number = shard.next;
        shard.next += 1;
        shard.entries.insert(
            key,
            Entry {
                reference,
                response,
                fingerprint,
                until,
                number,
            },
        );
        shard.order.push_back((key, number));
        let mut evicted = 0;
        while shard.entries.len() > self.per_shard {
            let Some((old, n)) = shard.order.pop_front() else {
                break;
            };
            if shard.entries.get(&old).is_some_and(|e| e.number == n) {
                shard.entries.remove(&old);
                evicted += 1;
            }
        }
        // Keys put again, or expired and removed, leave stale numbers behind: drop them
        // once they outnumber the entries.
        if shard.order.len() > 2 * self.per_shard.max(1) {
            let Shard { entries, order, .. } = &mut *shard;
            order.retain(|(k, n)| entries.get(k).is_some_and(|e| e.number == *n));
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> Key {
        Key::from_bytes([n; 32])
    }

    fn answer(body: &str) -> StoredResponse {
        StoredResponse {
            ok: true,
            body: body.into(),
        }
    }

    fn kept(reference: Reference, body: &str, fingerprint: Option<Fingerprint>) -> Answer {
        Answer {
            reference,
            response: answer(body),
            fingerprint,
        }
    }

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn hit(f: Found) -> Option<String> {
        match f {
            Found::Hit(_, r) => Some(r.body.clone()),
            Found::Miss => None,
        }
    }

    #[test]
    fn engine_clock_entries_end_exactly_at_the_window() {
        let cache = AnswerCache::new(8, 1024).unwrap();
        let completed = Completed {
            at: at(1_000),
            sent: tokio::time::Instant::now(),
        };
        let until = Until::of(WindowClock::Engine, Duration::from_secs(10), completed).unwrap();
        cache.put(key(1), kept(key(1).reference(1), "1", None), until);
        assert_eq!(
            hit(cache.get(&key(1), None, at(10_999))).as_deref(),
            Some("1")
        );
        assert!(hit(cache.get(&key(1), None, at(11_000))).is_none());
        // Gone once seen expired.
        assert!(hit(cache.get(&key(1), None, at(0))).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn own_clock_entries_end_before_the_window_by_the_slew_margin() {
        let cache = AnswerCache::new(8, 1024).unwrap();
        let completed = Completed {
            at: at(0),
            sent: tokio::time::Instant::now(),
        };
        let until = Until::of(WindowClock::Own, Duration::from_secs(1_000), completed).unwrap();
        cache.put(key(1), kept(key(1).reference(1), "1", None), until);
        tokio::time::advance(Duration::from_millis(998_999)).await;
        assert!(hit(cache.get(&key(1), None, at(0))).is_some());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(hit(cache.get(&key(1), None, at(0))).is_none());
        assert!(Until::of(WindowClock::Unknown, Duration::from_secs(1), completed).is_none());
    }

    #[test]
    fn fingerprints_must_match() {
        let cache = AnswerCache::new(8, 1024).unwrap();
        let f = Fingerprint::from_slice(&[7; 32]);
        let until = Until::Engine(at(100));
        cache.put(key(1), kept(key(1).reference(1), "1", f), until);
        assert!(hit(cache.get(&key(1), f, at(0))).is_some());
        assert!(hit(cache.get(&key(1), None, at(0))).is_none());
        assert!(hit(cache.get(&key(1), Fingerprint::from_slice(&[8; 32]), at(0))).is_none());
    }

    #[test]
    fn bounded_by_entries_and_answer_size() {
        let cache = AnswerCache::new(16, 4).unwrap();
        let until = Until::Engine(at(100));
        assert_eq!(
            cache.put(key(0), kept(key(0).reference(1), "12345", None), until),
            0
        );
        assert!(hit(cache.get(&key(0), None, at(0))).is_none(), "too large");
        let mut evicted = 0;
        for n in 0..=255u8 {
            evicted += cache.put(key(n), kept(key(n).reference(1), "1", None), until);
        }
        let kept = (0..=255u8)
            .filter(|n| hit(cache.get(&key(*n), None, at(0))).is_some())
            .count();
        assert_eq!(kept, 16);
        assert_eq!(evicted, 256 - 16);
        // The newest of each shard stayed (keys 0..=255 spread over 16 shards by their first byte).
        assert!(hit(cache.get(&key(255), None, at(0))).is_some());
    }

    #[test]
    fn a_key_put_again_keeps_its_newest_answer() {
        let cache = AnswerCache::new(1, 1024).unwrap();
        let until = Until::Engine(at(100));
        cache.put(key(1), kept(key(1).reference(1), "1", None), until);
        cache.put(key(1), kept(key(1).reference(2), "2", None), until);
        assert_eq!(hit(cache.get(&key(1), None, at(0))).as_deref(), Some("2"));
    }
}
