//! The fenced updates of the Redis store (complete, release, mark unknown, renew, take over,
//! settle): one script each, checked against the claim's token.

use super::cas::Settled;
use super::conn::{array, bad, int, Conn};
use super::record::{generation, state_name, COMPLETED_ERR, COMPLETED_OK, RELEASED, UNKNOWN};
use super::{ms, Completion, Inner, RedisStore, Settlement, StoreError, Token};
use crate::clock::Timestamp;
use crate::key::{Key, Reference};

/// What a fenced update is.
pub(super) enum Op<'a> {
    Complete(&'a Completion<'a>),
    Release(Timestamp),
    Unknown,
    Renew(Timestamp, Timestamp),
    TakeOver(Timestamp, Timestamp),
    Settle(&'a Settlement, Timestamp),
}

impl RedisStore {
    /// Runs a fenced update.
    pub(super) async fn fenced(
        &self,
        key: Key,
        token: Token,
        op: Op<'_>,
    ) -> Result<(), StoreError> {
        self.fenced_update(key, token, op).await.map(|_| ())
    }

    /// Runs a fenced update; the record's reference when it applied.
    pub(super) async fn fenced_update(
        &self,
        key: Key,
        token: Token,
        op: Op<'_>,
    ) -> Result<Reference, StoreError> {
        let inner = &*self.inner;
        let trusted = inner.trusted[0] == b'1';
        let by_cas = match &op {
            Op::Complete(c) if c.outbox.is_empty() => Some(Settled {
                state: if c.response.ok {
                    COMPLETED_OK
                } else {
                    COMPLETED_ERR
                },
                body: c.response.body.as_bytes(),
                windowed: true,
                now: c.now.as_millis(),
                trusted,
            }),
            Op::Release(at) => Some(Settled {
                state: RELEASED,
                body: b"",
                windowed: false,
                now: at.as_millis(),
                trusted,
            }),
            _ => {
                inner.cas.forget(&key, token);
                None
            }
        };
        if let Some(settled) = by_cas {
            let wait = inner.wait();
            if let Some(g) = inner.settle_by_cas(key, token, settled, wait).await? {
                return Ok(key.reference(g));
            }
        }
        let prefix = *key.reference(1).prefix();
        let k = inner.keys(&prefix);
        let token_b = token.0.to_be_bytes();
        let retention = inner.retention_ms.to_string();
        let (code, now): (&[u8], Vec<u8>) = match &op {
            Op::Complete(c) => (b"c", ms(c.now)),
            Op::Release(at) => (b"r", ms(*at)),
            Op::Unknown => (b"u", b"0".to_vec()),
            Op::Renew(now, _) => (b"n", ms(*now)),
            Op::TakeOver(now, _) => (b"t", ms(*now)),
            Op::Settle(_, at) => (b"s", ms(*at)),
        };
        let flags = [
            inner.trusted[0],
            if matches!(inner.conn.0, Conn::Cluster(_)) {
                b's'
            } else {
                b'p'
            },
        ];
        let mut args: Vec<Vec<u8>> = vec![
            code.to_vec(),
            key.as_bytes()[8..].to_vec(),
            token_b.to_vec(),
            flags.to_vec(),
            now,
            retention.into_bytes(),
        ];
        let mut wait = None;
        match &op {
            Op::Complete(c) => {
                let code = if c.response.ok {
                    COMPLETED_OK
                } else {
                    COMPLETED_ERR
                };
                args.push(code.to_string().into_bytes());
                args.push(c.response.body.as_bytes().to_vec());
                args.push(c.outbox.len().to_string().into_bytes());
                for m in c.outbox {
                    args.push(m.topic.as_bytes().to_vec());
                    args.push(m.payload.as_bytes().to_vec());
                }
                wait = inner.wait();
            }
            Op::Renew(_, lease) => args.push(ms(*lease)),
            Op::TakeOver(_, lease) => {
                args.push(ms(*lease));
                wait = inner.wait();
            }
            Op::Settle(s, _) => {
                args.push((token.0 + 1).to_be_bytes().to_vec());
                let (code, body) = match s {
                    Settlement::Completed(r) if r.ok => (COMPLETED_OK, r.body.as_str()),
                    Settlement::Completed(r) => (COMPLETED_ERR, r.body.as_str()),
                    Settlement::Released => (RELEASED, ""),
                    Settlement::Unknown => (UNKNOWN, ""),
                };
                args.push(code.to_string().into_bytes());
                args.push(body.as_bytes().to_vec());
                wait = inner.wait();
            }
            Op::Release(_) => wait = inner.wait(),
            Op::Unknown => {}
        }
        let outbox = k.outbox();
        let keys = [
            k.record.as_str(),
            k.index.as_str(),
            outbox.as_str(),
            k.watch.as_str(),
        ];
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let (reply, acked) = inner
            .conn_for(wait)
            .await?
            .run(&inner.scripts.fenced, &keys, &args, wait)
            .await?;
        let reply = array(reply)?;
        let answer = reply.first().map(int).transpose()?;
        let reference = || -> Result<Reference, StoreError> {
            Ok(key.reference(generation(
                reply.get(1).ok_or_else(|| bad("no generation"))?,
            )?))
        };
        match answer {
            Some(0) => Inner::replicated(wait, acked).and_then(|()| reference()),
            Some(-1) => Err(StoreError::NotFound),
            Some(-2) => Err(StoreError::Fenced {
                reference: reference()?,
            }),
            Some(-3) => {
                let state = int(reply.get(2).ok_or_else(|| bad("no state"))?)?;
                Err(StoreError::WrongState {
                    reference: reference()?,
                    state: state_name(state)?.0.as_str(),
                })
            }
            other => Err(bad(format!("unexpected fenced answer {other:?}"))),
        }
    }
}
