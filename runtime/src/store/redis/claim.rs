//! The claim without a script, on servers whose `SET` takes `NX` and `GET` together (Redis
//! ≥ 7.0, Valkey): one transaction, `MULTI`, `SET <record> <new record> NX GET`, `ZADD <index>
//! NX <lease end> <member>`, `EXEC` (then `WAIT` when writes wait for a replica).
//!
//! - No record: the `SET` writes the new one and the `ZADD` its index entry; the claim is won.
//!   An index entry already there (its record expired by itself, `PXAT`, and no purge removed
//!   the entry yet) keeps its old score: the claim then puts it where the record's state says
//!   (`reindex.lua`), a second round trip only in that case. A process that dies in between
//!   leaves the entry in the settled band, where the next purge finds the in-flight record and
//!   moves the entry to the unsettled band (`purge.lua`).
//! - A record: neither command writes anything, and the `SET` answers the record, which this
//!   process reads as `claim.lua` would: in flight, unknown, completed (replayed), a mismatch,
//!   another key under the reference. The cases that write (a released record, a completed one
//!   whose window ended, one this process cannot read) go to `claim.lua`, which decides them
//!   on the server's clock and answers as it always did.
//!
//! The new record's times are on the server's clock without a `TIME` per call: the earliest the
//! server's clock can read now, from a reading younger than a second (see `clock.rs`). Without
//! one, the claim is `claim.lua`'s, and a reading starts beside it: still one round trip for the
//! call. A completed answer is replayed only when the latest the server's clock can read now is
//! still before the window's end; nearer the end, `claim.lua` decides.

use std::sync::atomic::Ordering;

use redis::Value;

use super::clock::Now;
use super::conn::{bad, command, redis_error};
use super::record::{state_name, Record, COMPLETED_ERR, COMPLETED_OK, HEAD, RELEASED, UNKNOWN};
use super::{Claim, ClaimRequest, Inner, ShardKeys, StoreError};
use crate::clock::Timestamp;
use crate::record::StoredResponse;

/// The head of a new record (see `Record`): in flight, generation 1, claimed, lease end, no
/// completion, the tool's window.
fn new_head(claimed: i64, lease_end: i64, window: i64) -> [u8; HEAD] {
    let mut head = [0u8; HEAD];
    head[1..5].copy_from_slice(&1u32.to_be_bytes());
    for (i, t) in [claimed, lease_end, 0, window].into_iter().enumerate() {
        head[5 + 8 * i..13 + 8 * i].copy_from_slice(&(t as f64).to_be_bytes());
    }
    head
}

impl Inner {
    /// Claims by `SET … NX GET`: the claim's answer, or `None` when `claim.lua` must decide (see
    /// the module's docs) or the server cannot take `NX` and `GET` together.
    pub(super) async fn claim_by_set(
        &self,
        req: &ClaimRequest<'_>,
        k: &ShardKeys,
        blob: &mut Vec<u8>,
    ) -> Result<Option<Claim>, StoreError> {
        if !self.set_nx_get.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let asked = req.now.as_millis();
        // The server's time now, as bounds; the caller's own when the store trusts it.
        let now = if self.trusted == b"1" {
            Now {
                early: asked,
                late: asked,
            }
        } else {
            match self.clock.now_or_read(&self.conn, k.route()) {
                Some(now) => now,
                None => return Ok(None),
            }
        };
        let early = now.early;
        let lease_ms = i64::try_from(req.lease.as_millis()).unwrap_or(i64::MAX / 4);
        let window = i64::try_from(req.window.as_millis()).unwrap_or(i64::MAX / 4);
        let lease_end = early.saturating_add(lease_ms);
        let Some(head) = blob.get_mut(..HEAD) else {
            return Ok(None);
        };
        head.copy_from_slice(&new_head(early, lease_end, window));
        let member = k.member();

        let wait = self.wait();
        let mut set = command("SET", 4, k.record.len() + blob.len() + 5);
        set.arg(&k.record).arg(&blob[..]).arg("NX").arg("GET");
        let mut zadd = command("ZADD", 4, k.index.len() + 2 + 20 + member.len());
        zadd.arg(&k.index).arg("NX").arg(lease_end).arg(member);
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
        let mut c = self.conn_for(wait).await?.clone();
        let mut replies: Vec<Value> = pipe.query_async(&mut c).await.map_err(redis_error)?;
        let acked = match wait.map(|_| replies.pop()) {
            Some(Some(Value::Int(n))) => Some(n),
            _ => None,
        };
        let mut exec = match replies.pop() {
            Some(Value::Array(exec)) => exec.into_iter(),
            Some(Value::ServerError(e)) if e.code() == "EXECABORT" => {
                // The server refused the transaction (no `NX` with `GET` before Redis 7.0):
                // nothing ran; the script from here on.
                self.set_nx_get.store(false, Ordering::Relaxed);
                return Ok(None);
            }
            Some(Value::ServerError(e)) => return Err(redis_error(e.into())),
            other => return Err(bad(format!("EXEC answered {other:?}"))),
        };
        let (found, indexed) = (exec.next(), exec.next());
        match found {
            Some(Value::Nil) => {
                if !matches!(indexed, Some(Value::Int(1))) {
                    // An entry was there (or the ZADD failed): put it where the state says.
                    let keys = [k.record.as_str(), k.index.as_str()];
                    self.conn.run(&self.cas.reindex, &keys, &[], None).await?;
                }
                Inner::replicated(wait, acked)?;
                self.cas.hold(&req.key, req.token, std::mem::take(blob));
                Ok(Some(Claim::New {
                    reference: req.key.reference(1),
                    token: req.token,
                }))
            }
            Some(Value::BulkString(found)) => existing(req, &found, now),
            Some(Value::ServerError(e)) => Err(redis_error(e.into())),
            other => Err(bad(format!("SET … NX GET answered {other:?}"))),
        }
    }
}

/// The answer to a claim that found the record `found`, read as `claim.lua` reads it; `None`
/// for the cases `claim.lua` decides. `now` is the server's time now (the caller's when the
/// store trusts it): its earliest less the caller's time is the server's clock less the
/// caller's, its latest what decides whether a completed record's window has ended.
fn existing(req: &ClaimRequest<'_>, found: &[u8], now: Now) -> Result<Option<Claim>, StoreError> {
    let (off, late) = (now.early - req.now.as_millis(), now.late);
    let Ok(r) = Record::parse(found) else {
        return Ok(None);
    };
    let reference = req.key.reference(r.generation);
    let state = i64::from(r.state);
    if state > COMPLETED_ERR {
        return Ok(None);
    }
    if r.key_rest != &req.key.as_bytes()[8..] {
        return Err(StoreError::ReferenceTaken { reference });
    }
    let completed = state == COMPLETED_OK || state == COMPLETED_ERR;
    if state == RELEASED || (completed && late >= r.ends) {
        return Ok(None);
    }
    let asked = req
        .fingerprint
        .as_ref()
        .map_or(&[][..], |f| &f.as_bytes()[..]);
    if !r.fingerprint.is_empty() && !asked.is_empty() && r.fingerprint != asked {
        return Ok(Some(Claim::Mismatch { reference }));
    }
    let back = |t: i64| Timestamp::from_millis(t - off);
    Ok(Some(match state {
        UNKNOWN => Claim::Unknown {
            reference,
            since: back(r.claimed),
        },
        s if completed => {
            let (_, ok) = state_name(s)?;
            Claim::Completed {
                reference,
                response: StoredResponse {
                    ok: ok == Some(true),
                    body: String::from_utf8(r.response.to_vec())
                        .map_err(|_| bad("a text field is not UTF-8"))?,
                },
                completed_at: back(r.completed),
            }
        }
        _ => Claim::InFlight {
            reference,
            claimed_at: back(r.claimed),
            lease_expires_at: back(r.ends),
        },
    }))
}
