//! A wrapped plain function (not an rmcp tool): its whole call, `Call::run`.

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::Keys;
use crate::context::IdempotencyContext;
use crate::engine::Idempotency;
use crate::error::Error;
use crate::key::Caller;
use crate::outcome::{ErrorPolicy, Failure};
use crate::tool::{Prepared, ToolSpec};

/// How a plain function's errors are treated: its [`ErrorPolicy`], and how the wrapper's own
/// answers become its error type. Built by the generated code in an expression of its own,
/// spanned at the user's `E`, so that an `E` without these bounds is reported there, once.
pub struct Policy<E> {
    policy: ErrorPolicy<E>,
    from: fn(Error) -> E,
}

impl<E> Policy<E> {
    /// `policy`, and `E: From<Error>` for the wrapper's own answers.
    pub fn new(policy: ErrorPolicy<E>) -> Self
    where
        E: From<Error>,
    {
        Policy {
            policy,
            from: E::from,
        }
    }
}

impl<E> std::fmt::Debug for Policy<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy").finish_non_exhaustive()
    }
}

/// One call of a wrapped plain function: the engine and the caller, read from its context
/// before the body may take the context (nothing here borrows it).
#[derive(Debug)]
pub struct Call {
    engine: Idempotency,
    caller: Result<Caller, Error>,
    spec: ToolSpec,
}

impl Call {
    /// The call of the tool `spec` in the context `cx`.
    pub fn new<C: IdempotencyContext + ?Sized>(cx: &C, spec: ToolSpec) -> Self {
        Call {
            engine: cx.idempotency().clone(),
            caller: cx.caller(&()),
            spec,
        }
    }

    /// The whole call: `key` keys `args`, then the engine claims the key and runs `body` with
    /// `args` (or answers without running it). The wrapper's own answers are `E`, by `policy`.
    pub async fn run<A, T, E, K, B, F>(
        self,
        args: A,
        key: K,
        policy: Policy<E>,
        body: B,
    ) -> Result<T, E>
    where
        K: FnOnce(&Keys, &A) -> Result<Prepared, Error>,
        B: FnOnce(A) -> F,
        F: Future<Output = Result<T, E>> + Send,
        T: Serialize + DeserializeOwned,
    {
        let Call {
            engine,
            caller,
            spec,
        } = self;
        let prepared = caller.and_then(|caller| key(&Keys::new(caller, spec, None), &args));
        let prepared = match prepared {
            Ok(p) => p,
            Err(e) => return Err((policy.from)(e)),
        };
        let outcome = engine
            .execute_raw(prepared, policy.policy, body(args))
            .await;
        match outcome.result {
            Ok(v) => Ok(v),
            Err(Failure::Handler(e)) => Err(e),
            Err(Failure::Wrapper(e)) => Err((policy.from)(e)),
        }
    }
}
