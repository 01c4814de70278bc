//! A wrapped rmcp tool's call: read from the server and the request before the body may take
//! them ([`Call::new`]), keyed ([`Keys`]), run, and answered by the kind of its answer.

use std::future::Future;

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{CallToolResponse, CallToolResult};
use rmcp::{ErrorData, ServerHandler};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{Answer, Request, Response, Task};
use crate::__private::{Arguments, BusinessKeyField, KeyProbe, Keys as CallKeys};
use crate::context::IdempotencyContext;
use crate::engine::Idempotency;
use crate::error::Error;
use crate::key::{Caller, ClientKey};
use crate::mcp::answer::{answer, answer_verbatim, described, refuse};
use crate::mcp::argument_key::argument_key;
use crate::mcp::arguments::{check_arguments, RawArguments};
use crate::mcp::client_key::{client_key, keyed, refusal, ClientKeys, KeyedAnswer};
use crate::mcp::commerce::{commerce, Commerce};
use crate::mcp::interim::{answer_response, split_response, Interim};
use crate::mcp::origin::origin_of;
use crate::mcp::progress::progress_of;
use crate::origin::Origin;
use crate::outcome::{ErrorPolicy, Failure, Outcome};
use crate::progress::Reporter;
use crate::tool::{Prepared, ToolSpec};

/// One call of a wrapped rmcp tool. Nothing here borrows the server or the request, which the
/// body may then take.
#[derive(Debug)]
pub struct Call {
    engine: Idempotency,
    spec: ToolSpec,
    caller: Result<Caller, Error>,
    raw: RawArguments,
    origin: Origin,
    progress: Option<Reporter>,
    /// With `client_key`: the key the request carried (if any), or why it cannot be used.
    client: Option<Result<Option<ClientKey>, ErrorData>>,
    /// With `client_key_field`: the key's field in the arguments, read once they are known.
    field: Option<(ClientKeys, &'static str)>,
    /// With `answers = "acp" | "ucp"`: the protocol whose shape the wrapper's answers take.
    shape: Option<Commerce>,
}

impl Call {
    /// The call of the tool `spec` on `server`, for `request`, whose arguments were sent as `raw`.
    pub fn new<S: IdempotencyContext<Request> + ?Sized>(
        server: &S,
        request: &Request,
        raw: RawArguments,
        spec: ToolSpec,
    ) -> Self {
        Call {
            engine: server.idempotency().clone(),
            caller: server.caller(request),
            spec,
            raw,
            origin: origin_of(request),
            progress: progress_of(request),
            client: None,
            field: None,
            shape: None,
        }
    }

    /// `client_key = "accept"` with `client_key_field`: keyed by the key at `field` of the
    /// arguments when there is one.
    pub fn accept_client_key_at(mut self, field: &'static str) -> Self {
        self.field = Some((ClientKeys::Accept, field));
        self
    }

    /// `client_key = "require"` with `client_key_field`: keyed by the key at `field` of the
    /// arguments, and refused without one.
    pub fn require_client_key_at(mut self, field: &'static str) -> Self {
        self.field = Some((ClientKeys::Require, field));
        self
    }

    /// `answers = "acp"`: the wrapper's answers as ACP's MCP binding says errors.
    pub fn acp_answers(mut self) -> Self {
        self.shape = Some(Commerce::Acp);
        self
    }

    /// `answers = "ucp"`: the wrapper's answers as UCP's MCP binding says errors.
    pub fn ucp_answers(mut self) -> Self {
        self.shape = Some(Commerce::Ucp);
        self
    }

    /// `client_key = "accept"`: keyed by the client's key when `request` carries one.
    pub fn accept_client_key(self, request: &Request) -> Self {
        self.client_key(request, ClientKeys::Accept)
    }

    /// `client_key = "require"`: keyed by the client's key, and refused without one.
    pub fn require_client_key(self, request: &Request) -> Self {
        self.client_key(request, ClientKeys::Require)
    }

    fn client_key(mut self, request: &Request, mode: ClientKeys) -> Self {
        self.client = Some(client_key(request, mode, &self.spec));
        self
    }

    /// `task`: answered with a task when `server` and the request's client both declare the
    /// tasks extension (SEP-2663); the body then owns a clone of `server`.
    pub fn task<S: ServerHandler + Clone>(self, server: &S, request: &Request) -> Task<S> {
        let as_task = server.get_info().capabilities.supports_tasks()
            && request
                .client_capabilities()
                .is_some_and(|c| c.supports_tasks());
        Task::new(self, server.clone(), as_task)
    }

    /// A tool answering `T`: its structured content ([`answer`]).
    pub async fn answer<A, T, E, K, B, F>(
        self,
        params: Parameters<A>,
        key: K,
        policy: ErrorPolicy<E>,
        body: B,
    ) -> Answer
    where
        K: FnOnce(&Keys, &A) -> Result<Prepared, Error>,
        B: FnOnce(Parameters<A>) -> F,
        F: Future<Output = Result<T, E>> + Send,
        T: Serialize + DeserializeOwned,
    {
        let ready = match self.prepare(&params.0, key) {
            Ok(ready) => ready,
            Err(early) => return early,
        };
        let run = body(params);
        ready
            .run(policy, run, |o| answer(described(o, policy)))
            .await
    }

    /// A tool answering `Json<T>`: `T` stored and replayed, its structured content the answer.
    pub async fn json<A, T, E, K, B, F>(
        self,
        params: Parameters<A>,
        key: K,
        policy: ErrorPolicy<E>,
        body: B,
    ) -> Answer
    where
        K: FnOnce(&Keys, &A) -> Result<Prepared, Error>,
        B: FnOnce(Parameters<A>) -> F,
        F: Future<Output = Result<Json<T>, E>> + Send,
        T: Serialize + DeserializeOwned,
    {
        let ready = match self.prepare(&params.0, key) {
            Ok(ready) => ready,
            Err(early) => return early,
        };
        let run = body(params);
        let run = async move { run.await.map(|j| j.0) };
        ready
            .run(policy, run, |o| answer(described(o, policy)))
            .await
    }

    /// A tool answering a `CallToolResult`: stored and replayed verbatim ([`answer_verbatim`]).
    pub async fn verbatim<A, E, K, B, F>(
        self,
        params: Parameters<A>,
        key: K,
        policy: ErrorPolicy<E>,
        body: B,
    ) -> Answer
    where
        K: FnOnce(&Keys, &A) -> Result<Prepared, Error>,
        B: FnOnce(Parameters<A>) -> F,
        F: Future<Output = Result<CallToolResult, E>> + Send,
    {
        let ready = match self.prepare(&params.0, key) {
            Ok(ready) => ready,
            Err(early) => return early,
        };
        let run = body(params);
        ready
            .run(policy, run, |o| answer_verbatim(described(o, policy)))
            .await
    }

    /// A tool answering a `CallToolResponse`: a completed result verbatim, an `input_required`
    /// round or a task of its own passed on, not stored ([`Interim`]).
    pub async fn response<A, E, K, B, F>(
        self,
        params: Parameters<A>,
        key: K,
        policy: ErrorPolicy<Interim<E>>,
        body: B,
    ) -> Response
    where
        K: FnOnce(&Keys, &A) -> Result<Prepared, Error>,
        B: FnOnce(Parameters<A>) -> F,
        F: Future<Output = Result<CallToolResponse, E>> + Send,
    {
        let ready = match self.prepare(&params.0, key) {
            Ok(ready) => ready,
            Err(early) => return early.map(CallToolResponse::from),
        };
        let run = body(params);
        let run = async move { split_response(run.await) };
        ready.run(policy, run, |o| answer_response(o, policy)).await
    }

    /// The call keyed, or its early answer: the caller refused, the client's key unusable, the
    /// arguments unkeyable.
    pub(super) fn prepare<A, K>(self, args: &A, key: K) -> Result<Ready, Answer>
    where
        K: FnOnce(&Keys, &A) -> Result<Prepared, Error>,
    {
        let mut said = Said {
            spec: self.spec,
            sent: false,
            shape: self.shape,
            field: self.field.map(|(_, field)| field),
        };
        let caller = match self.caller {
            Ok(c) => c,
            Err(e) => return Err(said.finish(refuse(e))),
        };
        let client = match self.client {
            None => None,
            Some(Ok(client)) => client,
            Some(Err(e)) => return Err(said.finish(Err(e))),
        };
        said.sent = client.is_some();
        let keys = Keys {
            keys: CallKeys::new(caller, self.spec, client),
            raw: self.raw,
            spec: self.spec,
            field: self.field,
            read: std::cell::Cell::new(false),
        };
        let mut prepared = match key(&keys, args) {
            Ok(p) => p,
            // A client key read from the arguments, unusable: refused as one from `_meta` is.
            Err(Error::ClientKey { source, .. }) => {
                return Err(said.finish(Err(refusal(&self.spec, source))))
            }
            Err(e) => return Err(said.finish(refuse(e))),
        };
        said.sent |= keys.read.get();
        prepared.origin = self.origin;
        Ok(Ready {
            engine: self.engine,
            prepared,
            progress: self.progress,
            said,
        })
    }
}

/// How a call's answers are said: as a request with the client's key is answered ("in
/// progress" and "conflict" as the JSON-RPC errors SEP-3182 proposed), and in the shape of a
/// commerce protocol (`answers`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Said {
    spec: ToolSpec,
    /// The request carried the client's key.
    sent: bool,
    shape: Option<Commerce>,
    /// The client key's field in the arguments, named by a commerce answer about the key.
    field: Option<&'static str>,
}

impl Said {
    /// `answer`, said as this call says its answers.
    pub(super) fn finish<R: KeyedAnswer>(
        &self,
        answer: Result<R, ErrorData>,
    ) -> Result<R, ErrorData> {
        let answer = keyed(&self.spec, self.sent, answer);
        match self.shape {
            Some(shape) => commerce(shape, self.field, answer),
            None => answer,
        }
    }
}

/// A keyed call, ready to run.
#[derive(Debug)]
pub(super) struct Ready {
    pub(super) engine: Idempotency,
    pub(super) prepared: Prepared,
    progress: Option<Reporter>,
    pub(super) said: Said,
}

impl Ready {
    /// The call run by the engine (a waiting repeat telling the client how long it waited),
    /// its outcome rendered by `render`, as a request with the client's key is answered: "in
    /// progress" and "conflict" as the JSON-RPC errors SEP-3182 proposed.
    async fn run<T, E, F, R>(
        self,
        policy: ErrorPolicy<E>,
        body: F,
        render: impl FnOnce(Outcome<T, Failure<E>>) -> Result<R, ErrorData>,
    ) -> Result<R, ErrorData>
    where
        T: Serialize + DeserializeOwned,
        F: Future<Output = Result<T, E>> + Send,
        R: KeyedAnswer,
    {
        let run = self.engine.execute_raw(self.prepared, policy, body);
        let outcome = crate::progress::scope(self.progress, run).await;
        self.said.finish(render(outcome))
    }
}

/// What an rmcp tool's key is made from ([`crate::__private::Keys`]), the arguments checked
/// first against what the client sent (`check_arguments`).
#[derive(Debug)]
pub struct Keys {
    keys: CallKeys,
    raw: RawArguments,
    spec: ToolSpec,
    /// With `client_key_field`: where the client's key is in the arguments.
    field: Option<(ClientKeys, &'static str)>,
    /// The arguments carried the client's key.
    read: std::cell::Cell<bool>,
}

impl Keys {
    /// [`crate::__private::Keys::call`], once the arguments are checked.
    /// With `client_key_field`, the client's key is read from the arguments first.
    pub fn call<A: Arguments + DeserializeOwned>(&self, args: &A) -> Result<Prepared, Error> {
        check_arguments(&self.raw, args, &self.spec)?;
        let Some((mode, field)) = self.field else {
            return self.keys.call(args);
        };
        let client = argument_key(args, mode, field).map_err(|source| Error::ClientKey {
            tool: self.spec.name().to_owned(),
            source,
        })?;
        self.read.set(client.is_some());
        self.keys.call_as(client.as_ref(), args)
    }

    /// [`crate::__private::Keys::business`], once the arguments are checked.
    pub fn business<A: Arguments + DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        field: &str,
        value: &B,
        args: &A,
    ) -> Result<Prepared, Error> {
        check_arguments(&self.raw, args, &self.spec)?;
        self.keys.business(field, value, args)
    }

    /// [`crate::__private::Keys::probe`].
    pub fn probe<'a, T: ?Sized>(&self, field: &'a T) -> KeyProbe<'a, T> {
        self.keys.probe(field)
    }

    /// [`crate::__private::Keys::business_key_field`].
    pub fn business_key_field<B: BusinessKeyField + ?Sized>(&self, field: &B) {
        self.keys.business_key_field(field)
    }

    /// [`crate::__private::Keys::business_or_call`], once the arguments are checked.
    pub fn business_or_call<A: Arguments + DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        field: &str,
        value: &B,
        args: &A,
    ) -> Result<Prepared, Error> {
        check_arguments(&self.raw, args, &self.spec)?;
        self.keys.business_or_call(field, value, args)
    }
}
