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
