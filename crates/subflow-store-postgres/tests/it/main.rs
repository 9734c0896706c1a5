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
