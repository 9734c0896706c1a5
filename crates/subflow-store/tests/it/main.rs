//! Integration tests of the store crate: the conformance suite on the in-memory store,
//! and the event buffer, retry queue and spill file against a fault-injecting store.

mod buffer;

use std::sync::Arc;

use subflow_store::MemoryStore;
use subflow_store::conformance::Fixture;

async fn memory_fixture() -> Fixture {
    Fixture::new(Arc::new(MemoryStore::new()), ())
}

subflow_store::conformance_tests!(memory_fixture());

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Random batch histories on the memory store, whose clock the history moves.
    #[test]
    fn random_batch_histories_keep_the_invariants(
        ops in subflow_store::conformance::batch_history::history(60)
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let clock = Arc::new(subflow_store::batches::ManualClock::new(1_700_000_000_000));
            let store = Arc::new(MemoryStore::with_clock(clock.clone()));
            subflow_store::conformance::batch_history::check_history(store, Some(clock), &ops)
                .await;
        });
    }
}

#[test]
fn contract_validation_rejects_records_that_break_either_contract() {
    use serde_json::json;
    use subflow_contracts::RunEvent;
    use subflow_store::conformance::{our_contract, reference_contract};
    let good = RunEvent {
        thread_id: "t1".into(),
        run_id: "r1".into(),
        seq: 1,
        event_type: "subagent.step".into(),
        category: "subagent".into(),
        content: json!({"task_id": "c", "message_index": 1, "kind": "ai", "text": "", "truncated": false, "tool_calls": []}),
        metadata: serde_json::Map::from_iter([
            ("task_id".into(), json!("c")),
            ("message_index".into(), json!(1)),
        ]),
        created_at: "2026-11-30T01:02:03.000004Z".into(),
        user_id: None,
        event_id: uuid::Uuid::now_v7(),
    };
    let mut no_tool_calls = good.clone();
    no_tool_calls
        .content
        .as_object_mut()
        .unwrap()
        .remove("tool_calls");
    let mut bad_time = good.clone();
    bad_time.created_at = "yesterday".into();
    let mut wrong_category = good.clone();
    wrong_category.category = "trace".into();
    let mut bad_seq = good.clone();
    bad_seq.seq = 0;
    for contract in [our_contract(), reference_contract()] {
        assert!(contract.check(&good).is_ok());
        for bad in [&no_tool_calls, &bad_time, &wrong_category, &bad_seq] {
            assert!(contract.check(bad).is_err(), "{bad:?}");
        }
    }
    let mut loop_event = good.clone();
    loop_event.event_type = "middleware:loop_detection".into();
    loop_event.category = "middleware".into();
    loop_event.content = json!({"name": "LoopDetectionMiddleware", "hook": "after_model", "action": "explode", "changes": {}});
    assert!(
        reference_contract().check(&loop_event).is_ok(),
        "the reference only knows the generic shape"
    );
    assert!(
        our_contract().check(&loop_event).is_err(),
        "ours pins the loop_detection payload"
    );
}
