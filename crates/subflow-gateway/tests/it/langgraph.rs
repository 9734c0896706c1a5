//! What LangGraph clients (the JS and Python SDKs, DeerFlow's web client) rely on, over
//! HTTP: `updates` frames live, on a rejoin and in the stored log (docs/api.md#sse-frames); one id per
//! message from input to state, shared by its chunks (docs/api.md#objects); `Last-Event-ID: -1`
//! and the rejoin parameters the SDKs send (docs/api.md#resume-and-rejoin); `/api/info` and the assistant's
//! graph and schemas; one `run.end` per run, after `run.start` (docs/events.md#catalogue).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use subflow_contracts::RunEvent;
use subflow_store::EventQuery;
use subflow_store::conformance::assert_conforms;

use crate::{Frame, Options, TestApp, parse_frames, spawn_app, spawn_app_with};

/// What DeerFlow's web client asks for: no `values`.
const DEERFLOW_MODES: [&str; 3] = ["messages-tuple", "updates", "custom"];

fn demo(modes: &[&str]) -> Value {
    json!({"input": {"messages": [{"role": "user", "content": "Compare three message brokers"}]},
           "stream_mode": modes})
}

impl TestApp {
    async fn rejoin_with(
        &self,
        thread: &str,
        run: &str,
        cursor: Option<&str>,
        query: &str,
    ) -> reqwest::Response {
        let mut request = self
            .client
            .get(self.url(&format!("/api/threads/{thread}/runs/{run}/stream{query}")));
        if let Some(cursor) = cursor {
            request = request.header("Last-Event-ID", cursor);
        }
        request.send().await.unwrap()
    }

    async fn replay(
        &self,
        thread: &str,
        run: &str,
        cursor: Option<&str>,
        query: &str,
    ) -> Vec<Frame> {
        let response = self.rejoin_with(thread, run, cursor, query).await;
        assert_eq!(response.status(), 200);
        parse_frames(&response.text().await.unwrap())
    }

    async fn state_messages(&self, thread: &str) -> Vec<Value> {
        let (status, _, state) = self.get_json(&format!("/api/threads/{thread}/state")).await;
        assert_eq!(status, 200);
        state["values"]["messages"].as_array().unwrap().clone()
    }

    /// Every persisted record of a run, once it has ended (`join`), ascending by `seq`.
    async fn run_events(&self, thread: &str, run: &str) -> Vec<RunEvent> {
        let (status, _, _) = self
            .get_json(&format!("/api/threads/{thread}/runs/{run}/join"))
            .await;
        assert_eq!(status, 200);
        let mut query = EventQuery::run(thread, run);
        query.limit = 2000;
        self.store.list_events(&query).await.unwrap()
    }
}

/// A gateway whose scripted model pauses `delay_ms` between streamed pieces.
async fn paced(delay_ms: u64) -> TestApp {
    spawn_app_with(Options {
        delay_ms,
        ..Options::default()
    })
    .await
}

fn run_id(frames: &[Frame]) -> String {
    assert_eq!(frames[0].event, "metadata");
    frames[0].data["run_id"].as_str().unwrap().to_owned()
}

fn ids_of(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| {
            m["id"]
                .as_str()
                .expect("every message has an id")
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_frames_carry_each_lead_step_live_on_a_rejoin_and_in_the_stored_log() {
    let app = spawn_app().await;
    let streamed = app.stream_run("t-updates", demo(&DEERFLOW_MODES)).await;
    assert_eq!(streamed.status, 200);
    let frames = &streamed.frames;
    let run = run_id(frames);
    assert_eq!(frames.last().unwrap().event, "end");
    assert!(
        !frames.iter().any(|f| f.event == "values"),
        "no values asked for"
    );

    // One frame per lead step, named by node: the answer with three task calls, the
    // three task results, the summary.
    let updates: Vec<&Frame> = frames.iter().filter(|f| f.event == "updates").collect();
    let nodes: Vec<&str> = updates
        .iter()
        .map(|f| {
            let object = f.data.as_object().unwrap();
            assert_eq!(object.len(), 1, "{}", f.data);
            object.keys().next().unwrap().as_str()
        })
        .collect();
    assert_eq!(nodes, ["model", "tools", "model"]);
    let delta = |i: usize| {
        updates[i].data[nodes[i]]["messages"]
            .as_array()
            .unwrap()
            .clone()
    };
    assert_eq!(delta(1).len(), 3);
    assert!(
        delta(1)
            .iter()
            .all(|m| m["type"] == "tool" && m["name"] == "task")
    );
    assert_eq!(delta(0)[0]["tool_calls"].as_array().unwrap().len(), 3);
    let state = app.state_messages("t-updates").await;
    let updated: Vec<Value> = (0..3).flat_map(delta).collect();
    assert_eq!(
        ids_of(&updated),
        ids_of(&state[1..]),
        "the state after the input"
    );

    // The node names are those of the `messages` metadata.
    let message_nodes: BTreeSet<&str> = frames
        .iter()
        .filter(|f| f.event == "messages")
        .map(|f| f.data[1]["langgraph_node"].as_str().unwrap())
        .collect();
    assert_eq!(message_nodes, BTreeSet::from(["model", "tools"]));

    // The same frames on a rejoin, and `updates` alone when only they are asked for.
    assert_eq!(&app.replay("t-updates", &run, None, "").await, frames);
    let only: Vec<String> = app
        .replay("t-updates", &run, None, "?stream_mode=updates")
        .await
        .iter()
        .map(|f| f.event.clone())
        .collect();
    assert_eq!(only, ["metadata", "updates", "updates", "updates", "end"]);

    // And in the durable log, as they were sent.
    let stored = app.store.read_frames(&run, 0, 1000).await.unwrap();
    let stored_updates: Vec<Value> = stored
        .iter()
        .filter(|f| f.event == "updates")
        .map(|f| serde_json::from_str(&f.data).unwrap())
        .collect();
    let sent: Vec<Value> = updates.iter().map(|f| f.data.clone()).collect();
    assert_eq!(stored_updates, sent);

    // A run that asks for `updates` alone gets them too.
    let alone = app.stream_run("t-updates-only", demo(&["updates"])).await;
    let events: Vec<&str> = alone.frames.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(events, ["metadata", "updates", "updates", "updates", "end"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_has_one_id_from_input_to_state_and_its_chunks_share_it() {
    let app = spawn_app().await;
    let streamed = app
        .stream_run("t-ids", demo(&["messages-tuple", "values"]))
        .await;
    let state = app.state_messages("t-ids").await;
    let ids = ids_of(&state);
    assert_eq!(
        ids.iter().collect::<BTreeSet<_>>().len(),
        ids.len(),
        "unique"
    );
    assert!(
        uuid::Uuid::parse_str(&ids[0]).is_ok(),
        "the input got a UUID: {}",
        ids[0]
    );
    assert_eq!(state.iter().filter(|m| m["type"] == "tool").count(), 3);

    // Every `values` frame names each message by the id it keeps.
    for values in streamed.frames.iter().filter(|f| f.event == "values") {
        let messages = values.data["messages"].as_array().unwrap();
        assert_eq!(ids_of(messages), ids[..messages.len()]);
    }

    // `messages` frames: the chunks of one AI message share its id and spell it, tool
    // calls included; tool messages come whole, with their state id.
    let mut text: BTreeMap<String, String> = BTreeMap::new();
    let mut calls: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut tools = Vec::new();
    for frame in streamed.frames.iter().filter(|f| f.event == "messages") {
        let (chunk, metadata) = (&frame.data[0], &frame.data[1]);
        let id = chunk["id"]
            .as_str()
            .expect("no chunk without an id")
            .to_owned();
        match chunk["type"].as_str().unwrap() {
            "AIMessageChunk" => {
                assert_eq!(metadata["langgraph_node"], "model");
                text.entry(id.clone())
                    .or_default()
                    .push_str(chunk["content"].as_str().unwrap());
                for call in chunk["tool_call_chunks"].as_array().into_iter().flatten() {
                    let args: Value = serde_json::from_str(call["args"].as_str().unwrap()).unwrap();
                    calls.entry(id.clone()).or_default().push(
                        json!({"id": call["id"], "name": call["name"], "args": args, "type": "tool_call"}),
                    );
                }
            }
            "tool" => {
                assert_eq!(metadata["langgraph_node"], "tools");
                let whole = state
                    .iter()
                    .find(|m| m["id"] == chunk["id"])
                    .expect("in the state");
                assert_eq!(whole["tool_call_id"], chunk["tool_call_id"]);
                tools.push(id);
            }
            other => panic!("unexpected message type {other}"),
        }
    }
    let ai: Vec<&Value> = state.iter().filter(|m| m["type"] == "ai").collect();
    assert_eq!(text.len(), ai.len());
    for message in ai {
        let id = message["id"].as_str().unwrap();
        assert_eq!(text[id], message["content"].as_str().unwrap());
        assert_eq!(
            calls.get(id).cloned().unwrap_or_default(),
            message["tool_calls"].as_array().unwrap().clone()
        );
    }
    assert_eq!(tools.len(), 3);

    // The next run keeps them all, and keeps the id a client gave its input.
    app.stream_run(
        "t-ids",
        json!({"input": {"messages": [{"type": "human", "content": "/echo again", "id": "client-msg-1"}]}}),
    )
    .await;
    let after = ids_of(&app.state_messages("t-ids").await);
    assert_eq!(after[..ids.len()], ids[..]);
    assert_eq!(after[ids.len()], "client-msg-1");
    assert_eq!(after.len(), ids.len() + 2, "the input and the echo");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minus_one_replays_from_the_start_and_sdk_rejoin_parameters_are_accepted() {
    let app = spawn_app().await;
    let streamed = app.stream_run("t-join", demo(&DEERFLOW_MODES)).await;
    let run = run_id(&streamed.frames);
    assert_eq!(
        app.replay("t-join", &run, Some("-1"), "").await,
        streamed.frames
    );
    // What the JS SDK's joinStream sends.
    let query = "?cancel_on_disconnect=0&stream_mode=messages-tuple&stream_mode=updates&stream_mode=custom&namespace=tools&checkpoint_id=abc";
    assert_eq!(
        app.replay("t-join", &run, Some("-1"), query).await,
        streamed.frames
    );
    let query = "?cancel_on_disconnect=1&stream_mode=updates";
    let from_three = app.replay("t-join", &run, Some("3"), query).await;
    assert!(
        from_three
            .iter()
            .all(|f| ["updates", "end"].contains(&f.event.as_str()))
    );
    assert!(
        from_three
            .iter()
            .all(|f| f.id.as_deref().unwrap().parse::<u64>().unwrap() > 3)
    );

    // -2 and garbage are 422, an id the run never had 409, each with a detail.
    let last: u64 = streamed
        .frames
        .last()
        .unwrap()
        .id
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    for (cursor, status) in [
        ("-2", 422),
        ("abc", 422),
        ("", 422),
        (&(last + 1).to_string(), 409),
        ("18446744073709551615", 409),
        ("99999999999999999999999", 409),
    ] {
        let response = app.rejoin_with("t-join", &run, Some(cursor), "").await;
        assert_eq!(response.status(), status, "{cursor:?}");
        let body: Value = response.json().await.unwrap();
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("Invalid Last-Event-ID header"),
            "{detail}"
        );
    }
    let response = app
        .rejoin_with("t-join", &run, Some(&(last + 1).to_string()), "")
        .await;
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["detail"],
        format!(
            "Invalid Last-Event-ID header: event id {} is past the end of the run's stream (its last event id is {last})",
            last + 1
        )
    );
    let response = app
        .rejoin_with("t-join", &run, None, "?cancel_on_disconnect=maybe")
        .await;
    assert_eq!(response.status(), 422);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_past_a_live_runs_end_is_a_409_at_once() {
    let app = paced(200).await;
    let response = app
        .client
        .post(app.url("/api/threads/t-live/runs"))
        .json(&demo(&DEERFLOW_MODES))
        .send()
        .await
        .unwrap();
    let run: Value = response.json().await.unwrap();
    let run = run["run_id"].as_str().unwrap();
    let response = app.rejoin_with("t-live", run, Some("100000"), "").await;
    assert_eq!(response.status(), 409);
    let (_, _, record) = app
        .get_json(&format!("/api/threads/t-live/runs/{run}"))
        .await;
    assert!(
        ["pending", "running"].contains(&record["status"].as_str().unwrap()),
        "still live"
    );
    let frames = app.replay("t-live", run, Some("1"), "").await;
    assert_eq!(frames.last().unwrap().event, "end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_graph_and_schemas_answer_in_langgraphs_shapes() {
    let app = spawn_app().await;
    let (status, _, info) = app.get_json("/api/info").await;
    assert_eq!(status, 200);
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        info["flags"],
        json!({"assistants": true, "crons": false, "langsmith": false, "langsmith_tracing_replicas": false,
               "resumable_streams": true, "token_usage": true})
    );
    assert_eq!(info["host"]["kind"], "self-hosted");

    let (status, _, graph) = app
        .get_json("/api/assistants/lead_agent/graph?xray=true")
        .await;
    assert_eq!(status, 200);
    let nodes: Vec<&str> = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["__start__", "model", "tools", "__end__"]);
    let edges: Vec<(&str, &str)> = graph["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["source"].as_str().unwrap(), e["target"].as_str().unwrap()))
        .collect();
    assert_eq!(
        edges,
        [
            ("__start__", "model"),
            ("model", "tools"),
            ("model", "__end__"),
            ("tools", "model")
        ]
    );

    let (status, _, schemas) = app.get_json("/api/assistants/lead_agent/schemas").await;
    assert_eq!(status, 200);
    assert_eq!(schemas["graph_id"], "lead_agent");
    for key in [
        "input_schema",
        "output_schema",
        "state_schema",
        "config_schema",
        "context_schema",
    ] {
        assert_eq!(schemas[key]["type"], "object", "{key}");
    }
    assert_eq!(schemas["state_schema"]["required"], json!(["messages"]));
    assert!(schemas["config_schema"]["properties"]["model_name"].is_object());

    let (status, _, _) = app.get_json("/api/assistants/another/graph").await;
    assert_eq!(status, 404);
}

/// The run's records begin with `run.start`, hold exactly one `run.end` with `status`
/// and validate against our contract and both reference versions.
fn assert_lifecycle(records: &[RunEvent], status: &str) {
    assert_conforms(records);
    let kinds: Vec<&str> = records.iter().map(|r| r.event_type.as_str()).collect();
    assert_eq!(kinds[0], "run.start", "{kinds:?}");
    let ends: Vec<&RunEvent> = records
        .iter()
        .filter(|r| r.event_type == "run.end")
        .collect();
    assert_eq!(ends.len(), 1, "{kinds:?}");
    assert_eq!(
        Value::Object(ends[0].metadata.clone()),
        json!({"status": status})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_a_cancelled_and_a_timed_out_run_each_end_with_one_run_end() {
    let app = spawn_app().await;
    let streamed = app.stream_run("t-end", demo(&DEERFLOW_MODES)).await;
    let run = run_id(&streamed.frames);
    let records = app.run_events("t-end", &run).await;
    assert_lifecycle(&records, "success");
    // Task records keep the time they happened at: a task's start precedes its end
    // even though both were written in one batch.
    let task = records
        .iter()
        .find(|r| r.event_type == "subagent.start")
        .unwrap()
        .metadata["task_id"]
        .clone();
    let of_task: Vec<&RunEvent> = records
        .iter()
        .filter(|r| r.metadata.get("task_id") == Some(&task))
        .collect();
    assert_eq!(of_task.last().unwrap().event_type, "subagent.end");
    assert!(
        of_task
            .windows(2)
            .all(|w| w[0].created_at <= w[1].created_at)
    );
    assert!(of_task[0].created_at < of_task.last().unwrap().created_at);

    // Cancelled mid-run.
    let slow = paced(100).await;
    let created: Value = slow
        .client
        .post(slow.url("/api/threads/t-cancel/runs"))
        .json(&demo(&DEERFLOW_MODES))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run = created["run_id"].as_str().unwrap();
    // Cancel once the tasks are under way.
    loop {
        let records = slow
            .store
            .list_events(&EventQuery::run("t-cancel", run))
            .await
            .unwrap();
        if records.iter().any(|r| r.event_type == "subagent.step") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let response = slow
        .client
        .post(slow.url(&format!(
            "/api/threads/t-cancel/runs/{run}/cancel?wait=true"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let records = slow.run_events("t-cancel", run).await;
    assert_lifecycle(&records, "interrupted");
    assert_eq!(
        records
            .iter()
            .filter(|r| r.event_type == "subagent.end")
            .count(),
        3
    );

    // Past the run timeout.
    let timed = spawn_app_with(Options {
        delay_ms: 100,
        configure: Box::new(|app| app.run_timeout = Duration::from_millis(300)),
        ..Options::default()
    })
    .await;
    let streamed = timed.stream_run("t-timeout", demo(&DEERFLOW_MODES)).await;
    let run = run_id(&streamed.frames);
    let records = timed.run_events("t-timeout", &run).await;
    assert_lifecycle(&records, "timeout");
    let (_, _, record) = timed
        .get_json(&format!("/api/threads/t-timeout/runs/{run}"))
        .await;
    assert_eq!(record["status"], "timeout");
}
