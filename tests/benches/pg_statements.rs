//! A fresh call on PostgreSQL taken apart statement by statement, through sqlx, one client: the
//! store's claim and completion against the raw insert and update of the `stores` bench, a
//! `SELECT 1` round trip, and the claim statement's shapes (the store's CTE, a bare insert of the
//! same row with the same eleven parameters, a bare insert with three). Medians of calls
//! alternating in blocks. Prints, for scripts:
//!
//! ```text
//! pg_statements claim_us=476 raw_insert_us=453 complete_us=472 raw_update_us=452 select1_us=247 cte_us=496 bare11_us=471 bare3_us=465 raw_insert_b_us=469
//! ```
//!
//! ```text
//! DATABASE_URL=postgres://root@127.0.0.1:5432/test cargo bench -p idempotency-tests --bench pg_statements
//! ```
use idempotency::store::PostgresStore;
use idempotency::{
    clock::Timestamp,
    key::Key,
    store::{Claim, ClaimRequest, Completion, Store, StoredResponse, Token},
    Caller,
};
use idempotency_tests::pg::TestSchema;
use sqlx::postgres::PgPoolOptions;
use std::sync::Arc;
use std::time::{Duration, Instant};

const RESPONSE: &str = r#"{"charge_id":"ch_3PqR8sT2uV4wX5yZ6a7b","amount":4200,"currency":"EUR"}"#;
fn key(n: u64) -> Key {
    Key::for_call(
        &idempotency::key::Secret::demo(),
        &Caller::new("acme", "bench"),
        "charge_card",
        &n,
    )
    .unwrap()
}
fn now() -> Timestamp {
    Timestamp::from_millis(1_796_000_000_000)
}
fn p50(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

#[tokio::main]
async fn main() {
    if idempotency_tests::pg::database_url().is_none() {
        eprintln!("pg_statements: DATABASE_URL is not set; nothing measured");
        return;
    }
    let schema = TestSchema::create("statements").await.expect("a schema");
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .min_connections(2)
        .connect_with(PostgresStore::tune(schema.options()))
        .await
        .unwrap();
    let store = PostgresStore::from_pool(pool.clone()).await.unwrap();
    sqlx::query("CREATE TABLE raw_records (key BYTEA PRIMARY KEY, tenant TEXT NOT NULL, tool TEXT NOT NULL, created_at BIGINT NOT NULL, response TEXT)").execute(&pool).await.unwrap();
    let store: Arc<dyn Store> = Arc::new(store);
    let (mut sc, mut su, mut rc, mut ru, mut rs) = (vec![], vec![], vec![], vec![], vec![]);
    let mut n = 0u64;
    for _round in 0..100 {
        for _ in 0..30 {
            n += 1;
            let req = ClaimRequest {
                key: key(n),
                tenant: "acme",
                subject: None,
                tool: "charge_card",
                fingerprint: None,
                now: now(),
                lease_expires_at: now() + Duration::from_secs(30),
                window: Duration::from_secs(900),
                token: Token(1),
            };
            let t = Instant::now();
            let Claim::New { token, .. } = store.claim(&req).await.unwrap() else {
                panic!()
            };
            sc.push(t.elapsed());
            let response = StoredResponse {
                ok: true,
                body: RESPONSE.into(),
            };
            let c = Completion {
                key: req.key,
                token,
                response: &response,
                now: now(),
                expires_at: now() + Duration::from_secs(900),
                outbox: &[],
            };
            let t = Instant::now();
            store.complete(&c).await.unwrap();
            su.push(t.elapsed());
        }
        for _ in 0..30 {
            n += 1;
            let k = key(n);
            let t = Instant::now();
            let won: Option<Vec<u8>> = sqlx::query_scalar("INSERT INTO raw_records (key, tenant, tool, created_at) VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING RETURNING key")
                .bind(&k.as_bytes()[..]).bind("acme").bind("charge_card").bind(now().as_millis()).fetch_optional(&pool).await.unwrap();
            rc.push(t.elapsed());
            assert!(won.is_some());
            let t = Instant::now();
            sqlx::query("UPDATE raw_records SET response = $2 WHERE key = $1")
                .bind(&k.as_bytes()[..])
                .bind(RESPONSE)
                .execute(&pool)
                .await
                .unwrap();
            ru.push(t.elapsed());
            let t = Instant::now();
            let _: i32 = sqlx::query_scalar("SELECT 1")
                .fetch_one(&pool)
                .await
                .unwrap();
            rs.push(t.elapsed());
        }
    }
    let clk = "COALESCE((extract(epoch FROM statement_timestamp()) * 1000)::BIGINT + $10::BIGINT, $6::BIGINT)";
    let cols = "(ref, token, claimed_at, window_s, lease_or_settled_at, generation, state, key_rest, tenant, subject, tool, fingerprint)";
    let values =
        format!("VALUES ($1, $8, {clk}, $11, {clk} + ($7 - $6), 1, 0, $2, $3, $9, $4, $5)");
    let cte = format!("WITH ins AS (INSERT INTO idempotency_records {cols} {values} ON CONFLICT (ref) DO NOTHING RETURNING 1) SELECT NULL::idempotency_records, NULL::BIGINT FROM ins UNION ALL SELECT r, {clk} FROM idempotency_records r WHERE ref = $1 AND NOT EXISTS (SELECT 1 FROM ins)");
    let plain = format!(
        "INSERT INTO idempotency_records {cols} {values} ON CONFLICT (ref) DO NOTHING RETURNING 1"
    );
    let few = "INSERT INTO idempotency_records (ref, token, claimed_at, window_s, lease_or_settled_at, generation, state, key_rest, tenant, subject, tool, fingerprint) VALUES ($1, 1, $3, 900, $3 + 30000, 1, 0, $2, 'acme', '', 'charge_card', ''::BYTEA) ON CONFLICT (ref) DO NOTHING RETURNING 1".to_string();
    let variants = [("cte", cte), ("bare11", plain), ("bare3", few)];
    let mut times: Vec<Vec<Duration>> = vec![vec![]; 4];
    for _round in 0..60 {
        for (i, (name, sql)) in variants.iter().enumerate() {
            for _ in 0..25 {
                n += 1;
                let k = key(n);
                let r = i64::from_be_bytes(k.as_bytes()[..8].try_into().unwrap());
                let q = sqlx::query(sqlx::AssertSqlSafe(sql.clone()));
                let q = if *name == "bare3" {
                    q.bind(r).bind(&k.as_bytes()[8..]).bind(now().as_millis())
                } else {
                    q.bind(r)
                        .bind(&k.as_bytes()[8..])
                        .bind("acme")
                        .bind("charge_card")
                        .bind(&[][..] as &[u8])
                        .bind(now().as_millis())
                        .bind(now().as_millis() + 30000)
                        .bind(1i64)
                        .bind("")
                        .bind(Some(0i64))
                        .bind(900i32)
                };
                let t = Instant::now();
                let row = q.fetch_optional(&pool).await.unwrap();
                times[i].push(t.elapsed());
                assert!(row.is_some());
            }
        }
        for _ in 0..25 {
            n += 1;
            let k = key(n);
            let t = Instant::now();
            let won: Option<Vec<u8>> = sqlx::query_scalar("INSERT INTO raw_records (key, tenant, tool, created_at) VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING RETURNING key")
                .bind(&k.as_bytes()[..]).bind("acme").bind("charge_card").bind(now().as_millis()).fetch_optional(&pool).await.unwrap();
            times[3].push(t.elapsed());
            assert!(won.is_some());
        }
    }
    let t: Vec<f64> = times.into_iter().map(p50).collect();
    println!(
        "pg_statements claim_us={:.0} raw_insert_us={:.0} complete_us={:.0} raw_update_us={:.0} select1_us={:.0} cte_us={:.0} bare11_us={:.0} bare3_us={:.0} raw_insert_b_us={:.0}",
        p50(sc), p50(rc), p50(su), p50(ru), p50(rs), t[0], t[1], t[2], t[3]
    );
}
