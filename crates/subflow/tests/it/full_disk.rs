//! A real full disk: `subflow serve` keeps its SQLite database on an 8 MiB tmpfs, and a
//! file fills the rest of it mid-run. Cancel and a multitask interrupt answer while no
//! write can land; once the file is removed the cancelled run ends `interrupted`, as the
//! cancel asked, without a restart, its messages are kept, and the thread takes new runs. A
//! batch and a run under way when the disk fills both finish once it is freed, without a
//! restart. The WAL stays within a quarter of the volume's free space however many
//! commits rewrite a row, and a closed store leaves none. Mounting needs root (CI and the development machines run as root); as another
//! user the test says so and checks nothing, and as root a failed mount fails it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use subflow_store::batches::{BatchStore, WorkerHeartbeat};
use subflow_store_sqlite::SqliteStore;

use crate::recovery::{Serve, client, get, start_demo_run, write_config};

/// Bounds every wait, so a stuck run fails the test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(60);

/// A small tmpfs, unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// `None` only when not running as root; as root, a mount that fails fails the test.
    fn mount() -> Option<SmallDisk> {
        let uid = Command::new("id").arg("-u").output().expect("id runs");
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("mount runs");
        assert!(
            mounted.status.success(),
            "mounting an 8 MiB tmpfs as root failed: {}",
            String::from_utf8_lossy(&mounted.stderr)
        );
        Some(SmallDisk { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file until the disk is full; returns its path.
    fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while file.write_all(&chunk).is_ok() {}
        let _ = file.sync_all();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

async fn post(path: &str, body: &Value) -> (u16, Value) {
    let response = tokio::time::timeout(PATIENCE, client().post(path).json(body).send())
        .await
        .unwrap_or_else(|_| panic!("POST {path} answers"))
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_on_a_full_disk_ends_interrupted_once_space_is_freed_and_the_thread_runs_again()
 {
    let Some(disk) = SmallDisk::mount() else {
        eprintln!("skipped: mounting a tmpfs needs root, and this test runs as another user");
        return;
    };
    write_config(disk.path(), None);
    let (process, api) = Serve::start(disk.path());
    let run = start_demo_run(&api, "t-full").await;
    let filler = disk.fill();

    let (status, _) = post(
        &format!("{api}/threads/t-full/runs/{run}/cancel?wait=true"),
        &json!({}),
    )
    .await;
    assert_eq!(status, 202, "cancel answers on a full disk");
    let interrupting = json!({"input": {"messages": [{"role": "user", "content": "again"}]},
                              "multitask_strategy": "interrupt"});
    let (status, body) = post(&format!("{api}/threads/t-full/runs"), &interrupting).await;
    assert_eq!(status, 503, "a new run cannot be stored: {body}");

    std::fs::remove_file(filler).unwrap();
    let ended = async {
        loop {
            let record = get(&api, &format!("/threads/t-full/runs/{run}")).await;
            if !matches!(record["status"].as_str(), Some("running" | "pending")) {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let record = tokio::time::timeout(PATIENCE, ended)
        .await
        .expect("the run ends once there is space again, without a restart");
    assert_eq!(record["status"], "interrupted", "{record}");
    assert_eq!(record["stop_reason"], Value::Null, "{record}");

    let joined = get(&api, &format!("/threads/t-full/runs/{run}/join")).await;
    let messages = joined["messages"].as_array().unwrap();
    assert_eq!(messages[0]["content"], "Compare three storage engines");
    assert!(messages.len() > 1, "the run's messages are kept: {joined}");

    let again = json!({"input": {"messages": [{"role": "user", "content": "hello"}]}});
    let (status, values) = post(&format!("{api}/threads/t-full/runs/wait"), &again).await;
    assert_eq!(status, 200, "{values}");
    let after = get(&api, "/threads/t-full/runs?limit=1").await;
    assert_eq!(after[0]["status"], "success", "{after}");
    process.kill();
}

/// Items of the batch that runs through the outage.
const BATCH_ITEMS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_and_a_run_under_way_when_the_disk_fills_finish_once_it_is_freed() {
    let Some(disk) = SmallDisk::mount() else {
        eprintln!("skipped: mounting a tmpfs needs root, and this test runs as another user");
        return;
    };
    write_config(disk.path(), None);
    let (process, api) = Serve::start(disk.path());
    let items: Vec<Value> = (0..BATCH_ITEMS)
        .map(|n| json!({"key": format!("item-{n}"), "prompt": format!("Summarise part {n}")}))
        .collect();
    let submission = json!({"title": "through a full disk", "subagent_type": "general-purpose",
                            "items": items, "submission_key": "full-disk", "max_running_items": 2});
    let (status, batch) = post(
        &format!("{api}/threads/t-batch/subagent-batches"),
        &submission,
    )
    .await;
    assert_eq!(status, 201, "{batch}");
    let batch_path = format!(
        "/threads/t-batch/subagent-batches/{}",
        batch["id"].as_str().unwrap()
    );
    let started = async {
        while get(&api, &batch_path).await["counts"]["succeeded"].as_u64() < Some(2) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(PATIENCE, started)
        .await
        .expect("the batch gets under way");
    let run = start_demo_run(&api, "t-run").await;

    let filler = disk.fill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stalled = get(&api, &batch_path).await;
    assert_ne!(
        stalled["status"], "completed",
        "the batch was mid-way: {stalled}"
    );
    std::fs::remove_file(filler).unwrap();

    let finished = async {
        loop {
            let batch = get(&api, &batch_path).await;
            let record = get(&api, &format!("/threads/t-run/runs/{run}")).await;
            let run_over = !matches!(record["status"].as_str(), Some("running" | "pending"));
            if batch["status"] == "completed" && run_over {
                return (batch, record);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let Ok((batch, record)) = tokio::time::timeout(PATIENCE * 2, finished).await else {
        let batch = get(&api, &batch_path).await;
        let record = get(&api, &format!("/threads/t-run/runs/{run}")).await;
        panic!("the batch and the run did not finish once there was space again: {batch} {record}");
    };
    assert_eq!(
        batch["counts"]["succeeded"].as_u64(),
        Some(BATCH_ITEMS as u64),
        "every item succeeded: {batch}"
    );
    assert!(
        matches!(record["status"].as_str(), Some("success" | "error")),
        "{record}"
    );
    let again = json!({"input": {"messages": [{"role": "user", "content": "hello"}]}});
    let (status, values) = post(&format!("{api}/threads/t-run/runs/wait"), &again).await;
    assert_eq!(status, 200, "the thread runs again: {values}");
    process.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_stays_within_a_small_volume_and_a_closed_store_leaves_none() {
    let Some(disk) = SmallDisk::mount() else {
        eprintln!("skipped: mounting a tmpfs needs root, and this test runs as another user");
        return;
    };
    let path = disk.path().join("wal.sqlite");
    let store = SqliteStore::open(&format!("sqlite://{}", path.display()), 2)
        .await
        .unwrap();
    let wal = disk.path().join("wal.sqlite-wal");
    let mut largest = 0;
    // Each commit rewrites one row and appends at least a page to the WAL: 6,000 of them
    // are about three times the volume.
    for n in 0..6_000 {
        let heartbeat = WorkerHeartbeat {
            worker_id: "0".repeat(32),
            hostname: format!("host-{n}"),
            started_at: "2026-12-03T00:00:00Z".to_owned(),
        };
        if let Err(error) = store.heartbeat(&heartbeat).await {
            panic!("commit {n} failed with {largest} bytes of WAL: {error}");
        }
        if n % 100 == 0 {
            largest = largest.max(std::fs::metadata(&wal).map_or(0, |meta| meta.len()));
        }
    }
    assert!(
        largest <= 3 << 20,
        "the WAL grew to {largest} bytes on an 8 MiB volume"
    );
    assert_eq!(
        store.live_workers(Duration::from_secs(60)).await.unwrap(),
        1
    );
    store.close().await;
    let left = std::fs::metadata(&wal).map_or(0, |meta| meta.len());
    assert_eq!(left, 0, "a closed store leaves an empty WAL or none");
}
