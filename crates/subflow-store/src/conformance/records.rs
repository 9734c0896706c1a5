//! Conformance cases of [`RecordStore`](crate::RecordStore): threads and runs (docs/api.md#objects, docs/usage-and-cost.md#run-buckets).

use std::sync::Arc;

use serde_json::{Map, json};
use subflow_contracts::{RunStatus, RunStopReason, ThreadStatus};

use super::{all_events, new_run, new_thread, trace};
use subflow_contracts::api::{SortOrder, ThreadSortBy};

use crate::{Error, ModelUsage, RunStatusUpdate, RunUsage, Store, ThreadSearch};

/// Expands to one `#[tokio::test]` per record case; invoked by `conformance_tests!`.
#[doc(hidden)]
#[macro_export]
macro_rules! record_conformance_tests {
    ($factory:expr) => {
        $crate::record_conformance_tests!(@cases $factory;
            threads_are_created_searched_and_deleted,
            thread_search_sorts_and_filters_by_id_and_metadata_merges,
            runs_keep_their_first_terminal_status_and_usage,
        );
    };
    (@cases $factory:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $factory.await;
                $crate::conformance::records::$case(fixture.store.clone()).await;
            }
        )+
    };
}

/// Thread search orders by any of its keys either way (most recently updated first by
/// default), narrows to given ids, and a metadata merge keeps other keys and counts as an
/// update.
pub async fn thread_search_sorts_and_filters_by_id_and_metadata_merges(store: Arc<dyn Store>) {
    for id in ["b", "c", "a"] {
        store
            .create_thread(new_thread(id, "alice", json!({"n": id})))
            .await
            .unwrap();
        // Distinct timestamps: they have microsecond resolution.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let ids = |threads: Vec<crate::ThreadRecord>| {
        threads.into_iter().map(|t| t.thread_id).collect::<Vec<_>>()
    };
    let search = |sort_by, sort_order| {
        let mut search = ThreadSearch::owner("alice", 10);
        search.sort_by = sort_by;
        search.sort_order = sort_order;
        search
    };
    let found = |search: ThreadSearch| {
        let store = store.clone();
        async move { ids(store.search_threads(&search).await.unwrap()) }
    };
    assert_eq!(
        found(ThreadSearch::owner("alice", 10)).await,
        ["a", "c", "b"]
    );
    assert_eq!(
        found(search(ThreadSortBy::ThreadId, SortOrder::Asc)).await,
        ["a", "b", "c"]
    );
    assert_eq!(
        found(search(ThreadSortBy::CreatedAt, SortOrder::Asc)).await,
        ["b", "c", "a"]
    );
    // Renaming "b" makes it the most recently updated, not the newest created.
    let merged = store
        .update_thread_metadata("b", &Map::from_iter([("title".to_owned(), json!("B"))]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        merged.metadata,
        *json!({"n": "b", "title": "B"}).as_object().unwrap()
    );
    assert_eq!(store.get_thread("b").await.unwrap(), Some(merged));
    assert_eq!(
        found(ThreadSearch::owner("alice", 10)).await,
        ["b", "a", "c"]
    );
    assert_eq!(
        found(search(ThreadSortBy::CreatedAt, SortOrder::Desc)).await,
        ["a", "c", "b"]
    );
    assert_eq!(
        store
            .update_thread_metadata("nope", &Map::new())
            .await
            .unwrap(),
        None
    );
    let mut some = search(ThreadSortBy::ThreadId, SortOrder::Desc);
    some.ids = Some(vec!["a".into(), "c".into(), "zz".into()]);
    assert_eq!(found(some.clone()).await, ["c", "a"]);
    some.offset = 1;
    assert_eq!(found(some).await, ["a"]);
}

/// Threads: creation, duplicates, owner-scoped search newest first with filters, deletion
/// with runs and events.
pub async fn threads_are_created_searched_and_deleted(store: Arc<dyn Store>) {
    let created = store
        .create_thread(new_thread("t1", "alice", json!({"project": "x"})))
        .await
        .unwrap();
    assert_eq!(created.status, ThreadStatus::Idle);
    assert!(matches!(
        store
            .create_thread(new_thread("t1", "bob", json!({})))
            .await,
        Err(Error::ThreadExists(_))
    ));
    assert!(matches!(
        store
            .create_thread(new_thread("t 1", "bob", json!({})))
            .await,
        Err(Error::InvalidThreadId(_))
    ));
    store
        .create_thread(new_thread("t2", "alice", json!({"project": "y"})))
        .await
        .unwrap();
    store
        .create_thread(new_thread("t3", "alice", json!({"project": "x", "k": 1})))
        .await
        .unwrap();
    store
        .create_thread(new_thread("t4", "bob", json!({"project": "x"})))
        .await
        .unwrap();
    assert_eq!(store.get_thread("t1").await.unwrap(), Some(created));
    assert_eq!(store.get_thread("nope").await.unwrap(), None);

    let ids = |threads: Vec<crate::ThreadRecord>| {
        threads.into_iter().map(|t| t.thread_id).collect::<Vec<_>>()
    };
    assert_eq!(
        ids(store
            .search_threads(&ThreadSearch::owner("alice", 10))
            .await
            .unwrap()),
        ["t3", "t2", "t1"]
    );
    let mut search = ThreadSearch::owner("alice", 10);
    search.metadata = Map::from_iter([("project".to_owned(), json!("x"))]);
    assert_eq!(
        ids(store.search_threads(&search).await.unwrap()),
        ["t3", "t1"]
    );
    search.offset = 1;
    search.limit = 1;
    assert_eq!(ids(store.search_threads(&search).await.unwrap()), ["t1"]);
    assert!(
        store
            .set_thread_status("t2", ThreadStatus::Busy)
            .await
            .unwrap()
    );
    assert!(
        !store
            .set_thread_status("nope", ThreadStatus::Busy)
            .await
            .unwrap()
    );
    let mut busy = ThreadSearch::owner("alice", 10);
    busy.status = Some(ThreadStatus::Busy);
    assert_eq!(ids(store.search_threads(&busy).await.unwrap()), ["t2"]);

    store.create_run(new_run("r1", "t1")).await.unwrap();
    store.append(&[trace("t1", "r1", 1)]).await.unwrap();
    store.append(&[trace("t2", "r9", 1)]).await.unwrap();
    assert!(store.delete_thread("t1").await.unwrap());
    assert!(!store.delete_thread("t1").await.unwrap());
    assert_eq!(store.get_thread("t1").await.unwrap(), None);
    assert_eq!(store.get_run("t1", "r1").await.unwrap(), None);
    assert!(all_events(&*store, "t1", "r1").await.is_empty());
    assert_eq!(
        all_events(&*store, "t2", "r9").await.len(),
        1,
        "other threads keep their events"
    );
}

/// Runs: creation, thread scoping, newest-first listing, first terminal status wins,
/// usage rollups round-trip, rollback deletes the run and its events.
pub async fn runs_keep_their_first_terminal_status_and_usage(store: Arc<dyn Store>) {
    store
        .create_thread(new_thread("t1", "u1", json!({})))
        .await
        .unwrap();
    let created = store.create_run(new_run("r1", "t1")).await.unwrap();
    assert_eq!(created.status, RunStatus::Pending);
    assert!(matches!(
        store.create_run(new_run("r1", "t1")).await,
        Err(Error::RunExists(_))
    ));
    store.create_run(new_run("r2", "t1")).await.unwrap();
    assert_eq!(
        store.get_run("t1", "r1").await.unwrap(),
        Some(created.clone())
    );
    assert_eq!(
        store.get_run("t2", "r1").await.unwrap(),
        None,
        "scoped by thread"
    );

    let running = RunStatusUpdate {
        lease_owner: None,
        status: RunStatus::Running,
        stop_reason: None,
        error: None,
    };
    assert!(store.update_run_status("r1", &running).await.unwrap());
    let done = RunStatusUpdate {
        lease_owner: None,
        status: RunStatus::Success,
        stop_reason: Some(RunStopReason::LoopCapped),
        error: None,
    };
    assert!(store.update_run_status("r1", &done).await.unwrap());
    let late = RunStatusUpdate {
        lease_owner: None,
        status: RunStatus::Interrupted,
        stop_reason: None,
        error: Some("late".into()),
    };
    assert!(
        !store.update_run_status("r1", &late).await.unwrap(),
        "a terminal status never changes"
    );
    let run = store.get_run("t1", "r1").await.unwrap().unwrap();
    assert_eq!(
        (run.status, run.stop_reason, run.error),
        (RunStatus::Success, Some(RunStopReason::LoopCapped), None)
    );
    assert_eq!(
        run.trace_id.as_deref(),
        Some("0af7651916cd43dd8448eb211c80319c")
    );

    let usage = RunUsage {
        total_input_tokens: 900,
        total_output_tokens: 300,
        total_tokens: 1200,
        llm_call_count: 3,
        lead_agent_tokens: 1000,
        subagent_tokens: 200,
        middleware_tokens: 0,
        message_count: 7,
        token_usage_by_model: [
            (
                "gpt-4o".to_owned(),
                ModelUsage {
                    input_tokens: 800,
                    output_tokens: 200,
                    total_tokens: 1000,
                    cache_read_tokens: Some(300),
                    cache_write_tokens: None,
                },
            ),
            (
                "claude-x".to_owned(),
                ModelUsage {
                    input_tokens: 100,
                    output_tokens: 100,
                    total_tokens: 200,
                    cache_read_tokens: None,
                    cache_write_tokens: Some(40),
                },
            ),
        ]
        .into(),
    };
    assert!(store.save_run_usage("r1", &usage, None).await.unwrap());
    assert!(!store.save_run_usage("nope", &usage, None).await.unwrap());
    assert_eq!(
        store.get_run("t1", "r1").await.unwrap().unwrap().usage,
        usage
    );

    let listed: Vec<String> = store
        .list_runs(crate::RunScope::Thread("t1"), None, 10, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(listed, ["r2", "r1"]);
    let pending: Vec<String> = store
        .list_runs(
            crate::RunScope::Thread("t1"),
            Some(RunStatus::Pending),
            10,
            0,
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(pending, ["r2"]);
    assert_eq!(
        store
            .list_runs(crate::RunScope::Thread("t1"), None, 1, 1)
            .await
            .unwrap()
            .len(),
        1
    );

    // An owner's runs across threads, newest first; another owner's never.
    store
        .create_thread(new_thread("t2", "u1", json!({})))
        .await
        .unwrap();
    store.create_run(new_run("r3", "t2")).await.unwrap();
    store
        .create_thread(new_thread("t3", "u2", json!({})))
        .await
        .unwrap();
    let mut theirs = new_run("r4", "t3");
    theirs.owner = "u2".into();
    store.create_run(theirs).await.unwrap();
    let owned = |status, limit, offset| {
        let store = store.clone();
        async move {
            store
                .list_runs(crate::RunScope::Owner("u1"), status, limit, offset)
                .await
                .unwrap()
                .into_iter()
                .map(|r| (r.thread_id, r.run_id))
                .collect::<Vec<_>>()
        }
    };
    let pair = |thread: &str, run: &str| (thread.to_owned(), run.to_owned());
    assert_eq!(
        owned(None, 10, 0).await,
        [pair("t2", "r3"), pair("t1", "r2"), pair("t1", "r1")]
    );
    assert_eq!(owned(None, 1, 1).await, [pair("t1", "r2")]);
    assert_eq!(
        owned(Some(RunStatus::Pending), 10, 0).await,
        [pair("t2", "r3"), pair("t1", "r2")]
    );

    store
        .append(&[trace("t1", "r2", 1), trace("t1", "r1", 2)])
        .await
        .unwrap();
    assert!(store.delete_run("t1", "r2").await.unwrap());
    assert_eq!(store.get_run("t1", "r2").await.unwrap(), None);
    assert!(all_events(&*store, "t1", "r2").await.is_empty());
    assert_eq!(all_events(&*store, "t1", "r1").await.len(), 1);
}
