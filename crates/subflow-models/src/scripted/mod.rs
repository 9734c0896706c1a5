//! The scripted model (docs/configuration.md#models): deterministic answers with no network, from a script
//! file or, without one (or when no rule matches), from the built-in commands and the
//! demo plan. It is the default model, so `subflow serve` shows every feature offline.

mod demo;
mod script;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::Value;
use sha2::{Digest, Sha256};
use subflow_contracts::messages::Message;

use crate::{ChatEvent, ChatModel, ChatRequest, ChatStream, Error, ModelInfo, Usage};
use script::{Script, Turn};

pub use script::ScriptError;

/// Text is streamed in pieces of at most this many characters.
const CHUNK_CHARS: usize = 16;

/// Configuration of one scripted model entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedConfig {
    /// The configured `name`.
    pub name: String,
    /// The model id it reports (`scripted-1` by default).
    pub model: String,
    /// A TOML or JSON script; `None` uses the built-in behaviour only.
    pub script: Option<PathBuf>,
    /// Pause before the first and between streamed pieces of built-in answers, in
    /// milliseconds: a subagent's tool steps come one pause apart, as a model's would.
    pub demo_delay_ms: u64,
}

impl Default for ScriptedConfig {
    fn default() -> Self {
        ScriptedConfig {
            name: "scripted".to_owned(),
            model: "scripted-1".to_owned(),
            script: None,
            demo_delay_ms: 40,
        }
    }
}

/// The deterministic, offline chat model.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    info: ModelInfo,
    script: Option<Script>,
    demo_delay: Duration,
}

impl ScriptedModel {
    /// Builds the model, loading and validating its script file if it has one.
    pub fn new(config: ScriptedConfig) -> Result<Self, ScriptError> {
        let script = config.script.as_deref().map(Script::load).transpose()?;
        Ok(ScriptedModel {
            info: ModelInfo {
                name: config.name,
                model: config.model,
                provider: "scripted",
            },
            script,
            demo_delay: Duration::from_millis(config.demo_delay_ms),
        })
    }
}

#[async_trait]
impl ChatModel for ScriptedModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    async fn stream(&self, request: ChatRequest) -> Result<ChatStream, Error> {
        let first_human = request
            .messages
            .iter()
            .find(|m| matches!(m, Message::Human(_)))
            .map(Message::text)
            .unwrap_or_default();
        let turn = self
            .script
            .as_ref()
            .and_then(|script| script.turn(&request.agent, &first_human, request.call_index));
        let answer = match turn {
            Some(turn) => {
                if let Some(message) = &turn.error {
                    sleep(Duration::from_millis(turn.delay_ms)).await;
                    return Err(Error::Scripted(message.clone()));
                }
                Answer::scripted(turn, &request)
            }
            None => Answer::built_in(demo::respond(&request), &request, self.demo_delay),
        };
        Ok(answer.into_stream(&request, &first_human, &self.info.model))
    }
}

/// One answer, ready to stream.
struct Answer {
    text: String,
    /// Name, arguments and the script's id, if it gave one.
    calls: Vec<(String, Value, Option<String>)>,
    usage: Usage,
    finish_reason: Option<String>,
    delay_before: Duration,
    delay_between: Duration,
}

impl Answer {
    fn scripted(turn: &Turn, request: &ChatRequest) -> Answer {
        let text = turn.text.clone().unwrap_or_default();
        let calls: Vec<_> = turn
            .tool_calls
            .iter()
            .map(|call| {
                (
                    call.name.clone(),
                    Value::Object(call.args.clone()),
                    call.id.clone(),
                )
            })
            .collect();
        let mut usage = default_usage(request, &text, &calls);
        if let Some(given) = turn.usage {
            usage.input_tokens = given.input.unwrap_or(usage.input_tokens);
            usage.output_tokens = given.output.unwrap_or(usage.output_tokens);
            usage.cache_read = given.cache_read.unwrap_or(usage.cache_read);
            usage.cache_write = given.cache_write.unwrap_or(usage.cache_write);
            usage.total_tokens = usage.input_tokens + usage.output_tokens;
        }
        Answer {
            text,
            calls,
            usage,
            finish_reason: turn.finish_reason.clone(),
            delay_before: Duration::from_millis(turn.delay_ms),
            delay_between: Duration::ZERO,
        }
    }

    fn built_in(reply: demo::Reply, request: &ChatRequest, delay: Duration) -> Answer {
        let calls: Vec<_> = reply
            .calls
            .into_iter()
            .map(|(name, args)| (name, args, None))
            .collect();
        let mut usage = default_usage(request, &reply.text, &calls);
        // A provider caches what it was sent before: everything up to the previous
        // answer was the prompt of the previous call.
        if let Some(last_answer) = request
            .messages
            .iter()
            .rposition(|m| matches!(m, Message::Ai(_)))
        {
            usage.cache_read = tokens(request.messages[..last_answer].iter().map(message_chars));
        }
        Answer {
            text: reply.text,
            calls,
            usage,
            finish_reason: None,
            delay_before: delay,
            delay_between: delay,
        }
    }

    fn into_stream(self, request: &ChatRequest, first_human: &str, model: &str) -> ChatStream {
        let mut pieces: Vec<ChatEvent> = chunks(&self.text, CHUNK_CHARS)
            .map(|chunk| ChatEvent::TextDelta(chunk.to_owned()))
            .collect();
        let has_calls = !self.calls.is_empty();
        for (index, (name, args, id)) in self.calls.into_iter().enumerate() {
            let id = id.unwrap_or_else(|| call_id(request, first_human, index));
            pieces.push(ChatEvent::ToolCallDelta {
                index,
                id: Some(id),
                name: Some(name),
                arguments: args.to_string(),
            });
        }
        let reason = self
            .finish_reason
            .unwrap_or_else(|| if has_calls { "tool_calls" } else { "stop" }.to_owned());
        let mut timed = Vec::with_capacity(pieces.len() + 2);
        for (position, piece) in pieces.into_iter().enumerate() {
            let delay = if position == 0 {
                self.delay_before
            } else {
                self.delay_between
            };
            timed.push((delay, piece));
        }
        let delay = if timed.is_empty() {
            self.delay_before
        } else {
            Duration::ZERO
        };
        timed.push((delay, ChatEvent::Usage(self.usage)));
        timed.push((
            Duration::ZERO,
            ChatEvent::Finish {
                reason,
                model: Some(model.to_owned()),
            },
        ));
        futures::stream::iter(timed)
            .then(|(delay, event)| async move {
                sleep(delay).await;
                Ok(event)
            })
            .boxed()
    }
}

async fn sleep(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

/// Pieces of `text` of at most `size` characters (not bytes).
fn chunks(text: &str, size: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest.char_indices().nth(size).map_or(rest.len(), |(i, _)| i);
        let (chunk, tail) = rest.split_at(end);
        rest = tail;
        Some(chunk)
    })
}

/// ⌈characters / 4⌉ of the request (input) and of the answer (output), no cache.
fn default_usage(
    request: &ChatRequest,
    text: &str,
    calls: &[(String, Value, Option<String>)],
) -> Usage {
    let input_tokens = tokens(request.messages.iter().map(message_chars));
    let output_tokens = tokens(
        std::iter::once(text.chars().count())
            .chain(calls.iter().map(|(_, args, _)| json_chars(args))),
    );
    Usage {
        input_tokens,
        output_tokens,
        total_tokens: input_tokens + output_tokens,
        cache_read: 0,
        cache_write: 0,
    }
}

/// Characters of a message as a model would read them: its text and its calls' args.
/// Every request counts its whole history, so nothing is copied to count it.
fn message_chars(message: &Message) -> usize {
    let calls = match message {
        Message::Ai(ai) => ai
            .tool_calls
            .iter()
            .map(|call| json_chars(&call.args))
            .sum(),
        _ => 0,
    };
    let text = match message.content() {
        Value::String(text) => text.chars().count(),
        _ => message.text().chars().count(),
    };
    text + calls
}

/// Characters of `value` as compact JSON text, counted as it is written.
fn json_chars(value: &Value) -> usize {
    /// Counts the characters of the UTF-8 written to it.
    struct Chars(usize);
    impl std::io::Write for Chars {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            // A continuation byte does not start a character.
            self.0 += bytes.iter().filter(|&&byte| byte & 0xC0 != 0x80).count();
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut chars = Chars(0);
    match serde_json::to_writer(&mut chars, value) {
        Ok(()) => chars.0,
        // A JSON value always serialises, and the counter never refuses bytes.
        Err(_) => 0,
    }
}

fn tokens(characters: impl Iterator<Item = usize>) -> u64 {
    u64::try_from(characters.sum::<usize>().div_ceil(4)).unwrap_or(u64::MAX)
}

/// `call_` + 24 hex characters of SHA-256 over (run, agent, call index, position).
/// The first human message is hashed too: parallel subagents of one type share run,
/// agent and call index, and their ids must still differ.
fn call_id(request: &ChatRequest, first_human: &str, index: usize) -> String {
    let mut hasher = Sha256::new();
    for field in [
        request.run_id.as_bytes(),
        request.agent.as_bytes(),
        &request.call_index.to_le_bytes(),
        &(index as u64).to_le_bytes(),
        first_human.as_bytes(),
    ] {
        // Length prefixes keep the encoding unambiguous across field boundaries.
        hasher.update((field.len() as u64).to_le_bytes());
        hasher.update(field);
    }
    let digest = hasher.finalize();
    let mut id = String::with_capacity(29);
    id.push_str("call_");
    for byte in digest.iter().take(12) {
        id.push_str(&format!("{byte:02x}"));
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_count_characters_and_keep_everything() {
        let text = "ééééééééééééééééé-abc";
        let pieces: Vec<&str> = chunks(text, 16).collect();
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces[0].chars().count(), 16);
        assert_eq!(pieces.concat(), text);
        assert_eq!(chunks("", 16).count(), 0);
    }

    #[test]
    fn characters_are_counted_as_the_text_a_model_reads() {
        let args =
            serde_json::json!({"path": "notes/été.md", "lines": [1, 2], "note": "a \"quoted\" ✓"});
        assert_eq!(json_chars(&args), args.to_string().chars().count());
        let ai = Message::Ai(subflow_contracts::messages::AiMessage {
            content: Value::String("Voilà: two files.".into()),
            tool_calls: vec![subflow_contracts::messages::ToolCall::new(
                "call_1",
                "read_file",
                args.clone(),
            )],
            ..Default::default()
        });
        assert_eq!(
            message_chars(&ai),
            "Voilà: two files.".chars().count() + args.to_string().chars().count()
        );
        let blocks = Message::Human(subflow_contracts::messages::HumanMessage {
            content: serde_json::json!([{"type": "text", "text": "première"}, {"type": "text", "text": "second"}]),
            ..Default::default()
        });
        // Text blocks are read joined by newlines: "première\nsecond".
        assert_eq!(message_chars(&blocks), 15);
    }
}
