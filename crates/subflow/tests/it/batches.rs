//! Durable batches across real processes (docs/batches.md): `subflow worker` refuses SQLite,
//! `serve --no-worker` leaves batches to others, and batches survive `kill -9` — of a
//! worker on PostgreSQL while another worker carries on, and of the single `serve` on
//! SQLite, restarted on the same file.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use subflow_store_postgres::testing::{ItemChange, ItemHistory, TestDb};

use crate::cli::start_serve;

/// The lease of these tests (the smallest allowed): a killed worker's items come back
/// within it plus one claim pass.
const LEASE_SECONDS: u64 = 10;
const POLL_SECONDS: f64 = 0.2;

/// A configuration whose subagents answer "done" after `delay_ms`, with a short lease,
/// eight items of a batch running at once and four slots per process.
fn write_config(dir: &Path, delay_ms: u64, database_url: &str) -> String {
    let rules = json!([{"agent": "subagent:general-purpose",
        "turns": [{"text": "done", "delay_ms": delay_ms}]}]);
    let sections = format!(
        "[subagent_runtime]\nmax_running = 4\n\n[subagent_batches]\nlease_seconds = {LEASE_SECONDS}\n\
         poll_interval_seconds = {POLL_SECONDS}\ndefault_max_running_items = 8\n"
    );
    scripted_config(dir, database_url, &rules, &sections)
}

/// `subflow.toml` in `dir`: the scripted model following `rules` (written beside it as
/// `script.json`) on `database_url`, warnings only, workspaces under `dir`, and the TOML
/// `sections` after the model (a `[models.pricing]` first prices it). Returns its path.
pub(crate) fn scripted_config(
    dir: &Path,
    database_url: &str,
    rules: &Value,
    sections: &str,
) -> String {
    let script = dir.join("script.json");
    std::fs::write(&script, json!({ "rules": rules }).to_string()).unwrap();
    let config = format!(
        r#"[database]
url = "{database_url}"

[logging]
level = "warn"

[[models]]
name = "scripted"
provider = "scripted"
model = "scripted-1"
script = "{script}"
demo_delay_ms = 0

{sections}
[tools]
workspace_root = "{workspaces}"
"#,
        script = script.display(),
        workspaces = dir.join("workspaces").display(),
    );
    let path = dir.join("subflow.toml");
    std::fs::write(&path, config).unwrap();
    path.display().to_string()
}

/// A child process whose stderr is drained into `lines` (so it never blocks on a full
/// pipe), killed when dropped.
pub(crate) struct Process {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Process {
    pub(crate) fn drain(
        mut child: Child,
        rest: impl Iterator<Item = String> + Send + 'static,
    ) -> Process {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in rest {
                sink.lock().unwrap().push(line);
            }
        });
        if let Some(stderr) = child.stderr.take() {
            let sink = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    sink.lock().unwrap().push(line);
                }
            });
        }
        Process { child, lines }
    }

    pub(crate) fn output(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// `kill -9`.
    fn kill_hard(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then the exit status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn serve(dir: &Path, config: &str, extra: &[&str]) -> (Process, String) {
    let mut args = vec!["--config", config];
    args.extend_from_slice(extra);
    let (child, address, lines) = start_serve(dir, &args);
    (Process::drain(child, lines.map_while(Result::ok)), address)
}

/// Starts `subflow worker`; returns it and its worker id once it reports it.
fn worker(dir: &Path, config: &str) -> (Process, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_subflow"))
        .args(["worker", "--config", config])
        .current_dir(dir)
        .env_remove("SUBFLOW_CONFIG")
        .env_remove("SUBFLOW_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .expect("worker starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let id = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| {
            line.split("batch worker ")
                .nth(1)
                .map(|rest| rest.split_whitespace().next().unwrap().to_owned())
        })
        .expect("the worker reports its id");
    (Process::drain(child, lines.map_while(Result::ok)), id)
}

/// An HTTP client that never goes through a proxy.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// Runs `/batch` with `items` prompts on thread `t1`; returns the batch id.
async fn submit(address: &str, items: usize) -> String {
    let lines: Vec<String> = (1..=items).map(|i| format!("Item {i}")).collect();
    let prompt = format!("/batch general-purpose\n{}", lines.join("\n"));
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

/// `GET http://{address}{path}` as JSON.
pub(crate) async fn get(address: &str, path: &str) -> Value {
    client()
        .get(format!("http://{address}{path}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn batch(address: &str, id: &str) -> Value {
    get(address, &format!("/api/threads/t1/subagent-batches/{id}")).await
}

/// Polls the batch until `done` holds, for at most `limit`.
async fn wait_for(
    address: &str,
    id: &str,
    limit: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let batch = batch(address, id).await;
        if done(&batch) {
            return batch;
        }
        assert!(
            started.elapsed() < limit,
            "{what} within {limit:?}; the batch is {batch}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn subflow_worker_refuses_sqlite_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_subflow"))
        .args(["worker", "--database-url", "sqlite://subflow.db"])
        .current_dir(dir.path())
        .env_remove("SUBFLOW_CONFIG")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("subflow worker requires PostgreSQL"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("subflow.db").exists(),
        "nothing was opened"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_a_batch_to_the_end_and_no_worker_leaves_it_to_others() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("subflow.db").display());
    let config = write_config(dir.path(), 0, &url);
    let (mut idle, address) = serve(dir.path(), &config, &["--no-worker"]);
    let features = get(&address, "/api/features").await;
    assert_eq!(features["subagent_batches"]["worker_running"], false);
    let id = submit(&address, 5).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let waiting = batch(&address, &id).await;
    assert_eq!(waiting["status"], "queued", "no worker claims it");
    assert_eq!(waiting["counts"]["pending"], 5);
    assert!(idle.terminate().success());

    let (mut working, address) = serve(dir.path(), &config, &[]);
    let features = get(&address, "/api/features").await;
    assert_eq!(
        features["subagent_batches"],
        json!({"enabled": true, "repository_available": true, "worker_running": true, "max_running": 4})
    );
    let done = wait_for(&address, &id, Duration::from_secs(60), "completion", |b| {
        b["status"] == "completed"
    })
    .await;
    assert_eq!(done["counts"]["succeeded"], 5);
    let started = Instant::now();
    assert!(working.terminate().success(), "{}", working.output());
    println!(
        "serve with its worker stopped {:?} after SIGTERM",
        started.elapsed()
    );
}

/// The audit of one item's history: it ended succeeded exactly once, every claim came
/// from `queued` (so a new attempt never began while another held the item), the
/// finalising write came from the owner of the attempt that was running, and a lease
/// was recovered only after it expired.
fn audit_item(changes: &[&ItemChange]) -> Vec<String> {
    let mut problems = Vec::new();
    let key = &changes[0].item_key;
    let terminal: Vec<&&ItemChange> = changes
        .iter()
        .filter(|c| ["succeeded", "failed", "cancelled"].contains(&c.to_status.as_str()))
        .collect();
    if terminal.len() != 1 || terminal[0].to_status != "succeeded" {
        problems.push(format!("{key}: terminal changes {terminal:?}"));
    }
    let mut holder: Option<&str> = None;
    for change in changes {
        // A claim is `queued` → `leased`, or `queued` → `running` when the worker held a
        // slot for it and the pass started it.
        let claim = change.to_status == "leased"
            || (change.to_status == "running" && change.from_status == "queued");
        match change.to_status.as_str() {
            _ if claim => {
                if change.from_status != "queued" {
                    problems.push(format!("{key}: claimed from {}", change.from_status));
                }
                holder = change.owner_after.as_deref();
            }
            "running" | "succeeded" if change.owner_before.as_deref() != holder => {
                problems.push(format!(
                    "{key}: {} by {:?} while {holder:?} held it",
                    change.to_status, change.owner_before
                ));
            }
            "queued" if change.from_status == "leased" || change.from_status == "running" => {
                // A recovery: only once the lease had expired by the database clock.
                if change
                    .expires_before
                    .is_some_and(|expiry| change.at_ms < expiry)
                {
                    problems.push(format!("{key}: recovered before its lease expired"));
                }
                holder = None;
            }
            _ => {}
        }
    }
    problems
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_batch_survives_kill_9_of_one_of_two_workers() {
    let db = TestDb::new().await;
    ItemHistory::install(&db.store).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), 300, &db.url);
    let (_gateway, address) = serve(dir.path(), &config, &["--no-worker"]);
    let id = submit(&address, 200).await;
    let (mut doomed, doomed_id) = worker(dir.path(), &config);
    let (survivor, survivor_id) = worker(dir.path(), &config);
    assert_ne!(doomed_id, survivor_id);

    // Mid-way, with the doomed worker holding items, it is killed.
    wait_for(
        &address,
        &id,
        Duration::from_secs(120),
        "40 items done",
        |b| b["counts"]["succeeded"].as_u64().unwrap() >= 40,
    )
    .await;
    let held_by_doomed = || {
        let store = db.store.clone();
        let doomed_id = doomed_id.clone();
        async move {
            let changes = ItemHistory::read(&store).await;
            let mut holders = std::collections::HashMap::new();
            for change in &changes {
                holders.insert(change.item_id.clone(), change.owner_after.clone());
            }
            holders
                .values()
                .filter(|owner| owner.as_deref().is_some_and(|o| o.contains(&doomed_id)))
                .count()
        }
    };
    while held_by_doomed().await == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    doomed.kill_hard();
    let killed_at = Instant::now();
    let done = wait_for(
        &address,
        &id,
        Duration::from_secs(180),
        "completion after the kill",
        |b| b["status"] == "completed",
    )
    .await;
    println!(
        "the batch completed {:?} after kill -9",
        killed_at.elapsed()
    );
    assert_eq!(done["counts"]["succeeded"], 200, "{done}");
    assert_eq!(done["counts"]["failed"], 0);

    let changes = ItemHistory::read(&db.store).await;
    let mut by_item: std::collections::BTreeMap<&str, Vec<&ItemChange>> = Default::default();
    for change in &changes {
        by_item.entry(&change.item_id).or_default().push(change);
    }
    assert_eq!(by_item.len(), 200, "every item has a history");
    let problems: Vec<String> = by_item.values().flat_map(|c| audit_item(c)).collect();
    assert!(problems.is_empty(), "{problems:#?}");
    // The doomed worker's unfinished items came back once their lease expired, within
    // one claim pass (plus slack), and the survivor finished them on a new attempt.
    let recoveries: Vec<&ItemChange> = changes
        .iter()
        .filter(|c| {
            c.to_status == "queued"
                && c.owner_before
                    .as_deref()
                    .is_some_and(|o| o.contains(&doomed_id))
        })
        .collect();
    assert!(!recoveries.is_empty(), "the kill left items to recover");
    for recovery in &recoveries {
        let expiry = recovery.expires_before.unwrap();
        let late_ms = recovery.at_ms - expiry;
        println!(
            "{} recovered {late_ms} ms after its lease expired",
            recovery.item_key
        );
        assert!(
            (0..=5_000).contains(&late_ms),
            "{}: recovered {late_ms} ms after expiry",
            recovery.item_key
        );
        let finished = by_item[recovery.item_id.as_str()]
            .iter()
            .find(|c| c.to_status == "succeeded")
            .unwrap();
        assert!(
            finished
                .owner_before
                .as_deref()
                .unwrap()
                .contains(&survivor_id),
            "{finished:?}"
        );
    }
    // The survivor's rows are live; the killed worker's heartbeat went stale.
    drop(survivor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_serve_killed_mid_batch_and_restarted_finishes_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("subflow.db").display());
    // Attempts of 1.5 s, so the kill, made as soon as items are seen running, lands while
    // they run and not in the moment between one item's end and the next one's start.
    let config = write_config(dir.path(), 1500, &url);
    // A lease far longer than the test's patience: the restart must recover the killed
    // serve's items at once rather than after their lease.
    let text = std::fs::read_to_string(&config).unwrap();
    let long_lease = text.replace(
        &format!("lease_seconds = {LEASE_SECONDS}"),
        "lease_seconds = 600",
    );
    assert_ne!(text, long_lease, "the configuration names the lease");
    std::fs::write(&config, long_lease).unwrap();
    let (mut first, address) = serve(dir.path(), &config, &[]);
    let id = submit(&address, 40).await;
    let mid = wait_for(
        &address,
        &id,
        Duration::from_secs(60),
        "10 items done",
        |b| {
            b["counts"]["succeeded"].as_u64().unwrap() >= 10
                && b["counts"]["running"].as_u64().unwrap() > 0
        },
    )
    .await;
    first.kill_hard();
    println!("killed serve at {}", mid["counts"]);

    let (_second, address) = serve(dir.path(), &config, &[]);
    let done = wait_for(
        &address,
        &id,
        Duration::from_secs(120),
        "completion after the restart",
        |b| b["status"] == "completed",
    )
    .await;
    assert_eq!(done["counts"]["succeeded"], 40, "{done}");
    let items = get(
        &address,
        &format!("/api/threads/t1/subagent-batches/{id}/items?limit=500"),
    )
    .await;
    let items = items.as_array().unwrap();
    assert!(items.iter().all(|i| i["status"] == "succeeded"));
    // Items cut off by the kill ran again: their attempt says so.
    let rerun = items
        .iter()
        .filter(|i| i["attempt"].as_u64().unwrap() > 1)
        .count();
    assert!(rerun > 0, "{items:?}");
    assert!(items.iter().all(|i| i["attempt"].as_u64().unwrap() <= 2));
}
