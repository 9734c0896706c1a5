//! `X-Trace-Id` (docs/operations.md#trace-ids): exactly one on every response, taken from the request's
//! header when valid, else from a valid `traceparent`, else fresh.

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use subflow_runtime::spans::TraceParent;
use tracing::Instrument;

/// The header.
pub const TRACE_HEADER: HeaderName = HeaderName::from_static("x-trace-id");

/// Where a request's trace id came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestTrace {
    /// The id.
    pub id: String,
    /// A valid `traceparent`'s trace id and parent span, which a run's exported lead
    /// trace adopts (docs/operations.md#langfuse-and-otlp), whatever gave the id above.
    pub parent: Option<TraceParent>,
}

/// A valid inbound trace id: trimmed, 1–512 printable ASCII characters.
pub fn valid_trace_id(raw: &str) -> Option<&str> {
    let id = raw.trim();
    ((1..=512).contains(&id.len()) && id.bytes().all(|b| (0x20..=0x7e).contains(&b))).then_some(id)
}

/// The trace-id field of a valid W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`, no all-zero ids).
pub fn traceparent_trace_id(raw: &str) -> Option<&str> {
    traceparent_fields(raw).map(|(trace, _)| trace)
}

/// The trace id and parent span of a valid W3C `traceparent`.
pub fn traceparent(raw: &str) -> Option<TraceParent> {
    traceparent_fields(raw).and_then(|(trace, span)| TraceParent::from_hex(trace, span))
}

/// The trace-id and parent-id fields of a valid W3C `traceparent`.
fn traceparent_fields(raw: &str) -> Option<(&str, &str)> {
    let parts: Vec<&str> = raw.trim().split('-').collect();
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    match parts.as_slice() {
        ["00", trace, parent, flags]
            if hex(trace, 32)
                && hex(parent, 16)
                && hex(flags, 2)
                && !zero(trace)
                && !zero(parent) =>
        {
            Some((trace, parent))
        }
        _ => None,
    }
}

/// A fresh id: 32 lowercase hex characters.
pub fn fresh_trace_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The middleware: decides the id, hands it to the handlers, stamps the response.
pub async fn trace_id(mut request: Request, next: Next) -> Response {
    let headers = request.headers();
    let from_header = headers
        .get(&TRACE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(valid_trace_id)
        .map(str::to_owned);
    let raw_parent = headers.get("traceparent").and_then(|v| v.to_str().ok());
    let from_parent = raw_parent.and_then(traceparent_trace_id).map(str::to_owned);
    let parent = raw_parent.and_then(traceparent);
    let trace = RequestTrace {
        id: from_header.or(from_parent).unwrap_or_else(fresh_trace_id),
        parent,
    };
    request.extensions_mut().insert(trace.clone());
    // Log lines written while handling the request carry its trace id (docs/operations.md#logging).
    let span = tracing::info_span!("request", trace_id = %trace.id);
    let mut response = next.run(request).instrument(span).await;
    if let Ok(value) = HeaderValue::from_str(&trace.id) {
        response.headers_mut().insert(TRACE_HEADER, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inbound_ids_are_trimmed_and_bounded_to_printable_ascii() {
        assert_eq!(valid_trace_id("  abc  "), Some("abc"));
        assert_eq!(valid_trace_id(""), None);
        assert_eq!(valid_trace_id(&"x".repeat(513)), None);
        assert_eq!(valid_trace_id("tab\there"), None);
    }

    #[test]
    fn traceparents_give_their_trace_id_unless_malformed_or_zero() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(
            traceparent_trace_id(&format!("00-{id}-00f067aa0ba902b7-01")),
            Some(id)
        );
        assert_eq!(
            traceparent_trace_id(&format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32))),
            None
        );
        assert_eq!(
            traceparent_trace_id(&format!("01-{id}-00f067aa0ba902b7-01")),
            None
        );
        assert_eq!(traceparent_trace_id("00-xyz-00f067aa0ba902b7-01"), None);
        assert_eq!(fresh_trace_id().len(), 32);
    }
}
