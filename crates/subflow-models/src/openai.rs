//! The OpenAI-compatible provider: streaming Chat Completions (`POST {base_url}/chat/completions`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use subflow_contracts::messages::{AiMessage, Message};

use crate::content::{Part, parts};
use crate::http::{self, Backoff, Decoder, Endpoint};
use crate::sse::SseEvent;
use crate::{ChatEvent, ChatModel, ChatRequest, ChatStream, Error, ModelInfo, Secret, Usage};

const PROVIDER: &str = "openai";

/// The default `base_url` of [`OpenAiConfig`].
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// Settings of an OpenAI-compatible model; every value is passed in by the caller.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// The name subflow knows the model by.
    pub name: String,
    /// The provider's model id, sent as `model`.
    pub model: String,
    /// The API root; `/chat/completions` is appended.
    pub base_url: String,
    /// Sent as `Authorization: Bearer …`; `None` for local servers that need no key.
    pub api_key: Option<Secret>,
    /// Further attempts after the first for connection errors, HTTP 429 and 5xx.
    pub max_retries: u32,
    /// Waits between attempts.
    pub backoff: Backoff,
    /// Longest wait for a connection, the response headers or the next piece of the
    /// stream; `None` waits forever.
    pub timeout: Option<Duration>,
}

impl OpenAiConfig {
    /// A configuration with the defaults: the OpenAI API, no key, 2 retries, 5 minutes.
    pub fn new(name: impl Into<String>, model: impl Into<String>) -> Self {
        OpenAiConfig {
            name: name.into(),
            model: model.into(),
            base_url: OPENAI_BASE_URL.to_owned(),
            api_key: None,
            max_retries: http::DEFAULT_MAX_RETRIES,
            backoff: Backoff::default(),
            timeout: Some(http::DEFAULT_TIMEOUT),
        }
    }
}

/// A model behind an OpenAI-compatible Chat Completions endpoint.
#[derive(Debug)]
pub struct OpenAiModel {
    info: ModelInfo,
    endpoint: Arc<Endpoint>,
}

impl OpenAiModel {
    /// Checks the configuration and builds the HTTP client; no request is made.
    pub fn new(config: OpenAiConfig) -> Result<Self, Error> {
        let (base, url) = http::base_url(&config.base_url)?;
        if config.api_key.is_none() && url.host_str() == Some("api.openai.com") {
            return Err(Error::Config(format!(
                "model {:?}: api.openai.com needs an API key",
                config.name
            )));
        }
        let mut headers = vec![http::header("accept", "text/event-stream", false)?];
        if let Some(key) = &config.api_key {
            let value = format!("Bearer {}", key.expose());
            headers.push(http::header("authorization", &value, true)?);
        }
        let endpoint = Endpoint::new(
            PROVIDER,
            format!("{base}/chat/completions"),
            headers,
            config.timeout,
            config.max_retries,
            config.backoff,
        )?;
        Ok(OpenAiModel {
            info: ModelInfo {
                name: config.name,
                model: config.model,
                provider: PROVIDER,
            },
            endpoint: Arc::new(endpoint),
        })
    }
}

#[async_trait]
impl ChatModel for OpenAiModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    async fn stream(&self, request: ChatRequest) -> Result<ChatStream, Error> {
        let body = request_body(&self.info.model, &request);
        self.endpoint.stream::<ChunkDecoder>(body).await
    }
}

/// The `/chat/completions` request for `request`.
fn request_body(model: &str, request: &ChatRequest) -> Value {
    let mut body = json!({
        "model": model,
        "messages": request.messages.iter().map(message).collect::<Vec<_>>(),
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    // An empty `tools` list is rejected by some compatible servers.
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": object_schema(&tool.parameters),
                    }
                })
            })
            .collect();
    }
    body
}

/// A tool's parameters schema; a tool without one takes no arguments.
pub(crate) fn object_schema(parameters: &Value) -> Value {
    if parameters.is_object() {
        parameters.clone()
    } else {
        json!({"type": "object", "properties": {}})
    }
}

fn message(message: &Message) -> Value {
    match message {
        Message::System(_) => json!({"role": "system", "content": message.text()}),
        Message::Human(human) => {
            let mut converted = json!({"role": "user", "content": user_content(&human.content)});
            if let Some(name) = &human.name {
                converted["name"] = json!(name);
            }
            converted
        }
        Message::Ai(ai) => assistant(ai, message.text()),
        Message::Tool(tool) => json!({
            "role": "tool",
            "tool_call_id": tool.tool_call_id,
            "content": message.text(),
        }),
    }
}

/// Text stays a string, the shape every compatible server reads; images make a list.
fn user_content(content: &Value) -> Value {
    let parts = parts(content);
    if parts.iter().all(|part| matches!(part, Part::Text(_))) {
        let texts: Vec<_> = parts
            .into_iter()
            .filter_map(|part| match part {
                Part::Text(text) => Some(text),
                _ => None,
            })
            .collect();
        return Value::String(texts.join("\n"));
    }
    parts
        .into_iter()
        .map(|part| match part {
            Part::Text(text) => json!({"type": "text", "text": text}),
            Part::Image(image) => {
                json!({"type": "image_url", "image_url": {"url": image.to_url()}})
            }
            Part::Other(block) => block,
        })
        .collect()
}

fn assistant(ai: &AiMessage, text: String) -> Value {
    let mut calls: Vec<Value> = ai
        .tool_calls
        .iter()
        .map(|call| tool_call(&call.id, &call.name, call.args.to_string()))
        .collect();
    // Calls whose arguments did not parse were still made and may have been answered by
    // tool messages, which the API rejects unless their call is in the history.
    calls.extend(ai.invalid_tool_calls.iter().filter_map(|call| {
        let id = call.get("id")?.as_str()?;
        let name = call.get("name")?.as_str()?;
        let arguments = match call.get("args") {
            Some(Value::String(raw)) => raw.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        Some(tool_call(id, name, arguments))
    }));
    if calls.is_empty() {
        return json!({"role": "assistant", "content": text});
    }
    // With tool calls the API wants `null`, not "", for no text.
    let content = if text.is_empty() {
        Value::Null
    } else {
        Value::String(text)
    };
    json!({"role": "assistant", "content": content, "tool_calls": calls})
}

fn tool_call(id: &str, name: &str, arguments: String) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

/// One `data:` chunk. Every field is optional because compatible servers differ in what
/// they leave out or send as `null`.
#[derive(Deserialize)]
struct Chunk {
    model: Option<String>,
    choices: Option<Vec<Choice>>,
    usage: Option<WireUsage>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    index: Option<u32>,
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<Value>,
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Deserialize)]
struct WireToolCall {
    index: Option<usize>,
    id: Option<String>,
    function: Option<WireFunction>,
}

#[derive(Deserialize)]
struct WireFunction {
    name: Option<String>,
    arguments: Option<Value>,
}

#[derive(Deserialize)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    total_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptDetails>,
    /// Cache writes as Anthropic-backed OpenAI-compatible gateways report them.
    cache_creation_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
    /// Cache writes as OpenAI-compatible routers report them.
    cache_write_tokens: Option<u64>,
}

/// Decodes the chunk stream. Text and tool-call pieces go out as they come; the finish
/// waits for `[DONE]` because the usage chunk follows the one with `finish_reason`.
#[derive(Debug, Default)]
struct ChunkDecoder {
    model: Option<String>,
    finish_reason: Option<String>,
    saw_tool_call: bool,
    /// Call positions by id, for servers that leave out `index`.
    indexes: HashMap<String, usize>,
    last_index: Option<usize>,
}

impl Decoder for ChunkDecoder {
    fn event(&mut self, event: SseEvent, out: &mut VecDeque<ChatEvent>) -> Result<bool, Error> {
        let data = event.data.trim();
        if data == "[DONE]" {
            self.finish(out);
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|error| Error::Protocol {
            provider: PROVIDER,
            detail: format!("chunk {}: {error}", http::truncate(data)),
        })?;
        if let Some(error) = chunk.error.filter(|error| !error.is_null()) {
            return Err(stream_error(&error));
        }
        if let Some(model) = chunk.model.filter(|model| !model.is_empty()) {
            self.model.get_or_insert(model);
        }
        // Only the first choice is asked for; `n` is never set.
        for choice in chunk.choices.into_iter().flatten() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.delta {
                self.delta(delta, out);
            }
            if let Some(reason) = choice.finish_reason.filter(|reason| !reason.is_empty()) {
                self.finish_reason = Some(reason);
            }
        }
        // Some servers send `usage: {}` or zeros on every chunk; only real counts count.
        if let Some(usage) = chunk.usage
            && (usage.prompt_tokens.is_some() || usage.completion_tokens.is_some())
        {
            let input_tokens = usage.prompt_tokens.unwrap_or(0);
            let output_tokens = usage.completion_tokens.unwrap_or(0);
            out.push_back(ChatEvent::Usage(Usage {
                input_tokens,
                output_tokens,
                total_tokens: usage.total_tokens.unwrap_or(input_tokens + output_tokens),
                cache_read: usage
                    .prompt_tokens_details
                    .as_ref()
                    .and_then(|details| details.cached_tokens)
                    .unwrap_or(0),
                cache_write: usage
                    .prompt_tokens_details
                    .and_then(|details| details.cache_write_tokens)
                    .or(usage.cache_creation_input_tokens)
                    .unwrap_or(0),
            }));
        }
        Ok(false)
    }

    fn end(&mut self, out: &mut VecDeque<ChatEvent>) -> Result<(), Error> {
        // Servers that close without `[DONE]` still said they were done by a finish reason.
        if self.finish_reason.is_some() {
            self.finish(out);
            return Ok(());
        }
        Err(Error::Transport {
            provider: PROVIDER,
            detail: "the stream ended before the answer finished".to_owned(),
        })
    }
}

impl ChunkDecoder {
    fn delta(&mut self, delta: Delta, out: &mut VecDeque<ChatEvent>) {
        let text = match delta.content {
            Some(Value::String(text)) => text,
            Some(content @ Value::Array(_)) => {
                subflow_contracts::text::flatten_content(Some(&content))
            }
            _ => String::new(),
        };
        if !text.is_empty() {
            out.push_back(ChatEvent::TextDelta(text));
        }
        for call in delta.tool_calls.into_iter().flatten() {
            let index = self.call_index(call.index, call.id.as_deref());
            let (name, arguments) = match call.function {
                Some(function) => (function.name, function.arguments),
                None => (None, None),
            };
            let arguments = match arguments {
                Some(Value::String(text)) => text,
                Some(Value::Null) | None => String::new(),
                // A few servers send the arguments as an object instead of JSON text.
                Some(other) => other.to_string(),
            };
            self.saw_tool_call = true;
            out.push_back(ChatEvent::ToolCallDelta {
                index,
                id: call.id.filter(|id| !id.is_empty()),
                name: name.filter(|name| !name.is_empty()),
                arguments,
            });
        }
    }

    /// The call a piece belongs to: its `index`, else the call with its id, else a new
    /// call for a new id, else the call before.
    fn call_index(&mut self, index: Option<usize>, id: Option<&str>) -> usize {
        let index = match (index, id.filter(|id| !id.is_empty())) {
            (Some(index), _) => index,
            (None, Some(id)) => {
                let next = self.last_index.map_or(0, |last| last + 1);
                *self.indexes.entry(id.to_owned()).or_insert(next)
            }
            (None, None) => self.last_index.unwrap_or(0),
        };
        if let Some(id) = id.filter(|id| !id.is_empty()) {
            self.indexes.entry(id.to_owned()).or_insert(index);
        }
        self.last_index = Some(index);
        index
    }

    fn finish(&mut self, out: &mut VecDeque<ChatEvent>) {
        let reason = self.finish_reason.take().unwrap_or_else(|| {
            if self.saw_tool_call {
                "tool_calls".to_owned()
            } else {
                "stop".to_owned()
            }
        });
        out.push_back(ChatEvent::Finish {
            reason,
            model: self.model.take(),
        });
    }
}

/// An `error` object inside the stream: a status when it carries an HTTP code, else a
/// failed stream.
fn stream_error(error: &Value) -> Error {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .map_or_else(|| error.to_string(), str::to_owned);
    let code = error
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|code| u16::try_from(code).ok())
        .filter(|code| (400..600).contains(code));
    match code {
        Some(status) => Error::Status {
            provider: PROVIDER,
            status,
            detail: http::truncate(&message),
        },
        None => Error::Transport {
            provider: PROVIDER,
            detail: format!("the stream reported an error: {}", http::truncate(&message)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use subflow_contracts::messages::{HumanMessage, ToolCall, ToolMessage};

    fn decode(chunks: &[&str]) -> Result<Vec<ChatEvent>, Error> {
        let mut decoder = ChunkDecoder::default();
        let mut out = VecDeque::new();
        for data in chunks {
            let event = SseEvent {
                event: None,
                data: (*data).to_owned(),
            };
            if decoder.event(event, &mut out)? {
                return Ok(out.into());
            }
        }
        decoder.end(&mut out)?;
        Ok(out.into())
    }

    #[test]
    fn history_converts_to_chat_completions_messages() {
        let request = ChatRequest {
            messages: vec![
                Message::system("Be brief."),
                Message::Human(HumanMessage {
                    content: json!([{"type": "text", "text": "Look"}, {"type": "image_url", "image_url": {"url": "https://x/a.png"}}]),
                    name: Some("loop_warning".into()),
                    ..HumanMessage::default()
                }),
                Message::Ai(AiMessage {
                    content: json!(""),
                    tool_calls: vec![ToolCall::new("call_1", "ls", json!({"path": "."}))],
                    invalid_tool_calls: vec![
                        json!({"id": "call_2", "name": "cat", "args": "{bad", "type": "invalid_tool_call"}),
                    ],
                    ..AiMessage::default()
                }),
                Message::Tool(ToolMessage {
                    content: json!([{"type": "text", "text": "a.txt"}]),
                    tool_call_id: "call_1".into(),
                    ..ToolMessage::default()
                }),
                Message::Ai(AiMessage {
                    content: json!("Done."),
                    ..AiMessage::default()
                }),
            ]
            .into(),
            tools: Vec::new().into(),
            agent: "lead_agent".into(),
            call_index: 1,
            run_id: "run".into(),
        };
        let body = request_body("gpt-x", &request);
        assert_eq!(
            body["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "name": "loop_warning", "content": [
                    {"type": "text", "text": "Look"},
                    {"type": "image_url", "image_url": {"url": "https://x/a.png"}}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\":\".\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "cat", "arguments": "{bad"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
                {"role": "assistant", "content": "Done."}
            ])
        );
        assert!(body.get("tools").is_none());
    }

    #[test]
    fn calls_without_an_index_are_told_apart_by_id() {
        let events = decode(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"ls","arguments":{"path":"."}}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"cat","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{}"}}]},"finish_reason":"tool_calls"}]}"#,
        ])
        .unwrap();
        let indexes: Vec<_> = events
            .iter()
            .filter_map(|event| match event {
                ChatEvent::ToolCallDelta {
                    index, arguments, ..
                } => Some((*index, arguments.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(indexes, vec![(0, r#"{"path":"."}"#), (1, ""), (1, "{}")]);
        assert_eq!(
            events.last(),
            Some(&ChatEvent::Finish {
                reason: "tool_calls".into(),
                model: None
            })
        );
    }

    #[test]
    fn a_stream_without_done_or_finish_reason_is_cut_off() {
        let cut = decode(&[r#"{"choices":[{"delta":{"content":"Hi"}}]}"#]);
        assert!(matches!(cut, Err(Error::Transport { .. })), "{cut:?}");
        let finished =
            decode(&[r#"{"choices":[{"delta":{"content":"Hi"},"finish_reason":"length"}]}"#])
                .unwrap();
        assert_eq!(
            finished.last(),
            Some(&ChatEvent::Finish {
                reason: "length".into(),
                model: None
            })
        );
    }

    #[test]
    fn errors_inside_the_stream_keep_their_status() {
        let error = decode(&[r#"{"error":{"message":"rate limited","code":429}}"#]).unwrap_err();
        assert_eq!(
            error,
            Error::Status {
                provider: PROVIDER,
                status: 429,
                detail: "rate limited".into()
            }
        );
        let error = decode(&[r#"{"error":{"message":"boom","code":"server_error"}}"#]).unwrap_err();
        assert!(matches!(error, Error::Transport { .. }));
        assert!(matches!(
            decode(&["{not json"]),
            Err(Error::Protocol { .. })
        ));
    }
}
