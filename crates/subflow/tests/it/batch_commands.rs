//! `subflow batches` against a real `subflow serve` (SQLite, its own worker): `watch`
//! ends with 0 for a completed batch, 1 for a failed one and 130 for a cancelled one;
//! `export` prints exactly `results.jsonl`; every `--json` output parses; the controls
//! change what the API reports.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::batches::{Process, client, get, scripted_config, serve};

/// Subagents answer "done", fail on prompts with "Fail", and take a minute on prompts
/// with "Slow"; the model is priced, so batches have a cost.
fn write_config(dir: &Path) -> String {
    let rules = json!([
        {"agent": "subagent:general-purpose", "contains": "Fail", "turns": [{"error": "boom"}]},
        {"agent": "subagent:general-purpose", "contains": "Slow", "turns": [{"text": "late", "delay_ms": 60_000}]},
        {"agent": "subagent:general-purpose", "turns": [{"text": "done"}]}
    ]);
    let database = format!("sqlite://{}", dir.join("subflow.db").display());
    scripted_config(
        dir,
        &database,
        &rules,
        "[models.pricing]\ncurrency = \"USD\"\ninput_per_million = 2.0\noutput_per_million = 8.0\n\n\
         [subagent_batches]\npoll_interval_seconds = 0.1\n",
    )
}

/// `subflow batches ARGS…` against the gateway at `address`, to completion.
fn batches(address: &str, args: &[&str]) -> Output {
    command(address, args).output().expect("subflow runs")
}

fn command(address: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_subflow"));
    command
        .arg("batches")
        .args(args)
        .env("SUBFLOW_URL", format!("http://{address}"))
        .env_remove("SUBFLOW_TOKEN")
        .env_remove("SUBFLOW_LOG")
        .stdin(Stdio::null());
    command
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn json_of(output: &Output) -> Value {
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("--json prints JSON")
}

/// Runs `/batch` over `prompts` on thread `t1`; returns the new batch's id.
async fn submit(address: &str, prompts: &[&str]) -> String {
    let prompt = format!("/batch general-purpose\n{}", prompts.join("\n"));
    let response = client()
        .post(format!("http://{address}/api/threads/t1/runs/wait"))
        .json(&json!({"input": {"messages": [{"role": "user", "content": prompt}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let batches = get(address, "/api/threads/t1/subagent-batches").await;
    batches[0]["id"].as_str().unwrap().to_owned()
}

async fn batch(address: &str, id: &str) -> Value {
    get(address, &format!("/api/subagent-batches/{id}")).await
}

fn start(dir: &Path) -> (Process, String) {
    let config = write_config(dir);
    serve(dir, &config, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_exits_0_once_completed_and_export_list_and_show_print_what_the_api_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (serve, address) = start(dir.path());
    let id = submit(&address, &["Item 1", "Item 2", "Item 3"]).await;

    // Not a terminal: one JSON line per change, the last one the completed batch.
    let watched = batches(&address, &["watch", &id, "--interval", "0.1"]);
    assert_eq!(
        watched.status.code(),
        Some(0),
        "{watched:?}\n{}",
        serve.output()
    );
    let lines: Vec<Value> = stdout(&watched)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let last = lines.last().expect("at least one line");
    assert_eq!(last["status"], "completed");
    assert_eq!(last["counts"]["succeeded"], 3);
    assert!(last["cost"]["total"].as_f64().unwrap() > 0.0, "{last}");
    let stderr = String::from_utf8_lossy(&watched.stderr);
    assert!(
        stderr.contains(&format!("batch {id} completed: 3 of 3")),
        "{stderr}"
    );

    let exported = batches(&address, &["export", &id]);
    assert!(exported.status.success());
    let direct = client()
        .get(format!(
            "http://{address}/api/threads/t1/subagent-batches/{id}/results.jsonl"
        ))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(exported.stdout, direct.to_vec(), "export is results.jsonl");
    assert_eq!(stdout(&exported).lines().count(), 3);

    let listed = json_of(&batches(&address, &["list", "t1", "--json"]));
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["id"], id.as_str());
    let shown = json_of(&batches(&address, &["show", &id, "--json"]));
    assert_eq!(shown["batch"]["id"], id.as_str());
    let keys: Vec<&str> = shown["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["item_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["item-1", "item-2", "item-3"]);
    let table = stdout(&batches(&address, &["show", &id]));
    assert!(table.contains("KEY"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("item-2") && l.contains("succeeded") && l.ends_with("done")),
        "{table}"
    );
    let human = stdout(&batches(&address, &["list", "t1"]));
    assert!(
        human.contains("completed") && human.contains("3 of 3 · "),
        "{human}"
    );

    let usage = Command::new(env!("CARGO_BIN_EXE_subflow"))
        .args(["usage", "t1", "--json"])
        .env("SUBFLOW_URL", format!("http://{address}"))
        .output()
        .unwrap();
    let usage = json_of(&usage);
    assert_eq!(usage["batches"]["items"], 3);
    assert_eq!(usage["batches"]["cost"]["total"], last["cost"]["total"]);

    // A retry of an item that did not fail is the gateway's conflict: exit 1.
    let refused = batches(&address, &["retry", &id, "item-1"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("Only failed items can be retried"));

    let missing = batches(&address, &["show", "subagent-batch-nope"]);
    assert_eq!(
        missing.status.code(),
        Some(2),
        "an unknown batch is a usage error"
    );
    assert!(String::from_utf8_lossy(&missing.stderr).contains("Subagent batch not found"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_exits_1_for_a_failed_batch_and_retry_runs_its_item_again() {
    let dir = tempfile::tempdir().unwrap();
    let (serve, address) = start(dir.path());
    let id = submit(&address, &["Fail 1"]).await;
    let watched = batches(&address, &["watch", &id, "--interval", "0.1", "--json"]);
    assert_eq!(
        watched.status.code(),
        Some(1),
        "{watched:?}\n{}",
        serve.output()
    );
    let last: Value = serde_json::from_str(stdout(&watched).lines().last().unwrap()).unwrap();
    assert_eq!(last["status"], "failed");
    assert!(String::from_utf8_lossy(&watched.stderr).contains("ended failed"));

    let before = json_of(&batches(&address, &["show", &id, "--json"]));
    let retried = json_of(&batches(&address, &["retry", &id, "item-1", "--json"]));
    assert_eq!(retried["item_key"], "item-1");
    assert_eq!(retried["status"], "pending");
    // It runs (and fails) again, and watching it again says so.
    let watched = batches(&address, &["watch", &id, "--interval", "0.1"]);
    assert_eq!(watched.status.code(), Some(1));
    let after = json_of(&batches(&address, &["show", &id, "--json"]));
    assert_eq!(after["items"][0]["status"], "failed");
    assert_ne!(
        after["items"][0]["completed_at"], before["items"][0]["completed_at"],
        "a new run of the item"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_exits_130_when_the_batch_is_cancelled_and_the_controls_change_its_status() {
    let dir = tempfile::tempdir().unwrap();
    let (serve, address) = start(dir.path());
    let id = submit(&address, &["Slow 1", "Slow 2"]).await;
    let watcher = command(&address, &["watch", &id, "--interval", "0.1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while batch(&address, &id).await["counts"]["running"] == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{}",
            serve.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let paused = json_of(&batches(&address, &["pause", &id, "--json"]));
    assert_eq!(paused["status"], "paused");
    assert_eq!(batch(&address, &id).await["status"], "paused");
    let resumed = stdout(&batches(&address, &["resume", &id]));
    assert!(resumed.contains("queued"), "{resumed}");
    let cancelled = batches(&address, &["cancel", &id]);
    assert!(cancelled.status.success());
    assert!(stdout(&cancelled).contains("cancelled"));
    assert_eq!(batch(&address, &id).await["counts"]["cancelled"], 2);
    let output = tokio::task::spawn_blocking(move || watcher.wait_with_output().unwrap())
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(130), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("was cancelled"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_makes_one_batch_of_a_5000_line_file_and_names_a_bad_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    // No worker: the items stay queued, as the file gave them.
    let (serve, address) = serve(dir.path(), &config, &["--no-worker"]);
    let file = dir.path().join("items.jsonl");
    let lines: Vec<String> = (1..=5000)
        .map(|n| {
            json!({"key": format!("row-{n:04}"), "prompt": format!("Summarise row {n}: {}", "lorem ipsum ".repeat(20))})
                .to_string()
        })
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let file_arg = file.display().to_string();
    let args = [
        "submit",
        "imports",
        "--type",
        "general-purpose",
        "--file",
        &file_arg,
        "--max-running",
        "2",
        "--title",
        "Import of 5,000 rows",
    ];
    let first = batches(&address, &args);
    assert_eq!(
        first.status.code(),
        Some(0),
        "{first:?}\n{}",
        serve.output()
    );
    let id = stdout(&first).trim().to_owned();
    assert!(id.starts_with("subagent-batch-"), "{id}");
    let stderr = String::from_utf8_lossy(&first.stderr);
    // Not a terminal, and over a mebibyte: a progress line at each quarter.
    assert!(
        stderr.contains("uploading ") && stderr.contains("(100%)"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("batch {id} submitted with 5000 items")),
        "{stderr}"
    );

    // The same command again returns the same batch.
    let again = batches(&address, &args);
    assert_eq!(again.status.code(), Some(0), "{again:?}");
    assert_eq!(stdout(&again).trim(), id);
    assert!(String::from_utf8_lossy(&again.stderr).contains("already submitted"));

    // The items are the file's, in order.
    let shown = json_of(&batches(&address, &["show", &id, "--json"]));
    let batch = &shown["batch"];
    assert_eq!(batch["total_items"], 5000, "{batch}");
    assert_eq!(batch["title"], "Import of 5,000 rows");
    assert_eq!(batch["max_running_items"], 2);
    let client = reqwest::Client::new();
    let mut keys = Vec::new();
    for offset in (0..5000).step_by(500) {
        let page: Value = client
            .get(format!(
                "http://{address}/api/threads/imports/subagent-batches/{id}/items?offset={offset}&limit=500"
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        keys.extend(
            page.as_array()
                .unwrap()
                .iter()
                .map(|item| item["item_key"].as_str().unwrap().to_owned()),
        );
    }
    let expected: Vec<String> = (1..=5000).map(|n| format!("row-{n:04}")).collect();
    assert_eq!(keys, expected);

    // A bad line is named, and nothing is submitted.
    std::fs::write(
        &file,
        "{\"key\": \"a\", \"prompt\": \"p\"}\n\n{\"key\": \"b\"}\n",
    )
    .unwrap();
    let bad = batches(
        &address,
        &[
            "submit",
            "imports",
            "--type",
            "general-purpose",
            "--file",
            &file_arg,
        ],
    );
    assert_eq!(bad.status.code(), Some(2));
    let error = String::from_utf8_lossy(&bad.stderr);
    assert!(error.contains("items.jsonl line 3: not an item"), "{error}");
    assert!(error.contains("missing field `prompt`"), "{error}");
    // The gateway's refusals come through as they are.
    std::fs::write(&file, "{\"key\": \"a\", \"prompt\": \"p\"}\n").unwrap();
    let refused = batches(
        &address,
        &["submit", "imports", "--type", "nope", "--file", &file_arg],
    );
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("Unknown or disallowed subagent type 'nope'"),
        "{refused:?}"
    );
    let listed = json_of(&batches(&address, &["list", "imports", "--json"]));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
}
