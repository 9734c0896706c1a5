//! A run's own records and live output as LangGraph clients read them: `run.start`
//! first, exactly one `run.end` mirroring each terminal status (docs/events.md#catalogue, the
//! reference's 2.1 contract), every message with one id from input to state, the AI
//! chunks sharing it, and one `updates` item per lead step (docs/api.md#objects, docs/api.md#sse-frames).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use subflow_contracts::messages::Message;
use subflow_contracts::{RunEvent, RunStatus};
use subflow_runtime::output::{OutputSink, RunOutput};
use subflow_runtime::run::RunSpec;
use subflow_store::MemoryStore;
use subflow_store::conformance::assert_conforms;

use crate::harness::{Harness, harness, scripted};

fn memory_harness(script: Option<Value>) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let path = script.map(|rules| {
        let path = dir.path().join("script.json");
        std::fs::write(&path, json!({"rules": rules}).to_string()).unwrap();
        path
    });
    harness(
        Arc::new(MemoryStore::new()),
        dir,
        vec![scripted(path)],
        |_| {},
    )
}

/// The run's records begin with `run.start`, hold one `run.end` whose metadata is the
/// run's terminal status, written after that status, and validate against every contract.
async fn assert_one_run_end(h: &Harness, thread: &str, run: &str, status: RunStatus) -> RunEvent {
    let rows = h.events(thread, run).await;
    assert_conforms(&rows);
    assert_eq!(rows[0].event_type, "run.start", "{:?}", kinds(&rows));
    let ends: Vec<&RunEvent> = rows.iter().filter(|r| r.event_type == "run.end").collect();
    assert_eq!(ends.len(), 1, "{:?}", kinds(&rows));
    let end = ends[0].clone();
    assert_eq!(end.category, "outputs");
    assert_eq!(
        Value::Object(end.metadata.clone()),
        json!({"status": status.as_str()})
    );
    let record = h.store.get_run(thread, run).await.unwrap().unwrap();
    assert_eq!(record.status, status);
    assert!(
        end.created_at >= record.updated_at,
        "run.end ({}) follows the durable status ({})",
        end.created_at,
        record.updated_at
    );
    end
}

fn kinds(rows: &[RunEvent]) -> Vec<&str> {
    rows.iter().map(|r| r.event_type.as_str()).collect()
}

#[tokio::test(start_paused = true)]
async fn every_terminal_status_writes_one_run_end_and_run_start_comes_first() {
    // success: the demo plan, whose subagent records flush long before the journal's.
    let h = memory_harness(None);
    let (result, _) = h.run("t-ok", "r-ok", "Compare two queues").await;
    assert_eq!(result.status, RunStatus::Success);
    let end = assert_one_run_end(&h, "t-ok", "r-ok", RunStatus::Success).await;
    assert_eq!(end.content, json!({"messages": result.messages.len()}));

    // error: the lead's model fails after its retries.
    let h = memory_harness(Some(json!([
        {"agent": "lead_agent", "turns": [{"error": "provider exploded"}]}
    ])));
    let (result, _) = h.run("t-err", "r-err", "hello").await;
    assert_eq!(result.status, RunStatus::Error);
    let end = assert_one_run_end(&h, "t-err", "r-err", RunStatus::Error).await;
    assert_eq!(end.content, json!({}), "a failed run has no root output");

    // timeout and interrupted: a task that outlives the run, or its cancel.
    let slow = json!([{"agent": "subagent:general-purpose", "turns": [{"text": "slow", "delay_ms": 600000}]}]);
    let h = memory_harness(Some(slow.clone()));
    let (result, _) = h
        .run_spec("t-slow", "r-slow", "/task general-purpose Slow", |spec| {
            spec.timeout = Duration::from_secs(30)
        })
        .await;
    assert_eq!(result.status, RunStatus::Timeout);
    assert_one_run_end(&h, "t-slow", "r-slow", RunStatus::Timeout).await;

    let h = memory_harness(Some(slow));
    let cancel = tokio_util::sync::CancellationToken::new();
    let canceller = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        canceller.cancel();
    });
    let (result, _) = h
        .run_with_cancel("t-stop", "r-stop", "/task general-purpose Slow", cancel)
        .await;
    assert_eq!(result.status, RunStatus::Interrupted);
    let end = assert_one_run_end(&h, "t-stop", "r-stop", RunStatus::Interrupted).await;
    assert_eq!(end.content, json!({}));
}

#[tokio::test(start_paused = true)]
async fn a_run_whose_status_was_already_ended_writes_no_second_run_end() {
    let h = memory_harness(None);
    // Another writer (orphan recovery, a panicking task's pump) ended the run first.
    h.store
        .create_run(subflow_store::NewRun {
            run_id: "r-taken".into(),
            thread_id: "t-taken".into(),
            owner: "u1".into(),
            assistant_id: "lead_agent".into(),
            model_name: None,
            trace_id: None,
            metadata: Default::default(),
            multitask_strategy: "reject".into(),
            kwargs: json!({}),
        })
        .await
        .unwrap();
    let ended = subflow_store::RunStatusUpdate {
        lease_owner: None,
        status: RunStatus::Error,
        stop_reason: None,
        error: Some("taken over".into()),
    };
    assert!(h.store.update_run_status("r-taken", &ended).await.unwrap());
    let spec = RunSpec {
        lease_owner: None,
        thread_id: "t-taken".into(),
        run_id: "r-taken".into(),
        user_id: Some("u1".into()),
        model_name: None,
        input: vec![Message::human("/echo hi")],
        trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
        delegation_trace: None,
        cancel: tokio_util::sync::CancellationToken::new(),
        tasks: Default::default(),
        timeout: Duration::from_secs(600),
        trace: Default::default(),
    };
    let result = h.runtime.run(spec, OutputSink::channel().0).await;
    assert_eq!(result.status, RunStatus::Success, "the run itself finished");
    let rows = h.events("t-taken", "r-taken").await;
    assert!(
        !rows.iter().any(|r| r.event_type == "run.end"),
        "the status it could not write is not mirrored: {:?}",
        kinds(&rows)
    );
}

/// The id of each message, in order.
fn ids(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m.id().expect("every message has an id").to_owned())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn each_message_keeps_one_id_its_chunks_share_and_each_lead_step_is_one_update() {
    let h = memory_harness(None);
    let (result, outputs) = h.run("t-ids", "r-ids", "Compare two queues").await;
    assert_eq!(result.status, RunStatus::Success);
    let state = ids(&result.messages);
    assert_eq!(
        state.iter().collect::<BTreeSet<_>>().len(),
        state.len(),
        "ids are unique"
    );
    assert!(
        uuid::Uuid::parse_str(&state[0]).is_ok(),
        "the input message got a UUID"
    );

    // One update per lead step, in order: the answer with three task calls, the three
    // task results, the summary. Their messages are the state after the input.
    let updates: Vec<&Value> = outputs
        .iter()
        .filter_map(|o| match o {
            RunOutput::Update(update) => Some(update),
            _ => None,
        })
        .collect();
    let nodes: Vec<&str> = updates
        .iter()
        .map(|u| {
            let object = u.as_object().unwrap();
            assert_eq!(object.len(), 1, "{u}");
            object.keys().next().unwrap().as_str()
        })
        .collect();
    assert_eq!(nodes, ["model", "tools", "model"]);
    let updated: Vec<String> = updates
        .iter()
        .flat_map(|u| u.as_object().unwrap().values())
        .flat_map(|delta| delta["messages"].as_array().unwrap().clone())
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(updated, state[1..]);

    // The `messages` items: chunks of each AI message carry its id and, joined, its text
    // and its tool calls; tool messages come whole with their state id.
    let mut chunk_text: std::collections::BTreeMap<String, String> = Default::default();
    let mut chunk_calls: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut tools = Vec::new();
    for output in &outputs {
        let RunOutput::Message { message, node } = output else {
            continue;
        };
        let id = message["id"]
            .as_str()
            .expect("every chunk has an id")
            .to_owned();
        match message["type"].as_str().unwrap() {
            "AIMessageChunk" => {
                assert_eq!(*node, "model");
                chunk_text
                    .entry(id.clone())
                    .or_default()
                    .push_str(message["content"].as_str().unwrap());
                for call in message["tool_call_chunks"].as_array().into_iter().flatten() {
                    chunk_calls
                        .entry(id.clone())
                        .or_default()
                        .push(call["id"].as_str().unwrap().to_owned());
                }
            }
            "tool" => {
                assert_eq!(*node, "tools");
                tools.push(id);
            }
            other => panic!("unexpected {other}"),
        }
    }
    for message in &result.messages {
        match message {
            Message::Ai(ai) => {
                let id = ai.id.as_deref().unwrap();
                assert_eq!(
                    chunk_text[id],
                    message.text(),
                    "the chunks spell the message"
                );
                let calls: Vec<String> = ai.tool_calls.iter().map(|c| c.id.clone()).collect();
                assert_eq!(chunk_calls.get(id).cloned().unwrap_or_default(), calls);
            }
            Message::Tool(tool) => assert!(tools.contains(tool.id.as_ref().unwrap())),
            _ => {}
        }
    }
    assert_eq!(tools.len(), 3);
    assert_eq!(chunk_text.len(), 2, "two AI messages streamed");

    // The next run keeps every id and takes a client's.
    let (again, _) = h
        .run_spec("t-ids", "r-ids-2", "/echo again", |spec| {
            spec.input = vec![
                serde_json::from_value(
                    json!({"type": "human", "content": "/echo again", "id": "client-7"}),
                )
                .unwrap(),
            ]
        })
        .await;
    let next = ids(&again.messages);
    assert_eq!(next[..state.len()], state[..]);
    assert_eq!(next[state.len()], "client-7");
}
