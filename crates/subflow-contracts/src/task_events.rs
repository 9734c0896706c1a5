//! Mapping of live task events (SPEC §3.3) to persisted `subagent.*` records (SPEC §5.3).

use serde_json::{Map, Value, json};

use crate::events::{EventCategory, EventType};
use crate::status::TaskEndStatus;
use crate::text::cap_chars;

/// Cap, in characters, on step text, serialised tool-call args, results and errors.
pub const PERSISTED_TEXT_CAP: usize = 8192;

string_enum! {
    /// The `type` of a live task event.
    pub enum TaskEventType {
        Started = "task_started",
        Running = "task_running",
        Completed = "task_completed",
        Failed = "task_failed",
        Cancelled = "task_cancelled",
        TimedOut = "task_timed_out",
    }
}

impl TaskEventType {
    /// The persisted end status of a terminal event, or `None` for start and running.
    pub const fn end_status(self) -> Option<TaskEndStatus> {
        match self {
            TaskEventType::Started | TaskEventType::Running => None,
            TaskEventType::Completed => Some(TaskEndStatus::Completed),
            TaskEventType::Failed => Some(TaskEndStatus::Failed),
            TaskEventType::Cancelled => Some(TaskEndStatus::Cancelled),
            TaskEventType::TimedOut => Some(TaskEndStatus::TimedOut),
        }
    }
}

/// Why a task event chunk is not persisted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RejectedChunk {
    /// Not an object, or `type` missing or unknown.
    #[error("unknown task event type")]
    UnknownType,
    /// `task_id` missing, not a string, or empty.
    #[error("task event without a task_id")]
    MissingTaskId,
    /// A start `description` that is neither a string nor null.
    #[error("task_started description is neither a string nor null")]
    BadDescription,
    /// A step `message_index` that is not a non-negative integer.
    #[error("task_running message_index is not a non-negative integer")]
    BadMessageIndex,
    /// A step `message` that is not an object.
    #[error("task_running message is not an object")]
    BadMessage,
}

/// The persisted form of one task event: type, content and metadata of a `subagent.*` record.
#[derive(Debug, Clone, PartialEq)]
pub struct MappedTaskEvent {
    /// `subagent.start`, `subagent.step` or `subagent.end`.
    pub event_type: EventType,
    /// Record content, with exactly the keys of SPEC §5.3.
    pub content: Value,
    /// Record metadata: `task_id`, plus `message_index` on steps.
    pub metadata: Map<String, Value>,
}

impl MappedTaskEvent {
    /// Always `subagent`.
    pub const fn category(&self) -> EventCategory {
        EventCategory::Subagent
    }
}

/// Maps a live task event chunk to its persisted record, or says why it is rejected.
pub fn map_task_event(chunk: &Value) -> Result<MappedTaskEvent, RejectedChunk> {
    let object = chunk.as_object().ok_or(RejectedChunk::UnknownType)?;
    let kind: TaskEventType = object
        .get("type")
        .and_then(Value::as_str)
        .and_then(|t| t.parse().ok())
        .ok_or(RejectedChunk::UnknownType)?;
    let task_id = match object.get("task_id") {
        Some(Value::String(id)) if !id.is_empty() => id.as_str(),
        _ => return Err(RejectedChunk::MissingTaskId),
    };
    let mut metadata = Map::new();
    metadata.insert("task_id".into(), json!(task_id));

    match kind {
        TaskEventType::Started => {
            let description = match object.get("description") {
                None | Some(Value::Null) => Value::Null,
                Some(Value::String(text)) => json!(text),
                Some(_) => return Err(RejectedChunk::BadDescription),
            };
            Ok(MappedTaskEvent {
                event_type: EventType::SubagentStart,
                content: json!({"task_id": task_id, "description": description}),
                metadata,
            })
        }
        TaskEventType::Running => {
            let message_index = object
                .get("message_index")
                .and_then(Value::as_u64)
                .ok_or(RejectedChunk::BadMessageIndex)?;
            let message = object
                .get("message")
                .and_then(Value::as_object)
                .ok_or(RejectedChunk::BadMessage)?;
            metadata.insert("message_index".into(), json!(message_index));
            Ok(MappedTaskEvent {
                event_type: EventType::SubagentStep,
                content: step_content(task_id, message_index, message),
                metadata,
            })
        }
        terminal => {
            let status = terminal
                .end_status()
                .expect("terminal task events have an end status");
            Ok(MappedTaskEvent {
                event_type: EventType::SubagentEnd,
                content: end_content(task_id, status, object),
                metadata,
            })
        }
    }
}

fn step_content(task_id: &str, message_index: u64, message: &Map<String, Value>) -> Value {
    let is_tool = message.get("type").and_then(Value::as_str) == Some("tool");
    let full_text = flatten_content(message.get("content"));
    let (text, truncated) = cap_chars(&full_text, PERSISTED_TEXT_CAP);
    let mut content = Map::new();
    content.insert("task_id".into(), json!(task_id));
    content.insert("message_index".into(), json!(message_index));
    content.insert("kind".into(), json!(if is_tool { "tool" } else { "ai" }));
    content.insert("text".into(), json!(text));
    content.insert("truncated".into(), json!(truncated));
    if is_tool {
        let tool_name = message.get("name").filter(|n| n.is_string()).cloned();
        content.insert("tool_name".into(), tool_name.unwrap_or(Value::Null));
    } else {
        let calls = message
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(|calls| calls.iter().map(step_tool_call).collect())
            .unwrap_or_default();
        content.insert("tool_calls".into(), Value::Array(calls));
    }
    Value::Object(content)
}

fn step_tool_call(call: &Value) -> Value {
    let name = call
        .get("name")
        .filter(|n| n.is_string())
        .cloned()
        .unwrap_or(Value::Null);
    let args = call.get("args").cloned().unwrap_or(Value::Null);
    let serialised = match &args {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    match cap_chars(&serialised, PERSISTED_TEXT_CAP) {
        (kept, true) => json!({"name": name, "args": kept, "args_truncated": true}),
        (_, false) => json!({"name": name, "args": args}),
    }
}

fn end_content(task_id: &str, status: TaskEndStatus, chunk: &Map<String, Value>) -> Value {
    let mut content = Map::new();
    content.insert("task_id".into(), json!(task_id));
    content.insert("status".into(), json!(status.as_str()));
    if let Some(model) = chunk
        .get("model_name")
        .and_then(Value::as_str)
        .map(str::trim)
        && !model.is_empty()
    {
        content.insert("model_name".into(), json!(model));
    }
    if let Some(usage) = chunk.get("usage").and_then(valid_usage) {
        content.insert("usage".into(), usage);
    }
    for (key, flag) in [("result", "result_truncated"), ("error", "error_truncated")] {
        let text = match chunk.get(key) {
            None | Some(Value::Null) => continue,
            Some(Value::String(text)) => text.clone(),
            Some(other) => other.to_string(),
        };
        let (kept, cut) = cap_chars(&text, PERSISTED_TEXT_CAP);
        content.insert(key.into(), json!(kept));
        if cut {
            content.insert(flag.into(), json!(true));
        }
    }
    Value::Object(content)
}

/// `{input_tokens, output_tokens, total_tokens}` when all three are non-negative integers.
fn valid_usage(usage: &Value) -> Option<Value> {
    let count = |key| usage.get(key).and_then(Value::as_u64);
    Some(json!({
        "input_tokens": count("input_tokens")?,
        "output_tokens": count("output_tokens")?,
        "total_tokens": count("total_tokens")?,
    }))
}

/// Flattens message content to text: a string as is; a list joins its string items and
/// object `text` fields with `\n`, skipping empties; anything else is empty.
pub fn flatten_content(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|item| match item {
                Value::String(text) => Some(text.as_str()),
                Value::Object(block) => block.get("text").and_then(Value::as_str),
                _ => None,
            })
            .filter(|text| !text.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(value: &Value) -> Vec<&str> {
        value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect()
    }

    #[test]
    fn a_start_keeps_task_id_and_description_only() {
        let mapped = map_task_event(&json!({
            "type": "task_started", "task_id": "call_1", "description": "Look", "model_name": "m"
        }))
        .unwrap();
        assert_eq!(mapped.event_type, EventType::SubagentStart);
        assert_eq!(
            mapped.content,
            json!({"task_id": "call_1", "description": "Look"})
        );
        assert_eq!(Value::Object(mapped.metadata), json!({"task_id": "call_1"}));
        let missing = map_task_event(&json!({"type": "task_started", "task_id": "c"})).unwrap();
        assert_eq!(missing.content["description"], Value::Null);
    }

    #[test]
    fn an_ai_step_carries_tool_calls_and_flattened_text() {
        let mapped = map_task_event(&json!({
            "type": "task_running", "task_id": "call_1", "message_index": 1, "total_messages": 1,
            "message": {"type": "ai", "content": [{"type": "text", "text": "a"}, "", "b", {"x": 1}],
                         "tool_calls": [{"id": "c", "name": "ls", "args": {"path": "."}, "type": "tool_call"}]},
            "usage": null, "model_name": "m"
        }))
        .unwrap();
        assert_eq!(mapped.event_type, EventType::SubagentStep);
        assert_eq!(
            keys(&mapped.content),
            [
                "task_id",
                "message_index",
                "kind",
                "text",
                "truncated",
                "tool_calls"
            ]
        );
        assert_eq!(mapped.content["text"], "a\nb");
        assert_eq!(
            mapped.content["tool_calls"],
            json!([{"name": "ls", "args": {"path": "."}}])
        );
        assert_eq!(
            Value::Object(mapped.metadata),
            json!({"task_id": "call_1", "message_index": 1})
        );
    }

    #[test]
    fn a_tool_step_carries_its_tool_name_even_when_null() {
        let mapped = map_task_event(&json!({
            "type": "task_running", "task_id": "t", "message_index": 2,
            "message": {"type": "tool", "content": null}
        }))
        .unwrap();
        assert_eq!(
            keys(&mapped.content),
            [
                "task_id",
                "message_index",
                "kind",
                "text",
                "truncated",
                "tool_name"
            ]
        );
        assert_eq!(mapped.content["tool_name"], Value::Null);
        assert_eq!(mapped.content["text"], "");
    }

    #[test]
    fn long_text_and_args_are_cut_at_8192_characters_with_flags() {
        let text = "é".repeat(PERSISTED_TEXT_CAP + 10);
        let args = "x".repeat(PERSISTED_TEXT_CAP + 1);
        let mapped = map_task_event(&json!({
            "type": "task_running", "task_id": "t", "message_index": 3,
            "message": {"type": "ai", "content": text, "tool_calls": [{"name": "w", "args": args}]}
        }))
        .unwrap();
        assert_eq!(
            mapped.content["text"].as_str().unwrap().chars().count(),
            PERSISTED_TEXT_CAP
        );
        assert_eq!(mapped.content["truncated"], true);
        let call = &mapped.content["tool_calls"][0];
        assert_eq!(call["args"].as_str().unwrap().len(), PERSISTED_TEXT_CAP);
        assert_eq!(call["args_truncated"], true);
    }

    #[test]
    fn structured_args_over_the_cap_become_their_serialised_prefix() {
        let big = json!({"content": "y".repeat(PERSISTED_TEXT_CAP)});
        let mapped = map_task_event(&json!({
            "type": "task_running", "task_id": "t", "message_index": 1,
            "message": {"type": "ai", "content": "", "tool_calls": [{"name": "w", "args": big}]}
        }))
        .unwrap();
        let args = mapped.content["tool_calls"][0]["args"].as_str().unwrap();
        assert!(args.starts_with("{\"content\":\"yyy"));
        assert_eq!(args.chars().count(), PERSISTED_TEXT_CAP);
    }

    #[test]
    fn terminal_events_map_status_and_optional_fields() {
        let cases = [
            ("task_completed", "completed"),
            ("task_failed", "failed"),
            ("task_cancelled", "cancelled"),
            ("task_timed_out", "timed_out"),
        ];
        for (kind, status) in cases {
            let mapped = map_task_event(&json!({"type": kind, "task_id": "t"})).unwrap();
            assert_eq!(mapped.event_type, EventType::SubagentEnd);
            assert_eq!(mapped.content, json!({"task_id": "t", "status": status}));
        }
        let mapped = map_task_event(&json!({
            "type": "task_completed", "task_id": "t", "result": "r".repeat(PERSISTED_TEXT_CAP + 1),
            "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}, "model_name": "  m  "
        }))
        .unwrap();
        assert_eq!(
            keys(&mapped.content),
            [
                "task_id",
                "status",
                "model_name",
                "usage",
                "result",
                "result_truncated"
            ]
        );
        assert_eq!(mapped.content["model_name"], "m");
        let failed = map_task_event(&json!({
            "type": "task_failed", "task_id": "t", "error": "boom",
            "usage": {"input_tokens": -1, "output_tokens": 2, "total_tokens": 3}, "model_name": " "
        }))
        .unwrap();
        assert_eq!(
            failed.content,
            json!({"task_id": "t", "status": "failed", "error": "boom"})
        );
    }

    #[test]
    fn malformed_chunks_are_rejected() {
        let cases = [
            (
                json!({"type": "task_started"}),
                RejectedChunk::MissingTaskId,
            ),
            (
                json!({"type": "task_started", "task_id": ""}),
                RejectedChunk::MissingTaskId,
            ),
            (
                json!({"type": "task_started", "task_id": 5}),
                RejectedChunk::MissingTaskId,
            ),
            (
                json!({"type": "task_started", "task_id": "t", "description": 3}),
                RejectedChunk::BadDescription,
            ),
            (
                json!({"type": "task_running", "task_id": "t", "message_index": -1, "message": {}}),
                RejectedChunk::BadMessageIndex,
            ),
            (
                json!({"type": "task_running", "task_id": "t", "message_index": 1.5, "message": {}}),
                RejectedChunk::BadMessageIndex,
            ),
            (
                json!({"type": "task_running", "task_id": "t", "message_index": 1, "message": "hi"}),
                RejectedChunk::BadMessage,
            ),
            (
                json!({"type": "task_paused", "task_id": "t"}),
                RejectedChunk::UnknownType,
            ),
            (json!("task_started"), RejectedChunk::UnknownType),
        ];
        for (chunk, reason) in cases {
            assert_eq!(map_task_event(&chunk), Err(reason), "{chunk}");
        }
    }
}
