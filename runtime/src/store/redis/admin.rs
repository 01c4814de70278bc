//! What an operator reads across tenants (the admin tool): one record by its reference, every
//! record through the shard indexes (never a keyspace scan), and what a purge would delete.

use redis::Value;

use super::conn::{array, bytes, int};
use super::record::{state_name, Record};
use super::{hex, ms, unhex, RedisStore, SHARDS};
use crate::clock::Timestamp;
use crate::key::{Key, Reference};
use crate::record::RecordState;
use crate::store::{Admin, AdminRecord, BoxFuture, StoreError, StoreStats};

/// How many index entries one read of a shard takes.
const PAGE: isize = 500;

/// A record as the admin reads show it, from its bytes.
fn admin_record(prefix: &[u8; 8], blob: &[u8]) -> Result<AdminRecord, StoreError> {
    let r = Record::parse(blob)?;
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(prefix);
    if r.key_rest.len() != 24 {
        return Err(StoreError::corrupt("a record's key rest is not 24 bytes"));
    }
    key[8..].copy_from_slice(r.key_rest);
    let (state, ok) = state_name(i64::from(r.state))?;
    let settled = matches!(state, RecordState::Completed | RecordState::Released);
    let utf8 = |b: &[u8], what: &str| {
        String::from_utf8(b.to_vec())
            .map_err(|_| StoreError::corrupt(format!("a record's {what} is not UTF-8")))
    };
    let subject = utf8(r.subject, "subject")?;
    Ok(AdminRecord {
        reference: Key::from_bytes(key).reference(r.generation),
        tenant: utf8(r.tenant, "tenant")?,
        subject: (!subject.is_empty()).then_some(subject),
        tool: utf8(r.tool, "tool name")?,
        state,
        error_answer: ok == Some(false),
        claimed_at: Timestamp::from_millis(r.claimed),
        ends_at: Timestamp::from_millis(r.ends),
        completed_at: settled.then(|| Timestamp::from_millis(r.completed)),
        window: std::time::Duration::from_millis(
            u64::try_from(r.window)
                .map_err(|_| StoreError::corrupt("a record's window is below zero"))?,
        ),
        answer: ok.map(|_| utf8(r.response, "answer")).transpose()?,
    })
}

impl RedisStore {
    /// The record under `reference`'s key, whatever its tenant and generation (one `GET`).
    async fn admin_record(&self, reference: Reference) -> Result<Option<AdminRecord>, StoreError> {
        let k = self.inner.keys(reference.prefix());
        match self
            .inner
            .conn
            .query(redis::cmd("GET").arg(&k.record))
            .await?
        {
            Value::Nil => Ok(None),
            v => admin_record(reference.prefix(), &bytes(v)?).map(Some),
        }
    }

    /// Calls `visit` with every record of the store's namespace and its size in bytes, shard by
    /// shard, reading each shard's index a page at a time and its records with one `MGET` per
    /// page (never a keyspace scan; records written meanwhile may or may not be seen). For an
    /// operator's counts: it reads every record.
    async fn each_record(
        &self,
        mut visit: impl FnMut(AdminRecord, usize) + Send,
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        for shard in 0..SHARDS {
            let index = format!("{}:i", inner.shard_base(shard));
            let records = inner.record_prefix(shard);
            let mut start = 0isize;
            loop {
                let page = array(
                    inner
                        .conn
                        .query(
                            redis::cmd("ZRANGE")
                                .arg(&index)
                                .arg(start)
                                .arg(start + PAGE - 1),
                        )
                        .await?,
                )?;
                if page.is_empty() {
                    break;
                }
                let mut prefixes = Vec::with_capacity(page.len());
                let mut get = redis::cmd("MGET");
                for member in page {
                    let member = bytes(member)?;
                    let prefix: [u8; 8] = unhex(&member)
                        .and_then(|p| p.try_into().ok())
                        .ok_or_else(|| {
                            StoreError::corrupt("an index entry is not a reference prefix")
                        })?;
                    get.arg(format!("{records}{}", hex(&prefix)));
                    prefixes.push(prefix);
                }
                let n = prefixes.len() as isize;
                let blobs = array(inner.conn.query(&get).await?)?;
                for (prefix, blob) in prefixes.iter().zip(blobs) {
                    // Entries of records that expired stay in the settled band until a purge.
                    if !matches!(blob, Value::Nil) {
                        let blob = bytes(blob)?;
                        visit(admin_record(prefix, &blob)?, blob.len());
                    }
                }
                if n < PAGE {
                    break;
                }
                start += PAGE;
            }
        }
        Ok(())
    }

    /// How many records a purge at `now` and `older_than` would delete.
    async fn count_purgeable(
        &self,
        now: Timestamp,
        older_than: Timestamp,
    ) -> Result<u64, StoreError> {
        let inner = &*self.inner;
        let (now, older) = (ms(now), ms(older_than));
        let mut total = 0u64;
        for shard in 0..SHARDS {
            let index = format!("{}:i", inner.shard_base(shard));
            let records = inner.record_prefix(shard);
            let args: [&[u8]; 4] = [&now, &older, inner.trusted, records.as_bytes()];
            let (n, _) = inner
                .conn
                .run(&inner.scripts.count, &[&index], &args, None)
                .await?;
            total += u64::try_from(int(&n)?).unwrap_or(0);
        }
        Ok(total)
    }
}

impl RedisStore {
    /// Whether the namespace holds anything of a store: its secret fingerprint or a shard's
    /// record index (one `EXISTS` each, stopping at the first found; never a keyspace scan).
    async fn holds_a_store(&self) -> Result<bool, StoreError> {
        let inner = &*self.inner;
        let secret = std::iter::once(format!("{}:secret", inner.namespace));
        let indexes = (0..SHARDS).map(|shard| format!("{}:i", inner.shard_base(shard)));
        for key in secret.chain(indexes) {
            if int(&inner.conn.query(redis::cmd("EXISTS").arg(&key)).await?)? > 0 {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The server's `TIME`, in ms.
    async fn time(&self) -> Result<Timestamp, StoreError> {
        let reply = array(self.inner.conn.query(&redis::cmd("TIME")).await?)?;
        let [seconds, micros] = reply.as_slice() else {
            return Err(super::conn::bad(format!("TIME answered {reply:?}")));
        };
        let (seconds, micros) = (int(seconds)?, int(micros)?);
        Ok(Timestamp::from_millis(
            seconds.saturating_mul(1000).saturating_add(micros / 1000),
        ))
    }
}

impl Admin for RedisStore {
    /// The reconciler's read ([`Maintenance::unsettled`](crate::store::Maintenance::unsettled)):
    /// Redis keeps no bookkeeping for it.
    fn unsettled_claims(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<crate::store::Unsettled>, StoreError>> {
        crate::store::Maintenance::unsettled(self, now, limit)
    }

    fn server_time(&self) -> BoxFuture<'_, Result<Option<Timestamp>, StoreError>> {
        Box::pin(async move { self.time().await.map(Some) })
    }

    /// The namespace holds its secret fingerprint or a record index.
    fn exists(&self) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(self.holds_a_store())
    }

    fn record(
        &self,
        reference: Reference,
    ) -> BoxFuture<'_, Result<Option<AdminRecord>, StoreError>> {
        Box::pin(self.admin_record(reference))
    }

    /// Reads every record of the namespace through the shard indexes; `bytes` is the records'
    /// own (Redis adds its per-key overhead).
    fn stats(&self, now: Timestamp) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        Box::pin(async move {
            let mut stats = StoreStats::default();
            self.each_record(|r, size| {
                stats.bytes += size as u64;
                if r.state == RecordState::InFlight {
                    stats.oldest_in_flight = Some(
                        stats
                            .oldest_in_flight
                            .map_or(r.claimed_at, |o| o.min(r.claimed_at)),
                    );
                }
                stats.count(&r.tool, r.standing(now), 1);
            })
            .await?;
            Ok(stats.sorted())
        })
    }

    fn purgeable(
        &self,
        now: Timestamp,
        older_than: Timestamp,
    ) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.count_purgeable(now, older_than))
    }
}
