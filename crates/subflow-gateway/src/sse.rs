//! SSE framing (SPEC §2.4): `event`, `data`, `id`, in that order.

use axum::body::Bytes;
use serde_json::Value;

/// One frame with its id.
pub fn frame(event: &str, data: &Value, id: u64) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\nid: {id}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_put_event_data_and_id_in_order() {
        let bytes = frame("metadata", &serde_json::json!({"run_id": "r"}), 1);
        assert_eq!(
            &bytes[..],
            b"event: metadata\ndata: {\"run_id\":\"r\"}\nid: 1\n\n"
        );
    }
}
