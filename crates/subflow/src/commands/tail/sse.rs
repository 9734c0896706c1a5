//! Server-sent events from a byte stream (docs/api.md#sse-frames): `event`, `data` and `id` fields,
//! frames ended by a blank line, `:` comments (heartbeats) skipped.

use serde_json::Value;

/// One frame; `id` is absent on `gap` frames.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// The event name.
    pub event: String,
    /// The data, parsed as JSON (a string when it is not JSON).
    pub data: Value,
    /// The frame id.
    pub id: Option<String>,
}

/// Splits bytes into frames; bytes may end anywhere, even inside a character.
#[derive(Debug, Default)]
pub struct SseDecoder {
    pending: Vec<u8>,
    event: String,
    data: Vec<String>,
    has_data: bool,
    id: Option<String>,
}

impl SseDecoder {
    /// Feeds bytes; returns the frames they completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Frame> {
        self.pending.extend_from_slice(bytes);
        let mut frames = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.pending.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line).into_owned();
            if let Some(frame) = self.line(&line) {
                frames.push(frame);
            }
        }
        frames
    }

    fn line(&mut self, line: &str) -> Option<Frame> {
        if line.is_empty() {
            let frame = self.has_data.then(|| {
                let data = self.data.join("\n");
                Frame {
                    event: if self.event.is_empty() {
                        "message".to_owned()
                    } else {
                        std::mem::take(&mut self.event)
                    },
                    data: serde_json::from_str(&data).unwrap_or(Value::String(data)),
                    id: self.id.take(),
                }
            });
            self.event.clear();
            self.data.clear();
            self.has_data = false;
            self.id = None;
            return frame;
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                self.data.push(value.to_owned());
                self.has_data = true;
            }
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn frames_split_anywhere_parse_like_the_gateway_writes_them() {
        let text = "event: metadata\ndata: {\"run_id\":\"r\"}\nid: 1\n\n: heartbeat\n\nevent: custom\r\ndata: {\"t\":\"é\"}\r\nid: 2\r\n\r\nevent: gap\ndata: {\"code\":\"stream_replay_gap\"}\n\n";
        let bytes = text.as_bytes();
        let mut decoder = SseDecoder::default();
        let mut frames = Vec::new();
        // One byte at a time splits every field, line ending and character.
        for byte in bytes {
            frames.extend(decoder.push(std::slice::from_ref(byte)));
        }
        assert_eq!(
            frames,
            vec![
                Frame {
                    event: "metadata".into(),
                    data: json!({"run_id": "r"}),
                    id: Some("1".into())
                },
                Frame {
                    event: "custom".into(),
                    data: json!({"t": "é"}),
                    id: Some("2".into())
                },
                Frame {
                    event: "gap".into(),
                    data: json!({"code": "stream_replay_gap"}),
                    id: None
                },
            ]
        );
    }

    #[test]
    fn data_that_is_not_json_stays_text_and_frames_without_data_are_dropped() {
        let mut decoder = SseDecoder::default();
        let frames = decoder.push(b"event: ping\n\ndata: a\ndata: b\n\n");
        assert_eq!(
            frames,
            vec![Frame {
                event: "message".into(),
                data: json!("a\nb"),
                id: None
            }]
        );
    }
}
