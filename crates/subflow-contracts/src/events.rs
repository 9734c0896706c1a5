//! The run event catalogue (docs/events.md#catalogue) and the record envelope (docs/events.md#envelope).

use serde::{Deserialize, Serialize};
use serde_json::value::{RawValue, to_raw_value};
use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::macros::format_description;
use uuid::Uuid;

use crate::RunStatus;

/// Longest `event_type`, in characters.
pub const EVENT_TYPE_MAX_CHARS: usize = 32;
/// Longest `category`, in characters.
pub const CATEGORY_MAX_CHARS: usize = 16;
/// Prefix of dynamic middleware event types.
pub const MIDDLEWARE_PREFIX: &str = "middleware:";
/// Shortest middleware event type (prefix plus a one-character tag).
pub const MIDDLEWARE_TYPE_MIN_CHARS: usize = 12;
/// Longest middleware tag.
pub const MIDDLEWARE_TAG_MAX_CHARS: usize = 21;
/// The legacy name read as `llm.ai.response` and never produced.
pub const LEGACY_AI_MESSAGE: &str = "ai_message";

string_enum! {
    /// Event categories (contract `categories`).
    pub enum EventCategory {
        Trace = "trace",
        Message = "message",
        Outputs = "outputs",
        Error = "error",
        Middleware = "middleware",
        Context = "context",
        Subagent = "subagent",
        Workspace = "workspace",
    }
}

impl EventCategory {
    /// Whether records of this category may appear in message projections.
    pub const fn in_message_projection(self) -> bool {
        matches!(self, EventCategory::Message)
    }
}

string_enum! {
    /// The frozen event types (contract `events`). Middleware events are dynamic: see [`MiddlewareTag`].
    pub enum EventType {
        RunStart = "run.start",
        RunEnd = "run.end",
        RunError = "run.error",
        LlmHumanInput = "llm.human.input",
        LlmAiResponse = "llm.ai.response",
        LlmToolResult = "llm.tool.result",
        LlmError = "llm.error",
        ContextMemory = "context:memory",
        SubagentStart = "subagent.start",
        SubagentStep = "subagent.step",
        SubagentEnd = "subagent.end",
        WorkspaceChanges = "workspace_changes",
    }
}

impl EventType {
    /// The category every record of this type carries.
    pub const fn category(self) -> EventCategory {
        match self {
            EventType::RunStart | EventType::LlmError => EventCategory::Trace,
            EventType::RunEnd => EventCategory::Outputs,
            EventType::RunError => EventCategory::Error,
            EventType::LlmHumanInput | EventType::LlmAiResponse | EventType::LlmToolResult => {
                EventCategory::Message
            }
            EventType::ContextMemory => EventCategory::Context,
            EventType::SubagentStart | EventType::SubagentStep | EventType::SubagentEnd => {
                EventCategory::Subagent
            }
            EventType::WorkspaceChanges => EventCategory::Workspace,
        }
    }

    /// Reads a stored event type, mapping the legacy `ai_message` alias.
    pub fn read(text: &str) -> Option<EventType> {
        if text == LEGACY_AI_MESSAGE {
            return Some(EventType::LlmAiResponse);
        }
        text.parse().ok()
    }
}

string_enum! {
    /// Known `middleware:{tag}` tags (contract `dynamic_event_patterns[0].known_tags`).
    pub enum MiddlewareTag {
        Guardrail = "guardrail",
        LoopDetection = "loop_detection",
        SafetyTermination = "safety_termination",
        SkillActivation = "skill_activation",
        SkillSecrets = "skill_secrets",
        ToolPromotion = "tool_promotion",
    }
}

impl MiddlewareTag {
    /// The event type `middleware:<tag>`.
    pub fn event_type(self) -> String {
        format!("{MIDDLEWARE_PREFIX}{}", self.as_str())
    }
}

/// A record on its way into the store: everything but `seq`, which the store assigns
/// when it writes the row. `created_at` is taken when the event is emitted (docs/events.md#envelope),
/// so a record flushed later still says when it happened. Content and metadata are
/// serialised once, when the event is emitted, so a queued record is compact and a
/// write only copies text.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewEvent {
    /// Idempotency key (UUID v7), assigned when the event is emitted.
    pub event_id: Uuid,
    /// The thread the event belongs to.
    pub thread_id: String,
    /// The run the event belongs to.
    pub run_id: String,
    /// 1–32 characters.
    pub event_type: String,
    /// 1–16 characters.
    pub category: String,
    /// Any JSON, serialised.
    pub content: Box<RawValue>,
    /// A JSON object, serialised.
    pub metadata: Box<RawValue>,
    /// `metadata.task_id` when it is a string: the column the `task_id` filter uses.
    pub task_id: Option<String>,
    /// The run owner.
    pub user_id: Option<String>,
    /// When the event happened: RFC 3339 UTC with microseconds. A spilled record from
    /// before this field existed is stamped when it is read back.
    #[serde(default = "now_rfc3339")]
    pub created_at: String,
}

/// `at` in UTC as RFC 3339 with microseconds, the form every backend stores.
pub fn rfc3339(at: OffsetDateTime) -> String {
    let format =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z");
    at.to_offset(time::UtcOffset::UTC)
        .format(format)
        .expect("a UTC timestamp always formats")
}

/// Now, as [`rfc3339`].
pub fn now_rfc3339() -> String {
    rfc3339(OffsetDateTime::now_utc())
}

impl NewEvent {
    /// A new event with a fresh UUID v7 `event_id`.
    pub fn new(
        thread_id: impl Into<String>,
        run_id: impl Into<String>,
        event_type: impl Into<String>,
        category: impl Into<String>,
        content: Value,
        metadata: Map<String, Value>,
    ) -> Self {
        let content = to_raw_value(&content).expect("a JSON value always serialises");
        Self::with_raw_content(thread_id, run_id, event_type, category, content, metadata)
    }

    /// [`NewEvent::new`] with content already serialised.
    pub fn with_raw_content(
        thread_id: impl Into<String>,
        run_id: impl Into<String>,
        event_type: impl Into<String>,
        category: impl Into<String>,
        content: Box<RawValue>,
        metadata: Map<String, Value>,
    ) -> Self {
        let task_id = metadata
            .get("task_id")
            .and_then(Value::as_str)
            .map(str::to_owned);
        NewEvent {
            event_id: Uuid::now_v7(),
            thread_id: thread_id.into(),
            run_id: run_id.into(),
            event_type: event_type.into(),
            category: category.into(),
            content,
            metadata: to_raw_value(&metadata).expect("a JSON object always serialises"),
            task_id,
            user_id: None,
            created_at: now_rfc3339(),
        }
    }

    /// `run.end` (docs/events.md#catalogue, the reference's 2.1 contract): written once per run, after
    /// its terminal `status` is durable, with the root `output` (`{}` when the run has
    /// none); `recovered` marks a run that orphan recovery ended.
    pub fn run_end(
        thread_id: impl Into<String>,
        run_id: impl Into<String>,
        status: RunStatus,
        output: Value,
        recovered: bool,
    ) -> Self {
        let mut metadata = Map::new();
        metadata.insert("status".into(), Value::String(status.as_str().to_owned()));
        if recovered {
            metadata.insert("recovered".into(), Value::Bool(true));
        }
        NewEvent::new(
            thread_id,
            run_id,
            EventType::RunEnd.as_str(),
            EventCategory::Outputs.as_str(),
            output,
            metadata,
        )
    }

    /// Sets the run owner.
    pub fn with_user(mut self, user_id: Option<String>) -> Self {
        self.user_id = user_id;
        self
    }

    /// The indexed `metadata.task_id`.
    pub fn task_id(&self) -> Option<&str> {
        self.task_id.as_deref()
    }

    /// The content, parsed.
    pub fn content_value(&self) -> Value {
        serde_json::from_str(self.content.get()).expect("content was serialised from a JSON value")
    }

    /// The metadata object, parsed; empty if a spilled record carried something else.
    pub fn metadata_map(&self) -> Map<String, Value> {
        serde_json::from_str(self.metadata.get()).unwrap_or_default()
    }
}

/// A persisted record (docs/events.md#envelope), as `/events` returns it;
/// `contracts/run_event_stream_contract.json` describes each event type's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunEvent {
    /// Thread id.
    pub thread_id: String,
    /// Run id.
    pub run_id: String,
    /// Thread-global, strictly increasing, ≥ 1.
    pub seq: i64,
    /// Event type.
    #[cfg_attr(feature = "openapi", schema(schema_with = event_type_schema))]
    pub event_type: String,
    /// Category.
    #[cfg_attr(feature = "openapi", schema(value_type = EventCategory))]
    pub category: String,
    /// Payload.
    pub content: Value,
    /// Metadata object.
    pub metadata: Map<String, Value>,
    /// RFC 3339 time at which the event happened (taken by its producer).
    pub created_at: String,
    /// Run owner, or null.
    pub user_id: Option<String>,
    /// The idempotency key (additive envelope field).
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = "uuid"))]
    pub event_id: Uuid,
}

/// `event_type`: a frozen [`EventType`], or a dynamic `middleware:{tag}` (docs/events.md#catalogue).
#[cfg(feature = "openapi")]
fn event_type_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
    use utoipa::openapi::{Ref, RefOr};
    let tags: Vec<&str> = MiddlewareTag::ALL.iter().map(|t| t.as_str()).collect();
    let middleware = ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(format!(
            "^{MIDDLEWARE_PREFIX}[\\s\\S]{{1,{MIDDLEWARE_TAG_MAX_CHARS}}}$"
        )))
        .max_length(Some(EVENT_TYPE_MAX_CHARS))
        .description(Some(format!(
            "A middleware audit event; the known tags are {}",
            tags.join(", ")
        )));
    Schema::OneOf(
        OneOfBuilder::new()
            .item(RefOr::Ref(Ref::from_schema_name("EventType")))
            .item(middleware)
            .description(Some("Event type"))
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_follow_the_catalogue() {
        assert_eq!(EventType::SubagentStep.category(), EventCategory::Subagent);
        assert_eq!(EventType::RunEnd.category(), EventCategory::Outputs);
        assert!(!EventCategory::Subagent.in_message_projection());
        assert!(EventCategory::Message.in_message_projection());
    }

    #[test]
    fn the_legacy_alias_reads_as_ai_response() {
        assert_eq!(
            EventType::read("ai_message"),
            Some(EventType::LlmAiResponse)
        );
        assert_eq!(EventType::read("nope"), None);
        assert!("ai_message".parse::<EventType>().is_err());
    }

    #[test]
    fn run_end_carries_the_terminal_status_and_marks_recoveries() {
        for status in [
            RunStatus::Success,
            RunStatus::Error,
            RunStatus::Timeout,
            RunStatus::Interrupted,
        ] {
            let event = NewEvent::run_end("t", "r", status, serde_json::json!({}), false);
            assert_eq!(event.event_type, "run.end");
            assert_eq!(event.category, "outputs");
            assert_eq!(
                event.metadata_map(),
                Map::from_iter([("status".to_owned(), Value::from(status.as_str()))])
            );
        }
        let recovered = NewEvent::run_end("t", "r", RunStatus::Error, serde_json::json!({}), true);
        assert_eq!(recovered.metadata_map()["recovered"], true);
    }

    #[test]
    fn events_are_stamped_when_emitted_and_keep_the_stamp_through_a_spill() {
        let before = now_rfc3339();
        let event = NewEvent::new("t", "r", "llm.error", "trace", Value::Null, Map::new());
        let after = now_rfc3339();
        // Same fixed-width UTC form, so text order is time order.
        assert!(before <= event.created_at && event.created_at <= after);
        assert_eq!(event.created_at.len(), "2026-01-01T00:00:00.000000Z".len());
        let text = serde_json::to_string(&event).unwrap();
        let back: NewEvent = serde_json::from_str(&text).unwrap();
        assert_eq!(back.created_at, event.created_at);
        let mut old: Value = serde_json::from_str(&text).unwrap();
        old.as_object_mut().unwrap().remove("created_at");
        let stamped: NewEvent = serde_json::from_value(old).unwrap();
        assert!(stamped.created_at >= event.created_at);
    }

    #[test]
    fn middleware_event_types_fit_the_dynamic_pattern() {
        for tag in MiddlewareTag::ALL {
            let name = tag.event_type();
            let chars = name.chars().count();
            assert!(
                (MIDDLEWARE_TYPE_MIN_CHARS..=EVENT_TYPE_MAX_CHARS).contains(&chars),
                "{name}"
            );
            assert!(tag.as_str().chars().count() <= MIDDLEWARE_TAG_MAX_CHARS);
        }
    }
}
