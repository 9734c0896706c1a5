//! `subflow tail` and `subflow usage` against a real `subflow serve` (SPEC §15.2).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

use crate::cli::start_serve_with_env;

/// The scripted model with the demo plan paced by `delay_ms` per streamed piece.
fn config_with_delay(dir: &std::path::Path, delay_ms: u64) -> String {
    let path = dir.join("subflow.toml");
    std::fs::write(
        &path,
        format!(
            "[[models]]\nname = \"scripted\"\nprovider = \"scripted\"\nmodel = \"scripted-1\"\ndemo_delay_ms = {delay_ms}\n"
        ),
    )
    .unwrap();
    path.display().to_string()
}

fn client_command(address: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_subflow"));
    command
        .args(args)
        .env("SUBFLOW_URL", format!("http://{address}"))
        .env_remove("SUBFLOW_TOKEN")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env_remove("ALL_PROXY");
    command
}

fn client(address: &str, args: &[&str]) -> Output {
    client_command(address, args).output().unwrap()
}

/// Starts a background run whose stream log keeps `values` and `custom` frames.
fn start_run(address: &str, thread: &str) -> String {
    let body = json!({"input": {"messages": [{"role": "user", "content": "Compare two queues"}]},
                      "stream_mode": ["values", "custom"]});
    let run = http::blocking_post(address, &format!("/api/threads/{thread}/runs"), &body);
    run["run_id"].as_str().unwrap().to_owned()
}

/// Blocking calls without reqwest's blocking client: a current-thread runtime per call.
mod http {
    use serde_json::Value;

    pub fn blocking_post(address: &str, path: &str, body: &Value) -> Value {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let response = reqwest::Client::builder()
                    .no_proxy()
                    .build()
                    .unwrap()
                    .post(format!("http://{address}{path}"))
                    .json(body)
                    .send()
                    .await
                    .unwrap();
                assert!(
                    response.status().is_success(),
                    "POST {path}: {}",
                    response.status()
                );
                let text = response.text().await.unwrap();
                if text.is_empty() {
                    Value::Null
                } else {
                    serde_json::from_str(&text).unwrap()
                }
            })
    }

    pub fn blocking_get(address: &str, path: &str) -> String {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                reqwest::Client::builder()
                    .no_proxy()
                    .build()
                    .unwrap()
                    .get(format!("http://{address}{path}"))
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap()
            })
    }
}

fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect()
}

/// The last line printed for each task.
fn last_by_task(lines: &[Value]) -> HashMap<String, Value> {
    lines
        .iter()
        .map(|line| (line["task_id"].as_str().unwrap().to_owned(), line.clone()))
        .collect()
}

#[test]
fn tail_prints_a_json_line_per_card_change_until_the_run_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_delay(dir.path(), 20);
    let (mut server, address, _log) = start_serve_with_env(dir.path(), &["--config", &config], &[]);
    let run = start_run(&address, "tailed");

    // stdout is a pipe, not a terminal: JSON lines.
    let output = client(&address, &["tail", "tailed"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains(&format!("following run {run}")), "{stderr}");

    let lines = json_lines(&output.stdout);
    let keys: Vec<&str> = lines[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "task_id",
            "status",
            "subagent_type",
            "description",
            "model_name",
            "usage",
            "step_count",
            "error",
            "result"
        ]
    );
    let last = last_by_task(&lines);
    assert_eq!(last.len(), 3, "the demo plan's three tasks");
    for card in last.values() {
        assert_eq!(card["status"], "completed", "{card}");
        assert_eq!(card["step_count"], 5, "{card}");
        assert_eq!(card["model_name"], "scripted");
        assert_eq!(card["subagent_type"], "general-purpose");
        assert!(card["usage"]["total_tokens"].as_u64().unwrap() > 0);
        assert!(
            card["result"]
                .as_str()
                .unwrap()
                .contains("Compare two queues")
        );
        assert_eq!(card["error"], Value::Null);
    }
    // One line per change: consecutive lines of a task always differ, and steps only grow.
    let mut previous: HashMap<&str, &Value> = HashMap::new();
    for line in &lines {
        let id = line["task_id"].as_str().unwrap();
        if let Some(before) = previous.insert(id, line) {
            assert_ne!(before, line, "a repeated line");
            assert!(before["step_count"].as_u64() <= line["step_count"].as_u64());
        }
    }
    assert!(
        lines
            .iter()
            .any(|l| l["status"] == "in_progress" && l["step_count"].as_u64() > Some(0)),
        "steps were seen while the tasks ran"
    );

    // The run is over; tailing it again replays its log to the same cards.
    let again = client(&address, &["tail", "tailed", "--run", &run]);
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(last_by_task(&json_lines(&again.stdout)), last);

    // `usage --json` is the gateway's answer unchanged; the table has the cost column.
    let usage = client(&address, &["usage", "tailed", "--json"]);
    assert_eq!(usage.status.code(), Some(0));
    let body = http::blocking_get(&address, "/api/threads/tailed/token-usage");
    assert_eq!(String::from_utf8_lossy(&usage.stdout).trim_end(), body);
    let table = client(&address, &["usage", "tailed"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("Thread tailed: 1 counted run\n"), "{text}");
    assert!(text.contains("model") && text.contains("cost"), "{text}");
    assert!(text.contains("scripted-1"), "{text}");

    server.kill().unwrap();
    let _ = server.wait();
}

#[test]
fn tail_of_a_stopped_run_ends_its_unanswered_cards_failed_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    // Slow text keeps the subagents busy long enough to stop them mid-task.
    let config = config_with_delay(dir.path(), 300);
    let (mut server, address, _log) = start_serve_with_env(dir.path(), &["--config", &config], &[]);
    let run = start_run(&address, "stopped");
    let mut tail = client_command(&address, &["tail", "stopped", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(tail.stdout.take().unwrap()).lines();
    let mut lines = Vec::new();
    // Wait until a task has a step, then stop the run.
    for line in stdout.by_ref() {
        let line: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let started = line["step_count"].as_u64() > Some(0);
        lines.push(line);
        if started {
            break;
        }
    }
    http::blocking_post(
        &address,
        &format!("/api/threads/stopped/runs/{run}/cancel"),
        &json!({}),
    );
    lines.extend(stdout.map(|line| serde_json::from_str::<Value>(&line.unwrap()).unwrap()));
    let status = tail.wait().unwrap();
    assert_eq!(status.code(), Some(130), "an interrupted run exits 130");
    let last = last_by_task(&lines);
    assert_eq!(last.len(), 3);
    for card in last.values() {
        assert_eq!(card["status"], "failed", "{card}");
    }
    server.kill().unwrap();
    let _ = server.wait();
}

#[test]
fn client_commands_need_a_valid_thread_id_and_a_reachable_gateway() {
    let output = client("127.0.0.1:9", &["usage", "not a thread"]);
    assert_eq!(output.status.code(), Some(2));
    let output = client("127.0.0.1:9", &["tail", "t1"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("cannot reach the gateway at http://127.0.0.1:9"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
