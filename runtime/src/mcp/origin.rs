//! A request's [`Origin`]: `_meta.traceparent` and `_meta.tracestate` (the W3C trace context
//! OpenTelemetry's MCP conventions carry in `_meta`), and, over streamable HTTP with sessions,
//! the `Mcp-Session-Id` header.

use rmcp::service::RequestContext;
use rmcp::RoleServer;

use crate::tool::Origin;

/// The header that names the MCP session of a streamable HTTP request.
const SESSION_HEADER: &str = "mcp-session-id";

/// Where `request` came from.
pub(crate) fn origin_of(request: &RequestContext<RoleServer>) -> Origin {
    let meta = |name: &str| {
        request
            .meta
            .get(name)
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    let session = request
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.headers.get(SESSION_HEADER))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Origin {
        traceparent: meta("traceparent"),
        tracestate: meta("tracestate"),
        session,
    }
}
