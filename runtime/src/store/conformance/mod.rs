//! The store conformance suite (feature `conformance`): prove that a store keeps the contract
//! of the [store traits](crate::store), with the cases every built-in store passes.
//!
//! Give it a factory (an async closure, or any [`Factory`]) that makes a fresh, empty store;
//! the suite makes one per case and runs the cases one after another:
//!
//! ```
//! use idempotency::store::{conformance, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! conformance::run(|| async { MemoryStore::new() }).await;
//! # }
//! ```
//!
//! [`run`] panics when a case fails, with a report naming every failed case and what it
//! expected. To see each case as a test of its own, generate one test per name of [`cases`]
//! and call [`run_case`] in it (the workspace's own suite does, for every built-in store).
//!
//! Every case passes explicit times (in 2026, ms apart), so a store must decide by the times it
//! is given (a store that reads its server's clock needs a way to trust the caller's, as
//! `RedisStoreBuilder::trust_engine_clock` does). The contention cases spawn Tokio tasks, so the
//! suite runs inside a Tokio runtime; a multi-threaded one makes their races real.

use std::future::Future;

use crate::store::{BoxFuture, Store};

mod background;
mod claims;
mod concurrency;
mod fencing;
pub mod fixtures;
mod outbox;
mod run;
mod settle;
mod status;
mod subject;
#[cfg(test)]
mod tests;

use subject::Subject;

/// What makes the store under test: a fresh, empty store for each case.
///
/// Implemented for every closure `Fn() -> impl Future<Output = S>` where `S` is a [`Store`], so
/// `|| async { MyStore::connect(&fresh_table()).await.expect("connect") }` is a factory. A
/// store whose setup can fail panics in its factory: the case fails with that message.
pub trait Factory: Sync {
    /// The store it makes.
    type Store: Store;

    /// A fresh, empty store: no record, no outbox message, no secret.
    fn store(&self) -> impl Future<Output = Self::Store> + Send;
}

impl<F, Fut, S> Factory for F
where
    F: Fn() -> Fut + Sync,
    Fut: Future<Output = S> + Send,
    S: Store,
{
    type Store = S;

    fn store(&self) -> impl Future<Output = S> + Send {
        self()
    }
}

/// How the suite runs: [`Options::default`], changed by its methods.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Options {
    crowd: usize,
}

impl Default for Options {
    /// A crowd of 1,000 concurrent callers.
    fn default() -> Options {
        Options { crowd: 1_000 }
    }
}

impl Options {
    /// How many concurrent claims (or takeovers) of one key the contention cases make, of which
    /// exactly one must win (default 1,000; the workspace runs SQLite, one writer at a time,
    /// with 200). At least 2.
    #[must_use]
    pub fn crowd(mut self, callers: usize) -> Options {
        self.crowd = callers.max(2);
        self
    }
}

/// One case: its name and its body.
struct Case {
    name: &'static str,
    body: for<'a> fn(&'a Subject) -> BoxFuture<'a, ()>,
}

macro_rules! cases {
    ($($topic:ident :: $case:ident),* $(,)?) => {
        /// Every case, by topic.
        const CASES: &[Case] = &[$(
            Case { name: stringify!($case), body: |b| Box::pin($topic::$case(b)) },
        )*];
    };
}

cases!(
    claims::no_row_is_new_then_in_flight,
    claims::in_flight_stays_in_flight_after_its_lease,
    claims::completed_replays_within_its_window,
    claims::window_edges,
    claims::slow_completion_counts_the_window_from_completion,
    claims::fingerprint_mismatch,
    claims::each_claim_of_a_record_has_a_later_claim_time,
    fencing::released_is_taken_over_under_the_same_reference,
    fencing::unknown_answers_unknown_until_settled,
    fencing::stale_tokens_are_fenced,
    fencing::tokens_are_not_reused_after_a_purge,
    fencing::late_completion_after_settle_is_fenced,
    fencing::renew_extends_the_lease,
    status::status_is_tenant_scoped_and_generation_exact,
    background::purge_deletes_only_settled_records_past_the_cutoff,
    background::unsettled_lists_expired_leases_and_unknowns,
    settle::settle_completed_answers_repeats_for_the_window,
    settle::settle_released_lets_a_repeat_run_under_the_same_reference,
    settle::settle_unknown_keeps_it_unknown_until_its_worker_reports,
    settle::a_settlement_after_unknown_fences_the_worker,
    outbox::outbox_is_written_with_the_completion,
    concurrency::concurrent_claims_have_one_winner,
    concurrency::concurrent_takeovers_have_one_winner,
    concurrency::a_gone_call_is_taken_over_once_under_its_reference,
);

/// The names of every case, in the order [`run`] runs them: to generate a test per case, and
/// to check that a harness that does lists them all.
///
/// ```
/// let names: Vec<&str> = idempotency::store::conformance::cases().collect();
/// assert!(names.contains(&"concurrent_claims_have_one_winner"));
/// ```
pub fn cases() -> impl ExactSizeIterator<Item = &'static str> {
    CASES.iter().map(|c| c.name)
}

/// Runs every case, each on a fresh store from `factory`, with the default [`Options`].
///
/// # Panics
///
/// When a case fails: after every case ran, with a report naming each failed case and why.
pub async fn run(factory: impl Factory) {
    run_with(factory, Options::default()).await;
}

/// [`run`] with `options`.
///
/// ```
/// use idempotency::store::{conformance, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let options = conformance::Options::default().crowd(50);
/// conformance::run_with(|| async { MemoryStore::new() }, options).await;
/// # }
/// ```
///
/// # Panics
///
/// When a case fails, as [`run`].
pub async fn run_with(factory: impl Factory, options: Options) {
    let mut failed = Vec::new();
    for case in CASES {
        if let Err(why) = run::one(case, &factory, &options).await {
            failed.push((case.name, why));
        }
    }
    if !failed.is_empty() {
        panic!("{}", run::report(&failed, CASES.len()));
    }
}

/// Runs the case named `name` (one of [`cases`]) on a fresh store from `factory`, with the
/// default [`Options`].
///
/// ```
/// use idempotency::store::{conformance, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// conformance::run_case("window_edges", || async { MemoryStore::new() }).await;
/// # }
/// ```
///
/// # Panics
///
/// When the case fails (the message names it and what it expected), or no case is named `name`.
pub async fn run_case(name: &str, factory: impl Factory) {
    run_case_with(name, factory, Options::default()).await;
}

/// [`run_case`] with `options`.
///
/// # Panics
///
/// As [`run_case`].
pub async fn run_case_with(name: &str, factory: impl Factory, options: Options) {
    let Some(case) = CASES.iter().find(|c| c.name == name) else {
        let known: Vec<&str> = cases().collect();
        panic!(
            "no conformance case is named `{name}`; the cases are: {}",
            known.join(", ")
        );
    };
    if let Err(why) = run::one(case, &factory, &options).await {
        panic!("conformance case `{name}` failed: {why}");
    }
}
