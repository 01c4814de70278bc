//! A fresh call on PostgreSQL taken apart statement by statement, through sqlx, one client: the
//! store's claim and completion (through the `Store` trait) against the raw insert and update of
//! the `stores` bench, a `SELECT 1` round trip, and two bare inserts of the store's row, which
//! cannot answer a repeat: one with the eleven parameters of the claim a store with a clock
//! offset runs (a store without one, as users get it, binds nine), one with three (the rest
//! written into the statement). Medians of calls alternating in blocks of 25. Prints, for
//! scripts:
//!
//! ```text
//! pg_statements claim_us=476 complete_us=472 raw_insert_us=453 raw_update_us=452 select1_us=247 bare11_us=471 bare3_us=465
//! ```
//!
//! ```text
//! DATABASE_URL=postgres://root@127.0.0.1:5432/test cargo bench -p idempotency-tests --bench pg_statements
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotency::store::{Claim, Fenced, Store, StoredResponse};
use idempotency_tests::pg::TestSchema;
use idempotency_tests::raw::{self, key, now, RESPONSE};

/// The store's row inserted bare, with the parameters of the claim a store with a clock offset
/// runs (`$1`…`$11` as it binds them) and with three.
const BARE11: &str = "INSERT INTO idempotency_records \
     (ref, token, claimed_at, window_s, lease_or_settled_at, generation, state, key_rest, tenant, subject, tool, fingerprint) \
     VALUES ($1, $8, COALESCE((date_part('epoch', statement_timestamp()) * 1000)::BIGINT + $10::BIGINT, $6::BIGINT), $11, \
     COALESCE((date_part('epoch', statement_timestamp()) * 1000)::BIGINT + $10::BIGINT, $6::BIGINT) + ($7 - $6), \
     1, 0, $2, $3, $9, $4, $5) ON CONFLICT (ref) DO NOTHING RETURNING 1";
const BARE3: &str = "INSERT INTO idempotency_records \
     (ref, token, claimed_at, window_s, lease_or_settled_at, generation, state, key_rest, tenant, subject, tool, fingerprint) \
     VALUES ($1, 1, $3, 900, $3 + 30000, 1, 0, $2, 'acme', '', 'charge_card', ''::BYTEA) \
     ON CONFLICT (ref) DO NOTHING RETURNING 1";

const BLOCK: usize = 25;
const ROUNDS: usize = 80;

fn p50_us(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

/// Times `f` into `into`.
async fn timed<T>(into: &mut Vec<Duration>, f: impl std::future::Future<Output = T>) -> T {
    let t = Instant::now();
    let out = f.await;
    into.push(t.elapsed());
    out
}

#[derive(Default)]
struct Times {
    claim: Vec<Duration>,
    complete: Vec<Duration>,
    raw_insert: Vec<Duration>,
    raw_update: Vec<Duration>,
    select1: Vec<Duration>,
    bare11: Vec<Duration>,
    bare3: Vec<Duration>,
}

#[tokio::main]
async fn main() {
    if idempotency_tests::pg::database_url().is_none() {
        eprintln!("pg_statements: DATABASE_URL is not set; nothing measured");
        return;
    }
    let schema = TestSchema::create("statements").await.expect("a schema");
    let (pool, store) = raw::pg_pool_and_store(&schema, 2).await;
    let store: Arc<dyn Store> = Arc::new(store);
    let response = StoredResponse {
        ok: true,
        body: RESPONSE.into(),
    };
    let mut t = Times::default();
    let mut n = 0u64;
    let mut next = || {
        n += 1;
        n
    };
    for _ in 0..ROUNDS {
        for _ in 0..BLOCK {
            let req = raw::claim_request(key(next()));
            let claim = timed(&mut t.claim, store.claim(&req)).await;
            let Ok(Claim::New { token, .. }) = claim else {
                panic!("not a fresh claim: {claim:?}")
            };
            let c = raw::completion(req.key, token, &response);
            timed(&mut t.complete, store.complete(&c))
                .await
                .expect("complete");
        }
        for _ in 0..BLOCK {
            let k = key(next());
            let won: Option<Vec<u8>> = timed(
                &mut t.raw_insert,
                sqlx::query_scalar(raw::CLAIM)
                    .bind(&k.as_bytes()[..])
                    .bind("acme")
                    .bind("charge_card")
                    .bind(now().as_millis())
                    .fetch_optional(&pool),
            )
            .await
            .expect("raw insert");
            assert!(won.is_some(), "raw key was not fresh");
            timed(
                &mut t.raw_update,
                sqlx::query(raw::COMPLETE)
                    .bind(&k.as_bytes()[..])
                    .bind(RESPONSE)
                    .execute(&pool),
            )
            .await
            .expect("raw update");
            let one: i32 = timed(
                &mut t.select1,
                sqlx::query_scalar("SELECT 1").fetch_one(&pool),
            )
            .await
            .expect("select 1");
            assert_eq!(one, 1);
        }
        for _ in 0..BLOCK {
            let k = key(next());
            let r = i64::from_be_bytes(k.as_bytes()[..8].try_into().expect("8 bytes"));
            let row = timed(
                &mut t.bare11,
                sqlx::query(BARE11)
                    .bind(r)
                    .bind(&k.as_bytes()[8..])
                    .bind("acme")
                    .bind("charge_card")
                    .bind(&[][..] as &[u8])
                    .bind(now().as_millis())
                    .bind(now().as_millis() + 30_000)
                    .bind(1i64)
                    .bind("")
                    .bind(Some(0i64))
                    .bind(900i32)
                    .fetch_optional(&pool),
            )
            .await
            .expect("bare insert, 11 parameters");
            assert!(row.is_some(), "bare11 key was not fresh");
        }
        for _ in 0..BLOCK {
            let k = key(next());
            let r = i64::from_be_bytes(k.as_bytes()[..8].try_into().expect("8 bytes"));
            let row = timed(
                &mut t.bare3,
                sqlx::query(BARE3)
                    .bind(r)
                    .bind(&k.as_bytes()[8..])
                    .bind(now().as_millis())
                    .fetch_optional(&pool),
            )
            .await
            .expect("bare insert, 3 parameters");
            assert!(row.is_some(), "bare3 key was not fresh");
        }
    }
    println!(
        "pg_statements claim_us={:.0} complete_us={:.0} raw_insert_us={:.0} raw_update_us={:.0} select1_us={:.0} bare11_us={:.0} bare3_us={:.0}",
        p50_us(t.claim),
        p50_us(t.complete),
        p50_us(t.raw_insert),
        p50_us(t.raw_update),
        p50_us(t.select1),
        p50_us(t.bare11),
        p50_us(t.bare3),
    );
}
