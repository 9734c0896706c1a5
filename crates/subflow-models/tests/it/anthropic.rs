//! The Anthropic provider against a server replaying Messages API event streams.

use serde_json::json;
use subflow_contracts::messages::{AiMessage, Message, ToolCall, ToolMessage};
use subflow_models::{AnthropicConfig, AnthropicModel, Error, ToolSpec};

use crate::server::{Reply, TestServer};
use crate::{KEY, Provider, call, hello, request, within};

/// One event as the API frames it: the `event:` line repeats the data's `type`.
pub fn event(name: &str, data: &str) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

pub fn message_start(usage: &str) -> String {
    event(
        "message_start",
        &format!(
            r#"{{"type":"message_start","message":{{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[],"stop_reason":null,"stop_sequence":null,"usage":{usage}}}}}"#
        ),
    )
}

pub fn text_delta(index: u32, text: &str) -> String {
    event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}})
            .to_string(),
    )
}

fn json_delta(index: u32, partial: &str) -> String {
    event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": partial}})
            .to_string(),
    )
}

pub fn message_delta(stop_reason: &str, output_tokens: u64) -> String {
    event(
        "message_delta",
        &json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": output_tokens}})
            .to_string(),
    )
}

pub fn message_stop() -> String {
    event("message_stop", r#"{"type":"message_stop"}"#)
}

fn ping() -> String {
    event("ping", r#"{"type": "ping"}"#)
}

#[tokio::test]
async fn text_streams_with_cached_input_counted_as_input() {
    let server = TestServer::start(vec![Reply::sse([
        message_start(
            r#"{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":1,"service_tier":"standard"}"#,
        ),
        event(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        ping(),
        text_delta(0, "Hello"),
        text_delta(0, ", world"),
        text_delta(0, "!"),
        event(
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        message_delta("end_turn", 25),
        message_stop(),
    ])])
    .await;
    let model = Provider::Anthropic.model(&server, 2);

    let (message, usage, deltas) = within(call(model.as_ref(), hello())).await.unwrap();

    assert_eq!(deltas, ["Hello", ", world", "!"]);
    assert_eq!(message.content, json!("Hello, world!"));
    assert_eq!(
        message.response_metadata["model_name"],
        "claude-sonnet-4-5-20250929"
    );
    assert_eq!(message.response_metadata["finish_reason"], "stop");
    let reported = message.usage_metadata.unwrap();
    // docs/configuration.md#models: input = 12 + 2000 read + 100 written; cache_read =
    // 2000, cache_creation = 100.
    assert_eq!(
        (
            reported.input_tokens,
            reported.output_tokens,
            reported.total_tokens,
            reported.input_token_details.cache_read,
            reported.input_token_details.cache_creation
        ),
        (2112, 25, 2137, 2000, 100)
    );
    assert_eq!(usage.unwrap().input_tokens, 2112);

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("POST", "/v1/messages")
    );
    assert_eq!(sent.headers["x-api-key"], KEY);
    assert_eq!(sent.headers["anthropic-version"], "2023-06-01");
    assert!(!sent.headers.contains_key("authorization"));
    assert_eq!(sent.body["model"], "claude-sonnet-4-5");
    assert_eq!(sent.body["stream"], true);
    assert_eq!(sent.body["max_tokens"], 8192);
    assert_eq!(sent.body["system"], "You are terse.");
    assert_eq!(
        sent.body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}])
    );
    assert!(sent.body.get("tools").is_none());
}

#[tokio::test]
async fn tool_use_arguments_assemble_from_input_json_pieces() {
    let server = TestServer::start(vec![Reply::sse([
        message_start(
            r#"{"input_tokens":400,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":2}"#,
        ),
        event(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        text_delta(0, "Reading both."),
        event(
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        event(
            "content_block_start",
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01A","name":"read_file","input":{}}}"#,
        ),
        json_delta(1, ""),
        json_delta(1, "{\"path\": \"no"),
        json_delta(1, "tes.md\", \"lim"),
        json_delta(1, "it\": 20}"),
        event(
            "content_block_stop",
            r#"{"type":"content_block_stop","index":1}"#,
        ),
        event(
            "content_block_start",
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01B","name":"read_file","input":{}}}"#,
        ),
        json_delta(2, "{\"path\": \"todo.md\"}"),
        event(
            "content_block_stop",
            r#"{"type":"content_block_stop","index":2}"#,
        ),
        message_delta("tool_use", 61),
        message_stop(),
    ])])
    .await;
    let model = Provider::Anthropic.model(&server, 2);
    let history = request(
        vec![
            Message::system("Use tools."),
            Message::human("Read my notes"),
            Message::Ai(AiMessage {
                content: json!(""),
                tool_calls: vec![
                    ToolCall::new("toolu_00X", "ls", json!({"path": "."})),
                    ToolCall::new("toolu_00Y", "ls", json!({"path": "docs"})),
                ],
                ..AiMessage::default()
            }),
            Message::Tool(ToolMessage {
                content: json!("notes.md\ntodo.md"),
                tool_call_id: "toolu_00X".into(),
                ..ToolMessage::default()
            }),
            Message::Tool(ToolMessage {
                content: json!([{"type": "text", "text": "empty"}]),
                tool_call_id: "toolu_00Y".into(),
                ..ToolMessage::default()
            }),
        ],
        vec![ToolSpec {
            name: "read_file".into(),
            description: "Read a file".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["path"]}),
        }],
    );

    let (message, usage, _) = within(call(model.as_ref(), history)).await.unwrap();

    assert_eq!(message.content, json!("Reading both."));
    assert_eq!(
        message.tool_calls,
        vec![
            ToolCall::new(
                "toolu_01A",
                "read_file",
                json!({"path": "notes.md", "limit": 20})
            ),
            ToolCall::new("toolu_01B", "read_file", json!({"path": "todo.md"})),
        ]
    );
    assert_eq!(message.response_metadata["finish_reason"], "tool_calls");
    assert_eq!(usage.unwrap().output_tokens, 61);

    let sent = &server.requests()[0];
    assert_eq!(
        sent.body["tools"],
        json!([{"name": "read_file", "description": "Read a file", "input_schema":
            {"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["path"]}}])
    );
    assert_eq!(sent.body["system"], "Use tools.");
    assert_eq!(
        sent.body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Read my notes"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_00X", "name": "ls", "input": {"path": "."}},
                {"type": "tool_use", "id": "toolu_00Y", "name": "ls", "input": {"path": "docs"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_00X", "content": "notes.md\ntodo.md"},
                {"type": "tool_result", "tool_use_id": "toolu_00Y", "content": "empty"}
            ]}
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn an_overloaded_error_before_any_output_is_retried() {
    let overloaded = event(
        "error",
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    );
    let server = TestServer::start(vec![
        Reply::sse([
            message_start(r#"{"input_tokens":5,"output_tokens":1}"#),
            ping(),
            overloaded,
        ]),
        Reply::sse(Provider::Anthropic.hi()),
    ])
    .await;
    let model = Provider::Anthropic.model(&server, 2);

    let (message, _, _) = call(model.as_ref(), hello()).await.unwrap();

    assert_eq!(message.content, json!("Hi!"));
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn an_error_event_after_text_ends_the_call_without_a_retry() {
    let server = TestServer::start(vec![Reply::sse([
        message_start(r#"{"input_tokens":5,"output_tokens":1}"#),
        event(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        text_delta(0, "Partial"),
        event(
            "error",
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ),
    ])])
    .await;
    let model = Provider::Anthropic.model(&server, 2);

    let error = within(call(model.as_ref(), hello())).await.unwrap_err();

    assert_eq!(
        error,
        Error::Status {
            provider: "anthropic",
            status: 529,
            detail: "overloaded_error: Overloaded".into()
        }
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_base_url_ending_in_v1_is_not_doubled() {
    let server = TestServer::start(vec![Reply::sse(Provider::Anthropic.hi())]).await;
    let model = AnthropicModel::new(AnthropicConfig {
        base_url: format!("{}/v1/", server.base),
        api_key: Some(KEY.into()),
        timeout: None,
        ..AnthropicConfig::new("claude", "claude-haiku-4-5")
    })
    .unwrap();
    within(call(&model, hello())).await.unwrap();
    assert_eq!(server.requests()[0].path, "/v1/messages");
}

#[test]
fn the_api_key_never_shows_in_debug_output_and_is_required_by_the_api() {
    let config = AnthropicConfig {
        api_key: Some(KEY.into()),
        ..AnthropicConfig::new("claude", "claude-sonnet-4-5")
    };
    let model = AnthropicModel::new(config.clone()).unwrap();
    for text in [
        format!("{config:?}"),
        format!("{model:?}"),
        format!("{model:#?}"),
    ] {
        assert!(!text.contains(KEY), "{text}");
        assert!(!text.contains("0123456789abcdef"), "{text}");
    }
    let missing = AnthropicModel::new(AnthropicConfig::new("claude", "claude-sonnet-4-5"));
    assert!(matches!(missing, Err(Error::Config(_))), "{missing:?}");
}
