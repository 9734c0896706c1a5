//! Integration tests of the HTTP providers against local servers that replay each
//! provider's wire format.

mod anthropic;
mod openai;
mod retries;
mod scripted;
mod server;

use std::time::Duration;

use subflow_contracts::messages::{AiMessage, Message};
use subflow_models::{
    AnthropicConfig, AnthropicModel, ChatModel, ChatRequest, Error, OpenAiConfig, OpenAiModel,
    ToolSpec, Usage, assemble,
};

use server::TestServer;

/// The key every test model sends; it must never show in `Debug` output.
pub const KEY: &str = "sk-test-0123456789abcdef";

/// Which provider a shared test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    OpenAi,
    Anthropic,
}

pub const PROVIDERS: [Provider; 2] = [Provider::OpenAi, Provider::Anthropic];

impl Provider {
    /// A model talking to `server` with `max_retries` and no timeout, so that tests on
    /// paused time see no timer but the backoff.
    pub fn model(self, server: &TestServer, max_retries: u32) -> Box<dyn ChatModel> {
        self.model_at(&server.base, max_retries)
    }

    pub fn model_at(self, base: &str, max_retries: u32) -> Box<dyn ChatModel> {
        match self {
            Provider::OpenAi => Box::new(
                OpenAiModel::new(OpenAiConfig {
                    base_url: format!("{base}/v1"),
                    api_key: Some(KEY.into()),
                    max_retries,
                    timeout: None,
                    ..OpenAiConfig::new("gpt", "gpt-4o-mini")
                })
                .unwrap(),
            ),
            Provider::Anthropic => Box::new(
                AnthropicModel::new(AnthropicConfig {
                    base_url: base.to_owned(),
                    api_key: Some(KEY.into()),
                    max_retries,
                    timeout: None,
                    ..AnthropicConfig::new("claude", "claude-sonnet-4-5")
                })
                .unwrap(),
            ),
        }
    }

    /// The path each provider posts to.
    pub fn path(self) -> &'static str {
        match self {
            Provider::OpenAi => "/v1/chat/completions",
            Provider::Anthropic => "/v1/messages",
        }
    }

    /// A complete, successful streamed answer saying `Hi!`.
    pub fn hi(self) -> Vec<String> {
        match self {
            Provider::OpenAi => vec![
                openai::chunk(r#"{"role":"assistant","content":""}"#, None),
                openai::chunk(r#"{"content":"Hi!"}"#, Some("stop")),
                openai::usage_chunk(
                    r#"{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}"#,
                ),
                "data: [DONE]\n\n".to_owned(),
            ],
            Provider::Anthropic => vec![
                anthropic::message_start(r#"{"input_tokens":5,"output_tokens":1}"#),
                anthropic::event(
                    "content_block_start",
                    r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
                ),
                anthropic::text_delta(0, "Hi!"),
                anthropic::event(
                    "content_block_stop",
                    r#"{"type":"content_block_stop","index":0}"#,
                ),
                anthropic::message_delta("end_turn", 2),
                anthropic::message_stop(),
            ],
        }
    }
}

/// A request with a system prompt and one user message.
pub fn request(messages: Vec<Message>, tools: Vec<ToolSpec>) -> ChatRequest {
    ChatRequest {
        messages: messages.into(),
        tools: tools.into(),
        agent: "lead_agent".into(),
        call_index: 1,
        run_id: "run-1".into(),
    }
}

pub fn hello() -> ChatRequest {
    request(
        vec![Message::system("You are terse."), Message::human("Say hi")],
        vec![],
    )
}

/// Streams `request` through `model` and assembles the AI message, collecting the text
/// deltas as they arrive.
pub async fn call(
    model: &dyn ChatModel,
    request: ChatRequest,
) -> Result<(AiMessage, Option<Usage>, Vec<String>), Error> {
    let stream = model.stream(request).await?;
    let mut deltas = Vec::new();
    let (message, usage) = assemble(stream, &model.info().model, |delta| {
        deltas.push(delta.to_owned())
    })
    .await?;
    Ok((message, usage, deltas))
}

/// A guard for tests on real time: no test here should wait anywhere near this long.
pub async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), future)
        .await
        .expect("the test took too long")
}
