//! The store conformance suite on a real SQLite file.

use std::sync::Arc;

use subflow_store::conformance::Fixture;
use subflow_store_sqlite::SqliteStore;

async fn sqlite_fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("subflow.db").display());
    let store = SqliteStore::open(&url, 4).await.expect("open SQLite store");
    Fixture::new(Arc::new(store), dir)
}

subflow_store::conformance_tests!(sqlite_fixture());

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Random batch histories on a real SQLite file, whose clock the history moves.
    #[test]
    fn random_batch_histories_keep_the_invariants(
        ops in subflow_store::conformance::batch_history::history(40)
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        runtime.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}", dir.path().join("subflow.db").display());
            let clock = Arc::new(subflow_store::batches::ManualClock::new(1_700_000_000_000));
            let store = SqliteStore::open_with_clock(&url, 2, clock.clone()).await.unwrap();
            subflow_store::conformance::batch_history::check_history(
                Arc::new(store.clone()),
                Some(clock),
                &ops,
            )
            .await;
            store.close().await;
        });
    }
}

#[tokio::test]
async fn reopening_the_file_keeps_events_and_continues_the_sequence() {
    use subflow_contracts::NewEvent;
    use subflow_store::{EventQuery, EventStore};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("subflow.db").display());
    let event = |n: i64| {
        NewEvent::new(
            "t1",
            "r1",
            "llm.error",
            "trace",
            serde_json::json!(n),
            Default::default(),
        )
    };
    let store = SqliteStore::open(&url, 2).await.unwrap();
    store.append(&[event(1), event(2)]).await.unwrap();
    store.close().await;
    let reopened = SqliteStore::open(&url, 2).await.unwrap();
    reopened.append(&[event(3)]).await.unwrap();
    let rows = reopened
        .list_events(&EventQuery::run("t1", "r1"))
        .await
        .unwrap();
    assert_eq!(rows.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
}

#[tokio::test]
async fn the_database_file_is_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("subflow.db");
    let store = SqliteStore::open(&format!("sqlite://{}", path.display()), 2)
        .await
        .unwrap();
    store.close().await;
    // WAL is a property of the file: any other connection, e.g. the sqlite3 shell, sees it.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn deleting_a_thread_leaves_no_batch_or_item_rows_behind() {
    use subflow_store::conformance::batches::new_batch;
    use subflow_store::{BatchStore, NewThread, RecordStore};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("subflow.db");
    let store = SqliteStore::open(&format!("sqlite://{}", path.display()), 2)
        .await
        .unwrap();
    store
        .create_thread(NewThread {
            thread_id: "t1".into(),
            owner: "u1".into(),
            metadata: Default::default(),
        })
        .await
        .unwrap();
    store
        .submit_batch(new_batch("a", 7, 2, 1, 1))
        .await
        .unwrap();
    let rows = |table: &str| -> i64 {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |row| {
            row.get(0)
        })
        .unwrap()
    };
    assert_eq!(rows("subagent_batch_items"), 7);
    assert!(store.delete_thread("t1").await.unwrap());
    assert_eq!(rows("subagent_batches"), 0);
    assert_eq!(rows("subagent_batch_items"), 0, "items go with their batch");
    store.close().await;
}
