//! The kit itself: a store that breaks the contract fails the cases that check that part, and
//! the report names them.

use crate::clock::Timestamp;
use crate::key::{Key, Reference, SecretFingerprint};
use crate::store::{
    BoxFuture, Claim, ClaimRequest, Maintenance, MemoryStore, OutboxEntry, OutboxStore, Receipt,
    RecordStatus, RecordStore, SecretStore, StoreError, Token, Transition, Transitioned, Unsettled,
};

/// The memory store, except that `status` never finds a record.
struct Forgetful(MemoryStore);

impl RecordStore for Forgetful {
    fn claim<'a>(&'a self, req: &'a ClaimRequest<'a>) -> BoxFuture<'a, Result<Claim, StoreError>> {
        self.0.claim(req)
    }
    fn transition<'a>(
        &'a self,
        key: Key,
        token: Token,
        op: Transition<'a>,
    ) -> BoxFuture<'a, Result<Transitioned, StoreError>> {
        self.0.transition(key, token, op)
    }
    fn status<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: Reference,
    ) -> BoxFuture<'a, Result<Option<RecordStatus>, StoreError>> {
        Box::pin(async { Ok(None) })
    }
}

impl Maintenance for Forgetful {
    fn purge(
        &self,
        now: Timestamp,
        older_than: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.0.purge(now, older_than, limit)
    }
    fn unsettled(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Unsettled>, StoreError>> {
        self.0.unsettled(now, limit)
    }
}

impl OutboxStore for Forgetful {
    fn fetch(
        &self,
        now: Timestamp,
        invisible_until: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<OutboxEntry>, StoreError>> {
        self.0.fetch(now, invisible_until, limit)
    }
    fn ack<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        self.0.ack(receipt)
    }
}

impl SecretStore for Forgetful {
    fn swap_secret(
        &self,
        expected: Option<SecretFingerprint>,
        new: SecretFingerprint,
    ) -> BoxFuture<'_, Result<Option<SecretFingerprint>, StoreError>> {
        self.0.swap_secret(expected, new)
    }
}

/// What the task running `f` panicked with.
async fn panic_of(f: impl std::future::Future<Output = ()> + Send + 'static) -> String {
    let e = tokio::spawn(f).await.expect_err("it panics");
    *e.into_panic()
        .downcast::<String>()
        .expect("a formatted message")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_passes_every_case() {
    super::run_with(
        || async { MemoryStore::new() },
        super::Options::default().crowd(100),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_store_fails_with_a_report_naming_each_failed_case() {
    let report = panic_of(super::run(|| async { Forgetful(MemoryStore::new()) })).await;
    assert!(
        report.contains(" of 24 store conformance cases failed:"),
        "{report}"
    );
    for case in [
        "window_edges",
        "status_is_tenant_scoped_and_generation_exact",
        "renew_extends_the_lease",
    ] {
        assert!(report.contains(&format!("- `{case}`:")), "{case}: {report}");
    }
    assert!(
        !report.contains("`no_row_is_new_then_in_flight`"),
        "{report}"
    );

    let one = panic_of(super::run_case("window_edges", || async {
        Forgetful(MemoryStore::new())
    }))
    .await;
    assert!(
        one.starts_with("conformance case `window_edges` failed: "),
        "{one}"
    );
    super::run_case("no_row_is_new_then_in_flight", || async {
        Forgetful(MemoryStore::new())
    })
    .await;
}

#[tokio::test]
async fn an_unknown_case_is_refused_with_the_names() {
    let refused = panic_of(super::run_case("no_such_case", || async {
        MemoryStore::new()
    }))
    .await;
    assert!(
        refused.contains("no conformance case is named `no_such_case`"),
        "{refused}"
    );
    assert!(refused.contains("window_edges"), "{refused}");
}

#[test]
fn cases_are_named_once() {
    let mut names: Vec<&str> = super::cases().collect();
    assert_eq!(names.len(), 24);
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), 24);
}
