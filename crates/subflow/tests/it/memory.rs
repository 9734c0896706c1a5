//! `serve`'s memory stays bounded by a page of states, not by the response, when a
//! client reads the whole history of a long thread: the history is streamed a few
//! checkpoints at a time (issue 15: `limit=1000` on a thread of 150 runs once took the
//! server from 191 MB to 4.46 GB).

use serde_json::json;
use subflow_store::{CheckpointStore, NewCheckpoint, NewThread, RecordStore};

use crate::cli::start_serve;
use crate::client::KillOnDrop;

/// Runs in the thread, each adding a human message and a long AI answer.
const RUNS: usize = 150;
/// Characters of each answer.
const ANSWER_CHARS: usize = 16 * 1024;

/// `VmHWM` (peak resident set) of process `pid`, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc");
    kb * 1024
}

/// A thread of the local user with one checkpoint per message of `RUNS` runs.
async fn long_thread(dir: &std::path::Path) {
    let url = format!("sqlite://{}", dir.join("subflow.db").display());
    let store = subflow_store_sqlite::SqliteStore::open(&url, 1)
        .await
        .unwrap();
    store
        .create_thread(NewThread {
            thread_id: "long".into(),
            owner: "default".into(),
            metadata: Default::default(),
        })
        .await
        .unwrap();
    let mut messages = Vec::new();
    for run in 0..RUNS {
        let answer: String = std::iter::repeat_n(format!("answer {run} "), ANSWER_CHARS / 10)
            .collect::<String>()
            .chars()
            .take(ANSWER_CHARS)
            .collect();
        for message in [
            json!({"type": "human", "content": format!("question {run}"), "id": format!("h{run}")}),
            json!({"type": "ai", "content": answer, "id": format!("a{run}")}),
        ] {
            messages.push(message);
            store
                .put_checkpoint(NewCheckpoint {
                    lease_owner: None,
                    thread_id: "long".into(),
                    checkpoint_id: uuid::Uuid::now_v7().to_string(),
                    parent_checkpoint_id: None,
                    run_id: Some(format!("run-{run}")),
                    values: json!({"messages": messages}),
                    metadata: Default::default(),
                })
                .await
                .unwrap();
        }
    }
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_streams_a_long_threads_whole_history_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    long_thread(dir.path()).await;
    let (child, address, lines) = start_serve(dir.path(), &[]);
    let serve = KillOnDrop(child);
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let base = format!("http://{address}/api/threads/long");
    let state = client.get(format!("{base}/state")).send().await.unwrap();
    assert_eq!(state.status(), 200);
    let state_bytes = state.bytes().await.unwrap().len() as u64;
    let before = peak_rss(serve.0.id());

    let response = client
        .post(format!("{base}/history"))
        .json(&json!({"limit": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut response = response;
    let (mut streamed, mut tail) = (0u64, Vec::new());
    while let Some(chunk) = response.chunk().await.unwrap() {
        streamed += chunk.len() as u64;
        tail.extend_from_slice(&chunk);
        tail.drain(..tail.len().saturating_sub(64));
    }
    assert!(tail.ends_with(b"}]"), "a whole array");
    let after = peak_rss(serve.0.id());
    let growth = after.saturating_sub(before);
    println!(
        "history of {} states: {streamed} bytes streamed, the largest state {state_bytes} bytes; \
         serve's peak RSS {before} -> {after} bytes (+{growth})",
        2 * RUNS
    );
    assert!(streamed > 200_000_000, "{streamed}");
    assert!(
        growth < streamed / 4,
        "serve grew by {growth} bytes while streaming {streamed}"
    );
}
