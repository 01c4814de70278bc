//! The HTTP layer's cost over the same axum handler without it, in one run, over a real loopback
//! server (axum::serve, reqwest): the median latency of a request with a fresh key, the
//! throughput of 32 clients sending fresh keys, and the median latency of a replay. One line per
//! store (a SQLite file; PostgreSQL with `DATABASE_URL`):
//!
//! ```text
//! http store=<sqlite|postgres> fresh_p50_ratio_bare=<x> tps32_ratio_bare=<y> replay_p50_us=<z>
//! ```
//!
//! `fresh_p50_ratio_bare` is the layer's median over the bare handler's, `tps32_ratio_bare` the
//! layer's throughput over the bare handler's (both under 32 clients), `replay_p50_us` a
//! replay's median in microseconds. Rounds of both sides are interleaved, so drift and warm-up
//! hit both alike.
//!
//! `cargo bench -p idempotency-tests --bench http` (`HTTP_N` sets the sequential requests per
//! side, 400; `HTTP_TPS_N` the requests of each of the 32 clients, 50).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idempotency::http::IdempotencyLayer;
use idempotency::store::{SqliteStore, Store};
use idempotency::tool::ToolSpec;
use idempotency::{Caller, Idempotency};
use idempotency_tests::pg::TestSchema;

const CREATE_ORDER: ToolSpec = ToolSpec::new("create_order", Duration::from_secs(24 * 3600));
const CLIENTS: usize = 32;

async fn create(body: axum::body::Bytes) -> Response {
    let answer = format!(r#"{{"order":"created","bytes":{}}}"#, body.len());
    (
        axum::http::StatusCode::CREATED,
        [("content-type", "application/json")],
        answer,
    )
        .into_response()
}

async fn authenticate(mut request: Request, next: Next) -> Response {
    request
        .extensions_mut()
        .insert(Caller::new("acme", "alice"));
    next.run(request).await
}

/// A server of `/orders` on a loopback port, with the layer or bare; its URL.
async fn serve(layer: Option<IdempotencyLayer>) -> String {
    let route = match layer {
        Some(layer) => post(create).layer(layer),
        None => post(create),
    };
    let app = Router::new()
        .route("/orders", route)
        .layer(middleware::from_fn(authenticate));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let at = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{at}/orders")
}

/// One request with `key`: its latency.
async fn send(client: &reqwest::Client, url: &str, key: &str) -> Duration {
    let began = Instant::now();
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(r#"{"amount":4200,"currency":"EUR"}"#)
        .send()
        .await
        .expect("an answer");
    assert!(r.status().is_success(), "{}", r.status());
    r.bytes().await.expect("a body");
    began.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Requests per second of 32 clients each sending `per_client` fresh keys.
async fn throughput(url: &str, nonce: &str, per_client: usize) -> f64 {
    let client = reqwest::Client::new();
    let began = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (client, url, nonce) = (client.clone(), url.to_owned(), nonce.to_owned());
            tokio::spawn(async move {
                for i in 0..per_client {
                    send(&client, &url, &format!("tps-{nonce}-{c:03}-{i:08}")).await;
                }
            })
        })
        .collect();
    for c in clients {
        c.await.expect("a client");
    }
    (CLIENTS * per_client) as f64 / began.elapsed().as_secs_f64()
}

async fn measure(name: &str, store: Arc<dyn Store>) {
    let n: usize = std::env::var("HTTP_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let per_client: usize = std::env::var("HTTP_TPS_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let engine = Idempotency::builder_shared(store).build();
    let layered = serve(Some(IdempotencyLayer::new(engine, CREATE_ORDER))).await;
    let bare = serve(None).await;
    let client = reqwest::Client::new();
    // Warm both up (connections, statements).
    for i in 0..20 {
        send(&client, &layered, &format!("warm-{i:08}")).await;
        send(&client, &bare, &format!("warm-{i:08}")).await;
    }
    let (mut with, mut without) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let key = format!("fresh-{i:012}");
        if i % 2 == 0 {
            with.push(send(&client, &layered, &key).await);
            without.push(send(&client, &bare, &key).await);
        } else {
            without.push(send(&client, &bare, &key).await);
            with.push(send(&client, &layered, &key).await);
        }
    }
    let fresh_ratio = median(with).as_secs_f64() / median(without).as_secs_f64();
    let replays: Vec<Duration> = {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(send(&client, &layered, "fresh-000000000000").await);
        }
        v
    };
    let replay_us = median(replays).as_secs_f64() * 1e6;
    let (mut tps_with, mut tps_without) = (0.0, 0.0);
    for round in 0..2 {
        let nonce = format!("r{round}");
        if round % 2 == 0 {
            tps_with += throughput(&layered, &nonce, per_client).await;
            tps_without += throughput(&bare, &nonce, per_client).await;
        } else {
            tps_without += throughput(&bare, &nonce, per_client).await;
            tps_with += throughput(&layered, &nonce, per_client).await;
        }
    }
    println!(
        "http store={name} fresh_p50_ratio_bare={fresh_ratio:.2} tps32_ratio_bare={:.3} replay_p50_us={replay_us:.0}",
        tps_with / tps_without
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let path = std::env::temp_dir().join(format!("bench-http-{}.db", std::process::id()));
        let sqlite = SqliteStore::open(&path).await.expect("open sqlite");
        measure("sqlite", Arc::new(sqlite)).await;
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
        match TestSchema::create("bench_http").await {
            Some(schema) => {
                measure("postgres", Arc::new(schema.store().await)).await;
                schema.drop_schema().await;
            }
            None => eprintln!("http: PostgreSQL skipped (no DATABASE_URL)"),
        }
    });
}
