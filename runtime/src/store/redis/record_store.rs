//! [`RecordStore`] for [`RedisStore`]: the claim (by `SET … NX GET` in `claim.rs`, else
//! `claim.lua`), the transitions ([`Writes`], which `transition` dispatches to: the fenced
//! updates of `fenced.rs`, `cas.rs`), the status read, and the watch of a record a repeat waits
//! on (`notices.rs`).

use std::time::Duration;

use redis::Value;

use super::conn::{array, bad, bytes, int, text};
use super::fenced::Op;
use super::record::{generation, state_name, Record, HEAD};
use super::{ms, Inner, RedisStore};
use crate::clock::Timestamp;
use crate::key::{Key, Reference};
use crate::record::{RecordState, RecordStatus, StoredResponse};
use crate::store::transition::{dispatch, Writes};
use crate::store::{
    BoxFuture, Claim, ClaimRequest, Completion, RecordStore, Settlement, StoreError, Token,
    Transition, Transitioned, Wake, WindowClock,
};

impl RecordStore for RedisStore {
    /// The Redis server's clock (`TIME`; the engine's only in tests that move time by hand).
    fn window_clock(&self) -> WindowClock {
        if self.inner.trusted == b"1" {
            WindowClock::Engine
        } else {
            WindowClock::Own
        }
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let prefix = *req.key.reference(1).prefix();
            let k = inner.keys(&prefix);
            let mut blob = Record::blank(req)?;
            if let Some(claim) = inner.claim_by_set(req, &k, &mut blob).await? {
                return Ok(claim);
            }
            let (now, lease) = (ms(req.now), ms(req.now + req.lease));
            let window = u64::try_from(req.window.as_millis())
                .unwrap_or(u64::MAX)
                .to_string();
            let tail = blob.get(HEAD..).unwrap_or_default();
            let args: [&[u8]; 5] = [&now, &lease, inner.trusted, tail, window.as_bytes()];
            let keys = [k.record.as_str(), k.index.as_str()];
            let wait = inner.wait();
            let (reply, acked) = inner
                .conn_for(wait)
                .await?
                .run(&inner.scripts.claim, &keys, &args, wait)
                .await?;
            let mut reply = array(reply)?.into_iter();
            let code = int(&reply.next().ok_or_else(|| bad("empty claim answer"))?)?;
            let reference = req.key.reference(generation(
                &reply.next().ok_or_else(|| bad("no generation"))?,
            )?);
            let time = |v: Option<Value>| -> Result<Timestamp, StoreError> {
                Ok(Timestamp::from_millis(int(
                    &v.ok_or_else(|| bad("a time is missing"))?
                )?))
            };
            Ok(match code {
                0 => {
                    Inner::replicated(wait, acked)?;
                    if let Some(head) = reply.next() {
                        // What the script wrote: its head, then the tail it was given.
                        blob.splice(..HEAD.min(blob.len()), bytes(head)?);
                        inner.cas.hold(&req.key, req.token, blob);
                    }
                    Claim::New {
                        reference,
                        token: req.token,
                    }
                }
                1 => Claim::InFlight {
                    reference,
                    claimed_at: time(reply.next())?,
                    lease_expires_at: time(reply.next())?,
                },
                2 => {
                    let state = int(&reply.next().ok_or_else(|| bad("no state"))?)?;
                    let ok = match state_name(state)? {
                        (RecordState::Completed, Some(ok)) => ok,
                        _ => return Err(bad(format!("a completed answer in state {state}"))),
                    };
                    let completed_at = time(reply.next())?;
                    let body = reply.next().ok_or_else(|| {
                        StoreError::corrupt(format!(
                            "ref {reference} is completed without an answer"
                        ))
                    })?;
                    Claim::Completed {
                        reference,
                        response: StoredResponse {
                            ok,
                            body: text(body)?,
                        },
                        completed_at,
                    }
                }
                3 => Claim::Unknown {
                    reference,
                    since: time(reply.next())?,
                },
                4 => Claim::Mismatch { reference },
                5 => return Err(StoreError::ReferenceTaken { reference }),
                other => return Err(bad(format!("unexpected claim answer {other}"))),
            })
        })
    }

    /// One `GET` of the record the reference names (its times as the server recorded them).
    fn status<'a>(
        &'a self,
        tenant: &'a str,
        subject: &'a str,
        reference: Reference,
    ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>> {
        Box::pin(async move {
            let k = self.inner.keys(reference.prefix());
            let reply = self
                .inner
                .conn
                .query(redis::cmd("GET").arg(&k.record))
                .await?;
            let blob = match reply {
                Value::Nil => return Ok(None),
                v => bytes(v)?,
            };
            let r = Record::parse(&blob)?;
            if r.tenant != tenant.as_bytes()
                || !(r.subject.is_empty() || r.subject == subject.as_bytes())
                || r.generation < reference.generation()
            {
                return Ok(None);
            }
            let (state, ok) = state_name(i64::from(r.state))?;
            let settled = matches!(state, RecordState::Completed | RecordState::Released);
            let ends = Timestamp::from_millis(r.ends);
            let completed = settled.then(|| Timestamp::from_millis(r.completed));
            let tool = String::from_utf8(r.tool.to_vec())
                .map_err(|_| StoreError::corrupt("a record's tool name is not UTF-8"))?;
            let response = match ok {
                Some(ok) => Some(StoredResponse {
                    ok,
                    body: String::from_utf8(r.response.to_vec())
                        .map_err(|_| StoreError::corrupt("a stored answer is not UTF-8"))?,
                }),
                None => None,
            };
            // Judged on the shard's server clock, or the engine's when the store trusts it.
            let read_at = match self.inner.trusted {
                b"1" => None,
                _ => {
                    let now = self.inner.clock.early(&self.inner.conn, k.route()).await?;
                    Some(Timestamp::from_millis(now))
                }
            };
            Ok(Some(RecordStatus {
                reference: reference.with_generation(r.generation),
                tool,
                state,
                claimed_at: Timestamp::from_millis(r.claimed),
                lease_expires_at: state.lease_shown(ends, completed),
                completed_at: completed,
                expires_at: settled.then_some(ends),
                response,
                read_at,
            }))
        })
    }

    /// A mark on the record while it is in flight, and a notice on the record's channel when
    /// it leaves flight (see `notices.rs`).
    fn watch<'a>(
        &'a self,
        key: Key,
        _reference: Reference,
        wake: Wake,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let k = self.inner.keys(key.reference(1).prefix());
            self.inner.notices.watch(&self.inner.conn, &k, wake).await
        })
    }

    fn transition<'a>(
        &'a self,
        key: Key,
        token: Token,
        op: Transition<'a>,
    ) -> BoxFuture<'a, Result<Transitioned, StoreError>> {
        dispatch(self, key, token, op)
    }
}

impl Writes for RedisStore {
    fn complete<'a>(&'a self, c: Completion<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { self.fenced(c.key, c.token, Op::Complete(&c)).await })
    }

    fn release(
        &self,
        key: Key,
        token: Token,
        at: Timestamp,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.fenced(key, token, Op::Release(at)))
    }

    fn mark_unknown(&self, key: Key, token: Token) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.fenced(key, token, Op::Unknown))
    }

    fn renew(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.fenced(key, token, Op::Renew(now, now + lease)))
    }

    /// The fenced script's takeover: fenced by the state and the lease on the server's clock
    /// (its token is the new one); one script, so concurrent takeovers run one at a time.
    fn take_over(
        &self,
        key: Key,
        token: Token,
        now: Timestamp,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Reference, StoreError>> {
        Box::pin(self.fenced_update(key, token, Op::TakeOver(now, now + lease)))
    }

    fn settle<'a>(
        &'a self,
        key: Key,
        token: Token,
        settlement: &'a Settlement,
        at: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.fenced(key, token, Op::Settle(settlement, at)))
    }
}
