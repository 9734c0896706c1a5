//! Stopping one task of a run through `POST …/tasks/{task_id}/cancel`: the subagent ends
//! `cancelled` with its usage, the run's other tasks complete, the lead's answer names
//! all three outcomes, and the thread's token usage counts the cancelled task's tokens;
//! on one SQLite gateway and across two gateways sharing a PostgreSQL database.

use std::time::Duration;

use serde_json::{Value, json};
use subflow_store_postgres::testing::TestDb;

use crate::TestApp;
use crate::resume::{PATIENCE, demo_request, postgres_gateway, sqlite_gateway};

/// Runs the demo on `owner`, cancels its first task mid-step through `other`, and checks
/// every surface of the outcome.
async fn one_task_cancelled(owner: &TestApp, other: &TestApp, thread: &str) {
    let (run_id, _, mut sse) = owner
        .start_run(thread, demo_request(&["custom"], "continue"))
        .await;
    // Wait until all three tasks started and the first is stepping.
    let mut started = Vec::new();
    let victim = loop {
        let frame = tokio::time::timeout(PATIENCE, sse.next())
            .await
            .expect("frames keep coming")
            .expect("the run is still going");
        let event = &frame.data;
        if event["type"] == "task_started" {
            started.push(event["task_id"].as_str().unwrap().to_owned());
        }
        if started.len() == 3 && event["type"] == "task_running" && event["task_id"] == started[0] {
            break started[0].clone();
        }
    };
    let cancel = |task: &str| {
        other.client.post(other.url(&format!(
            "/api/threads/{thread}/runs/{run_id}/tasks/{task}/cancel"
        )))
    };
    let response = cancel(&victim).send().await.unwrap();
    assert_eq!(response.status(), 202);
    let accepted: Value = response.json().await.unwrap();
    assert_eq!(
        accepted,
        json!({"thread_id": thread, "run_id": run_id, "task_id": victim})
    );
    let rest = sse.rest().await;
    assert_eq!(rest.last().map(|f| f.event.as_str()), Some("end"));
    let terminal = |task: &str| {
        rest.iter()
            .filter(|f| f.data["task_id"] == task)
            .filter_map(|f| f.data["type"].as_str())
            .filter(|kind| *kind != "task_running")
            .collect::<Vec<_>>()
    };
    assert_eq!(terminal(&victim), ["task_cancelled"]);
    for task in &started[1..] {
        assert_eq!(terminal(task), ["task_completed"], "{task}");
    }
    let run = owner.finished_run(thread, &run_id).await;
    assert_eq!(run["status"], "success", "the run went on");

    // The persisted ends: cancelled with its usage, the others completed.
    let (_, _, ends) = owner
        .get_json(&format!(
            "/api/threads/{thread}/runs/{run_id}/events?event_types=subagent.end"
        ))
        .await;
    let ends = ends.as_array().unwrap();
    assert_eq!(ends.len(), 3);
    let mut subagent_tokens = 0;
    for end in ends {
        let content = &end["content"];
        let expected = if content["task_id"] == victim.as_str() {
            "cancelled"
        } else {
            "completed"
        };
        assert_eq!(content["status"], expected, "{content}");
        subagent_tokens += content["usage"]["total_tokens"].as_i64().unwrap();
    }
    let cancelled_end = ends
        .iter()
        .find(|e| e["content"]["task_id"] == victim.as_str())
        .unwrap();
    assert!(
        cancelled_end["content"]["usage"]["total_tokens"]
            .as_i64()
            .unwrap()
            > 0,
        "the cancelled task's usage so far is kept"
    );

    // The lead got the contract ToolMessage and named every outcome.
    let (_, _, state) = owner
        .get_json(&format!("/api/threads/{thread}/state"))
        .await;
    let messages = state["values"]["messages"].as_array().unwrap();
    let tool = messages
        .iter()
        .find(|m| m["type"] == "tool" && m["tool_call_id"] == victim.as_str())
        .unwrap();
    assert_eq!(tool["additional_kwargs"]["subagent_status"], "cancelled");
    assert!(
        tool["content"]
            .as_str()
            .unwrap()
            .contains("Task cancelled by user."),
        "{tool}"
    );
    let answer = messages.last().unwrap()["content"].as_str().unwrap();
    assert!(
        answer.contains(&format!("[{victim}]: “Task cancelled by user.”")),
        "{answer}"
    );
    for task in &started[1..] {
        assert!(answer.contains(&format!("[{task}]: “")), "{answer}");
    }

    // The thread's usage counts the cancelled task's tokens.
    let (_, _, usage) = owner
        .get_json(&format!("/api/threads/{thread}/token-usage"))
        .await;
    assert_eq!(usage["by_caller"]["subagent"], subagent_tokens, "{usage}");

    // Once ended, a task cannot be cancelled again; an unknown one is not found.
    let again = cancel(&victim).send().await.unwrap();
    assert_eq!(again.status(), 409);
    let detail: Value = again.json().await.unwrap();
    assert_eq!(
        detail["detail"],
        format!("Task {victim} has already ended (cancelled)")
    );
    let unknown = cancel("call_unknown").send().await.unwrap();
    assert_eq!(unknown.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_task_of_three_is_cancelled_and_the_run_goes_on_sqlite() {
    let (app, _dir) = sqlite_gateway(60).await;
    one_task_cancelled(&app, &app, "t-task-cancel").await;
    // A run that is not there, and a thread that is not.
    let response = app
        .client
        .post(app.url("/api/threads/t-task-cancel/runs/nope/tasks/x/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let response = app
        .client
        .post(app.url("/api/threads/nope/runs/nope/tasks/x/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_cancel_received_by_another_gateway_stops_the_task_where_it_runs() {
    let db = TestDb::new().await;
    let owner = postgres_gateway(&db.url, 60, Duration::from_secs(30)).await;
    let other = postgres_gateway(&db.url, 0, Duration::from_secs(30)).await;
    one_task_cancelled(&owner, &other, "t-pg-task-cancel").await;
}
