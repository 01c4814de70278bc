//! What `#[idempotent]` generates code against. Not a public API: names here change without notice.

pub use crate::context::IdempotencyContext;
pub use crate::engine::Idempotency;
pub use crate::error::Error;
pub use crate::key::Caller;
pub use crate::key::Scope;
pub use crate::outcome::{Classify, ErrorPolicy, Failure, Outcome};
pub use crate::tool::{BusinessKey, Prepared, Recover, TaskTool, ToolSpec, TransactionalTool};
pub use core::clone::Clone;
pub use core::convert::From;
pub use core::option::Option;
pub use core::result::Result;
pub use core::time::Duration;
pub use inventory;
pub use serde::de::DeserializeOwned;
pub use serde::Serialize;

#[cfg(feature = "rmcp")]
pub use ::rmcp;

/// The MCP side of generated code.
#[cfg(feature = "rmcp")]
pub mod mcp {
    pub use crate::mcp::answer::{answer, answer_verbatim, refuse};
    pub use crate::mcp::arguments::{check_arguments, closed_input_schema, RawArguments};
    pub use crate::mcp::client_key::{client_key, client_key_meta, keyed, ClientKeys, KeyedAnswer};
    pub use crate::mcp::interim::{answer_response, split_response, Interim};
    pub use crate::mcp::origin::with_origin;
    pub use crate::mcp::progress::{progress_of, reporting};
    pub use crate::mcp::task_impl::{
        render as task_render, render_verbatim as task_render_verbatim, TaskCall,
    };

    /// Whether a `task` tool answers `request` with a task: the server declares the tasks
    /// extension (SEP-2663), so `tasks/get` reaches it, and the request's client does too.
    pub fn wants_task<S: rmcp::ServerHandler>(server: &S, request: &Request) -> bool {
        server.get_info().capabilities.supports_tasks()
            && request
                .client_capabilities()
                .is_some_and(|c| c.supports_tasks())
    }

    /// [`refuse`] as the wrapped tool's own answer type (`CallToolResult` or `CallToolResponse`).
    pub fn refuse_into<R: From<rmcp::model::CallToolResult>>(
        e: crate::Error,
    ) -> Result<R, rmcp::ErrorData> {
        refuse(e).map(R::from)
    }

    /// What an rmcp tool's caller is read from.
    pub type Request = rmcp::service::RequestContext<rmcp::RoleServer>;
}

/// The arguments of a wrapped tool. Named in generated code with the argument type spelled out,
/// so that a type without `Serialize` is reported at that type.
#[diagnostic::on_unimplemented(
    message = "the arguments of an idempotent tool must implement `serde::Serialize`: `{Self}` does not",
    label = "the key is computed from the canonical JSON of `{Self}`",
    note = "add `#[derive(serde::Serialize)]` to `{Self}`"
)]
pub trait Arguments: Serialize {}
impl<A: Serialize + ?Sized> Arguments for A {}

/// [`Prepared::call`] for arguments of type `A`.
pub fn prepare_call<A: Arguments + ?Sized>(
    caller: &Caller,
    spec: &ToolSpec,
    args: &A,
) -> Result<Prepared, Error> {
    Prepared::call(caller, spec, args)
}

/// [`Prepared::business`] for arguments of type `A`.
pub fn prepare_business<A: Arguments + ?Sized, B: Serialize + ?Sized>(
    caller: &Caller,
    spec: &ToolSpec,
    business_key: BusinessKey<'_, B>,
    args: &A,
) -> Result<Prepared, Error> {
    Prepared::business(caller, spec, business_key, args)
}

/// [`Prepared::business_or_call`] for arguments of type `A`.
pub fn prepare_business_or_call<A: Arguments + ?Sized, B: Serialize + ?Sized>(
    caller: &Caller,
    spec: &ToolSpec,
    business_key: BusinessKey<'_, B>,
    args: &A,
) -> Result<Prepared, Error> {
    Prepared::business_or_call(caller, spec, business_key, args)
}

/// [`Prepared::client`] for arguments of type `A` when the request carries a client key, else
/// [`Prepared::call`].
pub fn prepare_client<A: Arguments + ?Sized>(
    caller: &Caller,
    spec: &ToolSpec,
    client_key: Option<&crate::key::ClientKey>,
    args: &A,
) -> Result<Prepared, Error> {
    match client_key {
        Some(key) => Prepared::client(caller, spec, key, args),
        None => Prepared::call(caller, spec, args),
    }
}

/// A probe that makes an `Option` business-key field a compile error (unless the attribute says
/// what a missing one means): for an `Option`, the inherent `key` below is chosen over
/// [`KeyProbeAny::key`] and returns a type that cannot be a business key.
pub struct KeyProbe<'a, T: ?Sized>(pub &'a T);

impl<T: ?Sized> std::fmt::Debug for KeyProbe<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyProbe")
    }
}

/// What [`KeyProbe::key`] gives for an `Option` field: a `business_key` field that may be
/// missing needs `missing_key = "refuse"` (refuse such calls) or `missing_key = "call_key"` (key
/// them by all their arguments).
#[allow(non_camel_case_types)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a business key: an `Option` field needs `missing_key = \"refuse\"` or `missing_key = \"call_key\"`",
    label = "a business key must be a field that is always there",
    note = "for an `Option` field, say what a call without it means: refuse it, or key it by all its arguments"
)]
pub trait BusinessKeyField: Serialize {}
impl<T: Serialize + ?Sized> BusinessKeyField for T {}

/// One business-key field, checked where the attribute names it.
pub fn business_key_field<B: BusinessKeyField + ?Sized>(_field: &B) {}

/// Stands for an `Option` business-key field; not a [`BusinessKeyField`].
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct an_Option_business_key_needs_missing_key;

impl<T> KeyProbe<'_, Option<T>> {
    /// Chosen for `Option` fields.
    pub fn key(&self) -> &'static an_Option_business_key_needs_missing_key {
        &an_Option_business_key_needs_missing_key
    }
}

/// Chosen for every field that is not an `Option`.
pub trait KeyProbeAny<'a, T: ?Sized> {
    /// The field itself.
    fn key(&self) -> &'a T;
}
impl<'a, T: ?Sized> KeyProbeAny<'a, T> for KeyProbe<'a, T> {
    fn key(&self) -> &'a T {
        self.0
    }
}
