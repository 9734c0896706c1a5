//! Folding a stream of answer pieces into one AI message.

use std::collections::BTreeMap;

use futures::StreamExt;
use serde_json::{Map, Value, json};
use subflow_contracts::messages::{AiMessage, InputTokenDetails, ToolCall, UsageMetadata};

use crate::{ChatEvent, ChatStream, Error, Usage};

#[derive(Default)]
struct PartialCall {
    id: Option<String>,
    name: Option<String>,
    arguments: String,
}

/// Reads `stream` to its end, calling `on_text` with each text delta, and returns the
/// AI message with its tool calls, usage and `response_metadata` (`model_name`,
/// `finish_reason`). Tool calls whose arguments are not a JSON object go to
/// `invalid_tool_calls`. `model_name` falls back to `default_model`.
pub async fn assemble(
    mut stream: ChatStream,
    default_model: &str,
    mut on_text: impl FnMut(&str),
) -> Result<(AiMessage, Option<Usage>), Error> {
    let mut text = String::new();
    let mut calls: BTreeMap<usize, PartialCall> = BTreeMap::new();
    let mut usage = None;
    let mut finish_reason = None;
    let mut model = None;
    while let Some(event) = stream.next().await {
        match event? {
            ChatEvent::TextDelta(delta) => {
                on_text(&delta);
                text.push_str(&delta);
            }
            ChatEvent::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            } => {
                let call = calls.entry(index).or_default();
                if id.is_some() {
                    call.id = id;
                }
                if let Some(name) = name.filter(|n| !n.is_empty()) {
                    call.name = Some(name);
                }
                call.arguments.push_str(&arguments);
            }
            ChatEvent::Usage(reported) => usage = Some(reported),
            ChatEvent::Finish {
                reason,
                model: reported,
            } => {
                finish_reason = Some(reason);
                model = reported.or(model);
            }
        }
    }
    let mut message = AiMessage {
        content: Value::String(text),
        ..AiMessage::default()
    };
    for (index, call) in calls {
        let id = call.id.unwrap_or_else(|| format!("call_{index}"));
        let name = call.name.unwrap_or_default();
        let arguments = if call.arguments.trim().is_empty() {
            "{}"
        } else {
            call.arguments.as_str()
        };
        match serde_json::from_str::<Value>(arguments) {
            Ok(args @ Value::Object(_)) if !name.is_empty() => message.tool_calls.push(ToolCall::new(id, name, args)),
            _ => message.invalid_tool_calls.push(json!({
                "id": id, "name": name, "args": call.arguments, "error": "arguments are not a JSON object", "type": "invalid_tool_call"
            })),
        }
    }
    let finish_reason = finish_reason.unwrap_or_else(|| {
        if message.tool_calls.is_empty() {
            "stop".to_owned()
        } else {
            "tool_calls".to_owned()
        }
    });
    let mut metadata = Map::new();
    metadata.insert(
        "model_name".into(),
        json!(model.unwrap_or_else(|| default_model.to_owned())),
    );
    metadata.insert("finish_reason".into(), json!(finish_reason));
    message.response_metadata = metadata;
    message.usage_metadata = usage.map(|u| UsageMetadata {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        total_tokens: if u.total_tokens > 0 {
            u.total_tokens
        } else {
            u.input_tokens + u.output_tokens
        },
        input_token_details: InputTokenDetails {
            cache_read: u.cache_read,
            cache_creation: u.cache_write,
        },
    });
    Ok((message, usage))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;

    fn stream_of(events: Vec<ChatEvent>) -> ChatStream {
        stream::iter(events.into_iter().map(Ok)).boxed()
    }

    #[tokio::test]
    async fn text_tool_calls_and_usage_become_one_message() {
        let events = vec![
            ChatEvent::TextDelta("Hel".into()),
            ChatEvent::TextDelta("lo".into()),
            ChatEvent::ToolCallDelta {
                index: 0,
                id: Some("call_a".into()),
                name: None,
                arguments: "{\"pa".into(),
            },
            ChatEvent::ToolCallDelta {
                index: 0,
                id: None,
                name: Some("ls".into()),
                arguments: "th\":\".\"}".into(),
            },
            ChatEvent::ToolCallDelta {
                index: 1,
                id: Some("call_b".into()),
                name: Some("bad".into()),
                arguments: "[1]".into(),
            },
            ChatEvent::Usage(Usage {
                input_tokens: 10,
                output_tokens: 5,
                total_tokens: 0,
                cache_read: 4,
                cache_write: 2,
            }),
            ChatEvent::Finish {
                reason: "tool_calls".into(),
                model: Some("gpt-x".into()),
            },
        ];
        let mut seen = String::new();
        let (message, usage) = assemble(stream_of(events), "fallback", |d| seen.push_str(d))
            .await
            .unwrap();
        assert_eq!(seen, "Hello");
        assert_eq!(message.content, json!("Hello"));
        assert_eq!(
            message.tool_calls,
            vec![ToolCall::new("call_a", "ls", json!({"path": "."}))]
        );
        assert_eq!(message.invalid_tool_calls.len(), 1);
        assert_eq!(message.response_metadata["model_name"], "gpt-x");
        assert_eq!(message.response_metadata["finish_reason"], "tool_calls");
        let reported = message.usage_metadata.unwrap();
        assert_eq!(
            (
                reported.total_tokens,
                reported.input_token_details.cache_read,
                reported.input_token_details.cache_creation
            ),
            (15, 4, 2)
        );
        assert_eq!(usage.unwrap().input_tokens, 10);
    }

    #[tokio::test]
    async fn an_error_item_ends_the_call() {
        let failing: ChatStream = stream::iter(vec![
            Ok(ChatEvent::TextDelta("a".into())),
            Err(Error::Scripted("boom".into())),
        ])
        .boxed();
        assert_eq!(
            assemble(failing, "m", |_| {}).await.unwrap_err(),
            Error::Scripted("boom".into())
        );
    }
}
