//! Storage grows with what runs add, not with the thread's history: a long thread's runs
//! do not copy its whole state into every checkpoint and every stream log.

use serde_json::{Value, json};

use crate::{Options, TestApp, parse_frames, spawn_app_with};

/// Runs per measurement, as in the report of issue 15.
const RUNS: usize = 60;

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
    if let Ok(mut st) =
        conn.prepare("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC")
    {
        let rows: Vec<(String, i64)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        println!("{rows:?}");
    } else {
        println!("no dbstat");
    }
    let mut st = conn
        .prepare("SELECT event_type, count(*), sum(length(content)) FROM run_events GROUP BY 1")
        .unwrap();
    let rows: Vec<(String, i64, i64)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    println!("{rows:?}");
    let mut st = conn
        .prepare("SELECT status, stop_reason, count(*) FROM runs GROUP BY 1,2")
        .unwrap();
    let rows: Vec<(String, Option<String>, i64)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    println!("{rows:?}");
    std::fs::metadata(path).unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_on_one_long_thread_store_about_what_runs_on_separate_threads_store() {
    let long = app().await;
    let mut last = None;
    for n in 0..RUNS {
        let streamed = long.stream_run("long", demo_run(n)).await;
        assert_eq!(streamed.status, 200);
        assert_eq!(streamed.frames.last().unwrap().event, "end");
        last = Some(streamed);
    }
    let separate = app().await;
    for n in 0..RUNS {
        let streamed = separate
            .stream_run(&format!("short-{n}"), demo_run(n))
            .await;
        assert_eq!(streamed.frames.last().unwrap().event, "end");
    }
    let (long_bytes, separate_bytes) = (sqlite_bytes(&long), sqlite_bytes(&separate));
    println!(
        "storage: {RUNS} runs on one thread {long_bytes} bytes, on {RUNS} threads {separate_bytes} bytes, ratio {:.2}",
        long_bytes as f64 / separate_bytes as f64
    );

    // A replay of the last run from the durable log is what its client saw live.
    let last = last.unwrap();
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
