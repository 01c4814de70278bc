//! The metrics as an operator's Prometheus sees them: every metric the library records is
//! described (`# HELP`) with the kind docs/metrics.md's table gives, histograms come with the
//! library's buckets (not summaries), and docs/metrics.md's table lists exactly the library's
//! metrics. Calls, a waiting repeat, a cache hit, a lease-expiry round and a purge run through
//! one engine under a Prometheus recorder, and its rendering is read back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use idempotency::clock::{ManualClock, Timestamp};
use idempotency::key::Secret;
use idempotency::metrics::{Kind, BUCKETS, METRICS};
use idempotency::outcome::ErrorPolicy;
use idempotency::store::{ClaimRequest, MemoryStore, Settlement, Store, Token, Unsettled};
use idempotency::tasks::{Purger, Reconcile, Reconciler};
use idempotency::tool::{Prepared, Recover, ToolSpec};
use idempotency::{Caller, Idempotency};
use idempotency_tests::charge::ChargeError;

const T0: i64 = 1_796_000_000_000;
const SPEC: ToolSpec = ToolSpec::new("charge_card", Duration::from_secs(60));

struct StillUnknown;

impl Reconcile for StillUnknown {
    fn reconcile<'a>(
        &'a self,
        _: &'a Unsettled,
    ) -> idempotency::store::BoxFuture<'a, Result<Settlement, idempotency::store::BoxError>> {
        Box::pin(async { Ok(Settlement::Unknown) })
    }
}

async fn exercise() {
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let engine = Idempotency::builder_shared(store.clone())
        .clock(clock.clone())
        .lease(Duration::from_secs(1))
        .without_reconciler()
        .cache(1)
        .build();
    let alice = Caller::new("acme", "alice");
    let call = |n: u64, spec: ToolSpec| {
        engine.execute_raw(
            Prepared::call(&alice, &spec, &n).expect("key"),
            ErrorPolicy::<ChargeError>::classified(),
            async move { Ok::<u64, ChargeError>(n) },
        )
    };
    // Fresh, then a replay from the cache.
    assert!(!call(1, SPEC).await.replayed);
    assert!(call(1, SPEC).await.replayed);
    // A repeat that waits for the call in progress.
    let (entered_tx, entered) = tokio::sync::oneshot::channel();
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let first = engine.execute_raw(
        Prepared::call(&alice, &SPEC, &2u64).expect("key"),
        ErrorPolicy::<ChargeError>::classified(),
        async move {
            let _ = entered_tx.send(());
            g.notified().await;
            Ok::<u64, ChargeError>(2)
        },
    );
    let waiting = async {
        entered.await.expect("entered");
        let repeat = call(2, SPEC.with_wait(Duration::from_secs(30)));
        tokio::pin!(repeat);
        // Let the repeat find the call and start waiting, then let the call finish.
        tokio::select! {
            biased;
            _ = &mut repeat => panic!("answered before the call finished"),
            () = tokio::task::yield_now() => {}
        }
        gate.notify_one();
        repeat.await
    };
    let (first, repeat) = tokio::join!(first, waiting);
    assert_eq!(first.result.ok(), Some(2));
    assert!(repeat.replayed);
    // A claim whose worker is gone, found by a round that leaves it unknown.
    let gone = engine.execute_raw(
        Prepared::call(&alice, &SPEC, &3u64).expect("key"),
        ErrorPolicy::<ChargeError>::classified(),
        std::future::pending::<Result<u64, ChargeError>>(),
    );
    let _ = tokio::time::timeout(Duration::from_millis(1), gone).await;
    // A claim made by a worker that died at once (its lease passes), run again by a repeat
    // of a tool with `recover = "rerun"`.
    let prepared = Prepared::call(&alice, &SPEC, &4u64).expect("key");
    let request = ClaimRequest {
        key: prepared.key.key(&Secret::demo()),
        tenant: "acme",
        subject: Some("alice"),
        tool: SPEC.name(),
        fingerprint: None,
        now: Timestamp::from_millis(T0),
        lease: Duration::from_secs(1),
        window: SPEC.window(),
        token: Token(1),
    };
    store.claim(&request).await.expect("claim");
    clock.advance(Duration::from_secs(2));
    let rerun = call(4, SPEC.with_recover(Recover::Rerun)).await;
    assert_eq!(rerun.result.ok(), Some(4));
    let report = Reconciler::new(&engine, StillUnknown)
        .run_once()
        .await
        .expect("round");
    assert_eq!(report.examined, 1, "{report:?}");
    // Windows and retention over: the purger deletes the completed records.
    clock.advance(Duration::from_secs(3_600));
    let purged = Purger::new(&engine)
        .retention(Duration::ZERO)
        .run_once()
        .await
        .expect("purge");
    assert!(purged >= 2, "purged {purged}");
}

/// `# HELP` and `# TYPE` of each metric the exporter printed.
fn printed(text: &str) -> BTreeMap<String, (String, String)> {
    let mut help = BTreeMap::new();
    let mut kind = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, h) = rest.split_once(' ').expect("name and text");
            help.insert(name.to_owned(), h.to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, k) = rest.split_once(' ').expect("name and kind");
            kind.insert(name.to_owned(), k.to_owned());
        }
    }
    kind.into_iter()
        .map(|(name, k)| {
            let h = help.get(&name).cloned().unwrap_or_default();
            (name, (k, h))
        })
        .collect()
}

fn kind_word(k: Kind) -> &'static str {
    match k {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
        Kind::Histogram => "histogram",
    }
}

#[test]
fn every_metric_is_described_with_its_kind_and_buckets() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(BUCKETS)
        .expect("buckets")
        .build_recorder();
    let handle = recorder.handle();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    metrics::with_local_recorder(&recorder, || rt.block_on(exercise()));
    let text = handle.render();
    let printed = printed(&text);
    for (name, kind, help) in METRICS {
        let Some((k, h)) = printed.get(*name) else {
            panic!("{name} was not recorded by the exercise:\n{text}")
        };
        assert_eq!(k, kind_word(*kind), "{name}:\n{text}");
        assert!(h.starts_with(help.trim_end_matches('.')), "{name}: {h:?}");
    }
    assert_eq!(
        printed.len(),
        METRICS.len(),
        "the exporter printed metrics the library does not list:\n{text}"
    );
    // Histograms with the library's buckets, from 0.1 ms to 10 s.
    for bound in ["le=\"0.0001\"", "le=\"10\""] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("idempotency_store_seconds_bucket{") && l.contains(bound)),
            "{bound}:\n{text}"
        );
    }
}

/// The metrics table (docs/metrics.md, which the README points to) lists exactly the library's
/// metrics, with their kinds.
#[test]
fn the_docs_list_every_metric() {
    let readme = include_str!("../docs/metrics.md");
    let section = readme
        .split("## Metrics")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a Metrics section");
    let listed: BTreeSet<(String, String)> = section
        .lines()
        .filter(|l| l.starts_with("| `idempotency_"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
        })
        .collect();
    let library: BTreeSet<(String, String)> = METRICS
        .iter()
        .map(|(name, kind, _)| ((*name).to_owned(), kind_word(*kind).to_owned()))
        .collect();
    assert_eq!(listed, library);
}
