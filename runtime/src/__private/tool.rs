//! A wrapped tool's descriptor as `#[idempotent]` writes it: `Tool::new(name, window_ms)`, its
//! options as methods, then `.spec()` (or `.registered()`, for a tool registered at link
//! time), all `const`.

use core::time::Duration;

use crate::key::Scope;
use crate::tool::{Recover, Registered, ToolSpec};

/// A [`ToolSpec`] being written by the attribute, in milliseconds and flags.
#[derive(Clone, Copy, Debug)]
pub struct Tool(ToolSpec);

impl Tool {
    /// The tool `name`, its answers replayed for `window_ms`.
    pub const fn new(name: &'static str, window_ms: u64) -> Self {
        Tool(ToolSpec::new(name, Duration::from_millis(window_ms)))
    }

    /// `timeout = "…"`.
    pub const fn timeout_ms(self, ms: u64) -> Self {
        Tool(self.0.with_timeout(Duration::from_millis(ms)))
    }

    /// `wait = "…"`.
    pub const fn wait_ms(self, ms: u64) -> Self {
        Tool(self.0.with_wait(Duration::from_millis(ms)))
    }

    /// `scope = "tenant"`.
    pub const fn tenant_scope(self) -> Self {
        Tool(self.0.with_scope(Scope::Tenant))
    }

    /// `scope = "subject"`.
    pub const fn subject_scope(self) -> Self {
        Tool(self.0.with_scope(Scope::Subject))
    }

    /// `ignore = [...]` (and the client key's own field).
    pub const fn ignoring(self, fields: &'static [&'static str]) -> Self {
        Tool(self.0.ignoring(fields))
    }

    /// `recover = "unknown"`.
    pub const fn recover_unknown(self) -> Self {
        Tool(self.0.with_recover(Recover::Unknown))
    }

    /// `recover = "rerun"`.
    pub const fn recover_rerun(self) -> Self {
        Tool(self.0.with_recover(Recover::Rerun))
    }

    /// `recover = "reconcile"`.
    pub const fn recover_reconcile(self) -> Self {
        Tool(self.0.with_recover(Recover::Reconcile))
    }

    /// `transactional`.
    pub const fn transactional(self) -> Self {
        Tool(self.0.with_transactional())
    }

    /// The descriptor.
    pub const fn spec(self) -> ToolSpec {
        self.0
    }

    /// The descriptor's registration at link time (a `static`, hence `const`).
    pub const fn registered(self) -> Registered {
        Registered::new(self.0)
    }
}
