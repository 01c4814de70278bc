//! The body as an attempt polls it: panics caught, its first poll noted, and never polled once
//! its worker's lease has passed.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use crate::engine::call::Call;
use crate::engine::lease::Lease;

/// A panic's message, when it has one.
pub(in crate::engine) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// The body, with panics caught and its first poll noted (a body that never started can be
/// released; one that started cannot), and never polled once its worker's lease has passed.
pub(in crate::engine) struct Running<'g, Fut> {
    pub(in crate::engine) body: Pin<Box<tokio::task::futures::TaskLocalFuture<Call, Fut>>>,
    pub(in crate::engine) started: &'g AtomicBool,
    /// The worker's lease, if the body runs under one.
    pub(in crate::engine) lease: Option<&'g Lease>,
}

/// Why the body gave no value.
pub(in crate::engine) enum Halted {
    /// It panicked; the payload.
    Panicked(Box<dyn std::any::Any + Send>),
    /// Its worker's lease passed: it was not polled again.
    LeaseEnded,
}

impl<Fut: Future> Future for Running<'_, Fut> {
    type Output = Result<Fut::Output, Halted>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Checked before every poll: a worker resumed after a pause, or whose renewals went
        // unanswered, takes no further step towards the side effect.
        if self.lease.is_some_and(Lease::passed) {
            return Poll::Ready(Err(Halted::LeaseEnded));
        }
        self.started.store(true, Ordering::Relaxed);
        let body = self.body.as_mut();
        match catch_unwind(AssertUnwindSafe(|| body.poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(p) => Poll::Ready(Err(Halted::Panicked(p))),
        }
    }
}
