//! The integration tests, one binary: each file beside this one is a module (a topic), so a
//! `cargo test` links this binary once instead of once per topic. A module whose stores or
//! integrations are features of this crate is built only with them (as `required-features`
//! did). Tests that run this binary again as a worker process find themselves by name through
//! `idempotency_tests::processes::test_path`.

mod behaviour;
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "redis"))]
mod cache;
#[cfg(all(feature = "sqlite", feature = "postgres"))]
mod clocks;
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "redis"))]
mod corrupt;
#[cfg(all(
    feature = "http",
    feature = "rmcp",
    feature = "sqlite",
    feature = "postgres",
    feature = "redis"
))]
mod doors;
mod engine;
#[cfg(all(feature = "sqlite", feature = "postgres"))]
mod faults;
#[cfg(all(
    feature = "http",
    feature = "sqlite",
    feature = "postgres",
    feature = "redis"
))]
mod http;
mod keys;
mod metrics;
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "redis"))]
mod pauses;
#[cfg(feature = "rmcp")]
mod progress;
mod purger;
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "redis"))]
mod recovery;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod redis_failover;
#[cfg(feature = "postgres")]
mod replicas;
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "redis"))]
mod rerun;
#[cfg(feature = "sqlite")]
mod restart;
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "redis"))]
mod secrets;
#[cfg(all(feature = "postgres", feature = "redis"))]
mod skew;
#[cfg(all(feature = "postgres", feature = "rmcp"))]
mod tasks;
mod terminal;
#[cfg(all(
    feature = "sqlite",
    feature = "postgres",
    feature = "redis",
    feature = "rmcp"
))]
mod transactional;
#[cfg(all(feature = "sqlite", feature = "postgres"))]
mod transactional_crash;
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "redis"))]
mod wait;
