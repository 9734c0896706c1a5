//! Mapping of live task events (docs/events.md#task-events) to persisted `subagent.*` records (docs/events.md#subagent-events).

use std::borrow::Cow;

use serde::Serialize;
use serde_json::value::{RawValue, to_raw_value};
use serde_json::{Map, Value, json};

use crate::events::{EventCategory, EventType, NewEvent};
use crate::messages::Message;
use crate::status::TaskEndStatus;
use crate::task_result::TokenUsage;
use crate::text::cap_chars;
use crate::text::flatten_content;

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
#[derive(Debug, Clone)]
pub struct MappedTaskEvent {
    /// `subagent.start`, `subagent.step` or `subagent.end`.
    pub event_type: EventType,
    /// Record content, serialised once, as it is stored: the keys of
    /// docs/events.md#subagent-events, plus the additive `model_name` of a start and
    /// `usage` of a step. A step (the frequent record) is written straight from its parts.
    pub content: Box<RawValue>,
    /// Record metadata: `task_id`, plus `message_index` on steps.
    pub metadata: Map<String, Value>,
}

/// Equal when type, metadata and the serialised content are: both ways of mapping write
/// the keys of a record in one order.
impl PartialEq for MappedTaskEvent {
    fn eq(&self, other: &Self) -> bool {
        self.event_type == other.event_type
            && self.metadata == other.metadata
            && self.content.get() == other.content.get()
    }
}

impl MappedTaskEvent {
    /// Always `subagent`.
    pub const fn category(&self) -> EventCategory {
        EventCategory::Subagent
    }

    /// The content as a JSON value.
    pub fn content_value(&self) -> Value {
        serde_json::from_str(self.content.get()).expect("record content is JSON")
    }

    /// The record as a new event of `thread_id`/`run_id`, its content as serialised.
    pub fn into_event(self, thread_id: &str, run_id: &str) -> NewEvent {
        NewEvent::with_raw_content(
            thread_id,
            run_id,
            self.event_type.as_str(),
            self.category().as_str(),
            self.content,
            self.metadata,
        )
    }

    /// The record with one more (additive) content field: what the runtime knows about a
    /// task that its live event does not carry, such as the subagent type or stop reason.
    pub fn with_content_field(mut self, key: &str, value: Value) -> Self {
        if let Value::Object(mut content) = self.content_value() {
            content.insert(key.to_owned(), value);
            self.content = raw(&content);
        }
        self
    }
}

/// `value` serialised.
fn raw(value: &impl Serialize) -> Box<RawValue> {
    to_raw_value(value).expect("record content always serialises")
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
                content: start_content(
                    task_id,
                    description,
                    object.get("model_name").and_then(Value::as_str),
                ),
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
            let usage = object.get("usage").and_then(valid_usage);
            Ok(MappedTaskEvent {
                event_type: EventType::SubagentStep,
                content: StepParts::of_chunk(message).content(task_id, message_index, usage),
                metadata,
            })
        }
        terminal => {
            let status = terminal
                .end_status()
                .expect("terminal task events have an end status");
            Ok(MappedTaskEvent {
                event_type: EventType::SubagentEnd,
                content: EndParts::of_chunk(object).content(task_id, status),
                metadata,
            })
        }
    }
}

/// What a step record is made of, however the step arrived.
struct StepParts<'a> {
    is_tool: bool,
    text: String,
    /// The tool message's `name`, or null.
    tool_name: Value,
    /// `(name, args)` of an AI message's tool calls.
    calls: Vec<(Value, &'a Value)>,
}

impl<'a> StepParts<'a> {
    fn of_chunk(message: &'a Map<String, Value>) -> Self {
        let is_tool = message.get("type").and_then(Value::as_str) == Some("tool");
        let calls = message
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(|calls| {
                calls
                    .iter()
                    .map(|call| {
                        let name = call.get("name").filter(|n| n.is_string()).cloned();
                        (
                            name.unwrap_or(Value::Null),
                            call.get("args").unwrap_or(&Value::Null),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        StepParts {
            is_tool,
            text: flatten_content(message.get("content")),
            tool_name: message
                .get("name")
                .filter(|n| n.is_string())
                .cloned()
                .unwrap_or(Value::Null),
            calls,
        }
    }

    fn of_message(message: &'a Message) -> Self {
        let (tool_name, calls) = match message {
            Message::Tool(tool) => (json!(tool.name), Vec::new()),
            Message::Ai(ai) => (
                Value::Null,
                ai.tool_calls
                    .iter()
                    .map(|call| (json!(call.name), &call.args))
                    .collect(),
            ),
            Message::Human(_) | Message::System(_) => (Value::Null, Vec::new()),
        };
        StepParts {
            is_tool: matches!(message, Message::Tool(_)),
            text: message.text(),
            tool_name,
            calls,
        }
    }

    /// The step record's content, serialised straight from the parts.
    fn content(
        &self,
        task_id: &str,
        message_index: u64,
        usage: Option<TokenUsage>,
    ) -> Box<RawValue> {
        let (text, truncated) = cap_chars(&self.text, PERSISTED_TEXT_CAP);
        raw(&StepContent {
            task_id,
            message_index,
            kind: if self.is_tool { "tool" } else { "ai" },
            text,
            truncated,
            tool_name: self.is_tool.then_some(&self.tool_name),
            tool_calls: (!self.is_tool).then(|| {
                self.calls
                    .iter()
                    .map(|(name, args)| StepToolCall::of(name, args))
                    .collect()
            }),
            usage,
        })
    }
}

/// A step record's content, keys in their documented order.
#[derive(Serialize)]
struct StepContent<'a> {
    task_id: &'a str,
    message_index: u64,
    kind: &'static str,
    text: &'a str,
    truncated: bool,
    /// A tool step's: its tool's name, or null.
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_name: Option<&'a Value>,
    /// An AI step's.
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<StepToolCall<'a>>>,
    /// Additive: the cumulative usage at this step, so a summary of a task that has
    /// not ended (or never will) still knows what it spent.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<TokenUsage>,
}

/// One tool call of a step: its args as called, or their serialised text cut to the cap.
#[derive(Serialize)]
struct StepToolCall<'a> {
    name: &'a Value,
    args: StepArgs<'a>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    args_truncated: bool,
}

#[derive(Serialize)]
#[serde(untagged)]
enum StepArgs<'a> {
    Whole(&'a Value),
    Cut(String),
}

impl<'a> StepToolCall<'a> {
    fn of(name: &'a Value, args: &'a Value) -> Self {
        let serialised = match args {
            Value::String(text) => Cow::Borrowed(text.as_str()),
            other => Cow::Owned(other.to_string()),
        };
        match cap_chars(&serialised, PERSISTED_TEXT_CAP) {
            (kept, true) => StepToolCall {
                name,
                args: StepArgs::Cut(kept.to_owned()),
                args_truncated: true,
            },
            (_, false) => StepToolCall {
                name,
                args: StepArgs::Whole(args),
                args_truncated: false,
            },
        }
    }
}

/// A start record's content: `task_id` and `description`, plus (additive) the effective
/// model when non-blank, so a task that never ends still names its model.
fn start_content(task_id: &str, description: Value, model_name: Option<&str>) -> Box<RawValue> {
    let mut content = Map::new();
    content.insert("task_id".into(), json!(task_id));
    content.insert("description".into(), description);
    if let Some(model) = model_name.map(str::trim)
        && !model.is_empty()
    {
        content.insert("model_name".into(), json!(model));
    }
    raw(&content)
}

/// What an end record is made of, however the terminal event arrived.
struct EndParts<'a> {
    model_name: Option<&'a str>,
    usage: Option<TokenUsage>,
    result: Option<Cow<'a, str>>,
    error: Option<Cow<'a, str>>,
}

impl<'a> EndParts<'a> {
    fn of_chunk(chunk: &'a Map<String, Value>) -> Self {
        let text = |key: &str| match chunk.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(Cow::Borrowed(text.as_str())),
            Some(other) => Some(Cow::Owned(other.to_string())),
        };
        EndParts {
            model_name: chunk.get("model_name").and_then(Value::as_str),
            usage: chunk.get("usage").and_then(valid_usage),
            result: text("result"),
            error: text("error"),
        }
    }

    fn failure(model_name: &'a str, usage: Option<TokenUsage>, error: &'a str) -> Self {
        EndParts {
            model_name: Some(model_name),
            usage,
            result: None,
            error: Some(Cow::Borrowed(error)),
        }
    }

    fn content(self, task_id: &str, status: TaskEndStatus) -> Box<RawValue> {
        let mut content = Map::new();
        content.insert("task_id".into(), json!(task_id));
        content.insert("status".into(), json!(status.as_str()));
        if let Some(model) = self.model_name.map(str::trim)
            && !model.is_empty()
        {
            content.insert("model_name".into(), json!(model));
        }
        if let Some(usage) = self.usage {
            content.insert("usage".into(), json!(usage));
        }
        for (key, flag, text) in [
            ("result", "result_truncated", self.result),
            ("error", "error_truncated", self.error),
        ] {
            let Some(text) = text else { continue };
            let (kept, cut) = cap_chars(&text, PERSISTED_TEXT_CAP);
            content.insert(key.into(), json!(kept));
            if cut {
                content.insert(flag.into(), json!(true));
            }
        }
        raw(&content)
    }
}

/// `{input_tokens, output_tokens, total_tokens}` when all three are non-negative integers.
fn valid_usage(usage: &Value) -> Option<TokenUsage> {
    TokenUsage::from_value(usage)
}

/// The error of a task whose execution vanished without a status (docs/events.md#task-events).
pub const DISAPPEARED_ERROR: &str = "Task disappeared from background tasks";

/// A live task event as the runtime produces it (docs/events.md#task-events). It serialises to the
/// `custom` payload with the fields in the documented order, and [`TaskEvent::record`]
/// maps it to its `subagent.*` record without going through JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum TaskEvent {
    /// `task_started`.
    #[serde(rename = "task_started")]
    Started {
        /// The tool_call_id.
        task_id: String,
        /// The task's description.
        description: String,
        /// The effective model.
        model_name: String,
    },
    /// `task_running`: one step message.
    #[serde(rename = "task_running")]
    Running {
        /// The tool_call_id.
        task_id: String,
        /// The step's full message dict.
        message: Box<Message>,
        /// 1-based, contiguous.
        message_index: u64,
        /// Steps captured at emission.
        total_messages: u64,
        /// Cumulative usage, null while there are no records.
        usage: Option<TokenUsage>,
        /// The effective model.
        model_name: String,
    },
    /// `task_completed`, with the untruncated result.
    #[serde(rename = "task_completed")]
    Completed {
        /// The tool_call_id.
        task_id: String,
        /// The result.
        result: String,
        /// Final usage.
        usage: Option<TokenUsage>,
        /// The effective model.
        model_name: String,
    },
    /// `task_failed`.
    #[serde(rename = "task_failed")]
    Failed {
        /// The tool_call_id.
        task_id: String,
        /// The failure.
        error: String,
        /// Final usage.
        usage: Option<TokenUsage>,
        /// The effective model.
        model_name: String,
    },
    /// `task_cancelled`.
    #[serde(rename = "task_cancelled")]
    Cancelled {
        /// The tool_call_id.
        task_id: String,
        /// Why.
        error: String,
        /// Final usage.
        usage: Option<TokenUsage>,
        /// The effective model.
        model_name: String,
    },
    /// `task_timed_out` from the executor's timeout.
    #[serde(rename = "task_timed_out")]
    TimedOut {
        /// The tool_call_id.
        task_id: String,
        /// The timeout text.
        error: String,
        /// Final usage.
        usage: Option<TokenUsage>,
        /// The effective model.
        model_name: String,
    },
    /// `task_timed_out` from the supervision safety net: no `error` key (docs/events.md#the-safety-net).
    #[serde(rename = "task_timed_out")]
    SafetyNetTimedOut {
        /// The tool_call_id.
        task_id: String,
        /// Usage when the net caught it.
        usage: Option<TokenUsage>,
        /// The effective model.
        model_name: String,
    },
    /// `task_failed` for an execution that vanished: no `usage` or `model_name` keys.
    #[serde(rename = "task_failed")]
    Disappeared {
        /// The tool_call_id.
        task_id: String,
        /// Always [`DISAPPEARED_ERROR`].
        error: &'static str,
    },
}

impl TaskEvent {
    /// The `task_failed` event of an execution that vanished.
    pub fn disappeared(task_id: impl Into<String>) -> Self {
        TaskEvent::Disappeared {
            task_id: task_id.into(),
            error: DISAPPEARED_ERROR,
        }
    }

    /// The wire `type`.
    pub fn event_type(&self) -> TaskEventType {
        match self {
            TaskEvent::Started { .. } => TaskEventType::Started,
            TaskEvent::Running { .. } => TaskEventType::Running,
            TaskEvent::Completed { .. } => TaskEventType::Completed,
            TaskEvent::Failed { .. } | TaskEvent::Disappeared { .. } => TaskEventType::Failed,
            TaskEvent::Cancelled { .. } => TaskEventType::Cancelled,
            TaskEvent::TimedOut { .. } | TaskEvent::SafetyNetTimedOut { .. } => {
                TaskEventType::TimedOut
            }
        }
    }

    /// The tool_call_id.
    pub fn task_id(&self) -> &str {
        match self {
            TaskEvent::Started { task_id, .. }
            | TaskEvent::Running { task_id, .. }
            | TaskEvent::Completed { task_id, .. }
            | TaskEvent::Failed { task_id, .. }
            | TaskEvent::Cancelled { task_id, .. }
            | TaskEvent::TimedOut { task_id, .. }
            | TaskEvent::SafetyNetTimedOut { task_id, .. }
            | TaskEvent::Disappeared { task_id, .. } => task_id,
        }
    }

    /// The `custom` payload, fields in the documented order.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("task events always serialise")
    }

    /// The persisted `subagent.*` record of this event; the same record
    /// [`map_task_event`] makes of its payload.
    pub fn record(&self) -> MappedTaskEvent {
        let task_id = self.task_id();
        let mut metadata = Map::new();
        metadata.insert("task_id".into(), json!(task_id));
        let end =
            |status, parts: EndParts<'_>| (EventType::SubagentEnd, parts.content(task_id, status));
        let (event_type, content) = match self {
            TaskEvent::Started {
                description,
                model_name,
                ..
            } => (
                EventType::SubagentStart,
                start_content(task_id, json!(description), Some(model_name)),
            ),
            TaskEvent::Running {
                message,
                message_index,
                usage,
                ..
            } => {
                metadata.insert("message_index".into(), json!(message_index));
                (
                    EventType::SubagentStep,
                    StepParts::of_message(message).content(task_id, *message_index, *usage),
                )
            }
            TaskEvent::Completed {
                result,
                usage,
                model_name,
                ..
            } => end(
                TaskEndStatus::Completed,
                EndParts {
                    model_name: Some(model_name),
                    usage: *usage,
                    result: Some(Cow::Borrowed(result)),
                    error: None,
                },
            ),
            TaskEvent::Failed {
                error,
                usage,
                model_name,
                ..
            } => end(
                TaskEndStatus::Failed,
                EndParts::failure(model_name, *usage, error),
            ),
            TaskEvent::Cancelled {
                error,
                usage,
                model_name,
                ..
            } => end(
                TaskEndStatus::Cancelled,
                EndParts::failure(model_name, *usage, error),
            ),
            TaskEvent::TimedOut {
                error,
                usage,
                model_name,
                ..
            } => end(
                TaskEndStatus::TimedOut,
                EndParts::failure(model_name, *usage, error),
            ),
            TaskEvent::SafetyNetTimedOut {
                usage, model_name, ..
            } => end(
                TaskEndStatus::TimedOut,
                EndParts {
                    model_name: Some(model_name),
                    usage: *usage,
                    result: None,
                    error: None,
                },
            ),
            TaskEvent::Disappeared { error, .. } => end(
                TaskEndStatus::Failed,
                EndParts {
                    model_name: None,
                    usage: None,
                    result: None,
                    error: Some(Cow::Borrowed(error)),
                },
            ),
        };
        MappedTaskEvent {
            event_type,
            content,
            metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(value: &Value) -> Vec<String> {
        value.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn a_start_keeps_task_id_description_and_a_non_blank_model() {
        let mapped = map_task_event(&json!({
            "type": "task_started", "task_id": "call_1", "description": "Look", "model_name": " m "
        }))
        .unwrap();
        assert_eq!(mapped.event_type, EventType::SubagentStart);
        assert_eq!(
            mapped.content_value(),
            json!({"task_id": "call_1", "description": "Look", "model_name": "m"})
        );
        assert_eq!(Value::Object(mapped.metadata), json!({"task_id": "call_1"}));
        let missing =
            map_task_event(&json!({"type": "task_started", "task_id": "c", "model_name": " "}))
                .unwrap();
        assert_eq!(
            missing.content_value(),
            json!({"task_id": "c", "description": null})
        );
    }

    #[test]
    fn a_step_keeps_a_valid_usage_only() {
        let step = |usage: Value| {
            map_task_event(&json!({
                "type": "task_running", "task_id": "t", "message_index": 1,
                "message": {"type": "tool", "content": "x"}, "usage": usage
            }))
            .unwrap()
            .content_value()
        };
        let usage = json!({"input_tokens": 1, "output_tokens": 2, "total_tokens": 3});
        assert_eq!(step(usage.clone())["usage"], usage);
        assert!(step(Value::Null).get("usage").is_none());
        assert!(
            step(json!({"input_tokens": -1, "output_tokens": 2, "total_tokens": 3}))
                .get("usage")
                .is_none()
        );
    }

    #[test]
    fn extra_fields_join_the_content_of_a_record() {
        let mapped = map_task_event(&json!({"type": "task_completed", "task_id": "t"}))
            .unwrap()
            .with_content_field("stop_reason", json!("turn_capped"));
        assert_eq!(
            mapped.content_value(),
            json!({"task_id": "t", "status": "completed", "stop_reason": "turn_capped"})
        );
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
            keys(&mapped.content_value()),
            [
                "task_id",
                "message_index",
                "kind",
                "text",
                "truncated",
                "tool_calls"
            ]
        );
        assert_eq!(mapped.content_value()["text"], "a\nb");
        assert_eq!(
            mapped.content_value()["tool_calls"],
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
            keys(&mapped.content_value()),
            [
                "task_id",
                "message_index",
                "kind",
                "text",
                "truncated",
                "tool_name"
            ]
        );
        assert_eq!(mapped.content_value()["tool_name"], Value::Null);
        assert_eq!(mapped.content_value()["text"], "");
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
            mapped.content_value()["text"]
                .as_str()
                .unwrap()
                .chars()
                .count(),
            PERSISTED_TEXT_CAP
        );
        assert_eq!(mapped.content_value()["truncated"], true);
        let content = mapped.content_value();
        let call = &content["tool_calls"][0];
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
        let content = mapped.content_value();
        let args = content["tool_calls"][0]["args"].as_str().unwrap();
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
            assert_eq!(
                mapped.content_value(),
                json!({"task_id": "t", "status": status})
            );
        }
        let mapped = map_task_event(&json!({
            "type": "task_completed", "task_id": "t", "result": "r".repeat(PERSISTED_TEXT_CAP + 1),
            "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}, "model_name": "  m  "
        }))
        .unwrap();
        assert_eq!(
            keys(&mapped.content_value()),
            [
                "task_id",
                "status",
                "model_name",
                "usage",
                "result",
                "result_truncated"
            ]
        );
        assert_eq!(mapped.content_value()["model_name"], "m");
        let failed = map_task_event(&json!({
            "type": "task_failed", "task_id": "t", "error": "boom",
            "usage": {"input_tokens": -1, "output_tokens": 2, "total_tokens": 3}, "model_name": " "
        }))
        .unwrap();
        assert_eq!(
            failed.content_value(),
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

    fn typed_events() -> Vec<TaskEvent> {
        let usage = Some(TokenUsage::new(5, 2, 7));
        let ai = Message::Ai(crate::messages::AiMessage {
            content: json!([{"type": "text", "text": "look"}, "here"]),
            id: Some("m1".into()),
            tool_calls: vec![crate::messages::ToolCall::new(
                "c1",
                "write_file",
                json!({"path": "n.md", "content": "x".repeat(PERSISTED_TEXT_CAP)}),
            )],
            ..crate::messages::AiMessage::default()
        });
        let tool = Message::Tool(crate::messages::ToolMessage {
            content: json!("ok"),
            name: Some("ls".into()),
            tool_call_id: "c1".into(),
            ..crate::messages::ToolMessage::default()
        });
        let nameless_tool = Message::Tool(crate::messages::ToolMessage {
            content: json!(null),
            tool_call_id: "c2".into(),
            ..crate::messages::ToolMessage::default()
        });
        let (task_id, model_name) = ("call_1".to_owned(), "m".to_owned());
        let running = |index: u64, message: Message, usage| TaskEvent::Running {
            task_id: task_id.clone(),
            message: Box::new(message),
            message_index: index,
            total_messages: index,
            usage,
            model_name: model_name.clone(),
        };
        vec![
            TaskEvent::Started {
                task_id: task_id.clone(),
                description: "Look around".into(),
                model_name: model_name.clone(),
            },
            running(1, ai, None),
            running(2, tool, usage),
            running(3, nameless_tool, usage),
            TaskEvent::Completed {
                task_id: task_id.clone(),
                result: "r".repeat(PERSISTED_TEXT_CAP + 1),
                usage,
                model_name: " m ".into(),
            },
            TaskEvent::Failed {
                task_id: task_id.clone(),
                error: "boom".into(),
                usage: None,
                model_name: model_name.clone(),
            },
            TaskEvent::Cancelled {
                task_id: task_id.clone(),
                error: "Cancelled by user".into(),
                usage,
                model_name: model_name.clone(),
            },
            TaskEvent::TimedOut {
                task_id: task_id.clone(),
                error: "Execution timed out after 1 seconds".into(),
                usage,
                model_name: model_name.clone(),
            },
            TaskEvent::SafetyNetTimedOut {
                task_id: task_id.clone(),
                usage,
                model_name: model_name.clone(),
            },
            TaskEvent::disappeared(task_id),
        ]
    }

    #[test]
    fn typed_events_record_what_their_payloads_map_to() {
        for event in typed_events() {
            let payload = event.to_value();
            assert_eq!(payload["type"], event.event_type().as_str());
            assert_eq!(Ok(event.record()), map_task_event(&payload), "{payload}");
        }
    }

    #[test]
    fn typed_payloads_have_the_documented_fields_in_order() {
        let usage = r#"{"input_tokens":5,"output_tokens":2,"total_tokens":7}"#;
        let payloads: Vec<String> = typed_events()
            .iter()
            .map(|event| serde_json::to_string(event).unwrap())
            .collect();
        assert_eq!(
            payloads[0],
            r#"{"type":"task_started","task_id":"call_1","description":"Look around","model_name":"m"}"#
        );
        assert!(
            payloads[1].starts_with(r#"{"type":"task_running","task_id":"call_1","message":{"type":"ai","content":[{"type":"text","text":"look"},"here"],"id":"m1""#),
            "{}",
            payloads[1]
        );
        assert!(
            payloads[1].ends_with(
                r#","message_index":1,"total_messages":1,"usage":null,"model_name":"m"}"#
            )
        );
        assert!(payloads[2].ends_with(&format!(
            r#","message_index":2,"total_messages":2,"usage":{usage},"model_name":"m"}}"#
        )));
        assert!(
            payloads[4].starts_with(r#"{"type":"task_completed","task_id":"call_1","result":"rrr"#)
        );
        assert!(payloads[4].ends_with(&format!(r#"","usage":{usage},"model_name":" m "}}"#)));
        assert_eq!(
            payloads[5],
            r#"{"type":"task_failed","task_id":"call_1","error":"boom","usage":null,"model_name":"m"}"#
        );
        assert_eq!(
            payloads[6],
            format!(
                r#"{{"type":"task_cancelled","task_id":"call_1","error":"Cancelled by user","usage":{usage},"model_name":"m"}}"#
            )
        );
        assert_eq!(
            payloads[7],
            format!(
                r#"{{"type":"task_timed_out","task_id":"call_1","error":"Execution timed out after 1 seconds","usage":{usage},"model_name":"m"}}"#
            )
        );
        assert_eq!(
            payloads[8],
            format!(
                r#"{{"type":"task_timed_out","task_id":"call_1","usage":{usage},"model_name":"m"}}"#
            )
        );
        assert_eq!(
            payloads[9],
            r#"{"type":"task_failed","task_id":"call_1","error":"Task disappeared from background tasks"}"#
        );
    }
}
