//! `subflow tail` and `subflow usage` against a real `subflow serve` (docs/workspace.md#in-the-terminal).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

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
    let (server, address, _log) = start_serve_with_env(dir.path(), &["--config", &config], &[]);
    let _server = KillOnDrop(server);
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
        assert_eq!(
            card["step_count"], 2,
            "{card}: the two tool steps a card lists"
        );
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
    // One line per change: consecutive lines of a task always differ, and steps only grow
    // while it runs (on completion its answer leaves the list to become the result).
    let mut previous: HashMap<&str, &Value> = HashMap::new();
    for line in &lines {
        let id = line["task_id"].as_str().unwrap();
        if let Some(before) = previous.insert(id, line) {
            assert_ne!(before, line, "a repeated line");
            if line["status"] == "in_progress" {
                assert!(before["step_count"].as_u64() <= line["step_count"].as_u64());
            }
        }
    }
    assert!(
        lines
            .iter()
            .any(|l| l["status"] == "in_progress" && l["step_count"].as_u64() > Some(0)),
        "steps were seen while the tasks ran"
    );

    // The run is over: tailing it again prints each card exactly once, final, painted
    // from the run's task summaries (its stream is not replayed).
    for args in [
        &["tail", "tailed", "--run", &run][..],
        &["tail", "tailed", "--json"][..],
    ] {
        let again = client(&address, args);
        assert_eq!(again.status.code(), Some(0), "{args:?}");
        let replayed = json_lines(&again.stdout);
        assert_eq!(
            replayed.len(),
            3,
            "{args:?}: one line per card: {replayed:#?}"
        );
        assert_eq!(last_by_task(&replayed), last, "{args:?}");
    }

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

    // `usage --all`: every thread of the user, grouped; the totals equal the thread's.
    let all = client(&address, &["usage", "--all", "--json"]);
    assert_eq!(all.status.code(), Some(0));
    let all: Value = serde_json::from_slice(&all.stdout).unwrap();
    let thread: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(all["group_by"], "day");
    assert_eq!(all["counted"]["runs"], thread["total_runs"]);
    assert_eq!(all["counted"]["total_tokens"], thread["total_tokens"]);
    assert_eq!(all["counted"]["cost"], thread["cost"]);
    let table = client(
        &address,
        &["usage", "--all", "--since", "2d", "--by", "thread"],
    );
    let text = String::from_utf8_lossy(&table.stdout);
    assert_eq!(table.status.code(), Some(0), "{text}");
    assert!(
        text.contains(", by thread\n") && text.contains("\n  tailed "),
        "{text}"
    );
    for (args, says) in [
        (
            &["usage", "--all", "--since", "3w"][..],
            "expected a number of days or hours",
        ),
        (
            &["usage", "--all", "--by", "week"][..],
            "invalid value 'week'",
        ),
        (&["usage"][..], "required"),
        (&["usage", "tailed", "--since", "2d"][..], "--all"),
    ] {
        let refused = client(&address, args);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// Joining a run that has ended prints each card once, final: no first line that says
/// "completed" with 0 steps before the real count.
#[test]
fn tail_of_a_finished_run_prints_each_card_once_with_its_steps() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_delay(dir.path(), 0);
    let (server, address, _log) = start_serve_with_env(dir.path(), &["--config", &config], &[]);
    let _server = KillOnDrop(server);
    let body = json!({"input": {"messages": [{"role": "user", "content": "Compare two queues"}]}});
    http::blocking_post(&address, "/api/threads/done/runs/wait", &body);
    let output = client(&address, &["tail", "done", "--json"]);
    assert_eq!(output.status.code(), Some(0));
    let lines = json_lines(&output.stdout);
    assert_eq!(lines.len(), 3, "one line per card: {lines:?}");
    for line in &lines {
        assert_eq!(line["status"], "completed", "{line}");
        assert_eq!(line["step_count"], 2, "{line}");
    }
}

#[test]
fn tail_of_a_stopped_run_ends_its_unanswered_cards_failed_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    // Slow text keeps the subagents busy long enough to stop them mid-task.
    let config = config_with_delay(dir.path(), 300);
    let (server, address, _log) = start_serve_with_env(dir.path(), &["--config", &config], &[]);
    let _server = KillOnDrop(server);
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

    // The stopped run's tokens are not counted, but `usage` shows them beside the totals.
    let record: Value = serde_json::from_str(&http::blocking_get(
        &address,
        &format!("/api/threads/stopped/runs/{run}"),
    ))
    .unwrap();
    let spent = record["total_tokens"].as_u64().unwrap();
    let table = client(&address, &["usage", "stopped"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.starts_with("Thread stopped: 0 counted runs\n"),
        "{text}"
    );
    let tokens = spent.to_string();
    let grouped = if spent >= 1000 {
        format!(
            "{},{}",
            &tokens[..tokens.len() - 3],
            &tokens[tokens.len() - 3..]
        )
    } else {
        tokens
    };
    assert!(
        text.contains(&format!("\n+ {grouped} tokens in 1 stopped run\n")),
        "{text}"
    );
}

/// A TCP proxy whose connections can be cut, and which answers the first resuming
/// stream request (one with `Last-Event-ID`) with a `gap` frame instead of forwarding it.
struct Proxy {
    address: String,
    connections: Arc<Mutex<Vec<TcpStream>>>,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let connections: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let (open, seen) = (connections.clone(), heads.clone());
        std::thread::spawn(move || {
            let mut gapped = false;
            for client in listener.incoming() {
                let Ok(mut client) = client else { return };
                // The first request head of the connection.
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buffer.windows(4).any(|w| w == b"\r\n\r\n") {
                    match client.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buffer).to_ascii_lowercase();
                seen.lock().unwrap().push(head.clone());
                let resumes = head.starts_with("get ") && head.contains("/stream?");
                if let (false, true, Some(cursor)) =
                    (gapped, resumes, header(&head, "last-event-id"))
                {
                    gapped = true;
                    let gap = json!({"code": "stream_replay_gap", "run_id": "r", "requested_event_id": cursor,
                        "earliest_available_event_id": cursor + 1, "latest_available_event_id": cursor,
                        "recovery": "reload_durable_state"});
                    let _ = write!(
                        client,
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\nevent: gap\ndata: {gap}\n\n"
                    );
                    continue;
                }
                let mut server = TcpStream::connect(&upstream).unwrap();
                server.write_all(&buffer).unwrap();
                open.lock()
                    .unwrap()
                    .extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                let (mut client_in, mut server_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                let later = seen.clone();
                // Forwards the client's bytes and records each further request head: the
                // tail sends only GETs, so heads are the text between blank lines.
                std::thread::spawn(move || {
                    let mut pending = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while let Ok(n) = client_in.read(&mut chunk) {
                        if n == 0 || server_out.write_all(&chunk[..n]).is_err() {
                            break;
                        }
                        pending.extend_from_slice(&chunk[..n]);
                        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head: Vec<u8> = pending.drain(..end + 4).collect();
                            later
                                .lock()
                                .unwrap()
                                .push(String::from_utf8_lossy(&head).to_ascii_lowercase());
                        }
                    }
                });
                std::thread::spawn(move || std::io::copy(&mut server, &mut client));
            }
        });
        Proxy {
            address,
            connections,
            heads,
        }
    }

    /// Breaks every open connection, as a network failure would.
    fn cut(&self) {
        for stream in self.connections.lock().unwrap().drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn header(head: &str, name: &str) -> Option<u64> {
    head.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}:")))
        .and_then(|value| value.trim().parse().ok())
}

#[test]
fn tail_resumes_after_a_broken_stream_and_recovers_from_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_delay(dir.path(), 100);
    let (server, address, _log) = start_serve_with_env(dir.path(), &["--config", &config], &[]);
    let _server = KillOnDrop(server);
    let proxy = Proxy::start(address.clone());
    start_run(&address, "resumed");
    let mut tail = client_command(&proxy.address, &["tail", "resumed", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(tail.stdout.take().unwrap()).lines();
    let mut lines = Vec::new();
    for line in stdout.by_ref() {
        let line: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let started = line["step_count"].as_u64() > Some(0);
        lines.push(line);
        if started {
            break;
        }
    }
    proxy.cut();
    lines.extend(stdout.map(|line| serde_json::from_str::<Value>(&line.unwrap()).unwrap()));
    let output = tail.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("reconnecting"), "{stderr}");
    assert!(stderr.contains("frames were pruned"), "{stderr}");

    // It came back with its cursor twice: once answered by the gap, then from the gap's
    // latest available id, which the proxy's gap set to the same cursor.
    let resumes: Vec<u64> = proxy
        .heads
        .lock()
        .unwrap()
        .iter()
        .filter(|head| head.contains("/stream?"))
        .filter_map(|head| header(head, "last-event-id"))
        .collect();
    assert_eq!(resumes.len(), 2, "{resumes:?}");
    assert_eq!(resumes[0], resumes[1]);

    let last = last_by_task(&lines);
    assert_eq!(last.len(), 3);
    for card in last.values() {
        assert_eq!(card["status"], "completed", "{card}");
        assert_eq!(
            card["step_count"], 2,
            "{card}: the two tool steps a card lists"
        );
    }
}

/// Stops a server when the test ends, also when it fails.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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

#[test]
fn run_prints_the_answer_and_follow_shows_the_cards_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_delay(dir.path(), 0);
    let (server, address, _log) = start_serve_with_env(dir.path(), &["--config", &config], &[]);
    let _server = KillOnDrop(server);

    let output = client(&address, &["run", "/echo hello there", "--thread", "asked"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "echo: hello there\n"
    );
    let runs: Value =
        serde_json::from_str(&http::blocking_get(&address, "/api/threads/asked/runs")).unwrap();
    assert_eq!(runs[0]["status"], "success");

    let output = client(
        &address,
        &[
            "run",
            "Compare two queues",
            "--follow",
            "--thread",
            "followed",
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    // stdout is the lead's text alone; the cards are JSON lines on stderr (not a terminal).
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!stdout.contains("task_id"), "no card on stdout: {stdout}");
    let state: Value =
        serde_json::from_str(&http::blocking_get(&address, "/api/threads/followed/state")).unwrap();
    let ai_texts: Vec<&str> = state["values"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["type"] == "ai")
        .filter_map(|m| m["content"].as_str())
        .filter(|text| !text.is_empty())
        .collect();
    assert_eq!(
        stdout,
        format!("{}\n", ai_texts.join("\n")),
        "every lead turn's text"
    );
    let lines: Vec<Value> = stderr
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let last = last_by_task(&lines);
    assert_eq!(last.len(), 3, "{stderr}");
    assert!(last.values().all(|card| card["status"] == "completed"));
}

#[test]
fn run_follow_streams_the_answer_to_stdout_while_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_delay(dir.path(), 100);
    let (server, address, _log) = start_serve_with_env(dir.path(), &["--config", &config], &[]);
    let _server = KillOnDrop(server);
    let mut run = client_command(
        &address,
        &["run", "Compare two queues", "--follow", "--thread", "live"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdout = run.stdout.take().unwrap();
    let mut first = [0u8; 16];
    let read = stdout.read(&mut first).unwrap();
    assert!(read > 0, "stdout closed before any text");
    let runs: Value =
        serde_json::from_str(&http::blocking_get(&address, "/api/threads/live/runs")).unwrap();
    assert_eq!(
        runs[0]["status"], "running",
        "text reached stdout before the run ended"
    );
    assert_ne!(first[0], b'{', "the lead's text, not a card");
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    assert!(run.wait().unwrap().success());
    let text = String::from_utf8_lossy(&[&first[..read], &rest[..]].concat()).into_owned();
    assert!(text.contains("Summary of \"Compare two queues\""), "{text}");
}

#[test]
fn a_closed_pipe_ends_tail_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_delay(dir.path(), 100);
    let (server, address, _log) = start_serve_with_env(dir.path(), &["--config", &config], &[]);
    let _server = KillOnDrop(server);
    start_run(&address, "piped");
    // `subflow tail piped | head -1`: the reader goes away after one line while cards
    // keep changing.
    let mut tail = client_command(&address, &["tail", "piped"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(tail.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.starts_with('{'), "{line}");
    drop(stdout);
    let output = tail.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        !stderr.contains("Broken pipe") && !stderr.contains("os error 32"),
        "{stderr}"
    );
}

#[test]
fn unknown_threads_runs_and_models_are_usage_errors_in_usage_tail_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_delay(dir.path(), 0);
    let (server, address, _log) = start_serve_with_env(dir.path(), &["--config", &config], &[]);
    let _server = KillOnDrop(server);
    let refused = |args: &[&str], message: &str| {
        let output = client(&address, args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    };
    // The gateway's answer for a thread that does not exist (or is another user's): 404.
    refused(&["usage", "nope"], "Thread nope not found");
    refused(&["usage", "nope", "--json"], "Thread nope not found");
    refused(&["tail", "nope"], "Thread nope not found");
    refused(
        &["run", "hi", "--model", "missing-model"],
        "Unknown model 'missing-model': the configured models are scripted",
    );
    http::blocking_post(&address, "/api/threads", &json!({"thread_id": "idle"}));
    refused(&["tail", "idle"], "thread idle has no runs");
    refused(&["tail", "idle", "--run", "nope"], "Run nope not found");
    refused(
        &["run", "hi", "--thread", "not a thread"],
        "invalid thread id",
    );
    assert_eq!(client(&address, &["usage", "idle"]).status.code(), Some(0));
}

/// The run's task summaries, through `GET …/tasks`.
fn task_summaries(address: &str, thread: &str, run: &str) -> Vec<Value> {
    let body = http::blocking_get(address, &format!("/api/threads/{thread}/runs/{run}/tasks"));
    serde_json::from_str(&body).unwrap()
}

#[test]
fn tasks_cancel_stops_one_task_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_delay(dir.path(), 100);
    let (server, address, _log) = start_serve_with_env(dir.path(), &["--config", &config], &[]);
    let _server = KillOnDrop(server);
    let run = start_run(&address, "stopped-task");
    // Three tasks running, as their persisted starts say.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let tasks = loop {
        let tasks = task_summaries(&address, "stopped-task", &run);
        if tasks.len() == 3 && tasks.iter().all(|t| t["status"] == "running") {
            break tasks;
        }
        assert!(std::time::Instant::now() < deadline, "{tasks:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let victim = tasks[1]["task_id"].as_str().unwrap();
    let output = client(&address, &["tasks", "cancel", "stopped-task", &run, victim]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(&format!("Task {victim} of run {run}")),
        "{stdout}"
    );
    // The run goes on to its end; only the one task is cancelled.
    let joined = http::blocking_get(
        &address,
        &format!("/api/threads/stopped-task/runs/{run}/join"),
    );
    assert!(joined.contains("messages"), "{joined}");
    let ended: Vec<(String, String)> = task_summaries(&address, "stopped-task", &run)
        .iter()
        .map(|t| {
            (
                t["task_id"].as_str().unwrap().to_owned(),
                t["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (task, status) in &ended {
        let expected = if task == victim {
            "cancelled"
        } else {
            "completed"
        };
        assert_eq!(status, expected, "{ended:?}");
    }
    // Again: the task has ended (a conflict, exit 1); an unknown task is a usage error.
    let again = client(&address, &["tasks", "cancel", "stopped-task", &run, victim]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("has already ended (cancelled)"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let unknown = client(
        &address,
        &["tasks", "cancel", "stopped-task", &run, "call_x"],
    );
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("Task call_x not found"));
}
