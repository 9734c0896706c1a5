//! Traces of agent executions (docs/operations.md#langfuse-and-otlp), shaped like OpenTelemetry spans with the
//! GenAI semantic-convention and Langfuse attributes.
//!
//! The runtime builds finished [`SpanData`] and hands each to a [`SpanSink`], which
//! must return at once; encoding, queueing and HTTP live in `subflow-telemetry`. One
//! [`AgentTrace`] is one trace: a lead run's (`lead_agent`) or a subagent execution's
//! (`subagent:<name>`). Its trace-level attributes are repeated on every span, and a
//! subagent's root span links to the lead's `execute_tool task` span.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::{Map, Value, json};
use subflow_contracts::messages::{AiMessage, ToolCall, ToolMessage, ToolStatus};
use subflow_models::ModelInfo;

/// `langfuse.user.id` of a run without an owner, as in local mode (docs/operations.md#langfuse-and-otlp).
pub const DEFAULT_USER: &str = "default";

/// A 16-byte trace id.
pub type TraceId = [u8; 16];
/// An 8-byte span id.
pub type SpanId = [u8; 8];

/// One attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttributeValue {
    /// A string.
    String(String),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A list of strings.
    StringArray(Vec<String>),
}

/// One attribute.
pub type Attribute = (String, AttributeValue);

/// How a span ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpanStatus {
    /// No verdict.
    Unset,
    /// Failed, with a message.
    Error(String),
}

/// What a span stands for, as OpenTelemetry's span kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Work inside the process: agents and tools.
    Internal,
    /// A call to a remote service: model calls.
    Client,
}

/// A link to a span of another trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanLink {
    /// The other trace.
    pub trace_id: TraceId,
    /// The span in it.
    pub span_id: SpanId,
}

/// A finished span.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanData {
    /// Its trace.
    pub trace_id: TraceId,
    /// Its id.
    pub span_id: SpanId,
    /// The parent span, if any (a root span adopting a `traceparent` has one).
    pub parent_span_id: Option<SpanId>,
    /// `invoke_agent <name>`, `chat <model>` or `execute_tool <name>`.
    pub name: String,
    /// Client for model calls, internal otherwise.
    pub kind: SpanKind,
    /// When it started.
    pub start: SystemTime,
    /// When it ended.
    pub end: SystemTime,
    /// Its attributes, trace-level ones first.
    pub attributes: Vec<Attribute>,
    /// Links to spans of other traces.
    pub links: Vec<SpanLink>,
    /// How it ended.
    pub status: SpanStatus,
}

impl SpanData {
    /// The value of attribute `key`, if present.
    pub fn attribute(&self, key: &str) -> Option<&AttributeValue> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
}

/// Where finished spans go. `export` must never wait: a sink that cannot take a span
/// drops it (and counts the drop).
pub trait SpanSink: Send + Sync + fmt::Debug {
    /// Takes one finished span.
    fn export(&self, span: SpanData);
}

/// Several sinks: each span goes to every one of them.
#[derive(Debug, Clone, Default)]
pub struct FanOut(pub Vec<Arc<dyn SpanSink>>);

impl SpanSink for FanOut {
    fn export(&self, span: SpanData) {
        if let Some((last, rest)) = self.0.split_last() {
            for sink in rest {
                sink.export(span.clone());
            }
            last.export(span);
        }
    }
}

/// The trace id and parent span of a valid W3C `traceparent` (docs/operations.md#langfuse-and-otlp "`traceparent`").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// Adopted as the lead trace's id.
    pub trace_id: TraceId,
    /// The lead root span's parent.
    pub span_id: SpanId,
}

fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != N * 2 {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

impl TraceParent {
    /// From the hex trace-id and parent-id fields of an already validated `traceparent`;
    /// `None` when either is not hex of the right length or is all zeros.
    pub fn from_hex(trace_id: &str, span_id: &str) -> Option<Self> {
        let trace_id = hex_bytes::<16>(trace_id).filter(|t| t.iter().any(|b| *b != 0))?;
        let span_id = hex_bytes::<8>(span_id).filter(|s| s.iter().any(|b| *b != 0))?;
        Some(TraceParent { trace_id, span_id })
    }
}

/// Caller-supplied trace attributes from `config.metadata` (docs/operations.md#langfuse-and-otlp "Caller
/// overrides"); they win on the lead trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceOverrides {
    /// `langfuse_session_id`.
    pub session_id: Option<String>,
    /// `langfuse_user_id`.
    pub user_id: Option<String>,
    /// `langfuse_trace_name`.
    pub trace_name: Option<String>,
    /// `langfuse_tags`: a list of strings, or one string.
    pub tags: Option<Vec<String>>,
}

impl TraceOverrides {
    /// The overrides present in a run's `config.metadata`; other keys and values of the
    /// wrong type are ignored.
    pub fn from_metadata(metadata: &Map<String, Value>) -> Self {
        let text = |key: &str| {
            metadata
                .get(key)
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let tags = match metadata.get("langfuse_tags") {
            Some(Value::Array(items)) => Some(
                items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect(),
            ),
            Some(Value::String(tag)) if !tag.is_empty() => Some(vec![tag.clone()]),
            _ => None,
        };
        TraceOverrides {
            session_id: text("langfuse_session_id"),
            user_id: text("langfuse_user_id"),
            trace_name: text("langfuse_trace_name"),
            tags,
        }
    }
}

/// What a run's caller adds to its trace: a `traceparent` to adopt and the overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceRequest {
    /// A valid inbound `traceparent`.
    pub parent: Option<TraceParent>,
    /// `config.metadata.langfuse_*`.
    pub overrides: TraceOverrides,
}

/// `subagent:` + the name trimmed, lowercased, `_` → `-`; `subagent` when empty.
pub fn subagent_trace_name(name: &str) -> String {
    let normalised = name.trim().to_lowercase().replace('_', "-");
    if normalised.is_empty() {
        "subagent".to_owned()
    } else {
        format!("subagent:{normalised}")
    }
}

/// A fresh random trace id.
pub fn new_trace_id() -> TraceId {
    *uuid::Uuid::new_v4().as_bytes()
}

/// A fresh random span id (never all zeros).
pub fn new_span_id() -> SpanId {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    let mut id = [0u8; 8];
    id.copy_from_slice(&bytes[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

fn string(key: &str, value: impl Into<String>) -> Attribute {
    (key.to_owned(), AttributeValue::String(value.into()))
}

fn int(key: &str, value: u64) -> Attribute {
    (
        key.to_owned(),
        AttributeValue::Int(i64::try_from(value).unwrap_or(i64::MAX)),
    )
}

/// Who a trace is for and what it is called; turned into the trace-level attributes.
#[derive(Debug, Clone)]
pub(crate) struct TraceIdentity {
    /// `langfuse.session.id`: the (parent) thread id.
    pub session_id: String,
    /// `langfuse.user.id`.
    pub user_id: String,
    /// `langfuse.trace.name`.
    pub trace_name: String,
    /// `langfuse.trace.tags`.
    pub tags: Vec<String>,
    /// `langfuse.trace.metadata.*`, `deerflow_trace_id` first.
    pub metadata: Vec<(String, String)>,
    /// `gen_ai.conversation.id`: the thread id.
    pub conversation_id: String,
}

impl TraceIdentity {
    fn attributes(&self) -> Vec<Attribute> {
        let mut attributes = vec![
            string("langfuse.session.id", &self.session_id),
            string("langfuse.user.id", &self.user_id),
            string("langfuse.trace.name", &self.trace_name),
        ];
        if !self.tags.is_empty() {
            attributes.push((
                "langfuse.trace.tags".to_owned(),
                AttributeValue::StringArray(self.tags.clone()),
            ));
        }
        for (key, value) in &self.metadata {
            attributes.push(string(&format!("langfuse.trace.metadata.{key}"), value));
        }
        attributes.push(string("gen_ai.conversation.id", &self.conversation_id));
        attributes
    }
}

/// The `env:` and `model:` tags of docs/operations.md#langfuse-and-otlp, each only when set.
pub(crate) fn trace_tags(environment: Option<&str>, model: Option<&str>) -> Vec<String> {
    let mut tags = Vec::new();
    if let Some(env) = environment.filter(|e| !e.is_empty()) {
        tags.push(format!("env:{env}"));
    }
    if let Some(model) = model.filter(|m| !m.is_empty()) {
        tags.push(format!("model:{model}"));
    }
    tags
}

/// One trace being recorded: its ids, the attributes every span repeats, and its root
/// span, exported by [`AgentTrace::finish`].
#[derive(Debug, Clone)]
pub(crate) struct AgentTrace {
    sink: Arc<dyn SpanSink>,
    trace_id: TraceId,
    root_span_id: SpanId,
    root_parent: Option<SpanId>,
    agent_name: String,
    common: Arc<Vec<Attribute>>,
    links: Vec<SpanLink>,
    started: SystemTime,
}

/// One model call as its `chat` span records it.
pub(crate) struct ChatCall<'a> {
    pub provider: &'a str,
    pub request_model: &'a str,
    pub started: SystemTime,
    /// The answer, or the provider's failure.
    pub answer: Result<&'a AiMessage, String>,
}

impl<'a> ChatCall<'a> {
    /// The call to `model` that began at `started` and gave `answer` (an assembled
    /// message with whatever else the provider returned, or the provider's failure).
    pub fn of<T, E: fmt::Display>(
        model: &'a ModelInfo,
        started: SystemTime,
        answer: &'a Result<(AiMessage, T), E>,
    ) -> Self {
        ChatCall {
            provider: model.provider,
            request_model: &model.model,
            started,
            answer: answer
                .as_ref()
                .map(|(ai, _)| ai)
                .map_err(ToString::to_string),
        }
    }
}

impl AgentTrace {
    /// Starts a trace for the agent `agent_name`, now.
    pub fn start(
        sink: Arc<dyn SpanSink>,
        identity: &TraceIdentity,
        agent_name: &str,
        parent: Option<TraceParent>,
        link: Option<SpanLink>,
    ) -> Self {
        AgentTrace {
            sink,
            trace_id: parent.map_or_else(new_trace_id, |p| p.trace_id),
            root_span_id: new_span_id(),
            root_parent: parent.map(|p| p.span_id),
            agent_name: agent_name.to_owned(),
            common: Arc::new(identity.attributes()),
            links: link.into_iter().collect(),
            started: SystemTime::now(),
        }
    }

    fn emit(
        &self,
        span_id: SpanId,
        name: String,
        kind: SpanKind,
        start: SystemTime,
        extra: Vec<Attribute>,
        status: SpanStatus,
    ) {
        let mut attributes = Vec::with_capacity(self.common.len() + extra.len());
        attributes.extend(self.common.iter().cloned());
        attributes.extend(extra);
        self.sink.export(SpanData {
            trace_id: self.trace_id,
            span_id,
            parent_span_id: Some(self.root_span_id),
            name,
            kind,
            start,
            end: SystemTime::now().max(start),
            attributes,
            links: Vec::new(),
            status,
        });
    }

    /// Exports the `chat <model>` generation span of one model call, ending now.
    pub fn chat(&self, call: &ChatCall<'_>) {
        let mut extra = vec![
            string("langfuse.observation.type", "generation"),
            string("gen_ai.operation.name", "chat"),
            string("gen_ai.provider.name", call.provider),
            string("gen_ai.request.model", call.request_model),
        ];
        let status = match &call.answer {
            Err(error) => SpanStatus::Error(error.clone()),
            Ok(ai) => {
                let metadata = &ai.response_metadata;
                let response_model = metadata
                    .get("model_name")
                    .and_then(Value::as_str)
                    .unwrap_or(call.request_model);
                extra.push(string("gen_ai.response.model", response_model));
                if let Some(reason) = metadata.get("finish_reason").and_then(Value::as_str) {
                    extra.push((
                        "gen_ai.response.finish_reasons".to_owned(),
                        AttributeValue::StringArray(vec![reason.to_owned()]),
                    ));
                }
                if let Some(usage) = &ai.usage_metadata {
                    // Input is reported uncached, beside the cache reads and writes, so
                    // that Langfuse prices each at its own rate and never twice; the
                    // counts are clamped as the price function clamps them.
                    let details = &usage.input_token_details;
                    let cache_read = details.cache_read.min(usage.input_tokens);
                    let cache_write = details.cache_creation.min(usage.input_tokens - cache_read);
                    let uncached = usage.input_tokens - cache_read - cache_write;
                    extra.push(int("gen_ai.usage.input_tokens", uncached));
                    extra.push(int("gen_ai.usage.output_tokens", usage.output_tokens));
                    extra.push(int("gen_ai.usage.cache_read.input_tokens", cache_read));
                    let mut usage_details = json!({"input": uncached, "output": usage.output_tokens, "input_cache_read": cache_read});
                    if cache_write > 0 {
                        extra.push(int("gen_ai.usage.cache_creation.input_tokens", cache_write));
                        usage_details["input_cache_creation"] = json!(cache_write);
                    }
                    extra.push(string(
                        "langfuse.observation.usage_details",
                        usage_details.to_string(),
                    ));
                }
                SpanStatus::Unset
            }
        };
        self.emit(
            new_span_id(),
            format!("chat {}", call.request_model),
            SpanKind::Client,
            call.started,
            extra,
            status,
        );
    }

    /// Exports the `execute_tool <name>` span of one tool call, ending now; `span_id` was
    /// chosen when the call started (a subagent links to it). `result` is `None` when
    /// the call was cut off by a cancellation.
    pub fn tool(
        &self,
        span_id: SpanId,
        started: SystemTime,
        call: &ToolCall,
        result: Option<&ToolMessage>,
    ) {
        let name = &call.name;
        let extra = vec![
            string("langfuse.observation.type", "tool"),
            string("gen_ai.operation.name", "execute_tool"),
            string("gen_ai.tool.name", name),
            string("gen_ai.tool.call.id", &call.id),
        ];
        let status = match result {
            None => SpanStatus::Error("Cancelled".to_owned()),
            Some(tool) if tool.status == ToolStatus::Error => SpanStatus::Error(
                subflow_contracts::text::flatten_content(Some(&tool.content)),
            ),
            Some(_) => SpanStatus::Unset,
        };
        self.emit(
            span_id,
            format!("execute_tool {name}"),
            SpanKind::Internal,
            started,
            extra,
            status,
        );
    }

    /// The link a subagent trace's root span carries to the tool span `span_id` here.
    pub fn link_to(&self, span_id: SpanId) -> SpanLink {
        SpanLink {
            trace_id: self.trace_id,
            span_id,
        }
    }

    /// Exports the root `invoke_agent <name>` span, ending now.
    pub fn finish(self, error: Option<String>) {
        let mut attributes = Vec::with_capacity(self.common.len() + 3);
        attributes.extend(self.common.iter().cloned());
        attributes.push(string("langfuse.observation.type", "agent"));
        attributes.push(string("gen_ai.operation.name", "invoke_agent"));
        attributes.push(string("gen_ai.agent.name", &self.agent_name));
        self.sink.export(SpanData {
            trace_id: self.trace_id,
            span_id: self.root_span_id,
            parent_span_id: self.root_parent,
            name: format!("invoke_agent {}", self.agent_name),
            kind: SpanKind::Internal,
            start: self.started,
            end: SystemTime::now().max(self.started),
            attributes,
            links: self.links,
            status: error.map_or(SpanStatus::Unset, SpanStatus::Error),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subagent_trace_names_are_normalised() {
        assert_eq!(
            subagent_trace_name("  General_Purpose "),
            "subagent:general-purpose"
        );
        assert_eq!(subagent_trace_name("   "), "subagent");
    }

    #[test]
    fn traceparent_fields_become_ids_unless_zero_or_malformed() {
        let parent =
            TraceParent::from_hex("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7").unwrap();
        assert_eq!(parent.trace_id[0], 0x4b);
        assert_eq!(parent.span_id[7], 0xb7);
        assert!(TraceParent::from_hex(&"0".repeat(32), "00f067aa0ba902b7").is_none());
        assert!(TraceParent::from_hex("4bf92f3577b34da6a3ce929d0e0e4736", "0000").is_none());
        assert!(TraceParent::from_hex("zz".repeat(16).as_str(), "00f067aa0ba902b7").is_none());
    }

    #[test]
    fn overrides_read_strings_and_tag_lists_and_ignore_the_rest() {
        let metadata = json!({"langfuse_session_id": "s", "langfuse_user_id": 7,
            "langfuse_trace_name": "", "langfuse_tags": ["a", 1, "b"], "other": "x"});
        let overrides = TraceOverrides::from_metadata(metadata.as_object().unwrap());
        assert_eq!(overrides.session_id.as_deref(), Some("s"));
        assert_eq!(overrides.user_id, None);
        assert_eq!(overrides.trace_name, None);
        assert_eq!(overrides.tags, Some(vec!["a".into(), "b".into()]));
        let single = json!({"langfuse_tags": "solo"});
        assert_eq!(
            TraceOverrides::from_metadata(single.as_object().unwrap()).tags,
            Some(vec!["solo".into()])
        );
    }

    /// Keeps every span exported to it.
    #[derive(Debug, Default)]
    struct Kept(std::sync::Mutex<Vec<SpanData>>);

    impl SpanSink for Kept {
        fn export(&self, span: SpanData) {
            self.0.lock().unwrap().push(span);
        }
    }

    #[test]
    fn a_chat_span_reports_input_uncached_beside_its_cache_reads_and_writes() {
        use subflow_contracts::messages::{InputTokenDetails, UsageMetadata};
        let kept = Arc::new(Kept::default());
        let identity = TraceIdentity {
            session_id: "t".into(),
            user_id: "u".into(),
            trace_name: "lead_agent".into(),
            tags: Vec::new(),
            metadata: Vec::new(),
            conversation_id: "t".into(),
        };
        let trace = AgentTrace::start(kept.clone(), &identity, "lead_agent", None, None);
        let ai = AiMessage {
            usage_metadata: Some(UsageMetadata {
                input_tokens: 2112,
                output_tokens: 25,
                total_tokens: 2137,
                input_token_details: InputTokenDetails {
                    cache_read: 2000,
                    cache_creation: 100,
                },
            }),
            ..AiMessage::default()
        };
        trace.chat(&ChatCall {
            provider: "anthropic",
            request_model: "claude",
            started: SystemTime::now(),
            answer: Ok(&ai),
        });
        let spans = kept.0.lock().unwrap();
        let value = |key: &str| {
            spans[0]
                .attributes
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            value("gen_ai.usage.input_tokens"),
            Some(AttributeValue::Int(12))
        );
        assert_eq!(
            value("gen_ai.usage.cache_read.input_tokens"),
            Some(AttributeValue::Int(2000))
        );
        assert_eq!(
            value("gen_ai.usage.cache_creation.input_tokens"),
            Some(AttributeValue::Int(100))
        );
        let Some(AttributeValue::String(details)) = value("langfuse.observation.usage_details")
        else {
            panic!("usage details are a string");
        };
        assert_eq!(
            serde_json::from_str::<Value>(&details).unwrap(),
            json!({"input": 12, "output": 25, "input_cache_read": 2000, "input_cache_creation": 100})
        );
    }

    #[test]
    fn tags_name_the_environment_then_the_model_when_set() {
        assert_eq!(
            trace_tags(Some("prod"), Some("gpt")),
            ["env:prod", "model:gpt"]
        );
        assert_eq!(trace_tags(None, Some("gpt")), ["model:gpt"]);
        assert!(trace_tags(Some(""), None).is_empty());
    }
}
