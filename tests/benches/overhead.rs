//! The cost of `#[idempotent]` over the same logic written by hand against the runtime (derive
//! the `Prepared` key, build the body future, call the engine), both on `MemoryStore`, for fresh
//! calls and for replays. Rounds of both are interleaved in one run, alternating which goes
//! first, so drift and warm-up hit both alike.
//!
//! `cargo bench -p idempotency-tests --bench overhead` (`OVERHEAD_N` sets calls per variant).

use std::hint::black_box;
use std::time::{Duration, Instant};

use idempotency::{
    idempotent,
    outcome::ErrorPolicy,
    store::MemoryStore,
    tool::{Prepared, ToolSpec},
    Caller, Error, Idempotency, IdempotencyContext,
};
use serde::{Deserialize, Serialize};

struct Ctx {
    engine: Idempotency,
}

impl IdempotencyContext for Ctx {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, _: &()) -> Result<Caller, Error> {
        Ok(Caller::new("acme", "alice"))
    }
}

#[derive(Serialize)]
struct ChargeArgs {
    amount: u64,
    currency: &'static str,
    card_token: &'static str,
}

#[derive(Serialize, Deserialize)]
struct Receipt {
    amount: u64,
    status: String,
}

fn work(args: &ChargeArgs) -> Result<Receipt, Error> {
    Ok(Receipt {
        amount: black_box(args.amount),
        status: "captured".into(),
    })
}

// Equal-length names: the name is hashed into the key.
#[idempotent(name = "charge_m", window = "15m", on_error = "retryable")]
async fn by_macro(ctx: &Ctx, args: ChargeArgs) -> Result<Receipt, Error> {
    work(&args)
}

/// What a careful user writes without the attribute.
async fn by_hand(ctx: &Ctx, args: ChargeArgs) -> Result<Receipt, Error> {
    const SPEC: ToolSpec = ToolSpec::new("charge_h", Duration::from_secs(15 * 60));
    let engine = ctx.idempotency();
    let caller = ctx.caller(&())?;
    let prepared = Prepared::call(&caller, &SPEC, &args)?;
    let body = async move { work(&args) };
    engine
        .execute(prepared, ErrorPolicy::retryable(), body)
        .await
        .result
}

fn args(amount: u64) -> ChargeArgs {
    ChargeArgs {
        amount,
        currency: "EUR",
        card_token: "tok_visa_4242",
    }
}

#[derive(Default)]
struct Timing {
    total: Duration,
    calls: u64,
}

impl Timing {
    fn ns(&self) -> f64 {
        self.total.as_nanos() as f64 / self.calls.max(1) as f64
    }
}

async fn round_macro(ctx: &Ctx, amounts: std::ops::Range<u64>, t: &mut Timing) {
    let n = amounts.end - amounts.start;
    let start = Instant::now();
    for a in amounts {
        black_box(by_macro(ctx, args(a)).await.is_ok());
    }
    t.total += start.elapsed();
    t.calls += n;
}

async fn round_hand(ctx: &Ctx, amounts: std::ops::Range<u64>, t: &mut Timing) {
    let n = amounts.end - amounts.start;
    let start = Instant::now();
    for a in amounts {
        black_box(by_hand(ctx, args(a)).await.is_ok());
    }
    t.total += start.elapsed();
    t.calls += n;
}

/// `n` calls per variant in rounds of `batch`; `fresh` gives every call new arguments, otherwise
/// the calls cycle over `batch` keys recorded beforehand.
async fn measure(n: u64, batch: u64, fresh: bool) -> (Timing, Timing) {
    let m = Ctx {
        engine: Idempotency::new(MemoryStore::new()),
    };
    let h = Ctx {
        engine: Idempotency::new(MemoryStore::new()),
    };
    if !fresh {
        round_macro(&m, 0..batch, &mut Timing::default()).await;
        round_hand(&h, 0..batch, &mut Timing::default()).await;
    }
    let (mut tm, mut th) = (Timing::default(), Timing::default());
    for round in 0..n / batch {
        let range = if fresh {
            1_000_000 + round * batch..1_000_000 + (round + 1) * batch
        } else {
            0..batch
        };
        if round % 2 == 0 {
            round_macro(&m, range.clone(), &mut tm).await;
            round_hand(&h, range, &mut th).await;
        } else {
            round_hand(&h, range.clone(), &mut th).await;
            round_macro(&m, range, &mut tm).await;
        }
    }
    (tm, th)
}

fn main() {
    let n: u64 = std::env::var("OVERHEAD_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let batch = 1_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        // Warm-up (allocator, caches, lazy statics), not counted.
        measure(batch * 10, batch, true).await;
        println!("#[idempotent] vs hand-written, MemoryStore, {n} calls each, rounds of {batch}, interleaved");
        for (label, fresh) in [("fresh  ", true), ("replay ", false)] {
            let (m, h) = measure(n, batch, fresh).await;
            println!(
                "{label} macro {:>8.0} ns/call   by hand {:>8.0} ns/call   ratio {:.3}x",
                m.ns(),
                h.ns(),
                m.ns() / h.ns()
            );
        }
    });
}
