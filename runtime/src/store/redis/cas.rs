//! Completions and releases by compare-and-set against the string the claim wrote.
//!
//! A record is one string holding the claim's token (see `Record`), so the whole string the
//! claim wrote is the fence: the record is settled only while it is exactly as this process's
//! claim left it — same key, same token, still in flight, no answer, not renewed, taken over
//! or marked as watched since. Both claims (the transaction's `SET … NX GET` and the claim
//! script, which returns the head it wrote) know that string; the store keeps it until the
//! call's completion or release (a bounded map, in this process), so those need no read first
//! and nothing to unpack.
//!
//! One round trip (then `WAIT` on the same connection when writes wait for a replica):
//!
//! - With a conditional `SET` (Valkey ≥ 8.1, Redis ≥ 8.4: `SET key value IFEQ old`), no script:
//!   a transaction, `MULTI`, the `SET … IFEQ … GET PXAT` of the settled record, the `ZADD` of
//!   its index entry into the settled band, `EXEC`. When the `SET` did not apply (the `GET`
//!   shows another string), the `ZADD` did: a script puts the index entry back where the
//!   record's state says.
//! - Without one (Redis 7): `settle.lua`, which compares the string and only then does the
//!   same writes; on a mismatch it writes nothing. It costs the server a fraction of the fenced
//!   script (no unpacking, packing or slicing of the record in Lua).
//!
//! Neither announces the settlement: a repeat waiting on another process marks the record
//! first (`notices.rs`), so its string no longer matches and the fenced script, which
//! announces, settles it. When the compare-and-set did not apply, the call goes to the fenced
//! script, which answers as it always did (not found, fenced, wrong state, or applies). A
//! completion with outbox messages, a call whose claim string this process does not hold
//! (renewed, taken over, claimed elsewhere, or more than `HELD_MAX` calls in flight here) and
//! every other update use the scripts.
//!
//! The completion time is the server's: the claim's time (the server's `TIME`, in the head)
//! plus the monotonic time since its answer came back, so neither this machine's wall clock
//! nor its steps matter.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::Value;

use super::conn::{command, redis_error, Replicas, Script};
use super::record::HEAD;
use super::{Inner, RedisConnection, ShardKeys, StoreError};
use crate::key::Key;
use crate::store::Token;

/// At most this many claim strings are kept; beyond it, completions use the fenced script.
const HELD_MAX: usize = 65_536;
/// When the map is full, claim strings older than this are dropped (at most once per
/// `SWEEP_EVERY`): their calls most likely ended without a completion or release through this
/// store, and should one still come, dropping its string only sends it to the fenced script.
const HELD_STALE: Duration = Duration::from_secs(600);
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// The settled band's offset below lease-end scores (see `fenced.lua`).
const BAND: i64 = 1 << 50;

/// Whether the server has `SET … IFEQ`, and the claim strings of this process's calls (held on
/// every server: without `IFEQ`, `settle.lua` compares them).
pub(super) struct Cas {
    ifeq: AtomicBool,
    held: Mutex<HeldMap>,
    pub(super) reindex: Script,
    settle: Script,
}

/// The claim strings by key and token, and when a full map was last swept.
#[derive(Default)]
struct HeldMap {
    calls: HashMap<([u8; 32], i64), Held>,
    swept: Option<Instant>,
}

/// What a claim wrote, and when its answer came back.
struct Held {
    blob: Vec<u8>,
    answered: Instant,
}

impl std::fmt::Debug for Cas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cas")
            .field("set_ifeq", &self.ifeq.load(Ordering::Relaxed))
            .finish()
    }
}

/// One compare-and-set: the record's keys, the claim's string and the settled one, the
/// settled record's expiry (`PXAT`) and its index score.
struct Swap<'a> {
    k: &'a ShardKeys,
    old: &'a [u8],
    new: &'a [u8],
    expires: i64,
    score: i64,
}

/// A settlement by compare-and-set: the new state, its answer, whether the window follows.
pub(super) struct Settled<'a> {
    pub state: i64,
    pub body: &'a [u8],
    /// A completion (the record is replayed for its window from now); a release ends now.
    pub windowed: bool,
    /// The caller's time, and whether the store trusts it.
    pub now: i64,
    pub trusted: bool,
}

impl Cas {
    /// Asks the server whether it has `SET … IFEQ` (a `SET` of `probe` that cannot apply: the
    /// key is absent).
    pub(super) async fn detect(conn: &RedisConnection, probe: &str) -> Cas {
        let ifeq = conn
            .query(redis::cmd("SET").arg(probe).arg("x").arg("IFEQ").arg("y"))
            .await
            .is_ok();
        Cas {
            ifeq: AtomicBool::new(ifeq),
            held: Mutex::new(HeldMap::default()),
            reindex: Script::new(include_str!("scripts/reindex.lua")),
            settle: Script::new(include_str!("scripts/settle.lua")),
        }
    }

    /// Whether the compare-and-set is a `SET … IFEQ` (else `settle.lua`).
    fn enabled(&self) -> bool {
        self.ifeq.load(Ordering::Relaxed)
    }

    /// Keeps what a claim wrote (head + tail), for its completion or release.
    pub(super) fn hold(&self, key: &Key, token: Token, blob: Vec<u8>) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.calls.len() >= HELD_MAX && held.swept.is_none_or(|t| t.elapsed() >= SWEEP_EVERY) {
            held.calls.retain(|_, h| h.answered.elapsed() < HELD_STALE);
            held.swept = Some(Instant::now());
        }
        if held.calls.len() < HELD_MAX {
            held.calls.insert(
                (*key.as_bytes(), token.0),
                Held {
                    blob,
                    answered: Instant::now(),
                },
            );
        }
    }

    /// Takes what the claim under `token` wrote, if this process holds it.
    fn take(&self, key: &Key, token: Token) -> Option<Held> {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .calls
            .remove(&(*key.as_bytes(), token.0))
    }

    /// Forgets a claim string (its record is changing another way).
    pub(super) fn forget(&self, key: &Key, token: Token) {
        self.take(key, token);
    }
}

impl Inner {
    /// Settles the record by compare-and-set when this process holds its claim string: the
    /// record's generation when it applied, `None` when the caller must use the fenced script
    /// instead (nothing held, or the record is no longer what the claim wrote).
    pub(super) async fn settle_by_cas(
        &self,
        key: Key,
        token: Token,
        s: Settled<'_>,
        wait: Option<Replicas>,
    ) -> Result<Option<u32>, StoreError> {
        let Some(held) = self.cas.take(&key, token) else {
            return Ok(None);
        };
        let old = held.blob;
        let (Some(head), Some(mid)) = (old.get(..HEAD), old.get(HEAD..old.len().saturating_sub(4)))
        else {
            return Ok(None);
        };
        let generation = head
            .get(1..5)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_be_bytes);
        let time = |at: usize| {
            head.get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map_or(0.0, f64::from_be_bytes)
        };
        let (claimed, window) = (time(5) as i64, time(29) as i64);
        let elapsed = i64::try_from(held.answered.elapsed().as_millis()).unwrap_or(i64::MAX / 4);
        // The server's now: the claim's time plus what passed since (its own clock when the
        // store trusts the caller's times, as the script does).
        let now = if s.trusted {
            s.now
        } else {
            claimed.saturating_add(elapsed)
        };
        let at = now.max(claimed);
        let ends = if s.windowed { at + window } else { at };
        // Expiry on the server's real clock: with trusted times, shifted by how far the
        // caller's time is from this machine's (the tests' only use).
        let real_shift = if s.trusted {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4))
                - s.now
        } else {
            0
        };
        let expires = ends + self.retention_ms + real_shift;
        let mut new = Vec::with_capacity(mid.len() + 41 + s.body.len());
        new.push(u8::try_from(s.state).unwrap_or(0));
        new.extend_from_slice(&head[1..5]);
        for t in [claimed, ends, at, window] {
            new.extend_from_slice(&(t as f64).to_be_bytes());
        }
        new.extend_from_slice(mid);
        let len = u32::try_from(s.body.len()).map_err(|_| StoreError::Config {
            problem: "an answer is too long for the Redis record (at most 4 GiB)".into(),
            source: None,
        })?;
        new.extend_from_slice(&len.to_be_bytes());
        new.extend_from_slice(s.body);

        let k = self.keys(key.reference(1).prefix());
        let swap = Swap {
            k: &k,
            old: &old,
            new: &new,
            expires,
            score: ends - BAND,
        };
        let applied = if self.cas.enabled() {
            self.swap_by_ifeq(&swap, wait).await?
        } else {
            self.swap_by_script(&swap, wait).await?
        };
        Ok(applied.then_some(generation))
    }

    /// `settle.lua`: the compare-and-set in a script of its own (no `SET … IFEQ` here). On
    /// a mismatch it wrote nothing, so the fenced script can follow directly.
    async fn swap_by_script(
        &self,
        s: &Swap<'_>,
        wait: Option<Replicas>,
    ) -> Result<bool, StoreError> {
        let member = s.k.member();
        let (expires, score) = (s.expires.to_string(), s.score.to_string());
        let keys = [s.k.record.as_str(), s.k.index.as_str()];
        let args: [&[u8]; 5] = [
            s.old,
            s.new,
            expires.as_bytes(),
            score.as_bytes(),
            member.as_bytes(),
        ];
        let (reply, acked) = self
            .conn_for(wait)
            .await?
            .run(&self.cas.settle, &keys, &args, wait)
            .await?;
        match reply {
            Value::Int(1) => {
                Inner::replicated(wait, acked)?;
                Ok(true)
            }
            Value::Int(0) => Ok(false),
            other => Err(super::conn::bad(format!("settle.lua answered {other:?}"))),
        }
    }

    /// `SET … IFEQ` in a transaction with the index entry.
    async fn swap_by_ifeq(&self, s: &Swap<'_>, wait: Option<Replicas>) -> Result<bool, StoreError> {
        let k = s.k;
        let member = k.member();
        let mut set = command("SET", 7, k.record.len() + s.new.len() + s.old.len() + 36);
        set.arg(&k.record)
            .arg(s.new)
            .arg("IFEQ")
            .arg(s.old)
            .arg("GET")
            .arg("PXAT")
            .arg(s.expires);
        let mut zadd = command("ZADD", 3, k.index.len() + 20 + member.len());
        zadd.arg(&k.index).arg(s.score).arg(member);
        let mut pipe = redis::Pipeline::with_capacity(5);
        pipe.cmd("MULTI")
            .add_command(set)
            .add_command(zadd)
            .cmd("EXEC");
        if let Some(w) = wait {
            pipe.cmd("WAIT")
                .arg(w.count)
                .arg(w.timeout.as_millis() as u64);
        }
        pipe.ignore_errors();
        let conn = self.conn_for(wait).await?;
        let mut c = conn.clone();
        let mut replies: Vec<Value> = pipe.query_async(&mut c).await.map_err(redis_error)?;
        let acked = match wait.map(|_| replies.pop()) {
            Some(Some(Value::Int(n))) => Some(n),
            _ => None,
        };
        let found = match replies.pop() {
            Some(Value::Array(exec)) => exec.into_iter().next(),
            Some(Value::ServerError(e)) if e.code() == "EXECABORT" => {
                // The server refused the transaction: no conditional SET after all (a node of
                // another version). Nothing ran; the scripts from here on.
                self.cas.ifeq.store(false, Ordering::Relaxed);
                return Ok(false);
            }
            Some(Value::ServerError(e)) => return Err(redis_error(e.into())),
            other => return Err(super::conn::bad(format!("EXEC answered {other:?}"))),
        };
        if matches!(&found, Some(Value::BulkString(b)) if b == s.old) {
            Inner::replicated(wait, acked)?;
            return Ok(true);
        }
        if let Some(Value::ServerError(e)) = found {
            return Err(redis_error(e.into()));
        }
        // Not applied, but the index entry moved: put it back by the record's state.
        let keys = [k.record.as_str(), k.index.as_str()];
        self.conn.run(&self.cas.reindex, &keys, &[], None).await?;
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cas() -> Cas {
        Cas {
            ifeq: AtomicBool::new(false),
            held: Mutex::new(HeldMap::default()),
            reindex: Script::new(""),
            settle: Script::new(""),
        }
    }

    fn fill(cas: &Cas, answered: Instant) {
        let mut held = cas.held.lock().unwrap_or_else(PoisonError::into_inner);
        for n in 0..HELD_MAX {
            let blob = Vec::new();
            held.calls
                .insert(([0; 32], n as i64), Held { blob, answered });
        }
    }

    /// A full map of stale claim strings (calls that ended without a completion here) makes
    /// room; a full map of live ones stays as it is, and the new call goes to the fenced script.
    #[test]
    fn a_full_map_drops_only_stale_claim_strings() {
        let key = Key::from_bytes([1; 32]);
        let Some(old) = Instant::now().checked_sub(HELD_STALE + Duration::from_secs(1)) else {
            return; // a machine up for less than HELD_STALE: no such instant to test with
        };
        let stale = cas();
        fill(&stale, old);
        stale.hold(&key, Token(1), vec![1]);
        assert_eq!(stale.take(&key, Token(1)).map(|h| h.blob), Some(vec![1]));
        assert!(stale
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .calls
            .is_empty());

        let live = cas();
        fill(&live, Instant::now());
        live.hold(&key, Token(1), vec![1]);
        assert!(live.take(&key, Token(1)).is_none());
        let held = live.held.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(held.calls.len(), HELD_MAX);
    }
}
