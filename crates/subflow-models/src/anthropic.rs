//! The Anthropic provider: the streaming Messages API (`POST {base_url}/v1/messages`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use subflow_contracts::messages::{AiMessage, Message, ToolMessage, ToolStatus};

use crate::content::{Image, Part, parts};
use crate::http::{self, Backoff, Decoder, Endpoint};
use crate::openai::object_schema;
use crate::sse::SseEvent;
use crate::{ChatEvent, ChatModel, ChatRequest, ChatStream, Error, ModelInfo, Secret, Usage};

const PROVIDER: &str = "anthropic";

/// The default `base_url` of [`AnthropicConfig`].
pub const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";

/// The API version every request names.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The default `max_tokens`, which the Messages API requires on every request.
pub const DEFAULT_MAX_TOKENS: u32 = 8192;

/// Settings of an Anthropic model; every value is passed in by the caller.
#[derive(Debug, Clone)]
pub struct AnthropicConfig {
    /// The name subflow knows the model by.
    pub name: String,
    /// The provider's model id, sent as `model`.
    pub model: String,
    /// The API root; `/v1/messages` is appended (only `/messages` when it ends in `/v1`).
    pub base_url: String,
    /// Sent as `x-api-key`; `None` only for proxies that add it themselves.
    pub api_key: Option<Secret>,
    /// The answer's length limit, sent as `max_tokens`.
    pub max_tokens: u32,
    /// Further attempts after the first for connection errors, HTTP 429 and 5xx.
    pub max_retries: u32,
    /// Waits between attempts.
    pub backoff: Backoff,
    /// Longest wait for a connection, the response headers or the next piece of the
    /// stream; `None` waits forever.
    pub timeout: Option<Duration>,
}

impl AnthropicConfig {
    /// A configuration with the defaults: the Anthropic API, no key, 8192 output tokens,
    /// 2 retries, 5 minutes.
    pub fn new(name: impl Into<String>, model: impl Into<String>) -> Self {
        AnthropicConfig {
            name: name.into(),
            model: model.into(),
            base_url: ANTHROPIC_BASE_URL.to_owned(),
            api_key: None,
            max_tokens: DEFAULT_MAX_TOKENS,
            max_retries: http::DEFAULT_MAX_RETRIES,
            backoff: Backoff::default(),
            timeout: Some(http::DEFAULT_TIMEOUT),
        }
    }
}

/// A model behind the Anthropic Messages API.
#[derive(Debug)]
pub struct AnthropicModel {
    info: ModelInfo,
    max_tokens: u32,
    endpoint: Arc<Endpoint>,
}

impl AnthropicModel {
    /// Checks the configuration and builds the HTTP client; no request is made.
    pub fn new(config: AnthropicConfig) -> Result<Self, Error> {
        let (base, url) = http::base_url(&config.base_url)?;
        if config.api_key.is_none() && url.host_str() == Some("api.anthropic.com") {
            return Err(Error::Config(format!(
                "model {:?}: api.anthropic.com needs an API key",
                config.name
            )));
        }
        if config.max_tokens == 0 {
            return Err(Error::Config(format!(
                "model {:?}: max_tokens must be at least 1",
                config.name
            )));
        }
        let mut headers = vec![
            http::header("anthropic-version", ANTHROPIC_VERSION, false)?,
            http::header("accept", "text/event-stream", false)?,
        ];
        if let Some(key) = &config.api_key {
            headers.push(http::header("x-api-key", key.expose(), true)?);
        }
        let url = if base.ends_with("/v1") {
            format!("{base}/messages")
        } else {
            format!("{base}/v1/messages")
        };
        let endpoint = Endpoint::new(
            PROVIDER,
            url,
            headers,
            config.timeout,
            config.max_retries,
            config.backoff,
        )?;
        Ok(AnthropicModel {
            info: ModelInfo {
                name: config.name,
                model: config.model,
                provider: PROVIDER,
            },
            max_tokens: config.max_tokens,
            endpoint: Arc::new(endpoint),
        })
    }
}

#[async_trait]
impl ChatModel for AnthropicModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    async fn stream(&self, request: ChatRequest) -> Result<ChatStream, Error> {
        let body = request_body(&self.info.model, self.max_tokens, &request);
        self.endpoint.stream::<EventDecoder>(body).await
    }
}

/// The `/v1/messages` request for `request`.
fn request_body(model: &str, max_tokens: u32, request: &ChatRequest) -> Value {
    let mut system = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in request.messages.iter() {
        let (role, blocks) = match message {
            // The API has no system role: all instructions go to the top-level `system`.
            Message::System(_) => {
                let text = message.text();
                if !text.is_empty() {
                    system.push(text);
                }
                continue;
            }
            Message::Human(human) => ("user", content_blocks(&human.content)),
            Message::Ai(ai) => ("assistant", assistant_blocks(ai, message.text())),
            Message::Tool(tool) => ("user", vec![tool_result(tool)]),
        };
        if blocks.is_empty() {
            continue;
        }
        // Parallel tool results must share one user turn, right after the tool calls.
        match turns.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, mut blocks)| {
            // The API wants a user turn's tool results before anything else in it.
            blocks.sort_by_key(|block| block["type"] != "tool_result");
            json!({"role": role, "content": blocks})
        })
        .collect();
    let mut body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "stream": true,
        "messages": messages,
    });
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": object_schema(&tool.parameters),
                })
            })
            .collect();
    }
    body
}

fn content_blocks(content: &Value) -> Vec<Value> {
    parts(content)
        .into_iter()
        .map(|part| match part {
            Part::Text(text) => json!({"type": "text", "text": text}),
            Part::Image(Image::Url(url)) => {
                json!({"type": "image", "source": {"type": "url", "url": url}})
            }
            Part::Image(Image::Base64 { media_type, data }) => json!({
                "type": "image",
                "source": {"type": "base64", "media_type": media_type, "data": data},
            }),
            Part::Other(block) => block,
        })
        .collect()
}

fn assistant_blocks(ai: &AiMessage, text: String) -> Vec<Value> {
    let mut blocks = Vec::new();
    // Empty text blocks are rejected by the API.
    if !text.is_empty() {
        blocks.push(json!({"type": "text", "text": text}));
    }
    for call in &ai.tool_calls {
        let input = if call.args.is_object() {
            call.args.clone()
        } else {
            json!({})
        };
        blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
    }
    // Calls whose arguments did not parse may have been answered by tool results, which
    // the API rejects unless their `tool_use` is in the history.
    for call in &ai.invalid_tool_calls {
        if let (Some(id), Some(name)) = (
            call.get("id").and_then(Value::as_str),
            call.get("name").and_then(Value::as_str),
        ) {
            blocks.push(json!({"type": "tool_use", "id": id, "name": name, "input": {}}));
        }
    }
    blocks
}

fn tool_result(tool: &ToolMessage) -> Value {
    let mut block = json!({"type": "tool_result", "tool_use_id": tool.tool_call_id});
    let content = content_blocks(&tool.content);
    if content.iter().all(|block| block["type"] == "text") {
        let text: Vec<_> = content
            .iter()
            .filter_map(|block| block["text"].as_str())
            .collect();
        // `content` is optional, and an empty one is better left out than sent empty.
        if !text.is_empty() {
            block["content"] = json!(text.join("\n"));
        }
    } else {
        block["content"] = Value::Array(content);
    }
    if tool.status == ToolStatus::Error {
        block["is_error"] = json!(true);
    }
    block
}

/// A tool-use content block being streamed.
#[derive(Debug)]
struct ToolBlock {
    /// Position of the call among the answer's tool calls.
    call: usize,
    /// A non-empty `input` given at the block's start, sent if no deltas follow.
    initial_input: Option<String>,
    got_delta: bool,
}

/// Decodes the Messages event stream. Usage is reported once, at the end, because
/// `message_start` carries the input counts and `message_delta` the output count.
#[derive(Debug, Default)]
struct EventDecoder {
    model: Option<String>,
    input_tokens: u64,
    cache_read: u64,
    cache_creation: u64,
    output_tokens: u64,
    saw_usage: bool,
    stop_reason: Option<String>,
    /// Tool-use blocks by content-block index.
    tool_blocks: HashMap<u64, ToolBlock>,
}

impl Decoder for EventDecoder {
    fn event(&mut self, event: SseEvent, out: &mut VecDeque<ChatEvent>) -> Result<bool, Error> {
        if event.data.trim().is_empty() {
            return Ok(false);
        }
        let data: Value = serde_json::from_str(&event.data).map_err(|error| Error::Protocol {
            provider: PROVIDER,
            detail: format!("event {}: {error}", http::truncate(&event.data)),
        })?;
        // The `type` inside the data is authoritative; the `event:` line repeats it.
        let kind = data["type"]
            .as_str()
            .or(event.event.as_deref())
            .unwrap_or_default();
        match kind {
            "message_start" => {
                let message = &data["message"];
                if let Some(model) = message["model"].as_str().filter(|m| !m.is_empty()) {
                    self.model = Some(model.to_owned());
                }
                self.usage(&message["usage"]);
            }
            "content_block_start" => self.block_start(&data, out),
            "content_block_delta" => self.block_delta(&data, out),
            "content_block_stop" => {
                let index = data["index"].as_u64().unwrap_or(0);
                if let Some(block) = self.tool_blocks.get_mut(&index)
                    && !block.got_delta
                    && let Some(input) = block.initial_input.take()
                {
                    out.push_back(ChatEvent::ToolCallDelta {
                        index: block.call,
                        id: None,
                        name: None,
                        arguments: input,
                    });
                }
            }
            "message_delta" => {
                if let Some(reason) = data["delta"]["stop_reason"].as_str() {
                    self.stop_reason = Some(reason.to_owned());
                }
                self.usage(&data["usage"]);
            }
            "message_stop" => {
                self.finish(out);
                return Ok(true);
            }
            "error" => return Err(stream_error(&data["error"])),
            // `ping` and event types added after this was written carry nothing we use.
            _ => {}
        }
        Ok(false)
    }

    fn end(&mut self, out: &mut VecDeque<ChatEvent>) -> Result<(), Error> {
        // A stop reason means the answer was complete even if `message_stop` was lost.
        if self.stop_reason.is_some() {
            self.finish(out);
            return Ok(());
        }
        Err(Error::Transport {
            provider: PROVIDER,
            detail: "the stream ended before the answer finished".to_owned(),
        })
    }
}

impl EventDecoder {
    /// Takes the counts present in a `usage` object; `message_delta` counts are
    /// cumulative, so a later value replaces an earlier one.
    fn usage(&mut self, usage: &Value) {
        let fields: [(&str, &mut u64); 4] = [
            ("input_tokens", &mut self.input_tokens),
            ("cache_read_input_tokens", &mut self.cache_read),
            ("cache_creation_input_tokens", &mut self.cache_creation),
            ("output_tokens", &mut self.output_tokens),
        ];
        for (key, slot) in fields {
            if let Some(count) = usage[key].as_u64() {
                *slot = count;
                self.saw_usage = true;
            }
        }
    }

    fn block_start(&mut self, data: &Value, out: &mut VecDeque<ChatEvent>) {
        let block = &data["content_block"];
        match block["type"].as_str() {
            Some("text") => {
                if let Some(text) = block["text"].as_str().filter(|t| !t.is_empty()) {
                    out.push_back(ChatEvent::TextDelta(text.to_owned()));
                }
            }
            Some("tool_use") => {
                let call = self.tool_blocks.len();
                let initial_input = block["input"]
                    .as_object()
                    .filter(|input| !input.is_empty())
                    .map(|input| Value::Object(input.clone()).to_string());
                self.tool_blocks.insert(
                    data["index"].as_u64().unwrap_or(0),
                    ToolBlock {
                        call,
                        initial_input,
                        got_delta: false,
                    },
                );
                out.push_back(ChatEvent::ToolCallDelta {
                    index: call,
                    id: block["id"].as_str().map(str::to_owned),
                    name: block["name"].as_str().map(str::to_owned),
                    arguments: String::new(),
                });
            }
            // Thinking and server-tool blocks are not part of the AI message.
            _ => {}
        }
    }

    fn block_delta(&mut self, data: &Value, out: &mut VecDeque<ChatEvent>) {
        let delta = &data["delta"];
        match delta["type"].as_str() {
            Some("text_delta") => {
                if let Some(text) = delta["text"].as_str().filter(|t| !t.is_empty()) {
                    out.push_back(ChatEvent::TextDelta(text.to_owned()));
                }
            }
            Some("input_json_delta") => {
                let index = data["index"].as_u64().unwrap_or(0);
                let piece = delta["partial_json"].as_str().unwrap_or_default();
                if let Some(block) = self.tool_blocks.get_mut(&index)
                    && !piece.is_empty()
                {
                    block.got_delta = true;
                    out.push_back(ChatEvent::ToolCallDelta {
                        index: block.call,
                        id: None,
                        name: None,
                        arguments: piece.to_owned(),
                    });
                }
            }
            _ => {}
        }
    }

    fn finish(&mut self, out: &mut VecDeque<ChatEvent>) {
        if self.saw_usage {
            // docs/configuration.md#models: input counts cached input, whether read from or written to the cache.
            let input_tokens = self.input_tokens + self.cache_read + self.cache_creation;
            out.push_back(ChatEvent::Usage(Usage {
                input_tokens,
                output_tokens: self.output_tokens,
                total_tokens: input_tokens + self.output_tokens,
                cache_read: self.cache_read,
                cache_write: self.cache_creation,
            }));
        }
        let reason = match self.stop_reason.take().as_deref() {
            Some("end_turn") => "stop".to_owned(),
            Some("tool_use") => "tool_calls".to_owned(),
            Some("max_tokens") => "length".to_owned(),
            Some(other) => other.to_owned(),
            None if self.tool_blocks.is_empty() => "stop".to_owned(),
            None => "tool_calls".to_owned(),
        };
        out.push_back(ChatEvent::Finish {
            reason,
            model: self.model.take(),
        });
    }
}

/// An `error` event, given the HTTP status its type has when it ends a request instead.
fn stream_error(error: &Value) -> Error {
    let kind = error["type"].as_str().unwrap_or("error");
    let status = match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "overloaded_error" => 529,
        _ => 500,
    };
    let message = error["message"].as_str().unwrap_or_default();
    Error::Status {
        provider: PROVIDER,
        status,
        detail: http::truncate(&format!("{kind}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ToolSpec;
    use subflow_contracts::messages::ToolCall;

    #[test]
    fn history_converts_to_messages_with_a_top_level_system() {
        let request = ChatRequest {
            messages: vec![
                Message::system("Be brief."),
                Message::human("List files"),
                Message::Ai(AiMessage {
                    content: json!("Looking."),
                    tool_calls: vec![
                        ToolCall::new("toolu_1", "ls", json!({"path": "."})),
                        ToolCall::new("toolu_2", "ls", json!({"path": "/"})),
                    ],
                    ..AiMessage::default()
                }),
                Message::Tool(ToolMessage {
                    content: json!("a.txt"),
                    tool_call_id: "toolu_1".into(),
                    ..ToolMessage::default()
                }),
                Message::Tool(ToolMessage {
                    content: json!(""),
                    tool_call_id: "toolu_2".into(),
                    status: ToolStatus::Error,
                    ..ToolMessage::default()
                }),
                Message::human("Go on"),
                Message::system("Also: be kind."),
            ]
            .into(),
            tools: vec![ToolSpec {
                name: "ls".into(),
                description: "List a folder".into(),
                parameters: Value::Null,
            }]
            .into(),
            agent: "lead_agent".into(),
            call_index: 2,
            run_id: "run".into(),
        };
        let body = request_body("claude-x", 1024, &request);
        assert_eq!(body["system"], "Be brief.\n\nAlso: be kind.");
        assert_eq!(body["max_tokens"], 1024);
        assert_eq!(
            body["tools"],
            json!([{"name": "ls", "description": "List a folder", "input_schema": {"type": "object", "properties": {}}}])
        );
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "List files"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "."}},
                    {"type": "tool_use", "id": "toolu_2", "name": "ls", "input": {"path": "/"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true},
                    {"type": "text", "text": "Go on"}
                ]}
            ])
        );
    }

    #[test]
    fn stop_reasons_map_to_finish_reasons() {
        for (stop, finish) in [
            ("end_turn", "stop"),
            ("tool_use", "tool_calls"),
            ("max_tokens", "length"),
            ("stop_sequence", "stop_sequence"),
            ("refusal", "refusal"),
        ] {
            let mut decoder = EventDecoder {
                stop_reason: Some(stop.into()),
                ..EventDecoder::default()
            };
            let mut out = VecDeque::new();
            decoder.finish(&mut out);
            assert_eq!(
                out.pop_back(),
                Some(ChatEvent::Finish {
                    reason: finish.into(),
                    model: None
                })
            );
        }
    }

    #[test]
    fn error_events_carry_the_status_of_their_type() {
        let error = stream_error(&json!({"type": "overloaded_error", "message": "Overloaded"}));
        assert_eq!(
            error,
            Error::Status {
                provider: PROVIDER,
                status: 529,
                detail: "overloaded_error: Overloaded".into()
            }
        );
    }
}
