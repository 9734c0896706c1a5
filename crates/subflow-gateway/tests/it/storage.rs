//! Storage grows with what runs add, not with the thread's history: a long thread's runs
//! do not copy its whole state into every checkpoint and every stream log.

use serde_json::{Value, json};

use crate::{Options, TestApp, parse_frames, spawn_app_with};

/// Runs per measurement, as in the report of issue 15.
const RUNS: usize = 150;

/// The `n`-th demo run: three parallel tasks and a summary.
fn demo_run(n: usize) -> Value {
    let ask = format!("Compare storage engines for workload {n}");
    json!({"input": {"messages": [{"role": "user", "content": ask}]},
           "stream_mode": ["values", "messages-tuple", "updates", "custom"]})
}

/// A gateway whose runs all do the same work: loop detection, which follows a thread
/// across its runs, would stop the long thread's later runs early.
async fn app() -> TestApp {
    spawn_app_with(Options {
        configure: Box::new(|app| app.runtime.config.loop_detection.enabled = false),
        ..Options::default()
    })
    .await
}

/// The bytes of the app's SQLite file, its write-ahead log folded in first.
fn sqlite_bytes(app: &TestApp) -> u64 {
    let path = app.sqlite.as_ref().expect("a SQLite file of its own");
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(30))
        .unwrap();
    let busy: i64 = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| row.get(0))
        .unwrap();
    assert_eq!(busy, 0, "the checkpoint ran to completion");
    std::fs::metadata(path).unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_on_one_long_thread_store_about_what_runs_on_separate_threads_store() {
    let started = std::time::Instant::now();
    let long = app().await;
    let mut runs = Vec::new();
    for n in 0..RUNS {
        let streamed = long.stream_run("long", demo_run(n)).await;
        assert_eq!(streamed.status, 200);
        assert_eq!(streamed.frames.last().unwrap().event, "end");
        runs.push(streamed);
    }
    let long_took = started.elapsed();
    let started = std::time::Instant::now();
    let separate = app().await;
    for n in 0..RUNS {
        let streamed = separate
            .stream_run(&format!("short-{n}"), demo_run(n))
            .await;
        assert_eq!(streamed.frames.last().unwrap().event, "end");
    }
    println!(
        "runs took {long_took:?} on one thread, {:?} on separate threads",
        started.elapsed()
    );
    let (long_bytes, separate_bytes) = (sqlite_bytes(&long), sqlite_bytes(&separate));
    println!(
        "storage: {RUNS} runs on one thread {long_bytes} bytes, on {RUNS} threads {separate_bytes} bytes, ratio {:.2}",
        long_bytes as f64 / separate_bytes as f64
    );

    // The stream log of the thread's last run is about as large as its first one's:
    // its `values` frames are references to the checkpoints holding them.
    let log = |streamed: &crate::Streamed| {
        let run_id = streamed.frames[0].data["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let store = long.store.clone();
        async move { store.read_frames(&run_id, 0, 2000).await.unwrap() }
    };
    let (first_log, last_log) = (log(&runs[0]).await, log(&runs[RUNS - 1]).await);
    let bytes = |frames: &[subflow_store::StreamFrame]| -> usize {
        frames.iter().map(|f| f.data.len()).sum()
    };
    println!(
        "stream log: the first run {} bytes, the last {} bytes (live, the last run sent {} bytes)",
        bytes(&first_log),
        bytes(&last_log),
        runs[RUNS - 1].text.len()
    );
    assert!(last_log.iter().any(|f| f.event == "values:checkpoint"));
    assert!(!last_log.iter().any(|f| f.event == "values"));
    assert!(bytes(&last_log) < 2 * bytes(&first_log));

    // A replay of the last run from the durable log is what its client saw live.
    let last = runs.pop().unwrap();
    let run_id = last.frames[0].data["run_id"].as_str().unwrap();
    let replay = long
        .client
        .get(long.url(&format!("/api/threads/long/runs/{run_id}/stream")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(parse_frames(&replay), last.frames);
    assert_eq!(
        replay, last.text,
        "the replay is byte for byte the live stream"
    );
    assert!(
        long_bytes as f64 <= 1.5 * separate_bytes as f64,
        "{long_bytes} bytes on one thread against {separate_bytes} on separate threads"
    );
}
