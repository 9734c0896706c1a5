//! Thread and run records.

use std::collections::BTreeMap;

use serde_json::{Map, json};
use subflow_contracts::{RunStatus, RunStopReason, ThreadStatus};
use subflow_store::{
    Error, EventQuery, EventStore, ModelUsage, NewRun, NewThread, RecordStore, RunStatusUpdate,
    RunUsage, ThreadSearch,
};

use crate::harness::{TestDb, event};

fn thread(thread_id: &str, owner: &str, project: &str) -> NewThread {
    let mut metadata = Map::new();
    metadata.insert("project".to_owned(), json!(project));
    NewThread {
        thread_id: thread_id.to_owned(),
        owner: owner.to_owned(),
        metadata,
    }
}

fn run(run_id: &str, thread_id: &str) -> NewRun {
    NewRun {
        run_id: run_id.to_owned(),
        thread_id: thread_id.to_owned(),
        owner: "alice".to_owned(),
        assistant_id: "lead_agent".to_owned(),
        model_name: Some("m1".to_owned()),
        trace_id: None,
        metadata: Map::new(),
        multitask_strategy: "reject".to_owned(),
        kwargs: json!({ "input": { "b": 1, "a": 2 } }),
    }
}

fn ids(threads: &[subflow_store::ThreadRecord]) -> Vec<&str> {
    threads.iter().map(|t| t.thread_id.as_str()).collect()
}

#[tokio::test]
async fn threads_are_created_searched_newest_first_and_deleted_with_their_history() {
    let db = TestDb::new().await;
    let store = &db.store;
    let created = store
        .create_thread(thread("t1", "alice", "x"))
        .await
        .unwrap();
    assert_eq!(created.status, ThreadStatus::Idle);
    assert_eq!(store.get_thread("t1").await.unwrap(), Some(created));
    for (id, owner, project) in [
        ("t2", "alice", "y"),
        ("t3", "alice", "x"),
        ("t4", "bob", "x"),
    ] {
        store
            .create_thread(thread(id, owner, project))
            .await
            .unwrap();
    }
    let duplicate = store
        .create_thread(thread("t1", "bob", "z"))
        .await
        .unwrap_err();
    assert!(
        matches!(duplicate, Error::ThreadExists(ref id) if id == "t1"),
        "{duplicate}"
    );
    let invalid = store
        .create_thread(thread("no spaces", "alice", "x"))
        .await
        .unwrap_err();
    assert!(matches!(invalid, Error::InvalidThreadId(_)), "{invalid}");

    let all = store
        .search_threads(&ThreadSearch::owner("alice", 10))
        .await
        .unwrap();
    assert_eq!(ids(&all), ["t3", "t2", "t1"]);
    let mut by_project = ThreadSearch::owner("alice", 10);
    by_project.metadata.insert("project".to_owned(), json!("x"));
    assert_eq!(
        ids(&store.search_threads(&by_project).await.unwrap()),
        ["t3", "t1"]
    );
    by_project.offset = 1;
    assert_eq!(
        ids(&store.search_threads(&by_project).await.unwrap()),
        ["t1"]
    );

    assert!(
        store
            .set_thread_status("t2", ThreadStatus::Busy)
            .await
            .unwrap()
    );
    assert!(
        !store
            .set_thread_status("missing", ThreadStatus::Busy)
            .await
            .unwrap()
    );
    let busy = ThreadSearch {
        status: Some(ThreadStatus::Busy),
        ..ThreadSearch::owner("alice", 10)
    };
    assert_eq!(ids(&store.search_threads(&busy).await.unwrap()), ["t2"]);

    store.create_run(run("r1", "t1")).await.unwrap();
    store
        .append(&[event("t1", "r1", "run.start", json!(null))])
        .await
        .unwrap();
    assert!(store.delete_thread("t1").await.unwrap());
    assert!(!store.delete_thread("t1").await.unwrap());
    assert_eq!(store.get_thread("t1").await.unwrap(), None);
    assert_eq!(store.get_run("t1", "r1").await.unwrap(), None);
    assert_eq!(db.count_events("t1").await, 0);
}

#[tokio::test]
async fn runs_keep_their_first_terminal_status_and_store_usage() {
    let db = TestDb::new().await;
    let store = &db.store;
    let created = store.create_run(run("r1", "t1")).await.unwrap();
    assert_eq!(created.status, RunStatus::Pending);
    assert_eq!(
        store.get_run("t1", "r1").await.unwrap(),
        Some(created.clone())
    );
    assert_eq!(
        store.get_run("t2", "r1").await.unwrap(),
        None,
        "scoped by thread"
    );
    let duplicate = store.create_run(run("r1", "t2")).await.unwrap_err();
    assert!(
        matches!(duplicate, Error::RunExists(ref id) if id == "r1"),
        "{duplicate}"
    );

    let running = RunStatusUpdate {
        status: RunStatus::Running,
        stop_reason: None,
        error: None,
    };
    assert!(store.update_run_status("r1", &running).await.unwrap());
    let capped = RunStatusUpdate {
        status: RunStatus::Success,
        stop_reason: Some(RunStopReason::TokenCapped),
        error: None,
    };
    assert!(store.update_run_status("r1", &capped).await.unwrap());
    let late = RunStatusUpdate {
        status: RunStatus::Error,
        stop_reason: None,
        error: Some("boom".to_owned()),
    };
    assert!(
        !store.update_run_status("r1", &late).await.unwrap(),
        "first terminal status wins"
    );
    assert!(!store.update_run_status("missing", &running).await.unwrap());

    let usage = RunUsage {
        total_input_tokens: 100,
        total_output_tokens: 20,
        total_tokens: 120,
        llm_call_count: 3,
        lead_agent_tokens: 70,
        subagent_tokens: 40,
        middleware_tokens: 10,
        message_count: 6,
        token_usage_by_model: BTreeMap::from([(
            "m1".to_owned(),
            ModelUsage {
                input_tokens: 100,
                output_tokens: 20,
                total_tokens: 120,
                cache_read_tokens: Some(30),
            },
        )]),
    };
    assert!(store.save_run_usage("r1", &usage).await.unwrap());
    assert!(!store.save_run_usage("missing", &usage).await.unwrap());

    let stored = store.get_run("t1", "r1").await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::Success);
    assert_eq!(stored.stop_reason, Some(RunStopReason::TokenCapped));
    assert_eq!(stored.error, None);
    assert_eq!(stored.usage, usage);
    assert_eq!(
        serde_json::to_string(&stored.kwargs).unwrap(),
        r#"{"input":{"b":1,"a":2}}"#
    );
    assert_eq!(stored.created_at, created.created_at);
}

#[tokio::test]
async fn runs_are_listed_newest_first_and_deleted_with_their_events() {
    let db = TestDb::new().await;
    let store = &db.store;
    for run_id in ["r1", "r2", "r3"] {
        store.create_run(run(run_id, "t1")).await.unwrap();
    }
    store.create_run(run("r4", "t2")).await.unwrap();
    let done = RunStatusUpdate {
        status: RunStatus::Success,
        stop_reason: None,
        error: None,
    };
    store.update_run_status("r2", &done).await.unwrap();

    let run_ids = |runs: Vec<subflow_store::RunRecord>| -> Vec<String> {
        runs.into_iter().map(|r| r.run_id).collect()
    };
    assert_eq!(
        run_ids(store.list_runs("t1", None, 10, 0).await.unwrap()),
        ["r3", "r2", "r1"]
    );
    assert_eq!(
        run_ids(store.list_runs("t1", None, 1, 1).await.unwrap()),
        ["r2"]
    );
    let pending = store
        .list_runs("t1", Some(RunStatus::Pending), 10, 0)
        .await
        .unwrap();
    assert_eq!(run_ids(pending), ["r3", "r1"]);

    store
        .append(&[
            event("t1", "r1", "run.start", json!(1)),
            event("t1", "r2", "run.start", json!(2)),
        ])
        .await
        .unwrap();
    assert!(
        !store.delete_run("t2", "r1").await.unwrap(),
        "scoped by thread"
    );
    assert!(store.delete_run("t1", "r1").await.unwrap());
    assert!(!store.delete_run("t1", "r1").await.unwrap());
    assert!(
        store
            .list_events(&EventQuery::run("t1", "r1"))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .list_events(&EventQuery::run("t1", "r2"))
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        run_ids(store.list_runs("t1", None, 10, 0).await.unwrap()),
        ["r3", "r2"]
    );
}
