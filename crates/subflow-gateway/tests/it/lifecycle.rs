//! Cancel, rollback, heartbeats, thread state, history, search and delete.

use std::time::Duration;

use serde_json::{Value, json};

use crate::{Options, parse_frames, spawn_app, spawn_app_with};

/// Starts a streamed run and reads until its `metadata` frame; returns the run id and
/// the response, whose body holds the rest of the stream.
async fn start_streaming(
    app: &crate::TestApp,
    thread: &str,
    body: Value,
) -> (String, reqwest::Response, String) {
    let mut response = app
        .client
        .post(app.url(&format!("/api/threads/{thread}/runs/stream")))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut seen = String::new();
    while !seen.contains("\n\n") {
        let chunk = response.chunk().await.unwrap().expect("the stream starts");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let metadata = parse_frames(&seen).into_iter().next().unwrap();
    assert_eq!(metadata.event, "metadata");
    (
        metadata.data["run_id"].as_str().unwrap().to_owned(),
        response,
        seen,
    )
}

async fn read_rest(mut response: reqwest::Response, mut seen: String) -> String {
    while let Some(chunk) = response.chunk().await.unwrap() {
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_interrupts_a_streaming_run_which_still_ends_its_stream() {
    let app = spawn_app_with(Options {
        delay_ms: 150,
        ..Options::default()
    })
    .await;
    let (run_id, response, seen) = start_streaming(&app, "t-cancel", json!({"input": {"messages": [{"role": "user", "content": "Plan a long trip"}]}, "stream_mode": ["custom"]})).await;
    let cancelled = app
        .client
        .post(app.url(&format!(
            "/api/threads/t-cancel/runs/{run_id}/cancel?wait=true"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 202);
    assert_eq!(cancelled.text().await.unwrap(), "");
    let frames = parse_frames(&read_rest(response, seen).await);
    assert_eq!(frames.last().unwrap().event, "end");
    let (_, _, run) = app
        .get_json(&format!("/api/threads/t-cancel/runs/{run_id}"))
        .await;
    assert_eq!(run["status"], "interrupted");
    let unknown = app
        .client
        .post(app.url("/api/threads/t-cancel/runs/nope/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let bad = app
        .client
        .post(app.url(&format!(
            "/api/threads/t-cancel/runs/{run_id}/cancel?action=explode"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 422);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_deletes_the_run_its_events_and_its_checkpoints() {
    let app = spawn_app().await;
    let streamed = app
        .stream_run(
            "t-rb",
            json!({"input": {"messages": [{"role": "user", "content": "/echo keep"}]}}),
        )
        .await;
    let first = streamed.frames[0].data["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let streamed = app
        .stream_run(
            "t-rb",
            json!({"input": {"messages": [{"role": "user", "content": "/echo drop"}]}}),
        )
        .await;
    let second = streamed.frames[0].data["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, _, history) = app.get_json("/api/threads/t-rb/history?limit=100").await;
    let before = history.as_array().unwrap().len();
    let rolled = app
        .client
        .post(app.url(&format!(
            "/api/threads/t-rb/runs/{second}/cancel?action=rollback&wait=true"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(rolled.status(), 202);
    let (status, _, _) = app
        .get_json(&format!("/api/threads/t-rb/runs/{second}"))
        .await;
    assert_eq!(status, 404);
    let (_, _, events) = app
        .get_json(&format!("/api/threads/t-rb/runs/{second}/events"))
        .await;
    assert_eq!(events, json!([]));
    let (_, _, history) = app.get_json("/api/threads/t-rb/history?limit=100").await;
    assert!(history.as_array().unwrap().len() < before);
    let (_, _, state) = app.get_json("/api/threads/t-rb/state").await;
    let last = state["values"]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        last["content"], "echo: keep",
        "the state is the first run's again"
    );
    let (status, _, _) = app
        .get_json(&format!("/api/threads/t-rb/runs/{first}"))
        .await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_streams_carry_heartbeats_without_ids() {
    let app = spawn_app_with(Options {
        delay_ms: 60,
        heartbeat: Duration::from_millis(100),
        ..Options::default()
    })
    .await;
    let streamed = app.stream_run("t-hb", json!({"input": {"messages": [{"role": "user", "content": "Think slowly"}]}, "stream_mode": ["custom"]})).await;
    assert!(
        streamed.text.contains(": heartbeat\n\n"),
        "no heartbeat in {} bytes",
        streamed.text.len()
    );
    let ids: Vec<u64> = streamed
        .frames
        .iter()
        .map(|f| f.id.as_deref().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        ids,
        (1..=streamed.frames.len() as u64).collect::<Vec<_>>(),
        "heartbeats take no id"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_are_searched_read_as_state_and_history_and_deleted() {
    let app = spawn_app().await;
    for (id, project) in [("t-a", "x"), ("t-b", "y"), ("t-c", "x")] {
        let created = app
            .client
            .post(app.url("/api/threads"))
            .json(&json!({"thread_id": id, "metadata": {"project": project}}))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), 200);
    }
    let duplicate = app
        .client
        .post(app.url("/api/threads"))
        .json(&json!({"thread_id": "t-a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(duplicate.status(), 409);
    let kept = app
        .client
        .post(app.url("/api/threads"))
        .json(&json!({"thread_id": "t-a", "if_exists": "do_nothing"}))
        .send()
        .await
        .unwrap();
    assert_eq!(kept.status(), 200);
    let found: Value = app
        .client
        .post(app.url("/api/threads/search"))
        .json(&json!({"metadata": {"project": "x"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = found
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["thread_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["t-c", "t-a"], "newest first");

    app.stream_run(
        "t-a",
        json!({"input": {"messages": [{"role": "user", "content": "/echo one"}]}}),
    )
    .await;
    let (_, _, state) = app.get_json("/api/threads/t-a/state").await;
    assert_eq!(state["checkpoint"]["checkpoint_ns"], "");
    assert_eq!(state["values"]["messages"].as_array().unwrap().len(), 2);
    assert!(state["metadata"]["deerflow_trace_id"].is_string());
    let history: Value = app
        .client
        .post(app.url("/api/threads/t-a/history"))
        .json(&json!({"limit": 2}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let history = history.as_array().unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(
        history[0]["checkpoint"]["checkpoint_id"], state["checkpoint"]["checkpoint_id"],
        "newest first"
    );
    let (_, _, empty) = app.get_json("/api/threads/t-none/state").await;
    assert_eq!(empty["values"]["messages"], json!([]));

    let deleted = app
        .client
        .delete(app.url("/api/threads/t-a"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let (status, _, body) = app.get_json("/api/threads/t-a").await;
    assert_eq!(
        (status, body["detail"].as_str()),
        (404, Some("Thread t-a not found"))
    );
    let again = app
        .client
        .delete(app.url("/api/threads/t-a"))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404);
}

/// Polls the run until it leaves `pending`/`running` (bounded).
async fn final_status(app: &crate::TestApp, thread: &str, run_id: &str) -> String {
    for _ in 0..200 {
        let (_, _, run) = app
            .get_json(&format!("/api/threads/{thread}/runs/{run_id}"))
            .await;
        let status = run["status"].as_str().unwrap().to_owned();
        if status != "running" && status != "pending" {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("run {run_id} did not finish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_client_cancels_the_run_unless_it_asked_to_continue() {
    let app = spawn_app_with(Options {
        delay_ms: 40,
        ..Options::default()
    })
    .await;
    let body = |mode: &str| json!({"input": {"messages": [{"role": "user", "content": "Write a long plan"}]}, "stream_mode": ["custom"], "on_disconnect": mode});
    let (cancelled_run, response, _) = start_streaming(&app, "t-dc1", body("cancel")).await;
    drop(response);
    assert_eq!(
        final_status(&app, "t-dc1", &cancelled_run).await,
        "interrupted"
    );
    let (continued_run, response, _) = start_streaming(&app, "t-dc2", body("continue")).await;
    drop(response);
    assert_eq!(final_status(&app, "t-dc2", &continued_run).await, "success");
}

/// `multitask_strategy`: `reject` is 409 while a run is active; `interrupt` stops it and
/// keeps its record; `rollback` stops it and erases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multitask_strategies_reject_interrupt_or_roll_back_the_active_run() {
    let app = spawn_app_with(Options {
        delay_ms: 150,
        ..Options::default()
    })
    .await;
    let long = json!({"input": {"messages": [{"role": "user", "content": "Plan a long trip"}]}, "stream_mode": ["custom"], "on_disconnect": "continue"});
    let (first, first_stream, _) = start_streaming(&app, "t-mt", long.clone()).await;

    let rejected = app
        .client
        .post(app.url("/api/threads/t-mt/runs/wait"))
        .json(&json!({"input": {"messages": [{"role": "user", "content": "/echo no"}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(rejected.status(), 409);
    let detail: Value = rejected.json().await.unwrap();
    assert!(detail["detail"].as_str().unwrap().contains("active run"));

    let (second, second_stream, _) = start_streaming(
        &app,
        "t-mt",
        json!({"input": {"messages": [{"role": "user", "content": "Plan a long trip"}]}, "stream_mode": ["custom"], "on_disconnect": "continue", "multitask_strategy": "interrupt"}),
    )
    .await;
    drop(first_stream);
    let (_, _, run) = app
        .get_json(&format!("/api/threads/t-mt/runs/{first}"))
        .await;
    assert_eq!(run["status"], "interrupted", "interrupt keeps the old run");

    let waited = app
        .client
        .post(app.url("/api/threads/t-mt/runs/wait"))
        .json(&json!({"input": {"messages": [{"role": "user", "content": "/echo after"}]}, "multitask_strategy": "rollback"}))
        .send()
        .await
        .unwrap();
    assert_eq!(waited.status(), 200);
    drop(second_stream);
    let (status, _, _) = app
        .get_json(&format!("/api/threads/t-mt/runs/{second}"))
        .await;
    assert_eq!(status, 404, "rollback erased the run it stopped");
    let (_, _, events) = app
        .get_json(&format!("/api/threads/t-mt/runs/{second}/events"))
        .await;
    assert_eq!(events, json!([]));
    let (_, _, runs) = app.get_json("/api/threads/t-mt/runs?limit=10").await;
    let statuses: Vec<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["success", "interrupted"]);
}
