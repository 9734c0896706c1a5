//! Several processes appending to one thread at once (docs/events.md#envelope: `seq` allocation must
//! be safe across processes).
//!
//! The parent test re-executes this test binary as child processes that run only
//! [`CHILD_TEST`], told through [`CHILD_ENV`] which database and thread to write to.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;

use serde_json::json;
use sqlx::Row;
use subflow_contracts::NewEvent;
use subflow_store::{EventQuery, EventStore};
use subflow_store_postgres::PostgresStore;

use crate::harness::{TestDb, event};

/// The libtest name of the child-mode test.
const CHILD_TEST: &str = "concurrency::child_writer_appends_its_batches_in_order";
/// `"<thread id> <database url>"`: set only in child processes.
const CHILD_ENV: &str = "SUBFLOW_IT_CHILD_WRITER";
const WRITERS: usize = 2;
const BATCHES: usize = 50;
const BATCH_SIZE: usize = 20;

/// Appends this writer's batches to `thread_id` as run `writer-<pid>`, numbering the
/// records 0.. in emission order, and returns the run id.
async fn write_batches(store: &PostgresStore, thread_id: &str) -> String {
    let run_id = format!("writer-{}", std::process::id());
    for batch_number in 0..BATCHES {
        let batch: Vec<NewEvent> = (0..BATCH_SIZE)
            .map(|i| {
                event(
                    thread_id,
                    &run_id,
                    "run.start",
                    json!(batch_number * BATCH_SIZE + i),
                )
            })
            .collect();
        let outcome = store.append(&batch).await.expect("append a batch");
        assert_eq!((outcome.written, outcome.skipped), (BATCH_SIZE, 0));
    }
    run_id
}

/// In a child process: one of the concurrent writers. Run directly: a lone writer on a
/// fresh database, whose records must come back numbered in emission order.
#[tokio::test]
async fn child_writer_appends_its_batches_in_order() {
    if let Ok(target) = std::env::var(CHILD_ENV) {
        let (thread_id, url) = target
            .split_once(' ')
            .expect("CHILD_ENV is '<thread> <url>'");
        let store = PostgresStore::connect(url, 2)
            .await
            .expect("child connects");
        write_batches(&store, thread_id).await;
        return;
    }
    let db = TestDb::new().await;
    let run_id = write_batches(&db.store, "solo").await;
    let query = EventQuery {
        limit: 2000,
        ..EventQuery::run("solo", run_id)
    };
    let events = db.store.list_events(&query).await.unwrap();
    assert_eq!(events.len(), BATCHES * BATCH_SIZE);
    for (n, record) in events.iter().enumerate() {
        assert_eq!(record.seq, n as i64 + 1);
        assert_eq!(record.content, json!(n));
    }
}

#[tokio::test]
async fn concurrent_processes_appending_to_one_thread_get_distinct_increasing_seqs() {
    let db = TestDb::new().await;
    let thread_id = "shared-thread";
    let exe = std::env::current_exe().expect("the test binary's path");
    // Spawn every writer before waiting on any, so they append at the same time.
    let children: Vec<_> = (0..WRITERS)
        .map(|_| {
            tokio::process::Command::new(&exe)
                .args(["--exact", CHILD_TEST, "--nocapture"])
                .env(CHILD_ENV, format!("{thread_id} {}", db.url))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn a writer process")
        })
        .collect();
    for child in children {
        let output = child
            .wait_with_output()
            .await
            .expect("wait for a writer process");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "writer failed:\n{stdout}\n{stderr}"
        );
        // libtest exits 0 when `--exact` matches nothing, so check the child really ran.
        assert!(
            stdout.contains("1 passed"),
            "writer ran no test:\n{stdout}\n{stderr}"
        );
    }

    let rows = sqlx::query(
        "SELECT seq, event_id::text AS event_id, run_id, content FROM run_events \
         WHERE thread_id = $1 ORDER BY seq",
    )
    .bind(thread_id)
    .fetch_all(db.store.pool())
    .await
    .unwrap();
    let total = WRITERS * BATCHES * BATCH_SIZE;
    assert_eq!(rows.len(), total);
    let seqs: Vec<i64> = rows.iter().map(|row| row.get("seq")).collect();
    assert!(
        seqs.windows(2).all(|pair| pair[0] < pair[1]),
        "seqs strictly increase"
    );
    assert!(seqs[0] >= 1);
    let event_ids: HashSet<String> = rows.iter().map(|row| row.get("event_id")).collect();
    assert_eq!(event_ids.len(), total, "no duplicate records");

    // Each writer's records keep their emission order in seq order.
    let mut per_writer: HashMap<String, Vec<usize>> = HashMap::new();
    for row in &rows {
        let content: String = row.get("content");
        let n: usize = content.parse().expect("content is the record number");
        per_writer.entry(row.get("run_id")).or_default().push(n);
    }
    assert_eq!(per_writer.len(), WRITERS);
    for numbers in per_writer.values() {
        assert_eq!(*numbers, (0..BATCHES * BATCH_SIZE).collect::<Vec<_>>());
    }
}
