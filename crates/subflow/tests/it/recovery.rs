//! A run whose `subflow serve` was killed (`kill -9`) mid-run is recovered by the next
//! process: on SQLite by the restarted `serve`, on PostgreSQL by another `serve` once the
//! run's lease expired. Every record the run persisted validates against our contract
//! and both reference versions, and the run has exactly one `run.end`, with status
//! `error` and `recovered: true` (docs/api.md#cancel, docs/events.md#catalogue).

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use serde_json::{Value, json};
use subflow_contracts::RunEvent;
use subflow_store::conformance::assert_conforms;
use subflow_store_postgres::testing::TestDb;

use crate::cli::start_serve;

/// Bounds every wait, so a broken recovery fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(60);

/// `subflow.toml` with a paced demo plan (so a run is still going when it is killed),
/// run leases of two seconds, and `database_url` when given.
pub(crate) fn write_config(dir: &Path, database_url: Option<&str>) {
    let mut config = String::from("[runs]\nlease_seconds = 2\n\n");
    if let Some(url) = database_url {
        config.push_str(&format!("[database]\nurl = \"{url}\"\n\n"));
    }
    config.push_str(
        "[[models]]\nname = \"scripted\"\nprovider = \"scripted\"\nmodel = \"scripted-1\"\ndemo_delay_ms = 60\n",
    );
    std::fs::write(dir.join("subflow.toml"), config).unwrap();
}

/// `serve` in `dir` with its config; its stderr is drained so it never blocks.
pub(crate) fn serve(dir: &Path) -> (Child, String) {
    let config = dir.join("subflow.toml");
    let (child, address, lines) = start_serve(dir, &["--config", config.to_str().unwrap()]);
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
    (child, format!("http://{address}/api"))
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

pub(crate) async fn get(api: &str, path: &str) -> Value {
    let response = client().get(format!("{api}{path}")).send().await.unwrap();
    assert_eq!(response.status(), 200, "{path}");
    response.json().await.unwrap()
}

pub(crate) async fn events(api: &str, thread: &str, run: &str) -> Vec<RunEvent> {
    let page = get(
        api,
        &format!("/threads/{thread}/runs/{run}/events?limit=2000"),
    )
    .await;
    serde_json::from_value(page).unwrap()
}

/// Posts the demo plan to `route` (`runs` or `runs/stream`) of `thread`, streaming what
/// DeerFlow's client streams.
pub(crate) async fn post_demo_run(api: &str, thread: &str, route: &str) -> reqwest::Response {
    client()
        .post(format!("{api}/threads/{thread}/{route}"))
        .json(&json!({"input": {"messages": [{"role": "user", "content": "Compare three storage engines"}]},
                      "stream_mode": ["messages-tuple", "updates", "custom"]}))
        .send()
        .await
        .unwrap()
}

/// A `serve` process, killed with `kill -9` when dropped, so a failing check leaves no
/// process behind.
pub(crate) struct Serve(Option<Child>);

impl Serve {
    pub(crate) fn start(dir: &std::path::Path) -> (Self, String) {
        let (child, api) = serve(dir);
        (Serve(Some(child)), api)
    }

    pub(crate) fn kill(mut self) {
        if let Some(child) = self.0.take() {
            kill_hard(child);
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to the process.
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.0.as_ref().expect("a running serve").id();
        let sent = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -{signal} {pid}");
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(child) = self.0.take() {
            kill_hard(child);
        }
    }
}

/// Starts the demo plan in the background; returns the run id once its tasks are under
/// way (a `subagent.step` is persisted).
pub(crate) async fn start_demo_run(api: &str, thread: &str) -> String {
    let response = post_demo_run(api, thread, "runs").await;
    assert_eq!(response.status(), 200);
    let run: Value = response.json().await.unwrap();
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let under_way = async {
        while !events(api, thread, &run_id)
            .await
            .iter()
            .any(|e| e.event_type == "subagent.step")
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(PATIENCE, under_way)
        .await
        .expect("the tasks start");
    run_id
}

pub(crate) fn kill_hard(mut child: Child) {
    // `Child::kill` is SIGKILL: no shutdown, no final flush, the lease left held.
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The recovered run: `error`/`orphan_recovered`, and its records as the contracts say.
async fn assert_recovered(api: &str, thread: &str, run: &str) {
    let ended = async {
        loop {
            let record = get(api, &format!("/threads/{thread}/runs/{run}")).await;
            let records = events(api, thread, run).await;
            if record["status"] != "running" && records.iter().any(|e| e.event_type == "run.end") {
                return (record, records);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (record, records) = tokio::time::timeout(PATIENCE, ended)
        .await
        .expect("the run is recovered");
    assert_eq!(record["status"], "error");
    assert_eq!(record["stop_reason"], "orphan_recovered");
    assert_conforms(&records);
    let kinds: Vec<&str> = records.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(kinds[0], "run.start", "{kinds:?}");
    let ends: Vec<&RunEvent> = records
        .iter()
        .filter(|e| e.event_type == "run.end")
        .collect();
    assert_eq!(ends.len(), 1, "{kinds:?}");
    assert_eq!(
        Value::Object(ends[0].metadata.clone()),
        json!({"status": "error", "recovered": true})
    );
    assert_eq!(ends[0].content, json!({}));
    let errors: Vec<&RunEvent> = records
        .iter()
        .filter(|e| e.event_type == "run.error")
        .collect();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].metadata["error_type"], "OrphanRecovered");
    assert!(
        kinds.contains(&"subagent.step"),
        "the records of the killed process are kept"
    );
    let log = client()
        .get(format!(
            "{api}/threads/{thread}/runs/{run}/stream?stream_mode=updates"
        ))
        .header("Last-Event-ID", "-1")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The log, replayed from the start (-1), closes with the recovery's error and end.
    let error_at = log.find("event: error").expect("an error frame");
    assert!(log[error_at..].contains("event: end"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_killed_mid_run_on_sqlite_leaves_a_run_the_restart_ends_with_one_run_end() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), None);
    let (first, api) = serve(dir.path());
    let run = start_demo_run(&api, "t-killed").await;
    kill_hard(first);

    let (second, api) = serve(dir.path());
    assert_recovered(&api, "t-killed", &run).await;
    kill_hard(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_killed_mid_run_on_postgres_leaves_a_run_another_serve_ends_with_one_run_end() {
    let db = TestDb::new().await;
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_config(a_dir.path(), Some(&db.url));
    write_config(b_dir.path(), Some(&db.url));
    let (a, a_api) = serve(a_dir.path());
    let (b, b_api) = serve(b_dir.path());
    let run = start_demo_run(&a_api, "t-pg-killed").await;
    kill_hard(a);
    // B finds the lease expired on one of its sweeps (every third of a lease).
    assert_recovered(&b_api, "t-pg-killed", &run).await;
    kill_hard(b);
}
