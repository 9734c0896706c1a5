//! A store that refuses every write for a while mid-run (a full disk, as PostgreSQL
//! reports it): cancel and a multitask interrupt still answer, and once the store takes
//! writes again the run ends without a restart (`interrupted` when it was cancelled,
//! else `error` with `store_unavailable`), its checkpointed messages are kept, and the
//! thread takes new runs.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use subflow_store::Store;
use subflow_store_postgres::testing::{FullDisk, TestDb};

use crate::{Options, TestApp, spawn_app_with};

/// Bounds every wait, so a stuck run fails the test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(60);

fn demo(strategy: &str) -> Value {
    json!({"input": {"messages": [{"role": "user", "content": "Compare three storage engines"}]},
           "stream_mode": ["custom"], "multitask_strategy": strategy})
}

async fn post(app: &TestApp, path: &str, body: &Value) -> (u16, Value) {
    let response = tokio::time::timeout(PATIENCE, app.client.post(app.url(path)).json(body).send())
        .await
        .unwrap_or_else(|_| panic!("POST {path} answers"))
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn run_record(app: &TestApp, thread: &str, run: &str) -> Value {
    app.get_json(&format!("/api/threads/{thread}/runs/{run}"))
        .await
        .2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_writes_fail_ends_error_once_the_store_heals_and_the_thread_runs_again() {
    outage(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_while_its_writes_fail_ends_interrupted_once_the_store_heals() {
    outage(true).await;
}

/// The run's writes fail from its first task step on; with `cancel` it is cancelled
/// during the outage (and a multitask interrupt is tried), else it runs to its end.
async fn outage(cancel: bool) {
    let db = TestDb::new().await;
    let store: Arc<dyn Store> = Arc::new(db.store.clone());
    let app = spawn_app_with(Options {
        delay_ms: 40,
        store: Some(store),
        ..Options::default()
    })
    .await;
    let (status, run) = post(&app, "/api/threads/t-full/runs", &demo("reject")).await;
    assert_eq!(status, 200, "{run}");
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let under_way = async {
        loop {
            let (_, _, page) = app
                .get_json(&format!(
                    "/api/threads/t-full/runs/{run_id}/events?limit=500"
                ))
                .await;
            if page
                .as_array()
                .is_some_and(|events| events.iter().any(|e| e["event_type"] == "subagent.step"))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(PATIENCE, under_way)
        .await
        .expect("the tasks start");

    FullDisk::fill(&db.store).await;
    if cancel {
        // Cancel answers although the run cannot store its end.
        let (status, _) = post(
            &app,
            &format!("/api/threads/t-full/runs/{run_id}/cancel?wait=true"),
            &json!({}),
        )
        .await;
        assert_eq!(status, 202);
        // So does a run that interrupts it: the new run cannot be stored, and says so.
        let (status, body) = post(&app, "/api/threads/t-full/runs", &demo("interrupt")).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["detail"], "Run event store not available");
    } else {
        // The demo's work takes about a second at 40 ms a step: it ends in memory, its
        // final writes waiting for the store.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let record = run_record(&app, "t-full", &run_id).await;
    assert!(
        matches!(record["status"].as_str(), Some("running" | "pending")),
        "nothing could be written yet: {record}"
    );

    FullDisk::heal(&db.store).await;
    let ended = async {
        loop {
            let record = run_record(&app, "t-full", &run_id).await;
            if !matches!(record["status"].as_str(), Some("running" | "pending")) {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let record = tokio::time::timeout(PATIENCE, ended)
        .await
        .expect("the run ends once the store takes writes, without a restart");
    if cancel {
        assert_eq!(record["status"], "interrupted", "{record}");
        assert_eq!(record["stop_reason"], Value::Null, "{record}");
    } else {
        assert_eq!(record["status"], "error", "{record}");
        assert_eq!(record["stop_reason"], "store_unavailable", "{record}");
        assert!(
            record["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("The store refused the run's writes")),
            "{record}"
        );
    }

    // The messages checkpointed before the disk filled are kept, and the run's own.
    let (status, _, joined) = app
        .get_json(&format!("/api/threads/t-full/runs/{run_id}/join"))
        .await;
    assert_eq!(status, 200);
    let messages = joined["messages"].as_array().unwrap();
    assert_eq!(messages[0]["content"], "Compare three storage engines");
    assert!(messages.len() > 1, "the run's messages: {joined}");
    let (_, _, state) = app.get_json("/api/threads/t-full/state").await;
    assert_eq!(state["values"]["messages"], joined["messages"]);

    // The thread takes new runs.
    let streamed = app.stream_run("t-full", demo("reject")).await;
    assert_eq!(streamed.status, 200, "{}", streamed.text);
    assert_eq!(streamed.frames.last().unwrap().event, "end");
    assert!(!streamed.frames.iter().any(|f| f.event == "error"));
}
