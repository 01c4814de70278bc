//! Where an idempotent handler finds its engine and its caller.

use std::sync::Arc;

use crate::engine::Idempotency;
use crate::error::Error;
use crate::key::Caller;

/// Where an idempotent handler finds its engine and its caller: one trait for plain functions
/// and MCP tools, generic over what the caller is read from.
///
/// - Plain functions and methods: `R = ()` (the default). Implement it on the context type your
///   handlers take, or on `self`'s type for methods.
/// - rmcp tools (feature `rmcp`): `R = RequestContext<RoleServer>`, so the caller comes from the
///   request (the HTTP authentication's identity, or the server's configured stdio identity:
///   [`mcp::Identity::resolve`](crate::mcp::Identity::resolve)).
///
/// ```
/// use idempotency::{Caller, Error, Idempotency, IdempotencyContext};
/// use idempotency::store::MemoryStore;
/// struct Ctx { engine: Idempotency, tenant: String, user: String }
/// impl IdempotencyContext for Ctx {
///     fn idempotency(&self) -> &Idempotency { &self.engine }
///     fn caller(&self, _request: &()) -> Result<Caller, Error> {
///         Ok(Caller::new(&*self.tenant, &*self.user))
///     }
/// }
/// ```
pub trait IdempotencyContext<R: ?Sized = ()> {
    /// The engine (store and clock).
    fn idempotency(&self) -> &Idempotency;
    /// Who is calling, from the server's authentication (never from the model's arguments).
    fn caller(&self, request: &R) -> Result<Caller, Error>;
}

impl<R: ?Sized, C: IdempotencyContext<R> + ?Sized> IdempotencyContext<R> for &C {
    fn idempotency(&self) -> &Idempotency {
        (**self).idempotency()
    }
    fn caller(&self, request: &R) -> Result<Caller, Error> {
        (**self).caller(request)
    }
}

impl<R: ?Sized, C: IdempotencyContext<R> + ?Sized> IdempotencyContext<R> for Arc<C> {
    fn idempotency(&self) -> &Idempotency {
        (**self).idempotency()
    }
    fn caller(&self, request: &R) -> Result<Caller, Error> {
        (**self).caller(request)
    }
}
