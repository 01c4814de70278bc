//! What a kind of call adds to the one pipeline, at the point where it learns something of its
//! own: a task (`mcp/task_impl.rs`) learns the claim that names it, to answer with the task
//! while its body runs.

use std::future::Future;

use crate::key::Reference;

/// A kind of call's hooks into the pipeline. A plain call has none: `()`.
pub(crate) trait Hooks: Send {
    /// The call holds its claim under `reference` (new, taken over, or its transaction open):
    /// what runs under it is `body` after whatever the hook does first, inside the body's scope
    /// and bounds (its lease, its timeout, its drop guard).
    fn on_claimed<F>(self, reference: Reference, body: F) -> impl Future<Output = F::Output> + Send
    where
        F: Future + Send;
}

/// A plain call: the body as it is.
impl Hooks for () {
    fn on_claimed<F>(self, _: Reference, body: F) -> impl Future<Output = F::Output> + Send
    where
        F: Future + Send,
    {
        body
    }
}
