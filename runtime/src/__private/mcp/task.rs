//! A wrapped rmcp `task` tool's call ([`Call::task`]): its body owns a clone of the server, so
//! it may outlive the request; answered with a task handle or inline.

use std::future::Future;

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{CallToolResponse, CallToolResult};
use serde::Serialize;

use super::{Call, Keys, Response};
use crate::error::Error;
use crate::mcp::task_impl::{render, render_verbatim, TaskCall};
use crate::outcome::ErrorPolicy;
use crate::tool::Prepared;

/// A `task` tool's call: [`Task::answer`], [`Task::json`] or [`Task::verbatim`] by the kind of
/// its answer, whose result is stored as the `CallToolResult` it renders.
#[derive(Debug)]
pub struct Task<S> {
    call: Call,
    server: S,
    as_task: bool,
}

impl<S> Task<S> {
    pub(super) fn new(call: Call, server: S, as_task: bool) -> Self {
        Task {
            call,
            server,
            as_task,
        }
    }
}

impl<S: Send + 'static> Task<S> {
    /// A tool answering `T`: its structured content.
    pub async fn answer<A, T, E, K, B, F>(
        self,
        params: Parameters<A>,
        key: K,
        policy: ErrorPolicy<E>,
        body: B,
    ) -> Response
    where
        K: FnOnce(&Keys, &A) -> Result<Prepared, Error>,
        B: FnOnce(S, Parameters<A>) -> F,
        F: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize,
        E: Send + 'static,
    {
        self.run(params, key, policy, |server, params| {
            let run = body(server, params);
            async move { render(run.await, policy) }
        })
        .await
    }

    /// A tool answering `Json<T>`: `T`'s structured content.
    pub async fn json<A, T, E, K, B, F>(
        self,
        params: Parameters<A>,
        key: K,
        policy: ErrorPolicy<E>,
        body: B,
    ) -> Response
    where
        K: FnOnce(&Keys, &A) -> Result<Prepared, Error>,
        B: FnOnce(S, Parameters<A>) -> F,
        F: Future<Output = Result<Json<T>, E>> + Send + 'static,
        T: Serialize,
        E: Send + 'static,
    {
        self.run(params, key, policy, |server, params| {
            let run = body(server, params);
            async move { render(run.await.map(|j| j.0), policy) }
        })
        .await
    }

    /// A tool answering a `CallToolResult`: kept as it is.
    pub async fn verbatim<A, E, K, B, F>(
        self,
        params: Parameters<A>,
        key: K,
        policy: ErrorPolicy<E>,
        body: B,
    ) -> Response
    where
        K: FnOnce(&Keys, &A) -> Result<Prepared, Error>,
        B: FnOnce(S, Parameters<A>) -> F,
        F: Future<Output = Result<CallToolResult, E>> + Send + 'static,
        E: Send + 'static,
    {
        self.run(params, key, policy, |server, params| {
            let run = body(server, params);
            async move { render_verbatim(run.await, policy) }
        })
        .await
    }

    /// The call keyed, then run as a task or inline; `rendered` gives the body's result as the
    /// `CallToolResult` that is stored (definitive errors already results).
    async fn run<A, E, K, R, F>(
        self,
        params: Parameters<A>,
        key: K,
        policy: ErrorPolicy<E>,
        rendered: R,
    ) -> Response
    where
        K: FnOnce(&Keys, &A) -> Result<Prepared, Error>,
        R: FnOnce(S, Parameters<A>) -> F,
        F: Future<Output = Result<CallToolResult, E>> + Send + 'static,
        E: Send + 'static,
    {
        let ready = match self.call.prepare(&params.0, key) {
            Ok(ready) => ready,
            Err(early) => return early.map(CallToolResponse::from),
        };
        let said = ready.said;
        let task = TaskCall {
            engine: ready.engine,
            prepared: ready.prepared,
            as_task: self.as_task,
        };
        let answer = task.run(policy, rendered(self.server, params)).await;
        said.finish(answer)
    }
}
