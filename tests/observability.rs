//! The tests that set a tracing subscriber for their thread (`set_default`): in a process of
//! their own, one at a time. tracing caches each callsite's interest and the highest enabled level
//! process-wide; a subscriber set while another thread registers a callsite, or sets or drops a
//! subscriber of its own, can miss spans and events (seen: the call span of
//! `otel::a_clients_traceparent_parents_the_call_span` never reached its subscriber when the file
//! ran inside the `integration` binary).

#[cfg(all(feature = "rmcp", feature = "opentelemetry"))]
mod otel;
mod tracing;

/// Held for the whole of each test that sets a subscriber, so no two overlap.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
