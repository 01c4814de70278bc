//! [`RedisStore`]'s background work: the claims to reconcile (the unsettled band of the shards'
//! indexes), purge (their settled band; records expire by themselves anyway) and the outbox (a
//! stream per shard, read through a consumer group).

use futures_util::future::join_all;
use redis::Value;

use super::conn::{array, bad, bytes, int, pairs, text};
use super::record::{generation, state_name};
use super::{hex, ms, unhex, RedisStore, SHARDS};
use crate::clock::Timestamp;
use crate::key::Key;
use crate::store::{
    BoxFuture, Maintenance, OutboxEntry, OutboxStore, Receipt, StoreError, Token, Unsettled,
};

impl Maintenance for RedisStore {
    /// Records expire by themselves (`SET … PXAT` window end + the store's retention), so a
    /// [`Purger`](crate::tasks::Purger) is not needed for retention. This deletes settled records
    /// whose window ended before `older_than` earlier than that, and trims the settled band of
    /// the shards' indexes of records already expired (they are not counted): it walks the shards one
    /// script at a time until `limit` records went, reading each shard's index by window end,
    /// never the keyspace.
    fn purge(
        &self,
        now: Timestamp,
        older_than: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let (now, older) = (ms(now), ms(older_than));
            let mut gone = 0u64;
            for shard in self.shard_walk() {
                let left = u64::from(limit).saturating_sub(gone);
                if left == 0 {
                    break;
                }
                let base = inner.shard_base(shard);
                let index = format!("{base}:i");
                let records = inner.record_prefix(shard);
                let left = left.to_string();
                let args: [&[u8]; 5] = [
                    &now,
                    &older,
                    inner.trusted,
                    left.as_bytes(),
                    records.as_bytes(),
                ];
                let (n, _) = inner
                    .conn
                    .run(&inner.scripts.purge, &[&index], &args, None)
                    .await?;
                gone += u64::try_from(int(&n)?).unwrap_or(0);
            }
            Ok(gone)
        })
    }

    /// Asks every shard at once (one script each) for its due claims, at most `limit` each by
    /// lease end, then keeps the `limit` oldest claims.
    fn unsettled(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Unsettled>, StoreError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let now = ms(now);
            let cap = limit.to_string();
            let asks = (0..SHARDS).map(|shard| {
                let (now, cap) = (&now, &cap);
                async move {
                    let index = format!("{}:i", inner.shard_base(shard));
                    let records = inner.record_prefix(shard);
                    let args: [&[u8]; 4] = [now, inner.trusted, cap.as_bytes(), records.as_bytes()];
                    inner
                        .conn
                        .run(&inner.scripts.unsettled, &[&index], &args, None)
                        .await
                }
            });
            let mut out = Vec::new();
            for reply in join_all(asks).await {
                for row in array(reply?.0)? {
                    out.push(unsettled_row(row)?);
                }
            }
            out.sort_by_key(|u| (u.claimed_at, u.key));
            out.truncate(limit as usize);
            Ok(out)
        })
    }
}

fn unsettled_row(row: Value) -> Result<Unsettled, StoreError> {
    let f = array(row)?;
    if f.len() != 10 {
        return Err(bad("an unsettled row has the wrong length"));
    }
    let mut f = f.into_iter();
    let mut next = || f.next().ok_or_else(|| bad("an unsettled row is short"));
    let member = bytes(next()?)?;
    let rest = bytes(next()?)?;
    let prefix = unhex(&member)
        .filter(|p| p.len() == 8)
        .ok_or_else(|| StoreError::corrupt("an index entry is not a reference prefix"))?;
    if rest.len() != 24 {
        return Err(StoreError::corrupt(format!(
            "the record of ref prefix {} holds a key rest of {} bytes, not 24",
            hex(&prefix),
            rest.len()
        )));
    }
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&prefix);
    key[8..].copy_from_slice(&rest);
    let key = Key::from_bytes(key);
    let generation = generation(&next()?)?;
    let (state, _) = state_name(int(&next()?)?)?;
    let token = i64::from_be_bytes(
        bytes(next()?)?
            .try_into()
            .map_err(|_| StoreError::corrupt("a token is not 8 bytes"))?,
    );
    let claimed_at = Timestamp::from_millis(int(&next()?)?);
    let tenant = text(next()?)?;
    let subject = text(next()?)?;
    let tool = text(next()?)?;
    let window = u64::try_from(int(&next()?)?)
        .map_err(|_| StoreError::corrupt("a record's window is below zero"))?;
    Ok(Unsettled {
        key,
        reference: key.reference(generation),
        tenant,
        subject: (!subject.is_empty()).then_some(subject),
        tool,
        state,
        token: Token(token),
        claimed_at,
        window: std::time::Duration::from_millis(window),
    })
}

/// A receipt is `<shard, 2 hex>/<stream id>`.
fn parse_receipt(receipt: &Receipt) -> Option<(usize, &str)> {
    let (shard, id) = receipt.as_str().split_once('/')?;
    let shard = unhex(shard.as_bytes()).filter(|s| s.len() == 1)?[0];
    let (ms, seq) = id.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(ms) && digits(seq)).then_some((usize::from(shard), id))
}

/// A stream id's order: milliseconds, then sequence.
fn id_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

impl OutboxStore for RedisStore {
    /// Walks the shards one script at a time (starting at a rotating one) until `limit`
    /// messages are handed out; within a shard, oldest first.
    fn fetch(
        &self,
        now: Timestamp,
        invisible_until: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<OutboxEntry>, StoreError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let (now, hidden) = (ms(now), ms(invisible_until));
            let mut out = Vec::new();
            for shard in self.shard_walk() {
                let left = (limit as usize).saturating_sub(out.len());
                if left == 0 {
                    break;
                }
                let base = inner.shard_base(shard);
                let (stream, visibility) = (format!("{base}:o"), format!("{base}:ov"));
                let left = left.to_string();
                let args: [&[u8]; 4] = [&now, &hidden, left.as_bytes(), inner.trusted];
                let (reply, _) = inner
                    .conn
                    .run(&inner.scripts.fetch, &[&stream, &visibility], &args, None)
                    .await?;
                let mut entries = Vec::new();
                for row in array(reply)? {
                    entries.push(outbox_row(shard, row)?);
                }
                entries.sort_by_key(|(order, _)| *order);
                out.extend(entries.into_iter().map(|(_, e)| e));
            }
            Ok(out)
        })
    }

    fn ack<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let Some((shard, id)) = parse_receipt(receipt) else {
                return Err(StoreError::ForeignReceipt {
                    receipt: receipt.as_str().to_owned(),
                });
            };
            let inner = &*self.inner;
            let base = inner.shard_base(shard);
            let (stream, visibility) = (format!("{base}:o"), format!("{base}:ov"));
            inner
                .conn
                .run(
                    &inner.scripts.ack,
                    &[&stream, &visibility],
                    &[id.as_bytes()],
                    None,
                )
                .await?;
            Ok(())
        })
    }
}

fn outbox_row(shard: usize, row: Value) -> Result<((u64, u64), OutboxEntry), StoreError> {
    let mut f = array(row)?.into_iter();
    let mut next = || f.next().ok_or_else(|| bad("an outbox row is short"));
    let id = text(next()?)?;
    let fields = pairs(next()?)?;
    let attempts = i32::try_from(int(&next()?)?).unwrap_or(i32::MAX);
    let (mut prefix, mut generation_v, mut topic, mut payload) = (None, None, None, None);
    for (name, value) in fields {
        match &name[..] {
            b"p" => prefix = Some(bytes(value)?),
            b"g" => generation_v = Some(generation(&value)?),
            b"tp" => topic = Some(text(value)?),
            b"pl" => payload = Some(text(value)?),
            _ => {}
        }
    }
    let (Some(prefix), Some(generation), Some(topic), Some(payload)) =
        (prefix, generation_v, topic, payload)
    else {
        return Err(StoreError::corrupt(format!(
            "outbox message {id} lacks a field"
        )));
    };
    let prefix: [u8; 8] = unhex(&prefix)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| StoreError::corrupt(format!("outbox message {id} has a bad reference")))?;
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&prefix);
    let reference = Key::from_bytes(key).reference(generation);
    Ok((
        id_order(&id),
        OutboxEntry {
            receipt: Receipt::new(format!("{}/{id}", hex(&[shard as u8]))),
            reference,
            topic,
            payload,
            attempts,
        },
    ))
}
