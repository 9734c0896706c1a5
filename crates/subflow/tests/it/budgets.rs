//! Money budgets on a real `subflow serve` (docs/usage-and-cost.md#budgets): a run over
//! `run_max_cost` warns once per fraction, then stops its subagent with `token_capped`
//! and `budget_kind: "cost"`; a batch pauses at `batch_max_cost` with its spend equal to
//! the sum of its items; a submission projected over the budget gets 422; every crossing
//! reaches a signed webhook once.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::batches::{Process, client, get, scripted_config};

/// The webhook's signing key.
const SECRET: &str = "budget-hook-key";

/// One webhook delivery: its event header, signature header and body.
type Delivery = (String, String, Value);

/// A loopback HTTP server that answers every request 200 and keeps what it was sent.
fn webhook_receiver() -> (String, Arc<Mutex<Vec<Delivery>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let received = Arc::new(Mutex::new(Vec::new()));
    let sink = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let mut reader = BufReader::new(stream);
            let mut headers = Vec::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                headers.push(line.trim_end().to_owned());
            }
            let header = |name: &str| {
                headers
                    .iter()
                    .find_map(|line| {
                        let (key, value) = line.split_once(':')?;
                        key.eq_ignore_ascii_case(name)
                            .then(|| value.trim().to_owned())
                    })
                    .unwrap_or_default()
            };
            let length: usize = header("content-length").parse().unwrap_or(0);
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            let event = header("x-subflow-event");
            let signature = header("x-subflow-signature");
            let mut stream = reader.into_inner();
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            if let Ok(body) = serde_json::from_slice(&body) {
                sink.lock().unwrap().push((event, signature, body));
            }
        }
    });
    (format!("http://{address}/hook"), received)
}

/// A configuration priced at 1 per million input tokens, with `budgets` and a signed
/// webhook to `hook`.
fn write_config(dir: &Path, rules: Value, budgets: &str, hook: &str) -> String {
    let database = format!("sqlite://{}", dir.join("subflow.db").display());
    let sections = format!(
        r#"[models.pricing]
currency = "USD"
input_per_million = 1.0
output_per_million = 0.0

[budgets]
{budgets}

[subagent_batches]
poll_interval_seconds = 0.1

[[observers.webhooks]]
url = "{hook}"
secret_env = "BUDGET_HOOK_SECRET"
"#
    );
    scripted_config(dir, &database, &rules, &sections)
}

/// `subflow serve` on `config`, with the webhook's secret in its environment.
fn start(dir: &Path, config: &str) -> (Process, String) {
    let (child, address, lines) = crate::cli::start_serve_with_env(
        dir,
        &["--config", config],
        &[("BUDGET_HOOK_SECRET", SECRET)],
    );
    (Process::drain(child, lines.map_while(Result::ok)), address)
}

/// The budget deliveries received so far, each checked for its signature.
fn budget_deliveries(received: &Mutex<Vec<Delivery>>) -> Vec<Value> {
    received
        .lock()
        .unwrap()
        .iter()
        .filter(|(event, ..)| event == "budget")
        .map(|(_, signature, body)| {
            let bytes = serde_json::to_vec(body).unwrap();
            assert_eq!(
                *signature,
                subflow_runtime::observers::signature(SECRET.as_bytes(), &bytes),
                "every budget delivery is signed"
            );
            body["budget"].clone()
        })
        .collect()
}

/// Waits up to 30 s for `wanted` budget deliveries.
fn await_deliveries(received: &Mutex<Vec<Delivery>>, wanted: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = budget_deliveries(received);
        if found.len() >= wanted || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn crossings(budgets: &[Value]) -> Vec<(String, String, f64)> {
    budgets
        .iter()
        .map(|b| {
            (
                b["scope"].as_str().unwrap().to_owned(),
                b["action"].as_str().unwrap().to_owned(),
                b["fraction"].as_f64().unwrap(),
            )
        })
        .collect()
}

fn warned_then_stopped(scope: &str) -> Vec<(String, String, f64)> {
    vec![
        (scope.to_owned(), "warn".to_owned(), 0.8),
        (scope.to_owned(), "warn".to_owned(), 0.95),
        (scope.to_owned(), "hard_stop".to_owned(), 1.0),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_its_money_budget_warns_per_fraction_then_stops_its_subagent() {
    let dir = tempfile::tempdir().unwrap();
    let (hook, received) = webhook_receiver();
    // At 1 per million input: the lead's first call costs 0.0001, each subagent call
    // 0.00036: 0.00046, 0.00082 (past 80 %), 0.00118 (past 95 % and the limit).
    let listing =
        json!({"tool_calls": [{"name": "ls", "args": {}}], "usage": {"input": 360, "output": 10}});
    let rules = json!([
        {"agent": "lead_agent", "contains": "spend", "turns": [
            {"tool_calls": [{"name": "task", "args": {"description": "Spend", "prompt": "spend money", "subagent_type": "general-purpose"}}],
             "usage": {"input": 100, "output": 10}},
            {"text": "wrapped up", "usage": {"input": 100, "output": 10}}
        ]},
        {"agent": "subagent:general-purpose", "contains": "spend money", "turns": [
            listing.clone(), listing.clone(), listing.clone(), listing,
            {"text": "never reached", "usage": {"input": 360, "output": 10}}
        ]}
    ]);
    let config = write_config(
        dir.path(),
        rules,
        "run_max_cost = 0.001\nthread_max_cost = 1.0\nuser_daily_max_cost = 0.5",
        &hook,
    );
    let (serve, address) = start(dir.path(), &config);

    let response = client()
        .post(format!("http://{address}/api/threads/t-budget/runs/wait"))
        .json(&json!({"input": {"messages": [{"role": "user", "content": "spend"}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{}", serve.output());
    let runs = get(&address, "/api/threads/t-budget/runs").await;
    let run = &runs[0];
    assert_eq!(run["stop_reason"], "token_capped", "{run}");
    let run_id = run["run_id"].as_str().unwrap();

    // The audit trail: one warn per fraction, then the hard stop, in the run's log.
    let events = get(
        &address,
        &format!("/api/threads/t-budget/runs/{run_id}/events?limit=500"),
    )
    .await;
    let events = events["events"]
        .as_array()
        .or(events.as_array())
        .unwrap()
        .clone();
    let budget: Vec<Value> = events
        .iter()
        .filter(|e| e["event_type"] == "middleware:budget")
        .map(|e| e["content"].clone())
        .collect();
    assert_eq!(crossings(&budget), warned_then_stopped("run"), "{budget:?}");
    assert_eq!(budget[0]["spent"], 0.00082);
    assert_eq!(budget[2]["spent"], 0.00118);
    assert_eq!(budget[2]["limit"], 0.001);

    // The subagent ended capped, and its ToolMessage says the cap was money.
    let state = get(&address, "/api/threads/t-budget/state").await;
    let messages = state["values"]["messages"].as_array().unwrap();
    let tool = messages
        .iter()
        .find(|m| m["type"] == "tool" && m["name"] == "task")
        .expect("the task's ToolMessage");
    assert_eq!(
        tool["additional_kwargs"]["subagent_stop_reason"],
        "token_capped"
    );
    assert_eq!(tool["additional_kwargs"]["budget_kind"], "cost");
    assert!(
        tool["content"]
            .as_str()
            .unwrap()
            .starts_with("Task Succeeded (capped: token budget)."),
        "{tool}"
    );

    // The same crossings reached the webhook once each, signed.
    let delivered = await_deliveries(&received, 3);
    assert_eq!(crossings(&delivered), warned_then_stopped("run"));
    assert_eq!(delivered[0]["run_id"], run_id);
    assert_eq!(delivered[0]["currency"], "USD");

    // /token-usage and /api/usage show the budgets beside the spend.
    let usage = get(&address, "/api/threads/t-budget/token-usage").await;
    let spent = 0.0001 * 2.0 + 0.00036 * 3.0;
    assert_eq!(
        usage["budgets"],
        json!([
            {"scope": "thread", "limit": 1.0, "spent": spent, "currency": "USD"},
            {"scope": "user_daily", "limit": 0.5, "spent": spent, "currency": "USD"}
        ])
    );
    let across = get(&address, "/api/usage").await;
    assert_eq!(across["budgets"][0]["scope"], "user_daily");
    assert_eq!(across["budgets"][0]["spent"], usage["budgets"][1]["spent"]);

    let metrics = client()
        .get(format!("http://{address}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ratio: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("subflow_budget_spent_ratio{scope=\"run\"} "))
        .expect("the run scope's gauge")
        .parse()
        .unwrap();
    assert!(ratio >= 1.0, "{ratio}");
}

/// Submits `items` prompts as a batch on `t-batch` with one item running at a time.
async fn submit(address: &str, key: &str, items: usize, over: bool) -> reqwest::Response {
    let items: Vec<Value> = (0..items)
        .map(|i| json!({"key": format!("item-{i}"), "prompt": format!("Item {i}")}))
        .collect();
    let mut body = json!({
        "submission_key": key,
        "subagent_type": "general-purpose",
        "items": items,
        "max_live_items": 1,
        "max_running_items": 1,
    });
    if over {
        body["allow_over_budget"] = json!(true);
    }
    client()
        .post(format!(
            "http://{address}/api/threads/t-batch/subagent-batches"
        ))
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_pauses_at_its_budget_and_a_submission_projected_over_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (hook, received) = webhook_receiver();
    // Each item costs 0.0003: the batch passes 80 % with its third item and its limit
    // with its fourth.
    let rules = json!([
        {"agent": "subagent:general-purpose", "contains": "Item", "turns": [
            {"text": "done", "usage": {"input": 300, "output": 10}}
        ]}
    ]);
    let config = write_config(dir.path(), rules, "batch_max_cost = 0.001", &hook);
    let (serve, address) = start(dir.path(), &config);

    // No history yet: nothing to project, so the first batch is taken.
    let created = submit(&address, "first", 10, false).await;
    assert_eq!(created.status(), 201, "{}", serve.output());
    let batch: Value = created.json().await.unwrap();
    let id = batch["id"].as_str().unwrap().to_owned();
    assert_eq!(batch["budget"]["limit"], 0.001);
    assert_eq!(batch["pause_reason"], Value::Null);

    let deadline = Instant::now() + Duration::from_secs(60);
    let paused = loop {
        let batch = get(&address, &format!("/api/subagent-batches/{id}")).await;
        if batch["status"] == "paused" || Instant::now() > deadline {
            break batch;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(paused["status"], "paused", "{paused}\n{}", serve.output());
    assert_eq!(paused["pause_reason"], "budget");
    let items = get(
        &address,
        &format!("/api/threads/t-batch/subagent-batches/{id}/items?limit=100"),
    )
    .await;
    let items = items.as_array().or(items["items"].as_array()).unwrap();
    let item_costs: f64 = items
        .iter()
        .filter_map(|item| item["token_usage"]["input_tokens"].as_f64())
        .map(|input| input / 1e6)
        .sum();
    let spent = paused["budget"]["spent"].as_f64().unwrap();
    assert!((spent - item_costs).abs() < 1e-9, "{spent} vs {item_costs}");
    assert!(spent >= 0.001, "{spent}");
    assert!(
        paused["counts"]["succeeded"].as_u64().unwrap() < 10,
        "the pause left items unrun: {paused}"
    );

    let delivered = await_deliveries(&received, 3);
    assert_eq!(crossings(&delivered), warned_then_stopped("batch"));
    assert_eq!(delivered[2]["batch_id"], id.as_str());

    // Ten more items at 0.0003 each project 0.003, over the 0.001 budget.
    let refused = submit(&address, "second", 10, false).await;
    assert_eq!(refused.status(), 422);
    let detail: Value = refused.json().await.unwrap();
    assert_eq!(
        detail["detail"],
        "Batch submission failed: projected cost 0.003 USD (10 items at 0.0003 USD each) exceeds budgets.batch_max_cost (0.001 USD); pass allow_over_budget to submit it anyway"
    );
    let allowed = submit(&address, "second", 10, true).await;
    assert_eq!(allowed.status(), 201);
    drop(serve);
}
