//! The provider-neutral request, stream events and trait.

use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde_json::Value;
use subflow_contracts::messages::Message;

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Tool name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: Value,
}

/// One model call.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The conversation so far, system message first when there is one; shared with the
    /// agent's own history, so a call does not copy the conversation.
    pub messages: Arc<Vec<Message>>,
    /// Tools offered to the model: one list shared by every call of an agent, so a turn
    /// does not copy the schemas again.
    pub tools: Arc<[ToolSpec]>,
    /// Who is calling: `lead_agent` or `subagent:<name>`. Scripted rules match on it.
    pub agent: String,
    /// 1-based index of this call within the agent's execution (scripted turn *n*).
    pub call_index: u32,
    /// The run, for deterministic scripted ids.
    pub run_id: String,
}

/// Usage normalised across providers: input includes cached input (docs/configuration.md#models).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Input tokens, cached ones included.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Total tokens as reported, else input + output.
    pub total_tokens: u64,
    /// Input tokens read from the provider's cache.
    pub cache_read: u64,
    /// Input tokens written to the provider's cache.
    pub cache_write: u64,
}

/// One item of a model's streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatEvent {
    /// A piece of the answer's text.
    TextDelta(String),
    /// A piece of a tool call; pieces with the same `index` form one call. The id and
    /// name may arrive in any piece (some providers send the name late).
    ToolCallDelta {
        /// Position of the call in the answer.
        index: usize,
        /// The call id, when this piece carries it.
        id: Option<String>,
        /// The tool name, when this piece carries it.
        name: Option<String>,
        /// A piece of the JSON arguments text.
        arguments: String,
    },
    /// Token usage of the call; a later report replaces an earlier one.
    Usage(Usage),
    /// The end of the answer.
    Finish {
        /// `stop`, `tool_calls`, `length`, `content_filter`, …
        reason: String,
        /// The model that answered, as the provider reports it.
        model: Option<String>,
    },
}

/// A provider failure, after the provider's own retries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The provider answered with an error status.
    #[error("{provider} returned HTTP {status}: {detail}")]
    Status {
        /// Provider name.
        provider: &'static str,
        /// HTTP status.
        status: u16,
        /// Body or reason.
        detail: String,
    },
    /// The connection or stream failed.
    #[error("{provider} request failed: {detail}")]
    Transport {
        /// Provider name.
        provider: &'static str,
        /// What failed.
        detail: String,
    },
    /// The provider sent something that is not its documented format.
    #[error("{provider} sent an unreadable response: {detail}")]
    Protocol {
        /// Provider name.
        provider: &'static str,
        /// What did not parse.
        detail: String,
    },
    /// A scripted turn's `error`.
    #[error("{0}")]
    Scripted(String),
    /// Configuration that cannot work (missing key, bad URL).
    #[error("model configuration: {0}")]
    Config(String),
}

/// A stream of answer pieces; dropping it aborts the call.
pub type ChatStream = BoxStream<'static, Result<ChatEvent, Error>>;

/// What the rest of subflow needs to know about a configured model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// The configured `name`.
    pub name: String,
    /// The provider's model id.
    pub model: String,
    /// `scripted`, `openai` or `anthropic`.
    pub provider: &'static str,
}

/// A chat model provider.
#[async_trait]
pub trait ChatModel: Send + Sync + std::fmt::Debug {
    /// Names and provider of this model.
    fn info(&self) -> &ModelInfo;

    /// Starts one call. Retries of transient failures happen inside; an `Err` (or an
    /// `Err` item) means the provider still failed after them.
    async fn stream(&self, request: ChatRequest) -> Result<ChatStream, Error>;
}
