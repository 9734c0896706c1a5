//! Integration tests of the PostgreSQL store against a live server.
//!
//! The server is `$SUBFLOW_TEST_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`);
//! every test works in a database of its own, so tests never see each other's rows.
//! An unreachable server fails the tests rather than skipping them.

mod concurrency;
mod harness;

use std::sync::Arc;

use subflow_store::conformance::Fixture;

async fn postgres_fixture() -> Fixture {
    let db = harness::TestDb::new().await;
    Fixture::new(Arc::new(db.store.clone()), db)
}

subflow_store::conformance_tests!(postgres_fixture());

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(8))]

    /// Random batch histories on PostgreSQL: expiry through leases of 0 on the
    /// database clock (its clock cannot be moved).
    #[test]
    fn random_batch_histories_keep_the_invariants(
        ops in subflow_store::conformance::batch_history::history(40)
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let db = harness::TestDb::new().await;
            subflow_store::conformance::batch_history::check_history(
                Arc::new(db.store.clone()),
                None,
                &ops,
            )
            .await;
        });
    }
}

#[tokio::test]
async fn deleting_a_thread_leaves_no_batch_or_item_rows_behind() {
    use subflow_store::conformance::batches::new_batch;
    use subflow_store::{BatchStore, NewThread, RecordStore};
    let db = harness::TestDb::new().await;
    let store = &db.store;
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
    let items = || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM subagent_batch_items")
            .fetch_one(store.pool())
            .await
            .unwrap()
    };
    assert_eq!(items().await, 7);
    assert!(store.delete_thread("t1").await.unwrap());
    assert_eq!(items().await, 0, "items go with their batch");
}
