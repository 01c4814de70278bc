//! Where a call came from, for its span ([`Origin`]): the client's W3C trace context, sent in
//! the request's `_meta` as `traceparent` and `tracestate` (what OpenTelemetry's MCP conventions
//! name), and the MCP session (`Mcp-Session-Id`), when there is one.
//!
//! The session becomes the span's `mcp.session.id`. With the `opentelemetry` feature, a valid
//! `traceparent` becomes the span's remote parent through `tracing-opentelemetry`, so the
//! call's span joins the client's trace; without the feature, or with a malformed
//! `traceparent` (which is ignored, never an error), the span starts a trace of its own.

/// Where a call came from: filled in by the MCP integration from the request, empty for a
/// call made without one (see the module's docs for what each becomes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    /// The W3C `traceparent` the client sent (`00-<trace id>-<span id>-<flags>`).
    pub traceparent: Option<String>,
    /// The W3C `tracestate` that came with it.
    pub tracestate: Option<String>,
    /// The MCP session the request belongs to.
    pub session: Option<String>,
}

/// A `traceparent`'s parts: trace id, parent span id, flags. `None` when it is not one
/// (version `ff`, wrong lengths, not hex, an all-zero id).
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
pub(crate) fn parse_traceparent(value: &str) -> Option<([u8; 16], [u8; 8], u8)> {
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    // Version 00 has exactly four parts; a later version may add some after them.
    if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    hex::<1>(version)?;
    let trace = hex::<16>(trace)?;
    let span = hex::<8>(span)?;
    let [flags] = hex::<1>(flags)?;
    if trace == [0; 16] || span == [0; 8] {
        return None;
    }
    Some((trace, span, flags))
}

/// Exactly `N` bytes of lowercase hex.
fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(s.as_bytes().chunks(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// Puts `origin` on the call's `span`: its session, and (with the `opentelemetry` feature) its
/// trace context as the span's parent.
pub(crate) fn adopt(span: &tracing::Span, origin: &Origin) {
    if let Some(session) = &origin.session {
        span.record("mcp.session.id", session.as_str());
    }
    #[cfg(feature = "opentelemetry")]
    otel::set_parent(span, origin);
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::{parse_traceparent, Origin};

    pub(super) fn set_parent(span: &tracing::Span, origin: &Origin) {
        let Some((trace, parent, flags)) =
            origin.traceparent.as_deref().and_then(parse_traceparent)
        else {
            return;
        };
        // A malformed tracestate is dropped, the parent kept (as W3C says).
        let state = origin
            .tracestate
            .as_deref()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let remote = SpanContext::new(
            TraceId::from_bytes(trace),
            SpanId::from_bytes(parent),
            TraceFlags::new(flags),
            true,
            state,
        );
        let cx = opentelemetry::Context::new().with_remote_span_context(remote);
        // Without tracing-opentelemetry's layer there is nothing to parent: not an error.
        let _ = span.set_parent(cx);
    }
}

#[cfg(test)]
mod tests {
    use super::parse_traceparent;

    #[test]
    fn traceparents_are_read_as_w3c_says() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (trace, span, flags) = parse_traceparent(ok).expect("valid");
        assert_eq!(trace[0], 0x4b);
        assert_eq!(span[7], 0xb7);
        assert_eq!(flags, 1);
        // A later version may carry more after the four parts.
        assert!(parse_traceparent(&format!("01-{}-x", &ok[3..])).is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }
}
