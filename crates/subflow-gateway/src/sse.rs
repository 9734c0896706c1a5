//! SSE framing (docs/api.md#sse-frames): `event`, `data`, `id`, in that order.

use axum::body::Bytes;
use serde_json::Value;

/// A heartbeat comment; it has no id.
pub const HEARTBEAT: &[u8] = b": heartbeat\n\n";

/// One frame with its id; `data` is JSON text.
pub fn frame_text(event: &str, data: &str, id: u64) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\nid: {id}\n\n"))
}

/// A frame without an id (`gap`, or an `end` of a run that never logged one).
pub fn frame_without_id(event: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_put_event_data_and_id_in_order() {
        let bytes = frame_text("metadata", r#"{"run_id":"r"}"#, 1);
        assert_eq!(
            &bytes[..],
            b"event: metadata\ndata: {\"run_id\":\"r\"}\nid: 1\n\n"
        );
        assert_eq!(
            &frame_without_id("gap", &serde_json::json!({"code": "x"}))[..],
            b"event: gap\ndata: {\"code\":\"x\"}\n\n"
        );
    }
}
