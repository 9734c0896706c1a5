//! The OpenAI-compatible provider against a server replaying Chat Completions streams.

use serde_json::json;
use subflow_contracts::messages::{AiMessage, Message, ToolCall, ToolMessage};
use subflow_models::{ChatEvent, Error, OpenAiConfig, OpenAiModel, ToolSpec};

use crate::server::{End, Reply, TestServer};
use crate::{KEY, Provider, call, hello, request, within};

/// One `data:` line of a chunk with this delta, as OpenAI sends it with
/// `include_usage` on (`usage: null` on every chunk but the last).
pub fn chunk(delta: &str, finish_reason: Option<&str>) -> String {
    let finish = finish_reason.map_or("null".to_owned(), |reason| format!("\"{reason}\""));
    format!(
        "data: {{\"id\":\"chatcmpl-AbC123\",\"object\":\"chat.completion.chunk\",\"created\":1727000000,\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}],\"usage\":null}}\n\n"
    )
}

/// The final chunk: no choices, only usage.
pub fn usage_chunk(usage: &str) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-AbC123\",\"object\":\"chat.completion.chunk\",\"created\":1727000000,\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[],\"usage\":{usage}}}\n\n"
    )
}

/// `body` in pieces of `size` characters, so lines and events straddle network reads.
fn pieces(body: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = body.chars().collect();
    chars
        .chunks(size)
        .map(|piece| piece.iter().collect())
        .collect()
}

#[tokio::test]
async fn text_streams_into_an_ai_message_with_usage_including_cache_reads() {
    let body = [
        chunk(r#"{"role":"assistant","content":"","refusal":null}"#, None),
        chunk(r#"{"content":"Hello"}"#, None),
        chunk(r#"{"content":", wörld"}"#, None),
        chunk(r#"{"content":"!"}"#, None),
        chunk("{}", Some("stop")),
        usage_chunk(
            r#"{"prompt_tokens":1200,"completion_tokens":9,"total_tokens":1209,"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}"#,
        ),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let server = TestServer::start(vec![Reply::sse(pieces(&body, 37))]).await;
    let model = Provider::OpenAi.model(&server, 2);

    let (message, usage, deltas) = within(call(model.as_ref(), hello())).await.unwrap();

    assert_eq!(deltas, ["Hello", ", wörld", "!"]);
    assert_eq!(message.content, json!("Hello, wörld!"));
    assert!(message.tool_calls.is_empty());
    assert_eq!(
        message.response_metadata["model_name"],
        "gpt-4o-mini-2024-07-18"
    );
    assert_eq!(message.response_metadata["finish_reason"], "stop");
    let reported = message.usage_metadata.unwrap();
    assert_eq!(
        (
            reported.input_tokens,
            reported.output_tokens,
            reported.total_tokens,
            reported.input_token_details.cache_read
        ),
        (1200, 9, 1209, 1024)
    );
    assert_eq!(usage.unwrap().cache_read, 1024);

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(sent.headers["authorization"], format!("Bearer {KEY}"));
    assert_eq!(sent.headers["content-type"], "application/json");
    assert_eq!(sent.body["model"], "gpt-4o-mini");
    assert_eq!(sent.body["stream"], true);
    assert_eq!(sent.body["stream_options"], json!({"include_usage": true}));
    assert_eq!(
        sent.body["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hi"}
        ])
    );
    assert!(sent.body.get("tools").is_none());
}

#[tokio::test]
async fn cache_writes_are_read_from_either_field_compatible_servers_report_them_in() {
    for usage in [
        r#"{"prompt_tokens":3000,"completion_tokens":7,"total_tokens":3007,"prompt_tokens_details":{"cached_tokens":2000,"cache_write_tokens":600}}"#,
        r#"{"prompt_tokens":3000,"completion_tokens":7,"total_tokens":3007,"prompt_tokens_details":{"cached_tokens":2000},"cache_creation_input_tokens":600}"#,
    ] {
        let body = [
            chunk(r#"{"role":"assistant","content":"Hi"}"#, None),
            chunk("{}", Some("stop")),
            usage_chunk(usage),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        let server = TestServer::start(vec![Reply::sse([body])]).await;
        let model = Provider::OpenAi.model(&server, 2);
        let (message, _, _) = within(call(model.as_ref(), hello())).await.unwrap();
        let details = message.usage_metadata.unwrap().input_token_details;
        assert_eq!(
            (details.cache_read, details.cache_creation),
            (2000, 600),
            "{usage}"
        );
    }
}

#[tokio::test]
async fn tool_calls_assemble_when_the_name_arrives_after_the_id() {
    let body = vec![
        chunk(r#"{"role":"assistant","content":null}"#, None),
        // Call 0: id first, the name one delta later, the arguments in three pieces.
        chunk(
            r#"{"tool_calls":[{"index":0,"id":"call_Ab1","type":"function","function":{"arguments":""}}]}"#,
            None,
        ),
        chunk(
            r#"{"tool_calls":[{"index":0,"function":{"name":"read_file"}}]}"#,
            None,
        ),
        chunk(
            r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"pa"}}]}"#,
            None,
        ),
        chunk(
            r#"{"tool_calls":[{"index":0,"function":{"arguments":"th\": \"notes"}}]}"#,
            None,
        ),
        chunk(
            r#"{"tool_calls":[{"index":0,"function":{"arguments":".md\"}"}}]}"#,
            None,
        ),
        // Call 1: the usual shape, id and name together.
        chunk(
            r#"{"tool_calls":[{"index":1,"id":"call_Cd2","type":"function","function":{"name":"ls","arguments":""}}]}"#,
            None,
        ),
        chunk(
            r#"{"tool_calls":[{"index":1,"function":{"arguments":"{\"path\":\"/\"}"}}]}"#,
            None,
        ),
        chunk("{}", Some("tool_calls")),
        usage_chunk(r#"{"prompt_tokens":80,"completion_tokens":40,"total_tokens":120}"#),
        "data: [DONE]\n\n".to_owned(),
    ];
    let server = TestServer::start(vec![Reply::sse(body)]).await;
    let model = Provider::OpenAi.model(&server, 2);
    let history = request(
        vec![
            Message::system("Use tools."),
            Message::human("What is in the notes?"),
            Message::Ai(AiMessage {
                content: json!("Let me look."),
                tool_calls: vec![ToolCall::new("call_prev", "ls", json!({"path": "."}))],
                ..AiMessage::default()
            }),
            Message::Tool(ToolMessage {
                content: json!("notes.md"),
                tool_call_id: "call_prev".into(),
                name: Some("ls".into()),
                ..ToolMessage::default()
            }),
        ],
        vec![
            ToolSpec {
                name: "read_file".into(),
                description: "Read a file".into(),
                parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
            },
            ToolSpec {
                name: "ls".into(),
                description: "List a folder".into(),
                parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            },
        ],
    );

    let (message, usage, deltas) = within(call(model.as_ref(), history)).await.unwrap();

    assert!(deltas.is_empty());
    assert_eq!(
        message.tool_calls,
        vec![
            ToolCall::new("call_Ab1", "read_file", json!({"path": "notes.md"})),
            ToolCall::new("call_Cd2", "ls", json!({"path": "/"})),
        ]
    );
    assert!(message.invalid_tool_calls.is_empty());
    assert_eq!(message.response_metadata["finish_reason"], "tool_calls");
    assert_eq!(usage.unwrap().total_tokens, 120);

    let sent = &server.requests()[0];
    assert_eq!(
        sent.body["tools"],
        json!([
            {"type": "function", "function": {"name": "read_file", "description": "Read a file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
            {"type": "function", "function": {"name": "ls", "description": "List a folder",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
        ])
    );
    assert_eq!(
        sent.body["messages"],
        json!([
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "What is in the notes?"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "call_prev", "type": "function", "function": {"name": "ls", "arguments": "{\"path\":\".\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_prev", "content": "notes.md"}
        ])
    );
}

#[tokio::test]
async fn empty_or_null_usage_and_chunks_without_choices_are_ignored() {
    // As some compatible servers do: `usage: {}` on every chunk, a keep-alive chunk with
    // no choices, `usage: null` and finally the real counts without cache details.
    let server = TestServer::start(vec![Reply::sse([
        r#"data: {"id":"x","model":"qwen2.5-7b","choices":[{"index":0,"delta":{"role":"assistant","content":"O"}}],"usage":{}}"#.to_owned() + "\n\n",
        r#"data: {"id":"x","model":"qwen2.5-7b","choices":[],"usage":{}}"#.to_owned() + "\n\n",
        r#"data: {"id":"x","model":"qwen2.5-7b","choices":[{"index":0,"delta":{"content":"K"},"finish_reason":null}],"usage":null}"#.to_owned() + "\n\n",
        r#"data: {"id":"x","model":"qwen2.5-7b","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{}}"#.to_owned() + "\n\n",
        r#"data: {"id":"x","model":"qwen2.5-7b","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":2}}"#.to_owned() + "\n\n",
        "data: [DONE]\n\n".to_owned(),
    ])])
    .await;
    let model = Provider::OpenAi.model(&server, 2);

    let stream = within(model.stream(hello())).await.unwrap();
    let events: Vec<_> = within(futures::StreamExt::collect::<Vec<_>>(stream))
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();

    let usages: Vec<_> = events
        .iter()
        .filter_map(|event| match event {
            ChatEvent::Usage(usage) => Some(*usage),
            _ => None,
        })
        .collect();
    assert_eq!(usages.len(), 1, "{events:?}");
    assert_eq!(
        (
            usages[0].input_tokens,
            usages[0].output_tokens,
            usages[0].total_tokens,
            usages[0].cache_read
        ),
        (11, 2, 13, 0)
    );
    assert_eq!(
        events.last(),
        Some(&ChatEvent::Finish {
            reason: "stop".into(),
            model: Some("qwen2.5-7b".into())
        })
    );
    assert_eq!(
        events
            .iter()
            .filter_map(|event| match event {
                ChatEvent::TextDelta(text) => Some(text.as_str()),
                _ => None,
            })
            .collect::<String>(),
        "OK"
    );
}

#[tokio::test]
async fn a_stream_cut_after_text_fails_without_a_retry() {
    let server = TestServer::start(vec![
        Reply::sse([
            chunk(r#"{"role":"assistant","content":""}"#, None),
            chunk(r#"{"content":"Half an ans"}"#, None),
        ])
        .ending(End::Cut),
    ])
    .await;
    let model = Provider::OpenAi.model(&server, 2);

    let error = within(call(model.as_ref(), hello())).await.unwrap_err();

    assert!(
        matches!(
            error,
            Error::Transport {
                provider: "openai",
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn an_answer_without_done_is_a_failure_unless_it_finished() {
    // The body ends cleanly but the answer did not: no finish reason, no [DONE].
    let server = TestServer::start(vec![Reply::sse([chunk(r#"{"content":"Hi"}"#, None)])]).await;
    let model = Provider::OpenAi.model(&server, 0);
    let error = within(call(model.as_ref(), hello())).await.unwrap_err();
    assert!(matches!(error, Error::Transport { .. }), "{error:?}");

    let server = TestServer::start(vec![Reply::sse([chunk(
        r#"{"content":"Hi"}"#,
        Some("stop"),
    )])])
    .await;
    let model = Provider::OpenAi.model(&server, 0);
    let (message, _, _) = within(call(model.as_ref(), hello())).await.unwrap();
    assert_eq!(message.content, json!("Hi"));
}

#[tokio::test]
async fn a_json_answer_to_a_streaming_request_is_a_protocol_error() {
    let server = TestServer::start(vec![Reply::status(
        200,
        r#"{"id":"chatcmpl-1","choices":[{"message":{"role":"assistant","content":"Hi"}}]}"#,
    )])
    .await;
    let model = Provider::OpenAi.model(&server, 2);
    let error = within(call(model.as_ref(), hello())).await.unwrap_err();
    assert!(matches!(error, Error::Protocol { .. }), "{error:?}");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn local_servers_need_no_key_but_the_openai_api_does() {
    let server = TestServer::start(vec![Reply::sse(Provider::OpenAi.hi())]).await;
    let model = OpenAiModel::new(OpenAiConfig {
        base_url: format!("{}/v1/", server.base),
        timeout: None,
        ..OpenAiConfig::new("local", "llama3")
    })
    .unwrap();
    within(call(&model, hello())).await.unwrap();
    assert!(!server.requests()[0].headers.contains_key("authorization"));

    let missing = OpenAiModel::new(OpenAiConfig::new("gpt", "gpt-4o")).unwrap_err();
    assert!(matches!(missing, Error::Config(_)), "{missing:?}");
    let bad_url = OpenAiModel::new(OpenAiConfig {
        base_url: "localhost:8000".into(),
        ..OpenAiConfig::new("local", "llama3")
    })
    .unwrap_err();
    assert!(matches!(bad_url, Error::Config(_)), "{bad_url:?}");
}

#[test]
fn the_api_key_never_shows_in_debug_output() {
    let config = OpenAiConfig {
        api_key: Some(KEY.into()),
        ..OpenAiConfig::new("gpt", "gpt-4o")
    };
    let model = OpenAiModel::new(config.clone()).unwrap();
    for text in [
        format!("{config:?}"),
        format!("{model:?}"),
        format!("{model:#?}"),
    ] {
        assert!(!text.contains(KEY), "{text}");
        assert!(!text.contains("0123456789abcdef"), "{text}");
    }
    assert!(format!("{config:?}").contains("redacted"));
}
