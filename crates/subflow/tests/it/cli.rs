//! The binary's commands over a real SQLite file.

use std::process::{Command, Output};

use serde_json::json;
use subflow_contracts::NewEvent;
use subflow_store::spill::SpillFile;
use subflow_store::{EventQuery, EventStore};
use subflow_store_sqlite::SqliteStore;

fn subflow(args: &[&str], dir: &std::path::Path) -> Output {
    subflow_with_env(args, dir, &[])
}

fn subflow_with_env(args: &[&str], dir: &std::path::Path, envs: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_subflow"))
        .args(args)
        .current_dir(dir)
        .env_remove("SUBFLOW__DATABASE__URL")
        .env_remove("SUBFLOW_CONFIG")
        .envs(envs.iter().copied())
        .output()
        .expect("the subflow binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn version_prints_the_binary_and_contract_versions_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let output = subflow(&["version"], dir.path());
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(
        stdout.trim(),
        format!(
            "subflow {} (subagent status contract v2, run event stream contract v1)",
            env!("CARGO_PKG_VERSION")
        )
    );
}

#[test]
fn migrate_creates_the_default_sqlite_database_in_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let output = subflow(&["migrate"], dir.path());
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(dir.path().join("subflow.db").exists());
    assert!(stderr(&output).contains("is migrated"));
}

#[test]
fn migrate_reads_the_configuration_serve_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let database = |name: &str| format!("[database]\nurl = 'sqlite://{name}'\n");
    std::fs::write(path.join("subflow.toml"), database("cwd.db")).unwrap();
    std::fs::write(path.join("custom.toml"), database("flag-file.db")).unwrap();
    std::fs::write(path.join("env.toml"), database("env-file.db")).unwrap();
    for (args, envs, created) in [
        (&["migrate"][..], &[][..], "cwd.db"),
        (&["migrate", "--config", "custom.toml"], &[], "flag-file.db"),
        (
            &["migrate"],
            &[("SUBFLOW_CONFIG", "env.toml")],
            "env-file.db",
        ),
        (
            &["migrate"],
            &[("SUBFLOW__DATABASE__URL", "sqlite://variable.db")],
            "variable.db",
        ),
        (
            &[
                "migrate",
                "--config",
                "custom.toml",
                "--database-url",
                "sqlite://flag.db",
            ],
            &[],
            "flag.db",
        ),
    ] {
        let output = subflow_with_env(args, path, envs);
        assert!(
            output.status.success(),
            "{args:?} {envs:?}: {}",
            stderr(&output)
        );
        assert!(
            path.join(created).exists(),
            "{args:?} {envs:?} creates {created}"
        );
        assert!(
            stderr(&output).contains(&format!("database sqlite://{created} is migrated")),
            "{}",
            stderr(&output)
        );
    }
    assert!(
        !path.join("subflow.db").exists(),
        "the default was never used"
    );
    // The same file `serve` would refuse is refused here, with the key named.
    std::fs::write(
        path.join("bad.toml"),
        "[database]\nmax_connections = 'many'\n",
    )
    .unwrap();
    let output = subflow(&["migrate", "--config", "bad.toml"], path);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("database.max_connections"),
        "{}",
        stderr(&output)
    );
}

/// Waits for `child` to exit; a child still running after `patience` is killed and fails
/// the test (a liveness bound, far above what a passing run takes, not a measurement).
fn exit_within(mut child: std::process::Child, patience: std::time::Duration) -> Output {
    let waited = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if waited.elapsed() > patience {
            let _ = child.kill();
            panic!("still running after {patience:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn serve_stops_at_once_on_an_unreachable_postgres_with_the_url_and_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    // A closed port refuses at once; a listener that never answers leaves the client waiting.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    for port in [closed_port, silent_port] {
        let url = format!("postgres://ana:secret@127.0.0.1:{port}/subflow");
        let child = Command::new(env!("CARGO_BIN_EXE_subflow"))
            .args(["serve", "--listen", "127.0.0.1:0", "--database-url", &url])
            .current_dir(dir.path())
            .env_remove("SUBFLOW_CONFIG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // sqlx's pool would retry for 30 s; serve gives up after one 5 s attempt.
        let output = exit_within(child, std::time::Duration::from_secs(20));
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "port {port}: {message}");
        assert!(
            message.contains(&format!("postgres://ana:***@127.0.0.1:{port}/subflow")),
            "{message}"
        );
        assert!(!message.contains("secret"), "{message}");
        assert!(!message.contains("listening on"), "{message}");
    }
    drop(silent);
}

#[test]
fn an_unsupported_database_url_is_a_usage_error_that_says_what_to_use() {
    let dir = tempfile::tempdir().unwrap();
    let output = subflow(
        &["migrate", "--database-url", "mysql://localhost/x"],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("use sqlite://PATH or postgres://"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn unknown_commands_and_bad_bench_sizes_exit_with_code_2() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(subflow(&["frobnicate"], dir.path()).status.code(), Some(2));
    let output = subflow(&["bench", "store", "--events", "10"], dir.path());
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("--events must be at least 20000"),
        "{}",
        stderr(&output)
    );
}

/// The value of `key` in a bench result line such as `steps=153 ratio=0.71`.
fn bench_field(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|field| field.strip_prefix(key)?.strip_prefix('='))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

#[test]
fn bench_runtime_and_bench_batches_run_to_their_result_line() {
    let dir = tempfile::tempdir().unwrap();
    let output = subflow(
        &[
            "bench",
            "runtime",
            "--subagents",
            "1",
            "--steps",
            "2",
            "--repeat",
            "2",
        ],
        dir.path(),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let line = String::from_utf8(output.stdout).unwrap();
    // One subagent of two tool steps and its answer: three `task_running` events a run.
    assert_eq!(bench_field(&line, "steps"), 3.0, "{line}");
    assert!(bench_field(&line, "ratio") > 0.0, "{line}");

    let output = subflow(&["bench", "batches", "--items", "100"], dir.path());
    assert!(output.status.success(), "{}", stderr(&output));
    let line = String::from_utf8(output.stdout).unwrap();
    assert_eq!(bench_field(&line, "items"), 100.0, "{line}");
    assert!(bench_field(&line, "ratio") > 0.0, "{line}");
    assert!(bench_field(&line, "store_writes_per_item") <= 1.0, "{line}");
    // The worker on the in-memory store, against the same executor-alone baseline.
    assert!(bench_field(&line, "memory_items_per_s") > 0.0, "{line}");
    let memory_ratio = bench_field(&line, "memory_ratio");
    let expected =
        bench_field(&line, "memory_items_per_s") / bench_field(&line, "baseline_items_per_s");
    assert!((memory_ratio - expected).abs() < 0.01, "{line}");
}

#[test]
fn bench_gateway_times_a_single_stream_once_and_refuses_empty_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let output = subflow(&["bench", "gateway", "--requests", "0"], dir.path());
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("--requests, --streams and --steps must be at least 1"),
        "{}",
        stderr(&output)
    );
    // `--streams 1` is the single stream alone: one SSE line, no second measurement.
    let output = subflow(
        &[
            "bench",
            "gateway",
            "--streams",
            "1",
            "--requests",
            "2",
            "--steps",
            "2",
            "--step-delay-ms",
            "0",
        ],
        dir.path(),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let text = String::from_utf8(output.stdout).unwrap();
    let sse: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("sse_streams="))
        .collect();
    assert_eq!(sse.len(), 1, "{text}");
    assert_eq!(bench_field(sse[0], "sse_streams"), 1.0, "{text}");
    assert!(bench_field(sse[0], "p99_ratio") > 0.0, "{text}");
    // The same steps through a gateway on the in-memory store, against the channel.
    let memory_ratio = bench_field(sse[0], "memory_p99_ratio");
    let expected = bench_field(sse[0], "memory_p99_ms") / bench_field(sse[0], "channel_p99_ms");
    assert!(
        (memory_ratio - expected).abs() < 0.01 * expected.max(1.0),
        "{text}"
    );
}

/// Starts `subflow serve` on a free port; returns the child and its address once it listens.
pub fn start_serve(
    dir: &std::path::Path,
    args: &[&str],
) -> (
    std::process::Child,
    String,
    std::io::Lines<std::io::BufReader<std::process::ChildStderr>>,
) {
    start_serve_with_env(dir, args, &[])
}

/// [`start_serve`] with extra environment variables.
pub fn start_serve_with_env(
    dir: &std::path::Path,
    args: &[&str],
    envs: &[(&str, &str)],
) -> (
    std::process::Child,
    String,
    std::io::Lines<std::io::BufReader<std::process::ChildStderr>>,
) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_subflow"))
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .envs(envs.iter().copied())
        .env_remove("SUBFLOW_LOG")
        .current_dir(dir)
        .env_remove("SUBFLOW_CONFIG")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve starts");
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let address = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| {
            line.split("listening on http://")
                .nth(1)
                .map(|rest| rest.split_whitespace().next().unwrap().to_owned())
        })
        .expect("serve reports its address");
    (child, address, lines)
}

/// A raw HTTP/1.1 GET over loopback.
fn http_get(address: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[tokio::test]
async fn serve_re_applies_spilled_events_serves_health_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<NewEvent> = (0..3)
        .map(|n| {
            NewEvent::new(
                "t1",
                "r1",
                "llm.error",
                "trace",
                json!(n),
                Default::default(),
            )
        })
        .collect();
    let spill = SpillFile::in_dir(dir.path());
    spill.append(&records).unwrap();
    let (mut child, address, lines) = start_serve(dir.path(), &[]);
    assert!(
        !spill.path().exists(),
        "the spill file is consumed before serving"
    );
    let health = http_get(&address, "/health");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.to_lowercase().contains("x-trace-id: "));
    assert!(health.ends_with(r#"{"status":"ok"}"#), "{health}");
    let url = format!("sqlite://{}", dir.path().join("subflow.db").display());
    let store = SqliteStore::open(&url, 1).await.unwrap();
    let rows = store
        .list_events(&EventQuery::run("t1", "r1"))
        .await
        .unwrap();
    assert_eq!(
        rows.iter().map(|r| r.event_id).collect::<Vec<_>>(),
        records.iter().map(|r| r.event_id).collect::<Vec<_>>()
    );
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "a SIGTERM is a graceful stop: {status}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(
        rest.iter().any(|l| l.contains("subflow: stopped")),
        "{rest:?}"
    );
}

#[test]
fn serve_refuses_a_bad_configuration_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("subflow.toml"),
        "[subagents]\nmax_concurrent = 9\n",
    )
    .unwrap();
    let output = subflow(&["serve"], dir.path());
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("subagents.max_concurrent must be between 1 and 4, got 9"),
        "{}",
        stderr(&output)
    );
}

/// A raw HTTP/1.1 POST of JSON over loopback, read to the end.
fn http_post(address: &str, path: &str, trace_id: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nX-Trace-Id: {trace_id}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// Runs one delegated task through `serve` with the given logging settings; returns stderr.
fn serve_log_lines(enhanced: Option<&str>) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let mut envs = vec![];
    if let Some(format) = enhanced {
        envs.push(("SUBFLOW__LOGGING__ENHANCE__ENABLED", "true"));
        envs.push(("SUBFLOW__LOGGING__ENHANCE__FORMAT", format));
    }
    let (mut child, address, lines) = start_serve_with_env(dir.path(), &[], &envs);
    let body = r#"{"input": {"messages": [{"role": "user", "content": "/task general-purpose Check the logs"}]}, "stream_mode": ["custom"]}"#;
    let response = http_post(
        &address,
        "/api/threads/t-log/runs/stream",
        "trace-abc",
        body,
    );
    assert!(response.contains("event: end"), "{response}");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    child.wait().unwrap();
    lines.map_while(Result::ok).collect()
}

#[test]
fn log_lines_follow_the_configured_format_with_the_request_trace_id_only_when_enhanced() {
    let plain = serve_log_lines(None);
    let task_line = plain
        .iter()
        .find(|l| l.contains(" - subflow_runtime::subagent - INFO - [trace="))
        .unwrap_or_else(|| panic!("a task line in {plain:#?}"));
    assert!(!task_line.contains("trace_id="), "{task_line}");
    assert_eq!(&task_line[4..5], "-", "{task_line}");

    let text = serve_log_lines(Some("text"));
    let task_line = text
        .iter()
        .find(|l| l.contains("subflow_runtime::subagent"))
        .unwrap_or_else(|| panic!("a task line in {text:#?}"));
    assert!(
        task_line.contains(" - INFO - [trace_id=trace-abc] - [trace="),
        "{task_line}"
    );

    let json = serve_log_lines(Some("json"));
    let records: Vec<serde_json::Value> = json
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let task = records
        .iter()
        .find(|r| r["logger"] == "subflow_runtime::subagent")
        .unwrap_or_else(|| panic!("a task record in {json:#?}"));
    assert_eq!(task["trace_id"], "trace-abc");
    assert_eq!(task["level"], "INFO");
    assert!(task["message"].as_str().unwrap().starts_with("[trace="));
    assert!(task["timestamp"].is_string());
}

#[test]
fn a_bad_gateway_url_or_item_status_is_a_usage_error_that_says_what_to_give() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["usage", "t1", "--url", "notaurl"][..],
        &[
            "tasks",
            "cancel",
            "t1",
            "r1",
            "c1",
            "--url",
            "ftp://example.test",
        ],
    ] {
        let output = subflow(args, dir.path());
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let text = stderr(&output);
        assert!(text.contains("--url"), "{text}");
        assert!(text.contains("http://"), "{text}");
        assert!(!text.contains("builder error"), "{text}");
    }
    let output = subflow(&["batches", "show", "b1", "--status", "bogus"], dir.path());
    assert_eq!(output.status.code(), Some(2));
    let text = stderr(&output);
    assert!(
        text.contains(
            "expected one of pending, queued, leased, running, succeeded, failed, cancelled"
        ),
        "{text}"
    );
}

/// Starting on an already migrated PostgreSQL database logs nothing about the migration
/// table (the server's "already exists, skipping" notice is not news to an operator).
#[tokio::test]
async fn migrating_a_migrated_postgres_database_logs_no_server_notice() {
    let db = subflow_store_postgres::testing::TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let output = subflow_with_env(
        &["migrate"],
        dir.path(),
        &[("SUBFLOW__DATABASE__URL", db.url.as_str())],
    );
    let text = stderr(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("is migrated"), "{text}");
    assert!(!text.contains("already exists"), "{text}");
}
