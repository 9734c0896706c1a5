//! A real batch worker on the gateway's own store and runtime, driven one step at a time
//! (`claim_and_run_once`), watched through the routes: `/batch` items run to completion,
//! leave nothing in the submitting run (docs/batches.md#observability), and an admission refusal gives the
//! attempt back (docs/batches.md#item-states).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::{Value, json};
use subflow_batches::{Step, Worker};
use subflow_runtime::admission::{AdmissionConfig, AdmissionPolicy};
use subflow_runtime::observers::{ObserverOutcome, ObserverSet, TaskInfo, TaskObserver};

use crate::metrics::{parse, scrape};
use crate::{Options, TestApp, spawn_app_with_worker};

/// Every observer call, as `start <agent>` / `stop <agent>`.
#[derive(Debug, Default)]
struct Heard(Mutex<Vec<String>>);

#[async_trait]
impl TaskObserver for Heard {
    async fn on_task_start(&self, info: &TaskInfo) {
        let agent = info.agent_name.clone().unwrap_or_default();
        self.0.lock().unwrap().push(format!("start {agent}"));
    }
    async fn on_task_stop(&self, info: &TaskInfo, _outcome: ObserverOutcome) {
        let agent = info.agent_name.clone().unwrap_or_default();
        self.0.lock().unwrap().push(format!("stop {agent}"));
    }
}

/// A gateway on SQLite whose runtime has `admission` and `observer`, and a worker on
/// the same store and runtime.
async fn with_worker(admission: AdmissionConfig, observer: Arc<Heard>) -> (TestApp, Worker) {
    spawn_app_with_worker(Options {
        configure: Box::new(move |app| {
            app.runtime.admission = admission;
            app.runtime.observers = ObserverSet::new().with_observer(observer);
        }),
        ..Options::default()
    })
    .await
}

async fn get(app: &TestApp, path: &str) -> Value {
    app.get_json(path).await.2
}

async fn wait_run(app: &TestApp, thread: &str, prompt: &str) -> Value {
    let response = app
        .client
        .post(app.url(&format!("/api/threads/{thread}/runs/wait")))
        .json(&json!({"input": {"messages": [{"role": "user", "content": prompt}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// Steps the worker until a pass claims nothing and nothing runs.
async fn run_until_idle(worker: &mut Worker) {
    loop {
        let step = worker.claim_and_run_once().await.unwrap();
        worker.wait_idle().await;
        if matches!(step, Step::Pass { claimed: 0, .. }) {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slash_batch_items_run_to_completion_and_leave_nothing_in_the_submitting_run() {
    let heard = Arc::new(Heard::default());
    let (app, mut worker) = with_worker(AdmissionConfig::default(), heard.clone()).await;
    wait_run(&app, "t1", "/batch general-purpose\nfirst\nsecond\nthird").await;
    let runs = get(&app, "/api/threads/t1/runs").await;
    let run_id = runs[0]["run_id"].as_str().unwrap().to_owned();
    let events_before = get(&app, &format!("/api/threads/t1/runs/{run_id}/events")).await;
    let usage_before = get(&app, "/api/threads/t1/token-usage").await;
    let heard_before = heard.0.lock().unwrap().clone();
    assert_eq!(heard_before, ["start lead_agent", "stop lead_agent"]);
    let spent_before = parse(&scrape(&app).await).sum("subflow_cost_total", &[]);

    run_until_idle(&mut worker).await;
    let batches = get(&app, "/api/threads/t1/subagent-batches").await;
    let batch = &batches[0];
    assert_eq!(batch["status"], "completed");
    assert_eq!(batch["counts"]["succeeded"], 3);
    let id = batch["id"].as_str().unwrap();
    let export = app
        .client
        .get(app.url(&format!(
            "/api/threads/t1/subagent-batches/{id}/results.jsonl"
        )))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lines: Vec<Value> = export
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (line, prompt) in lines.iter().zip(["first", "second", "third"]) {
        let key = line["item_key"].as_str().unwrap();
        let result = line["result"].as_str().unwrap();
        // The built-in subagent echoes what it got: the preamble, then the item prompt.
        assert!(
            result.starts_with(&format!(
                "echo: [Durable batch item \"{key}\"] This item may be executed more than once"
            )),
            "{result}"
        );
        assert!(result.ends_with(prompt), "{result}");
        assert_eq!(
            (line["status"].as_str(), line["attempt"].as_u64()),
            (Some("succeeded"), Some(1))
        );
        assert_eq!(line["model_name"], "scripted");
        assert!(line["token_usage"]["total_tokens"].as_u64().unwrap() > 0);
    }
    // docs/batches.md#observability: no run events, no observer calls, no usage in /token-usage.
    let events_after = get(&app, &format!("/api/threads/t1/runs/{run_id}/events")).await;
    assert_eq!(events_after, events_before);
    assert!(
        events_after
            .as_array()
            .unwrap()
            .iter()
            .all(|e| !e["event_type"].as_str().unwrap().starts_with("subagent."))
    );
    // Their spend is reported beside the totals, in `batches`, and only there.
    let mut usage_after = get(&app, "/api/threads/t1/token-usage").await;
    let section = usage_after.as_object_mut().unwrap().remove("batches");
    let mut usage_before = usage_before;
    let empty = usage_before.as_object_mut().unwrap().remove("batches");
    assert_eq!(usage_after, usage_before);
    assert_eq!(
        empty,
        Some(json!({"items": 0, "total_tokens": 0, "cost": null}))
    );
    let section = section.unwrap();
    let item_tokens: u64 = lines
        .iter()
        .map(|l| l["token_usage"]["total_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(section["items"], 3);
    assert_eq!(section["total_tokens"], item_tokens);
    assert_eq!(section["cost"]["currency"], "USD");
    assert_eq!(section["cost"]["total"], batch["cost"]["total"]);
    // The finished batch's progress: summed usage, its cost, the pace of the last five
    // minutes, no ETA and a projection that is the cost itself.
    assert_eq!(batch["usage"]["total_tokens"], item_tokens);
    assert!(batch["cost"]["total"].as_f64().unwrap() > 0.0, "{batch}");
    assert!(batch["items_per_minute"].as_f64().unwrap() > 0.0, "{batch}");
    assert_eq!(batch["eta_seconds"], Value::Null);
    assert_eq!(batch["projected_cost"], batch["cost"]["total"]);
    // `subflow_cost_total` counts the items' spend too, priced by the same function, under
    // the provider's model id as runs' spend is.
    let metrics = parse(&scrape(&app).await);
    let items_spent = metrics.sum("subflow_cost_total", &[]) - spent_before;
    assert!(
        (items_spent - batch["cost"]["total"].as_f64().unwrap()).abs() < 1e-6,
        "{items_spent} against {}",
        batch["cost"]
    );
    assert!(metrics.sum("subflow_cost_total", &[("model", "scripted-1")]) >= items_spent);
    assert_eq!(*heard.0.lock().unwrap(), heard_before);
    // The ended run's stream log holds what it held when it ended: no item frames.
    let log = app
        .client
        .get(app.url(&format!("/api/threads/t1/runs/{run_id}/stream")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!log.contains("Durable batch item"), "{log}");
    assert!(!log.contains("task_started"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_refusal_hands_the_item_back_with_its_attempt_restored() {
    let admission = AdmissionConfig {
        max_running: 1,
        admission_policy: AdmissionPolicy::Reject,
        ..AdmissionConfig::default()
    };
    let heard = Arc::new(Heard::default());
    let (app, mut worker) = with_worker(admission, heard).await;
    wait_run(&app, "t1", "/batch general-purpose\nonly item").await;
    let batches = get(&app, "/api/threads/t1/subagent-batches").await;
    let real = batches[0]["id"].as_str().unwrap().to_owned();
    // A `task` execution holds the process's only slot while the worker claims.
    let held = app.admission.admit().await.unwrap();
    worker.claim_and_run_once().await.unwrap();
    worker.wait_idle().await;
    let items = get(
        &app,
        &format!("/api/threads/t1/subagent-batches/{real}/items"),
    )
    .await;
    assert_eq!(items[0]["status"], "queued");
    assert_eq!(items[0]["attempt"], 0, "the attempt is given back");
    assert_eq!(
        items[0]["error"],
        "Subagent admission rejected: all 1 execution slots are busy"
    );
    drop(held);
    run_until_idle(&mut worker).await;
    let items = get(
        &app,
        &format!("/api/threads/t1/subagent-batches/{real}/items"),
    )
    .await;
    assert_eq!(items[0]["status"], "succeeded");
    assert_eq!(items[0]["attempt"], 1);
}
