use rmcp::service::RequestContext;
use rmcp::RoleServer;

use crate::{Caller, Error};

/// Where a server finds the caller of a tool call.
///
/// - Over streamable HTTP, rmcp puts the request's `http::request::Parts` into the request
///   context; your authentication middleware inserts an [`idempotency::Caller`](Caller) into the
///   HTTP request's extensions (e.g. from the bearer token). An HTTP request without one is
///   refused — it never falls back to the stdio identity.
/// - Over stdio there is no request to authenticate: the server is started by one host for one
///   user, so it is configured with that identity ([`Identity::stdio`]).
///
/// ```
/// use idempotency::{mcp::Identity, Caller};
/// let identity = Identity::stdio(Caller::new("local", "desktop-user"));
/// # let _ = identity;
/// ```
#[derive(Clone, Debug, Default)]
pub struct Identity {
    stdio: Option<Caller>,
}

impl Identity {
    /// HTTP only: every call must carry a [`Caller`] in its HTTP request extensions.
    pub fn http_only() -> Self {
        Identity { stdio: None }
    }

    /// Calls that arrive without HTTP parts (stdio) are made by `caller`; HTTP calls still need
    /// their own [`Caller`].
    pub fn stdio(caller: Caller) -> Self {
        Identity {
            stdio: Some(caller),
        }
    }

    /// The caller of `request`.
    pub fn resolve(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        if let Some(parts) = request.extensions.get::<http::request::Parts>() {
            return parts.extensions.get::<Caller>().cloned().ok_or_else(|| Error::InvalidCaller {
                reason: "this HTTP request carries no authenticated caller (the server's authentication middleware must insert an idempotency::Caller into the request extensions)".into(),
            });
        }
        self.stdio.clone().ok_or_else(|| Error::InvalidCaller {
            reason:
                "this request has no HTTP identity and the server has no configured stdio identity"
                    .into(),
        })
    }
}
