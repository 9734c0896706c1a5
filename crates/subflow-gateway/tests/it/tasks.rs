//! `GET …/runs/{run_id}/tasks` (docs/api.md#task-summaries) over HTTP: finished and stopped runs, counts
//! equal to what a card lists, cost at the model's price, 404s and 422s.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use subflow_contracts::task_card::{self, CardStatus};

use crate::{Options, TestApp, parse_frames, spawn_app, spawn_app_with};

/// The steps an expanded card lists for `task`, from the `/events` backfill.
async fn listed_steps(
    app: &TestApp,
    thread: &str,
    run: &str,
    task: &str,
    status: CardStatus,
) -> Vec<task_card::Step> {
    let path = task_card::backfill_path(thread, run, task, None);
    let (status_code, _, records) = app.get_json(&path).await;
    assert_eq!(status_code, 200);
    task_card::display_steps(&task_card::backfill_steps(&records, task), status)
}

/// The scripted price of the test app: 2 per million input, 8 per million output.
/// A task usage at the test gateway's prices (2 in, 0.5 cache read, 2.5 cache write, 8
/// out per million), written out here so a change to the shared price function shows.
fn scripted_cost(usage: &Value) -> f64 {
    let count = |key: &str| usage[key].as_f64().unwrap_or(0.0);
    let (read, written) = (count("cache_read_tokens"), count("cache_write_tokens"));
    let uncached = count("input_tokens") - read - written;
    let amount = uncached * 2.0 + read * 0.5 + written * 2.5 + count("output_tokens") * 8.0;
    (amount / 1e6 * 1e6).round() / 1e6
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_demo_run_has_one_summary_per_card_counting_what_the_card_lists() {
    let app = spawn_app().await;
    let streamed = app
        .stream_run(
            "t-tasks",
            json!({"input": {"messages": [{"role": "user", "content": "Compare two queues"}]}}),
        )
        .await;
    let run = streamed.frames[0].data["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, headers, tasks) = app
        .get_json(&format!("/api/threads/t-tasks/runs/{run}/tasks"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(headers.get_all("x-trace-id").iter().count(), 1);
    let tasks = tasks.as_array().unwrap().clone();
    assert_eq!(tasks.len(), 3, "{tasks:#?}");

    // Start order is the order of the lead's task calls.
    let (_, _, events) = app
        .get_json(&format!(
            "/api/threads/t-tasks/runs/{run}/events?event_types=subagent.start"
        ))
        .await;
    let started: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["metadata"]["task_id"].as_str().unwrap())
        .collect();
    let ids: Vec<&str> = tasks
        .iter()
        .map(|t| t["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, started);

    for task in &tasks {
        let id = task["task_id"].as_str().unwrap();
        assert_eq!(task["status"], "completed");
        assert_eq!(task["subagent_type"], "general-purpose");
        assert_eq!(task["model_name"], "scripted");
        assert!(task["description"].as_str().is_some_and(|d| !d.is_empty()));
        let listed = listed_steps(&app, "t-tasks", &run, id, CardStatus::Completed).await;
        assert_eq!(
            task["step_count"],
            listed.len(),
            "{id}: the count is what the card lists"
        );
        assert_eq!(listed.len(), 2, "the demo's two tool steps");
        let last = listed.last().unwrap();
        assert_eq!(
            task["latest_step"],
            json!({"kind": "tool", "text": last.text, "tool_name": last.tool_name})
        );
        assert_eq!(
            task["result_step"]["kind"], "ai",
            "the answer, which a completed card does not list"
        );
        assert!(task["usage"]["total_tokens"].as_u64().unwrap() > 0);
        assert!(
            task["usage"]["cache_read_tokens"].as_u64().unwrap() > 0,
            "the demo's subagents read their repeated prefixes from the cache: {}",
            task["usage"]
        );
        assert_eq!(task["cost"]["currency"], "USD");
        assert_eq!(
            task["cost"]["total"].as_f64().unwrap(),
            scripted_cost(&task["usage"])
        );
        assert!(task["started_at"].as_str().unwrap() <= task["ended_at"].as_str().unwrap());
        assert!(task["result_brief"].as_str().is_some_and(|r| !r.is_empty()));
        assert_eq!(task["error"], Value::Null);
        assert_eq!(task["stop_reason"], Value::Null);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_runs_are_404_and_bad_thread_ids_422() {
    let app = spawn_app().await;
    app.stream_run(
        "t-known",
        json!({"input": {"messages": [{"role": "user", "content": "/echo hi"}]}}),
    )
    .await;
    let (status, _, body) = app.get_json("/api/threads/t-known/runs/nope/tasks").await;
    assert_eq!(
        (status, body),
        (404, json!({"detail": "Run nope not found"}))
    );
    let (status, _, body) = app.get_json("/api/threads/t-unknown/runs/nope/tasks").await;
    assert_eq!(
        (status, body),
        (404, json!({"detail": "Thread t-unknown not found"}))
    );
    let (status, _, body) = app.get_json("/api/threads/bad%20id/runs/r/tasks").await;
    assert_eq!(status, 422);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .starts_with("Invalid thread_id")
    );
    // A run without tasks has none.
    let (_, _, runs) = app.get_json("/api/threads/t-known/runs").await;
    let run = runs[0]["run_id"].as_str().unwrap();
    let (status, _, body) = app
        .get_json(&format!("/api/threads/t-known/runs/{run}/tasks"))
        .await;
    assert_eq!((status, body), (200, json!([])));
}

/// Starts a slow demo run in `thread`, reads its stream until every task has streamed a
/// tool step, checks the running summaries, then stops it; returns the run id.
pub async fn stopped_demo_run(app: &TestApp, thread: &str) -> String {
    let mut response = app
        .client
        .post(app.url(&format!("/api/threads/{thread}/runs/stream")))
        .json(&json!({"input": {"messages": [{"role": "user", "content": "Compare two queues"}]}, "stream_mode": ["custom"]}))
        .send()
        .await
        .unwrap();
    let mut seen = String::new();
    let mut stepped: HashSet<String> = HashSet::new();
    while stepped.len() < 3 {
        let chunk = response
            .chunk()
            .await
            .unwrap()
            .expect("the run streams until stopped");
        seen.push_str(&String::from_utf8_lossy(&chunk));
        let Some(end) = seen.rfind("\n\n") else {
            continue;
        };
        for frame in parse_frames(&seen[..end]) {
            // A tool step: one a card lists, whatever the stop cuts off after it.
            if frame.event == "custom"
                && frame.data["type"] == "task_running"
                && frame.data["message"]["type"] == "tool"
            {
                stepped.insert(frame.data["task_id"].as_str().unwrap().to_owned());
            }
        }
    }
    let run = parse_frames(&seen)[0].data["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, _, running) = app
        .get_json(&format!("/api/threads/{thread}/runs/{run}/tasks"))
        .await;
    for task in running.as_array().unwrap() {
        if task["ended_at"].is_null() {
            assert_eq!(
                task["status"], "running",
                "a task of an active run without an end runs"
            );
        }
    }
    let cancelled = app
        .client
        .post(app.url(&format!(
            "/api/threads/{thread}/runs/{run}/cancel?wait=true"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 202);
    while response.chunk().await.unwrap().is_some() {}
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_run_keeps_the_usage_and_steps_of_its_cancelled_tasks() {
    let app = spawn_app_with(Options {
        delay_ms: 150,
        ..Options::default()
    })
    .await;
    let run = stopped_demo_run(&app, "t-stop").await;
    let (_, _, record) = app
        .get_json(&format!("/api/threads/t-stop/runs/{run}"))
        .await;
    assert_eq!(record["status"], "interrupted");
    // A run object carries its own cost, whatever its status.
    assert_eq!(record["cost"]["currency"], "USD");
    assert!(record["cost"]["total"].as_f64().unwrap() > 0.0);
    let (status, _, tasks) = app
        .get_json(&format!("/api/threads/t-stop/runs/{run}/tasks"))
        .await;
    assert_eq!(status, 200);
    let tasks = tasks.as_array().unwrap().clone();
    assert_eq!(tasks.len(), 3);
    let mut statuses = HashMap::new();
    for task in &tasks {
        let id = task["task_id"].as_str().unwrap();
        *statuses
            .entry(task["status"].as_str().unwrap().to_owned())
            .or_insert(0) += 1;
        assert!(
            task["usage"]["total_tokens"].as_u64().unwrap() > 0,
            "{id}: the end record's usage"
        );
        assert_eq!(
            task["cost"]["total"].as_f64().unwrap(),
            scripted_cost(&task["usage"])
        );
        // No ToolMessage answers a stopped task, so its card shows it failed.
        let listed = listed_steps(&app, "t-stop", &run, id, CardStatus::Failed).await;
        let result = usize::from(!task["result_step"].is_null());
        assert_eq!(
            task["step_count"].as_u64().unwrap() as usize + result,
            listed.len(),
            "{id}"
        );
        assert!(
            !listed.is_empty(),
            "{id}: it streamed a step before the stop"
        );
    }
    assert!(statuses.contains_key("cancelled"), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_usage_shows_what_stopped_runs_spent_beside_the_counted_totals() {
    let app = spawn_app_with(Options {
        delay_ms: 150,
        ..Options::default()
    })
    .await;
    let run = stopped_demo_run(&app, "t-spent").await;
    let (_, _, record) = app
        .get_json(&format!("/api/threads/t-spent/runs/{run}"))
        .await;
    let spent = record["total_tokens"].as_i64().unwrap();
    assert!(spent > 0, "the stopped run spent tokens: {record}");
    let (status, _, usage) = app.get_json("/api/threads/t-spent/token-usage").await;
    assert_eq!(status, 200);
    assert_eq!(
        (usage["total_runs"].as_i64(), usage["total_tokens"].as_i64()),
        (Some(0), Some(0)),
        "the reference rule stays"
    );
    let stopped = &usage["stopped_runs"];
    assert_eq!(stopped["runs"], 1);
    assert_eq!(stopped["total_tokens"], spent);
    assert_eq!(stopped["total_input_tokens"], record["total_input_tokens"]);
    assert_eq!(
        stopped["total_output_tokens"],
        record["total_output_tokens"]
    );
    assert_eq!(
        stopped["by_caller"],
        json!({"lead_agent": record["lead_agent_tokens"], "subagent": record["subagent_tokens"], "middleware": record["middleware_tokens"]})
    );
    assert_eq!(stopped["cost"]["currency"], "USD");
    assert!(stopped["cost"]["total"].as_f64().unwrap() > 0.0);

    // A later run that succeeds is counted; the stopped one stays beside it.
    app.stream_run(
        "t-spent",
        json!({"input": {"messages": [{"role": "user", "content": "/echo done"}]}}),
    )
    .await;
    let (_, _, usage) = app.get_json("/api/threads/t-spent/token-usage").await;
    assert_eq!(usage["total_runs"], 1);
    assert_eq!(usage["stopped_runs"]["total_tokens"], spent);
}
