//! Connections are timed out (`server.*_timeout_seconds`): one that sits idle, one whose
//! headers trickle in and one whose body trickles in are each closed at their timeout,
//! while a long answer (an SSE stream) to a silent client is never cut.
//!
//! Each test sets one timeout short and the others to a minute, so a close within the
//! [`PATIENCE`] bound can only come from the short one; the bound only stops a test that
//! would otherwise hang. The measured times are printed. `join` and `/runs/wait` answer
//! 504 at the `timeout` they were given, and the run goes on.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use subflow_gateway::server::ConnectionTimeouts;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{Options, TestApp, spawn_app_with};

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(60);
/// Far below `LONG`, far above `SHORT`.
const PATIENCE: Duration = Duration::from_secs(20);

async fn app_with(timeouts: ConnectionTimeouts, delay_ms: u64) -> TestApp {
    spawn_app_with(Options {
        delay_ms,
        configure: Box::new(move |app| app.connections = timeouts),
        ..Options::default()
    })
    .await
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Everything the server sends until it closes the connection.
async fn until_closed(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut received))
        .await
        .expect("the server closes the connection")
        .unwrap();
    String::from_utf8(received).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_at_the_idle_timeout() {
    let app = app_with(
        ConnectionTimeouts {
            idle: SHORT,
            header: LONG,
            body: LONG,
        },
        0,
    )
    .await;
    // A connection that never sends a byte.
    let mut silent = connect(&app).await;
    let started = Instant::now();
    assert_eq!(until_closed(&mut silent).await, "");
    println!("a silent connection closed after {:?}", started.elapsed());
    // A kept-alive connection after its request was answered.
    let mut kept = connect(&app).await;
    let host = app.base.trim_start_matches("http://");
    kept.write_all(format!("GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let started = Instant::now();
    let received = until_closed(&mut kept).await;
    assert!(received.starts_with("HTTP/1.1 200 OK"), "{received}");
    assert!(
        received.ends_with(r#"{"status":"ok"}"#),
        "one answer, then the close: {received}"
    );
    println!(
        "a kept-alive connection closed {:?} after its answer",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_trickling_in_are_cut_at_the_header_timeout() {
    let app = app_with(
        ConnectionTimeouts {
            idle: LONG,
            header: SHORT,
            body: LONG,
        },
        0,
    )
    .await;
    let stream = connect(&app).await;
    let (mut reader, mut writer) = stream.into_split();
    let started = Instant::now();
    // A slowloris: a byte every 20 ms, never the end of the headers.
    let trickle = tokio::spawn(async move {
        let header = b"GET /health HTTP/1.1\r\nX-Slow: "
            .iter()
            .chain(std::iter::repeat(&b'a'));
        for byte in header {
            if writer.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let mut received = Vec::new();
    tokio::time::timeout(PATIENCE, reader.read_to_end(&mut received))
        .await
        .expect("the server closes the connection")
        .ok();
    println!("trickled headers cut after {:?}", started.elapsed());
    assert!(
        received.is_empty(),
        "{}",
        String::from_utf8_lossy(&received)
    );
    trickle.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_trickling_in_is_a_408_at_the_body_timeout_and_the_connection_closes() {
    let app = app_with(
        ConnectionTimeouts {
            idle: LONG,
            header: LONG,
            body: SHORT,
        },
        0,
    )
    .await;
    let stream = connect(&app).await;
    let (mut reader, mut writer) = stream.into_split();
    let host = app.base.trim_start_matches("http://").to_owned();
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        let head = format!(
            "POST /api/threads/search HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
        );
        writer.write_all(head.as_bytes()).await.unwrap();
        for byte in std::iter::repeat(b' ') {
            if writer.write_all(&[byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let mut received = Vec::new();
    tokio::time::timeout(PATIENCE, reader.read_to_end(&mut received))
        .await
        .expect("the server closes the connection")
        .ok();
    println!("a trickled body cut after {:?}", started.elapsed());
    let received = String::from_utf8(received).unwrap();
    assert!(
        received.starts_with("HTTP/1.1 408 Request Timeout"),
        "{received}"
    );
    let body: Value = serde_json::from_str(received.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(
        body["detail"],
        "Request body timed out: the request body did not arrive within 0.3 s"
    );
    trickle.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_to_a_silent_client_is_never_cut() {
    // Every timeout short, and a paced demo run that streams for many of them.
    let app = app_with(
        ConnectionTimeouts {
            idle: SHORT,
            header: SHORT,
            body: SHORT,
        },
        40,
    )
    .await;
    let started = Instant::now();
    let streamed = app
        .stream_run(
            "slow",
            json!({"input": {"messages": [{"role": "user", "content": "Compare two queues"}]},
                   "stream_mode": ["messages-tuple", "custom"]}),
        )
        .await;
    let took = started.elapsed();
    println!("a paced run streamed for {took:?} with every timeout at {SHORT:?}");
    assert_eq!(streamed.frames.last().unwrap().event, "end");
    assert!(streamed.frames.iter().any(|f| f.event == "custom"));
    // `join` writes nothing until the run ends.
    let run: Value = app
        .client
        .post(app.url("/api/threads/slow/runs"))
        .json(&json!({"input": {"messages": [{"role": "user", "content": "Compare two caches"}]}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = run["run_id"].as_str().unwrap();
    let started = Instant::now();
    let joined = app
        .client
        .get(app.url(&format!("/api/threads/slow/runs/{run_id}/join")))
        .send()
        .await
        .unwrap();
    assert_eq!(joined.status(), 200);
    let values: Value = joined.json().await.unwrap();
    assert!(values["messages"].as_array().unwrap().len() > 3);
    println!("join answered after {:?} of silence", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_and_wait_answer_504_at_their_timeout_and_the_run_goes_on() {
    // The demo streams its pieces 100 ms apart: it runs for seconds.
    let app = spawn_app_with(Options {
        delay_ms: 100,
        ..Options::default()
    })
    .await;
    let body = json!({"input": {"messages": [{"role": "user", "content": "Compare three storage engines"}]}});
    let started = Instant::now();
    let waited = tokio::time::timeout(
        PATIENCE,
        app.client
            .post(app.url("/api/threads/t-wait/runs/wait?timeout=1"))
            .json(&body)
            .send(),
    )
    .await
    .expect("wait answers within its timeout")
    .unwrap();
    println!("wait?timeout=1 answered after {:?}", started.elapsed());
    assert_eq!(waited.status(), 504);
    let detail: Value = waited.json().await.unwrap();
    assert!(
        detail["detail"]
            .as_str()
            .is_some_and(|d| d.contains("has not ended within 1 s")),
        "{detail}"
    );
    let (_, _, runs) = app.get_json("/api/threads/t-wait/runs").await;
    let run = runs[0]["run_id"].as_str().unwrap().to_owned();
    assert_eq!(runs[0]["status"], "running", "answering did not cancel it");

    let join = format!("/api/threads/t-wait/runs/{run}/join");
    let (status, _, _) = app.get_json(&format!("{join}?timeout=1")).await;
    assert_eq!(status, 504);
    for bad in ["0", "86401", "soon"] {
        let (status, _, body) = app.get_json(&format!("{join}?timeout={bad}")).await;
        assert_eq!(status, 422, "timeout={bad}: {body}");
    }
    let (status, _, values) = tokio::time::timeout(Duration::from_secs(60), app.get_json(&join))
        .await
        .expect("join without a timeout waits for the end");
    assert_eq!(status, 200, "{values}");
    assert!(values["messages"].as_array().is_some_and(|m| m.len() > 1));
    let (_, _, record) = app
        .get_json(&format!("/api/threads/t-wait/runs/{run}"))
        .await;
    assert_eq!(record["status"], "success", "{record}");
}
