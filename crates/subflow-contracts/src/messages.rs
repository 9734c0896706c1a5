//! LangChain-shaped messages (docs/api.md#objects), as threads, checkpoints, task events and the
//! runs API carry them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::text::flatten_content;

/// A message of a conversation, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Message {
    /// From the user.
    Human(HumanMessage),
    /// From a model.
    Ai(AiMessage),
    /// A tool's result.
    Tool(ToolMessage),
    /// Instructions.
    System(SystemMessage),
}

/// A message that is text and metadata only: what a user or a system prompt says.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TextMessage {
    /// A string or a list of content blocks.
    pub content: Value,
    /// Message id.
    #[serde(default)]
    pub id: Option<String>,
    /// Optional name (e.g. `loop_warning`).
    #[serde(default)]
    pub name: Option<String>,
    /// Extra provider or framework data.
    #[serde(default)]
    pub additional_kwargs: Map<String, Value>,
    /// Response data.
    #[serde(default)]
    pub response_metadata: Map<String, Value>,
}

/// A user message.
pub type HumanMessage = TextMessage;

/// A system message.
pub type SystemMessage = TextMessage;

/// A model's reply.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AiMessage {
    /// A string or a list of content blocks.
    pub content: Value,
    /// Message id.
    #[serde(default)]
    pub id: Option<String>,
    /// Optional name.
    #[serde(default)]
    pub name: Option<String>,
    /// Extra data, e.g. `deerflow_error_fallback`.
    #[serde(default)]
    pub additional_kwargs: Map<String, Value>,
    /// `model_name` and `finish_reason`.
    #[serde(default)]
    pub response_metadata: Map<String, Value>,
    /// Tool calls the model asked for.
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// Tool calls whose arguments did not parse.
    #[serde(default)]
    pub invalid_tool_calls: Vec<Value>,
    /// Token usage of the call.
    #[serde(default)]
    pub usage_metadata: Option<UsageMetadata>,
}

/// One requested tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolCall {
    /// The provider's `tool_call_id`; a task's public `task_id`.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments, a JSON object.
    pub args: Value,
    /// Always `tool_call`.
    #[serde(rename = "type", default = "tool_call_type")]
    pub kind: String,
}

fn tool_call_type() -> String {
    "tool_call".to_owned()
}

impl ToolCall {
    /// A tool call with the `tool_call` type.
    pub fn new(id: impl Into<String>, name: impl Into<String>, args: Value) -> Self {
        ToolCall {
            id: id.into(),
            name: name.into(),
            args,
            kind: tool_call_type(),
        }
    }
}

/// Token usage of one model call; input includes cached input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageMetadata {
    /// Input tokens, cached ones included.
    #[serde(deserialize_with = "crate::api::numbers::whole_u64")]
    pub input_tokens: u64,
    /// Output tokens.
    #[serde(deserialize_with = "crate::api::numbers::whole_u64")]
    pub output_tokens: u64,
    /// Total tokens.
    #[serde(deserialize_with = "crate::api::numbers::whole_u64")]
    pub total_tokens: u64,
    /// Details of the input.
    #[serde(default)]
    pub input_token_details: InputTokenDetails,
}

impl UsageMetadata {
    /// The counts one call is priced on.
    pub fn tokens(&self) -> crate::cost::Tokens {
        crate::cost::Tokens {
            input: self.input_tokens,
            output: self.output_tokens,
            cache_read: self.input_token_details.cache_read,
            cache_write: self.input_token_details.cache_creation,
        }
    }
}

/// Details of the input tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InputTokenDetails {
    /// Input tokens served from the provider's cache.
    #[serde(default, deserialize_with = "crate::api::numbers::whole_u64")]
    pub cache_read: u64,
    /// Input tokens written to the provider's cache; present only when > 0.
    #[serde(
        default,
        deserialize_with = "crate::api::numbers::whole_u64",
        skip_serializing_if = "crate::api::numbers::is_zero"
    )]
    pub cache_creation: u64,
}

/// `status` of a tool message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ToolStatus {
    /// The tool ran.
    #[default]
    Success,
    /// The tool failed; the content says why.
    Error,
}

/// A tool's result.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolMessage {
    /// A string or a list of content blocks.
    pub content: Value,
    /// Message id.
    #[serde(default)]
    pub id: Option<String>,
    /// The tool's name.
    #[serde(default)]
    pub name: Option<String>,
    /// Extra data, e.g. the task status contract (docs/events.md#tool-result-contract).
    #[serde(default)]
    pub additional_kwargs: Map<String, Value>,
    /// Response data.
    #[serde(default)]
    pub response_metadata: Map<String, Value>,
    /// The call this answers.
    pub tool_call_id: String,
    /// success or error.
    #[serde(default)]
    pub status: ToolStatus,
    /// Structured result, if any.
    #[serde(default)]
    pub artifact: Value,
}

impl ToolMessage {
    /// A text answer to `call` with a fresh id.
    pub fn answering(call: &ToolCall, content: String, status: ToolStatus) -> Self {
        ToolMessage {
            content: Value::String(content),
            id: Some(uuid::Uuid::now_v7().to_string()),
            name: Some(call.name.clone()),
            tool_call_id: call.id.clone(),
            status,
            ..ToolMessage::default()
        }
    }
}

impl Message {
    /// The message id.
    pub fn id(&self) -> Option<&str> {
        match self {
            Message::Human(m) => m.id.as_deref(),
            Message::Ai(m) => m.id.as_deref(),
            Message::Tool(m) => m.id.as_deref(),
            Message::System(m) => m.id.as_deref(),
        }
    }

    /// Gives the message a fresh UUID (v7) unless it has an id (docs/api.md#objects: a message
    /// entering the state keeps one id from then on); returns the id.
    pub fn ensure_id(&mut self) -> &str {
        let id = match self {
            Message::Human(m) | Message::System(m) => &mut m.id,
            Message::Ai(m) => &mut m.id,
            Message::Tool(m) => &mut m.id,
        };
        id.get_or_insert_with(|| uuid::Uuid::now_v7().to_string())
    }

    /// The content, a string or a list of blocks.
    pub fn content(&self) -> &Value {
        match self {
            Message::Human(m) => &m.content,
            Message::Ai(m) => &m.content,
            Message::Tool(m) => &m.content,
            Message::System(m) => &m.content,
        }
    }

    /// The content flattened to text.
    pub fn text(&self) -> String {
        flatten_content(Some(self.content()))
    }

    /// A human message with text content.
    pub fn human(text: impl Into<String>) -> Self {
        Message::Human(HumanMessage {
            content: Value::String(text.into()),
            ..HumanMessage::default()
        })
    }

    /// A system message with text content.
    pub fn system(text: impl Into<String>) -> Self {
        Message::System(SystemMessage {
            content: Value::String(text.into()),
            ..SystemMessage::default()
        })
    }
}

/// The longest fallback title, in characters, before `...`.
pub const FALLBACK_TITLE_CHARS: usize = 50;

/// A thread's title when none was set: the first human message's text, trimmed, cut to
/// [`FALLBACK_TITLE_CHARS`] characters (and trimmed again) with `...` when longer; `None`
/// without a human message with text.
pub fn fallback_title(messages: &[Message]) -> Option<String> {
    let first = messages.iter().find(|m| matches!(m, Message::Human(_)))?;
    let text = first.text();
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if text.chars().count() <= FALLBACK_TITLE_CHARS {
        return Some(text.to_owned());
    }
    let cut: String = text.chars().take(FALLBACK_TITLE_CHARS).collect();
    Some(format!("{}...", cut.trim_end()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_serialise_as_langchain_dicts_with_type_first() {
        let ai = Message::Ai(AiMessage {
            content: json!("hi"),
            id: Some("m1".into()),
            tool_calls: vec![ToolCall::new("call_1", "ls", json!({}))],
            usage_metadata: Some(UsageMetadata {
                input_tokens: 3,
                output_tokens: 1,
                total_tokens: 4,
                input_token_details: InputTokenDetails {
                    cache_read: 2,
                    cache_creation: 0,
                },
            }),
            ..AiMessage::default()
        });
        let text = serde_json::to_string(&ai).unwrap();
        assert!(
            text.starts_with(r#"{"type":"ai","content":"hi","id":"m1""#),
            "{text}"
        );
        assert!(text.contains(
            r#""tool_calls":[{"id":"call_1","name":"ls","args":{},"type":"tool_call"}]"#
        ));
        assert!(text.contains(r#""input_token_details":{"cache_read":2}"#));
        assert_eq!(serde_json::from_str::<Message>(&text).unwrap(), ai);
    }

    #[test]
    fn ensure_id_keeps_an_id_and_fills_a_missing_one_once() {
        let mut given = Message::Human(HumanMessage {
            id: Some("client-1".into()),
            ..HumanMessage::default()
        });
        assert_eq!(given.ensure_id(), "client-1");
        let mut tool: Message = serde_json::from_value(
            json!({"type": "tool", "content": "ok", "tool_call_id": "c1", "id": null}),
        )
        .unwrap();
        assert_eq!(tool.id(), None);
        let first = tool.ensure_id().to_owned();
        assert!(uuid::Uuid::parse_str(&first).is_ok(), "{first}");
        assert_eq!(tool.ensure_id(), first, "the id is stable");
        assert_eq!(json!(tool)["id"], first);
    }

    #[test]
    fn minimal_dicts_parse_with_defaults() {
        let human: Message =
            serde_json::from_value(json!({"type": "human", "content": "hello"})).unwrap();
        assert_eq!(human.text(), "hello");
        let tool: Message = serde_json::from_value(json!({"type": "tool", "content": [{"type": "text", "text": "ok"}], "tool_call_id": "c1"})).unwrap();
        let Message::Tool(tool) = tool else {
            panic!("tool")
        };
        assert_eq!(tool.status, ToolStatus::Success);
        assert!(
            serde_json::from_value::<Message>(json!({"type": "robot", "content": ""})).is_err()
        );
    }

    #[test]
    fn the_fallback_title_is_the_first_human_text_trimmed_and_cut_at_50() {
        let exactly = "x".repeat(50);
        let long = format!("{} tail", "y".repeat(49));
        for (messages, title) in [
            (
                vec![Message::human("  Compare Rust and Go \n")],
                Some("Compare Rust and Go".to_owned()),
            ),
            (vec![Message::human(exactly.clone())], Some(exactly)),
            // 49 y, a space: cut at 50 characters, the trailing space trimmed, then `...`.
            (
                vec![Message::human(long)],
                Some(format!("{}...", "y".repeat(49))),
            ),
            (
                vec![Message::human("é".repeat(60))],
                Some(format!("{}...", "é".repeat(50))),
            ),
            (
                vec![Message::system("sys"), Message::human("second")],
                Some("second".to_owned()),
            ),
            (vec![Message::human("   ")], None),
            (vec![Message::system("only a system prompt")], None),
        ] {
            assert_eq!(fallback_title(&messages), title);
        }
    }
}
