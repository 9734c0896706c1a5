//! Event builders shared by the tests; scratch databases come from the crate's
//! `testing` module.

use serde_json::{Map, Value};
use subflow_contracts::NewEvent;

pub use subflow_store_postgres::testing::TestDb;

/// A trace event of `run_id` with `content`.
pub fn event(thread_id: &str, run_id: &str, event_type: &str, content: Value) -> NewEvent {
    NewEvent::new(thread_id, run_id, event_type, "trace", content, Map::new())
}
