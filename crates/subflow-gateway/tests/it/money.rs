//! One usage with cache reads and cache writes, priced alike on every surface it reaches
//! (docs/usage-and-cost.md#cost): a task card's rule, `/tasks`, `/token-usage`,
//! `/api/usage` and `subflow_cost_total`, to the micro-unit. The same three model calls
//! come from the scripted model, and from local servers speaking the OpenAI Chat
//! Completions and the Anthropic Messages streaming formats, so the providers' own usage
//! fields (`prompt_tokens_details.cached_tokens`/`cache_write_tokens`,
//! `cache_read_input_tokens`/`cache_creation_input_tokens`) are what gets priced.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::header::CONTENT_TYPE;
use serde_json::{Value, json};
use subflow_contracts::task_card;
use subflow_models::{
    AnthropicConfig, AnthropicModel, ChatModel, OpenAiConfig, OpenAiModel, ScriptedConfig,
    ScriptedModel,
};
use subflow_runtime::runtime::Models;

use crate::metrics::{parse, scrape};
use crate::{Options, TestApp, spawn_app_with};

/// The task call the lead makes first.
const TASK_ARGS: &str =
    r#"{"description":"Measure","prompt":"measure the cache","subagent_type":"general-purpose"}"#;

/// The lead delegates one task, then answers; each call reports cache reads and writes.
fn script() -> Value {
    json!({"rules": [
        {"agent": "lead_agent", "contains": "price the cache", "turns": [
            {"tool_calls": [{"name": "task", "args": {"description": "Measure", "prompt": "measure the cache", "subagent_type": "general-purpose"}}],
             "usage": {"input": 5000, "output": 200, "cache_read": 3000, "cache_write": 1000}},
            {"text": "done", "usage": {"input": 6000, "output": 100, "cache_read": 4000, "cache_write": 0}}
        ]},
        {"agent": "subagent:general-purpose", "contains": "measure the cache", "turns": [
            {"text": "measured", "usage": {"input": 10000, "output": 1000, "cache_read": 6000, "cache_write": 2000}}
        ]}
    ]})
}

/// A local server answering each POST with the next of `bodies` as an event stream, in
/// the order the run makes its calls: the lead's task call, the subagent, the lead's answer.
async fn replaying(bodies: Vec<String>) -> String {
    let queue = Arc::new(Mutex::new(VecDeque::from(bodies)));
    let app = Router::new().fallback(move || {
        let queue = queue.clone();
        async move {
            let body = queue.lock().unwrap().pop_front().unwrap_or_default();
            ([(CONTENT_TYPE, "text/event-stream")], body)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}")
}

/// One Chat Completions chunk.
fn openai_chunk(delta: Value, finish: Option<&str>, usage: Option<Value>) -> String {
    let choices = if usage.is_some() {
        json!([])
    } else {
        json!([{"index": 0, "delta": delta, "finish_reason": finish}])
    };
    let chunk = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1727000000,
        "model": "scripted-1", "choices": choices, "usage": usage});
    format!("data: {chunk}\n\n")
}

/// An OpenAI stream: `delta` then the final usage chunk, with prompt tokens counting
/// cached reads (`cached_tokens`) and writes (`cache_write_tokens`).
fn openai_stream(delta: Value, finish: &str, tokens: [u64; 4]) -> String {
    let [input, output, read, write] = tokens;
    let usage = json!({"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output,
        "prompt_tokens_details": {"cached_tokens": read, "cache_write_tokens": write}});
    [
        openai_chunk(delta, None, None),
        openai_chunk(json!({}), Some(finish), None),
        openai_chunk(json!({}), None, Some(usage)),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat()
}

fn event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// An Anthropic stream of one content block, whose `input_tokens` leave out the cache
/// reads and writes reported beside them.
fn anthropic_stream(block: Value, delta: Value, stop: &str, tokens: [u64; 4]) -> String {
    let [input, output, read, write] = tokens;
    let usage = json!({"input_tokens": input - read - write, "cache_read_input_tokens": read,
        "cache_creation_input_tokens": write, "output_tokens": 1});
    [
        event("message_start", json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "model": "scripted-1", "content": [], "stop_reason": null, "usage": usage}})),
        event("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": block})),
        event("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": delta})),
        event("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": output}})),
        event("message_stop", json!({"type": "message_stop"})),
    ]
    .concat()
}

/// The lead's task call, the subagent's answer and the lead's answer, as (input, output,
/// cache read, cache write).
const CALLS: [[u64; 4]; 3] = [
    [5000, 200, 3000, 1000],
    [10000, 1000, 6000, 2000],
    [6000, 100, 4000, 0],
];

async fn gateway_on(model: Arc<dyn ChatModel>) -> TestApp {
    spawn_app_with(Options {
        configure: Box::new(move |app| {
            app.runtime.models = Models::new(vec![model]);
        }),
        ..Options::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_and_written_input_costs_the_same_on_cards_tasks_token_usage_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.json");
    std::fs::write(&path, script().to_string()).unwrap();
    let model = ScriptedModel::new(ScriptedConfig {
        script: Some(path),
        ..ScriptedConfig::default()
    })
    .unwrap();
    priced_alike(&gateway_on(Arc::new(model)).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_compatible_providers_cache_fields_are_priced_the_same_everywhere() {
    let tool_call = json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
        "function": {"name": "task", "arguments": TASK_ARGS}}]});
    let base = replaying(vec![
        openai_stream(tool_call, "tool_calls", CALLS[0]),
        openai_stream(
            json!({"role": "assistant", "content": "measured"}),
            "stop",
            CALLS[1],
        ),
        openai_stream(
            json!({"role": "assistant", "content": "done"}),
            "stop",
            CALLS[2],
        ),
    ])
    .await;
    let mut config = OpenAiConfig::new("scripted", "scripted-1");
    config.base_url = format!("{base}/v1");
    priced_alike(&gateway_on(Arc::new(OpenAiModel::new(config).unwrap())).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_providers_cache_fields_are_priced_the_same_everywhere() {
    let text = |words: &str| {
        (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": words}),
        )
    };
    let tool = (
        json!({"type": "tool_use", "id": "toolu_1", "name": "task", "input": {}}),
        json!({"type": "input_json_delta", "partial_json": TASK_ARGS}),
    );
    let (measured, done) = (text("measured"), text("done"));
    let base = replaying(vec![
        anthropic_stream(tool.0, tool.1, "tool_use", CALLS[0]),
        anthropic_stream(measured.0, measured.1, "end_turn", CALLS[1]),
        anthropic_stream(done.0, done.1, "end_turn", CALLS[2]),
    ])
    .await;
    let mut config = AnthropicConfig::new("scripted", "scripted-1");
    config.base_url = base;
    config.api_key = Some(subflow_models::Secret::new("test-key"));
    priced_alike(&gateway_on(Arc::new(AnthropicModel::new(config).unwrap())).await).await;
}

/// Runs the three calls on `app` and checks every surface prices them alike.
async fn priced_alike(app: &TestApp) {
    let streamed = app
        .stream_run(
            "t-money",
            json!({"input": {"messages": [{"role": "user", "content": "price the cache"}]}}),
        )
        .await;
    let run = streamed.frames[0].data["run_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // At 2 per million uncached input, 0.5 read, 2.5 written and 8 output:
    // subagent 2,000·2 + 6,000·0.5 + 2,000·2.5 + 1,000·8 = 20,000 → 0.02;
    // lead 1,000·2 + 3,000·0.5 + 1,000·2.5 + 200·8 = 7,600 and 2,000·2 + 4,000·0.5 + 100·8
    // = 6,800 → 0.0144.
    let (_, _, tasks) = app
        .get_json(&format!("/api/threads/t-money/runs/{run}/tasks"))
        .await;
    let task = &tasks[0];
    assert_eq!(
        task["usage"],
        json!({"input_tokens": 10000, "output_tokens": 1000, "total_tokens": 11000,
               "cache_read_tokens": 6000, "cache_write_tokens": 2000})
    );
    assert_eq!(task["cost"], json!({"currency": "USD", "total": 0.02}));

    // The card prices the same usage, read off the wire, at /api/models' prices.
    let (_, _, models) = app.get_json("/api/models").await;
    let usage = task_card::read_usage(&task["usage"]).unwrap();
    let card =
        task_card::card_cost(Some(&usage), task["model_name"].as_str(), &models["models"]).unwrap();
    assert_eq!((card.amount, card.currency.as_str()), (0.02, "USD"));
    assert_eq!(
        task_card::cost_label(Some(&usage), task["model_name"].as_str(), &models["models"]),
        Some("$0.02".to_owned())
    );

    let (_, _, usage) = app.get_json("/api/threads/t-money/token-usage").await;
    assert_eq!(
        usage["cost"],
        json!({"currency": "USD", "total": 0.0344, "by_model": {"scripted-1": 0.0344}})
    );
    let (_, _, across) = app.get_json("/api/usage?group_by=model").await;
    assert_eq!(across["counted"]["cost"], usage["cost"]);
    assert_eq!(across["groups"][0]["key"], "scripted-1");
    let spent = parse(&scrape(app).await).sum("subflow_cost_total", &[("model", "scripted-1")]);
    assert!((spent - 0.0344).abs() < 1e-9, "{spent}");
}
