//! A request's [`Origin`]: `_meta.traceparent` and `_meta.tracestate` (the W3C trace context
//! OpenTelemetry's MCP conventions carry in `_meta`), and, over streamable HTTP with sessions,
//! the `Mcp-Session-Id` header.

use rmcp::service::RequestContext;
use rmcp::RoleServer;

use crate::tool::{Origin, Prepared};

/// The header that names the MCP session of a streamable HTTP request.
const SESSION_HEADER: &str = "mcp-session-id";

/// Where `request` came from.
fn origin_of(request: &RequestContext<RoleServer>) -> Origin {
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

/// `prepared`, with `request`'s origin for its span.
pub fn with_origin(mut prepared: Prepared, request: &RequestContext<RoleServer>) -> Prepared {
    prepared.origin = origin_of(request);
    prepared
}
