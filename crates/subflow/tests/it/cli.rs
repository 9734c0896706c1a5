//! The binary's commands over a real SQLite file.

use std::process::{Command, Output};

use serde_json::json;
use subflow_contracts::NewEvent;
use subflow_store::spill::SpillFile;
use subflow_store::{EventQuery, EventStore};
use subflow_store_sqlite::SqliteStore;

fn subflow(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_subflow"))
        .args(args)
        .current_dir(dir)
        .env_remove("SUBFLOW__DATABASE__URL")
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

#[tokio::test]
async fn serve_re_applies_spilled_run_events_before_anything_else() {
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
    let url = format!("sqlite://{}", dir.path().join("subflow.db").display());
    let output = subflow(&["serve", "--database-url", &url], dir.path());
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!spill.path().exists(), "the spill file is consumed");
    let store = SqliteStore::open(&url, 1).await.unwrap();
    let rows = store
        .list_events(&EventQuery::run("t1", "r1"))
        .await
        .unwrap();
    assert_eq!(
        rows.iter().map(|r| r.event_id).collect::<Vec<_>>(),
        records.iter().map(|r| r.event_id).collect::<Vec<_>>()
    );
}
