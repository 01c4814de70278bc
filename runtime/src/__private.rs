//! What `#[idempotent]` generates code against. Not a public API: names here change without notice.

pub use crate::context::IdempotencyContext;
pub use crate::engine::Idempotency;
pub use crate::error::Error;
pub use crate::key::Caller;
pub use crate::outcome::{Classify, ErrorPolicy, Failure, Outcome};
pub use crate::tool::{Prepared, ToolSpec};
pub use core::clone::Clone;
pub use core::convert::From;
pub use core::option::Option;
pub use core::result::Result;
pub use core::time::Duration;
pub use serde::de::DeserializeOwned;
pub use serde::Serialize;

#[cfg(feature = "rmcp")]
pub use ::rmcp;

/// The MCP side of generated code.
#[cfg(feature = "rmcp")]
pub mod mcp {
    pub use crate::mcp::{answer, refuse};

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
    tool: &str,
    args: &A,
) -> Result<Prepared, Error> {
    Prepared::call(caller, tool, args)
}

/// [`Prepared::business`] for arguments of type `A`.
pub fn prepare_business<A: Arguments + ?Sized, B: Serialize + ?Sized>(
    caller: &Caller,
    tool: &str,
    field: &str,
    business_key: &B,
    args: &A,
) -> Result<Prepared, Error> {
    Prepared::business(caller, tool, field, business_key, args)
}
