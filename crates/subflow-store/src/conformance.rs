//! The one conformance suite every backend runs (SPEC §5, §6, §16 items 31–36, 45).
//!
//! A backend's integration tests invoke [`conformance_tests!`](crate::conformance_tests)
//! with an async factory returning a fresh, empty [`Fixture`]; the macro expands to one
//! test per case. Every record a case reads back is validated against subflow's event
//! contract and against the reference contract vendored in `contracts/reference/`.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use subflow_contracts::task_events::map_task_event;
use subflow_contracts::{
    EventCategory, EventType, MiddlewareTag, NewEvent, RunEvent, RunStatus, RunStopReason,
    ThreadStatus,
};
use uuid::Uuid;

pub mod auth;
pub mod streams;

use crate::{
    Checkpoint, Error, EventQuery, EventStore, ModelUsage, NewCheckpoint, NewRun, NewThread,
    RunStatusUpdate, RunUsage, Store, ThreadSearch,
};

/// A fresh store plus whatever keeps it alive (a temp dir, a scratch database).
pub struct Fixture {
    /// The store under test.
    pub store: Arc<dyn Store>,
    _guard: Box<dyn Any + Send>,
}

impl std::fmt::Debug for Fixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fixture")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Fixture {
    /// Wraps a store and a guard dropped after the test.
    pub fn new(store: Arc<dyn Store>, guard: impl Any + Send) -> Self {
        Fixture {
            store,
            _guard: Box::new(guard),
        }
    }
}

/// Expands to one `#[tokio::test]` per conformance case, each with a fresh fixture
/// from `$factory` (an expression evaluating to a future of [`Fixture`]).
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::conformance_tests!(@cases $factory;
            seq_is_thread_global_and_strictly_increasing,
            batch_order_is_seq_order_and_records_round_trip,
            a_retried_batch_never_duplicates,
            invalid_input_is_a_typed_error_and_writes_nothing,
            task_filter_applies_before_the_limit,
            a_batch_larger_than_one_statement_keeps_its_order,
            type_filter_and_cursor,
            paging_with_limit_one_equals_the_full_list,
            queries_are_scoped_to_thread_and_run,
            query_bounds_are_enforced,
            message_projection_holds_only_message_records,
            concurrent_writers_to_one_thread_never_collide,
            a_full_run_history_conforms_to_both_contracts,
            identical_histories_give_identical_results,
            threads_are_created_searched_and_deleted,
            runs_keep_their_first_terminal_status_and_usage,
            checkpoints_round_trip_and_latest_is_the_newest,
            checkpoints_list_newest_first_with_limit_and_before,
            checkpoint_paging_with_limit_one_equals_the_full_list,
            an_invalid_checkpoint_thread_id_is_a_typed_error,
            checkpoints_of_other_threads_never_appear,
            deleting_run_checkpoints_removes_only_that_run,
            deleting_a_thread_removes_its_checkpoints,
            identical_checkpoint_histories_give_identical_results,
        );
        $crate::auth_conformance_tests!($factory);
        $crate::stream_conformance_tests!($factory);
    };
    (@cases $factory:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $factory.await;
                $crate::conformance::$case(fixture.store.clone()).await;
            }
        )+
    };
}

// ---------------------------------------------------------------------------------
// Contract validation

/// Validates records against one run event stream contract file.
pub struct ContractValidator {
    name: String,
    record: jsonschema::Validator,
    events: HashMap<String, EventSchemas>,
    middleware: MiddlewareSchemas,
}

struct EventSchemas {
    category: String,
    content: jsonschema::Validator,
    metadata: jsonschema::Validator,
}

struct MiddlewareSchemas {
    category: String,
    event_type: jsonschema::Validator,
    tag: jsonschema::Validator,
    content: jsonschema::Validator,
    metadata: jsonschema::Validator,
    tag_content: HashMap<String, jsonschema::Validator>,
}

impl std::fmt::Debug for ContractValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContractValidator")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn compile(schema: &Value) -> jsonschema::Validator {
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .build(schema)
        .unwrap_or_else(|error| panic!("contract schema does not compile: {error}\n{schema}"))
}

fn check(validator: &jsonschema::Validator, instance: &Value, what: &str) -> Result<(), String> {
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| e.to_string())
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("{what}: {}", errors.join("; ")))
    }
}

impl ContractValidator {
    /// Loads a contract file; panics with the path when it is missing or malformed.
    pub fn load(path: &Path) -> Self {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read contract file {}: {e}", path.display()));
        let contract: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("contract file {} is not JSON: {e}", path.display()));
        let events = contract["events"]
            .as_array()
            .expect("contract has an events list")
            .iter()
            .map(|event| {
                let name = event["event_type"].as_str().expect("event_type").to_owned();
                let schemas = EventSchemas {
                    category: event["category"].as_str().expect("category").to_owned(),
                    content: compile(&event["content_schema"]),
                    metadata: compile(&event["metadata_schema"]),
                };
                (name, schemas)
            })
            .collect();
        let pattern = &contract["dynamic_event_patterns"][0];
        let tag_content = pattern["tag_payloads"]
            .as_object()
            .map(|tags| {
                tags.iter()
                    .map(|(tag, payload)| (tag.clone(), compile(&payload["content_schema"])))
                    .collect()
            })
            .unwrap_or_default();
        ContractValidator {
            name: path.display().to_string(),
            record: compile(&contract["record_schema"]),
            events,
            middleware: MiddlewareSchemas {
                category: pattern["category"]
                    .as_str()
                    .expect("pattern category")
                    .to_owned(),
                event_type: compile(&pattern["event_type_schema"]),
                tag: compile(&pattern["tag_schema"]),
                content: compile(&pattern["content_schema"]),
                metadata: compile(&pattern["metadata_schema"]),
                tag_content,
            },
        }
    }

    /// Checks one record: the envelope, then the schemas of its event type. Unknown
    /// event types are checked against the envelope only, as consumers must ignore them.
    pub fn check(&self, record: &RunEvent) -> Result<(), String> {
        let value = serde_json::to_value(record).expect("records serialise");
        check(&self.record, &value, "record")?;
        let event_type = record.event_type.as_str();
        if let Some(schemas) = self.events.get(event_type) {
            if schemas.category != record.category {
                return Err(format!(
                    "{event_type}: category {} is not {}",
                    record.category, schemas.category
                ));
            }
            check(&schemas.content, &record.content, "content")?;
            check(&schemas.metadata, &value["metadata"], "metadata")?;
        } else if let Some(tag) = event_type.strip_prefix("middleware:") {
            let m = &self.middleware;
            if m.category != record.category {
                return Err(format!(
                    "{event_type}: category {} is not {}",
                    record.category, m.category
                ));
            }
            check(&m.event_type, &json!(event_type), "event_type")?;
            check(&m.tag, &json!(tag), "tag")?;
            check(&m.content, &record.content, "content")?;
            check(&m.metadata, &value["metadata"], "metadata")?;
            if let Some(tag_schema) = m.tag_content.get(tag) {
                check(tag_schema, &record.content, "tag content")?;
            }
        }
        Ok(())
    }
}

fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// subflow's own contract, `contracts/run_event_stream_contract.json`.
pub fn our_contract() -> ContractValidator {
    ContractValidator::load(&repository_root().join("contracts/run_event_stream_contract.json"))
}

/// DeerFlow's contract, vendored in `contracts/reference/`.
pub fn reference_contract() -> ContractValidator {
    ContractValidator::load(
        &repository_root().join("contracts/reference/deerflow_run_event_stream_contract.json"),
    )
}

/// Asserts every record validates against both contracts.
pub fn assert_conforms(records: &[RunEvent]) {
    for contract in [our_contract(), reference_contract()] {
        for record in records {
            if let Err(problem) = contract.check(record) {
                panic!(
                    "record seq {} ({}) violates {}: {problem}\n{record:#?}",
                    record.seq, record.event_type, contract.name
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Helpers

fn event(
    thread: &str,
    run: &str,
    event_type: &str,
    category: &str,
    content: Value,
    metadata: Value,
) -> NewEvent {
    let Value::Object(metadata) = metadata else {
        panic!("metadata must be an object")
    };
    NewEvent::new(thread, run, event_type, category, content, metadata).with_user(Some("u1".into()))
}

fn trace(thread: &str, run: &str, n: usize) -> NewEvent {
    event(
        thread,
        run,
        "llm.error",
        "trace",
        json!(format!("event {n}")),
        json!({}),
    )
}

fn step(thread: &str, run: &str, task: &str, index: u64) -> NewEvent {
    let mapped = map_task_event(&json!({
        "type": "task_running", "task_id": task, "message_index": index, "total_messages": index,
        "message": {"type": "ai", "content": format!("step {index} of {task}"), "tool_calls": [],
                    "id": format!("m{index}")},
        "usage": null, "model_name": "scripted-1"
    }))
    .expect("a valid step maps");
    event(
        thread,
        run,
        mapped.event_type.as_str(),
        mapped.category().as_str(),
        mapped.content,
        Value::Object(mapped.metadata),
    )
}

async fn all_events(store: &dyn Store, thread: &str, run: &str) -> Vec<RunEvent> {
    let mut query = EventQuery::run(thread, run);
    query.limit = crate::MAX_PAGE_LIMIT;
    let mut out = Vec::new();
    loop {
        let page = store.list_events(&query).await.expect("list_events");
        let short = page.len() < query.limit as usize;
        query.after_seq = page.last().map(|e| e.seq).or(query.after_seq);
        out.extend(page);
        if short {
            return out;
        }
    }
}

fn assert_strictly_increasing(records: &[RunEvent]) {
    for pair in records.windows(2) {
        assert!(
            pair[0].seq < pair[1].seq,
            "seq {} then {}",
            pair[0].seq,
            pair[1].seq
        );
    }
}

// ---------------------------------------------------------------------------------
// Event cases

/// `seq` is assigned per thread, across runs, strictly increasing from 1.
pub async fn seq_is_thread_global_and_strictly_increasing(store: Arc<dyn Store>) {
    store
        .append(&[trace("t1", "r1", 1), trace("t1", "r1", 2)])
        .await
        .unwrap();
    store.append(&[trace("t1", "r2", 3)]).await.unwrap();
    store.append(&[trace("t2", "r3", 4)]).await.unwrap();
    store.append(&[trace("t1", "r1", 5)]).await.unwrap();
    let r1 = all_events(&*store, "t1", "r1").await;
    let r2 = all_events(&*store, "t1", "r2").await;
    let r3 = all_events(&*store, "t2", "r3").await;
    assert_eq!(r1.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 4]);
    assert_eq!(r2.iter().map(|e| e.seq).collect::<Vec<_>>(), [3]);
    assert_eq!(
        r3.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1],
        "another thread has its own sequence"
    );
    assert_conforms(&[r1, r2, r3].concat());
}

/// Batch order is `seq` order, and every field comes back as written.
pub async fn batch_order_is_seq_order_and_records_round_trip(store: Arc<dyn Store>) {
    let batch: Vec<NewEvent> = (1..=30).map(|i| step("t1", "r1", "call_a", i)).collect();
    let outcome = store.append(&batch).await.unwrap();
    assert_eq!((outcome.written, outcome.skipped), (30, 0));
    let back = all_events(&*store, "t1", "r1").await;
    assert_eq!(back.len(), 30);
    for (written, read) in batch.iter().zip(&back) {
        assert_eq!(read.event_id, written.event_id);
        assert_eq!(read.event_type, written.event_type);
        assert_eq!(read.category, written.category);
        assert_eq!(read.content, written.content_value());
        assert_eq!(read.metadata, written.metadata_map());
        assert_eq!(
            serde_json::to_string(&read.content).unwrap(),
            written.content.get(),
            "text kept"
        );
        assert_eq!(read.user_id.as_deref(), Some("u1"));
        assert_eq!(read.thread_id, "t1");
        assert_eq!(read.run_id, "r1");
    }
    assert_strictly_increasing(&back);
    let keys: Vec<&str> = back[0]
        .content
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "task_id",
            "message_index",
            "kind",
            "text",
            "truncated",
            "tool_calls"
        ],
        "key order is kept"
    );
    assert_conforms(&back);
}

/// A batch appended again after an ambiguous failure writes nothing new.
pub async fn a_retried_batch_never_duplicates(store: Arc<dyn Store>) {
    let batch: Vec<NewEvent> = (0..5).map(|i| trace("t1", "r1", i)).collect();
    store.append(&batch).await.unwrap();
    let again = store.append(&batch).await.unwrap();
    assert_eq!((again.written, again.skipped), (0, 5));
    let mut overlapping = batch[3..].to_vec();
    overlapping.push(trace("t1", "r1", 99));
    let partial = store.append(&overlapping).await.unwrap();
    assert_eq!((partial.written, partial.skipped), (1, 2));
    let back = all_events(&*store, "t1", "r1").await;
    assert_eq!(back.len(), 6);
    let ids: HashSet<Uuid> = back.iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), 6);
    assert_eq!(back.last().unwrap().content, json!("event 99"));
    let seqs: Vec<i64> = back.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        [1, 2, 3, 4, 5, 6],
        "skipped records take no seq, as on every backend"
    );
}

/// Over-long types and categories, mixed threads and bad thread ids are typed errors,
/// and a batch holding one bad record writes none of its records.
pub async fn invalid_input_is_a_typed_error_and_writes_nothing(store: Arc<dyn Store>) {
    let good = trace("t1", "r1", 0);
    let long_type = event("t1", "r1", &"x".repeat(33), "trace", json!(null), json!({}));
    let long_category = event(
        "t1",
        "r1",
        "run.start",
        &"c".repeat(17),
        json!(null),
        json!({}),
    );
    let bad_middleware = event(
        "t1",
        "r1",
        "middleware:",
        "middleware",
        json!(null),
        json!({}),
    );
    let other_thread = trace("t2", "r1", 1);
    let bad_thread = trace("bad thread!", "r1", 2);
    type IsExpected = fn(&Error) -> bool;
    let cases: [(Vec<NewEvent>, IsExpected); 5] = [
        (vec![good.clone(), long_type], |e| {
            matches!(e, Error::InvalidEventType(_))
        }),
        (vec![good.clone(), long_category], |e| {
            matches!(e, Error::InvalidCategory(_))
        }),
        (vec![good.clone(), bad_middleware], |e| {
            matches!(e, Error::InvalidEventType(_))
        }),
        (vec![good.clone(), other_thread], |e| {
            matches!(e, Error::MixedThreads { .. })
        }),
        (vec![bad_thread], |e| matches!(e, Error::InvalidThreadId(_))),
    ];
    for (batch, expected) in cases {
        let error = store
            .append(&batch)
            .await
            .expect_err("invalid batch must fail");
        assert!(expected(&error), "unexpected error {error:?}");
        assert!(error.is_invalid_input());
    }
    assert!(
        all_events(&*store, "t1", "r1").await.is_empty(),
        "nothing was written"
    );
    assert!(all_events(&*store, "t2", "r1").await.is_empty());
    let exact = event(
        "t1",
        "r1",
        &"x".repeat(32),
        &"c".repeat(16),
        json!(null),
        json!({}),
    );
    store
        .append(&[exact])
        .await
        .expect("32 and 16 characters are allowed");
}

/// `task_id` filters in the store before the limit, so a page is full of that task.
pub async fn task_filter_applies_before_the_limit(store: Arc<dyn Store>) {
    let mut batch = Vec::new();
    for i in 1..=10 {
        batch.push(step("t1", "r1", "call_a", i));
        batch.push(step("t1", "r1", "call_b", i));
    }
    store.append(&batch).await.unwrap();
    let mut query = EventQuery::run("t1", "r1");
    query.task_id = Some("call_b".into());
    query.limit = 4;
    let page = store.list_events(&query).await.unwrap();
    assert_eq!(page.len(), 4);
    assert!(page.iter().all(|e| e.metadata["task_id"] == "call_b"));
    let indexes: Vec<u64> = page
        .iter()
        .map(|e| e.metadata["message_index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, [1, 2, 3, 4]);
    query.after_seq = Some(page[3].seq);
    query.limit = 100;
    let rest = store.list_events(&query).await.unwrap();
    assert_eq!(rest.len(), 6);
    query.task_id = Some("call_missing".into());
    assert!(store.list_events(&query).await.unwrap().is_empty());
    let numeric = Map::from_iter([("task_id".to_owned(), json!(7))]);
    store
        .append(&[NewEvent::new(
            "t1",
            "r1",
            "llm.error",
            "trace",
            json!(null),
            numeric,
        )])
        .await
        .unwrap();
    query.task_id = Some("7".into());
    query.after_seq = None;
    assert!(
        store.list_events(&query).await.unwrap().is_empty(),
        "a non-string task_id is not indexed"
    );
    assert_conforms(&[page, rest].concat());
}

/// A batch of 2,500 records (more than one insert statement on every backend) is one
/// atomic write numbered in order.
pub async fn a_batch_larger_than_one_statement_keeps_its_order(store: Arc<dyn Store>) {
    let batch: Vec<NewEvent> = (0..2500)
        .map(|n| event("t1", "r1", "llm.error", "trace", json!(n), json!({})))
        .collect();
    let outcome = store.append(&batch).await.unwrap();
    assert_eq!((outcome.written, outcome.skipped), (2500, 0));
    let all = all_events(&*store, "t1", "r1").await;
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=2500).collect::<Vec<i64>>()
    );
    assert!(all.iter().enumerate().all(|(n, e)| e.content == json!(n)));
}

/// Type filters select listed types; an empty list means no filter; the cursor excludes ≤ after_seq.
pub async fn type_filter_and_cursor(store: Arc<dyn Store>) {
    let batch = vec![
        event(
            "t1",
            "r1",
            "run.start",
            "trace",
            json!({"chain": "lead_agent"}),
            json!({"caller": "lead_agent"}),
        ),
        step("t1", "r1", "call_a", 1),
        event("t1", "r1", "llm.error", "trace", json!("boom"), json!({})),
        step("t1", "r1", "call_a", 2),
    ];
    store.append(&batch).await.unwrap();
    let mut query = EventQuery::run("t1", "r1");
    query.event_types = Some(vec!["subagent.step".into(), "run.start".into()]);
    let filtered = store.list_events(&query).await.unwrap();
    assert_eq!(
        filtered
            .iter()
            .map(|e| e.event_type.as_str())
            .collect::<Vec<_>>(),
        ["run.start", "subagent.step", "subagent.step"]
    );
    query.event_types = Some(vec![]);
    assert_eq!(store.list_events(&query).await.unwrap().len(), 4);
    query.event_types = Some(vec!["subagent.step, run.start".into()]);
    assert!(
        store.list_events(&query).await.unwrap().is_empty(),
        "types are matched exactly, untrimmed"
    );
    query.event_types = None;
    query.after_seq = Some(filtered[1].seq);
    let after = store.list_events(&query).await.unwrap();
    assert!(after.iter().all(|e| e.seq > filtered[1].seq));
    assert_eq!(after.len(), 2);
    assert_conforms(&filtered);
}

/// Paging with `limit = 1` from each last `seq` yields exactly the full list.
pub async fn paging_with_limit_one_equals_the_full_list(store: Arc<dyn Store>) {
    for chunk in 0..4 {
        let batch: Vec<NewEvent> = (0..7)
            .map(|i| {
                if i % 2 == 0 {
                    step("t1", "r1", "call_a", chunk * 7 + i + 1)
                } else {
                    trace("t1", "r1", i as usize)
                }
            })
            .collect();
        store.append(&batch).await.unwrap();
        store.append(&[trace("t1", "other", 0)]).await.unwrap();
    }
    let full = all_events(&*store, "t1", "r1").await;
    assert_eq!(full.len(), 28);
    let mut query = EventQuery::run("t1", "r1");
    query.limit = 1;
    let mut paged = Vec::new();
    loop {
        let page = store.list_events(&query).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert_eq!(page.len(), 1);
        query.after_seq = Some(page[0].seq);
        paged.extend(page);
    }
    assert_eq!(paged, full);
}

/// An unknown run, or a run of another thread, gives an empty list.
pub async fn queries_are_scoped_to_thread_and_run(store: Arc<dyn Store>) {
    store.append(&[trace("t1", "r1", 1)]).await.unwrap();
    store.append(&[trace("t2", "r2", 1)]).await.unwrap();
    assert!(
        all_events(&*store, "t1", "r2").await.is_empty(),
        "run of another thread"
    );
    assert!(
        all_events(&*store, "t1", "nope").await.is_empty(),
        "unknown run"
    );
    assert!(
        all_events(&*store, "t9", "r1").await.is_empty(),
        "unknown thread"
    );
    assert_eq!(all_events(&*store, "t2", "r2").await.len(), 1);
}

/// `limit` must be 1–2000 and `after_seq` at least 1.
pub async fn query_bounds_are_enforced(store: Arc<dyn Store>) {
    let mut query = EventQuery::run("t1", "r1");
    for limit in [0, 2001] {
        query.limit = limit;
        assert!(
            matches!(store.list_events(&query).await, Err(Error::InvalidQuery(_))),
            "limit {limit}"
        );
    }
    query.limit = 2000;
    assert!(store.list_events(&query).await.is_ok());
    query.after_seq = Some(0);
    assert!(matches!(
        store.list_events(&query).await,
        Err(Error::InvalidQuery(_))
    ));
    query.after_seq = Some(1);
    assert!(store.list_events(&query).await.is_ok());
}

/// Message projections hold `message` records only, never subagent or middleware ones.
pub async fn message_projection_holds_only_message_records(store: Arc<dyn Store>) {
    let history = full_run_history("t1", "r1");
    store.append(&history).await.unwrap();
    let messages = store.list_messages("t1").await.unwrap();
    let types: Vec<&str> = messages.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        [
            "llm.human.input",
            "llm.ai.response",
            "llm.tool.result",
            "llm.ai.response"
        ]
    );
    assert!(
        messages
            .iter()
            .all(|e| e.category == EventCategory::Message.as_str())
    );
    assert_strictly_increasing(&messages);
    assert!(store.list_messages("t-none").await.unwrap().is_empty());
}

/// Several writers appending to one thread at once: every record once, seqs unique and
/// increasing, each writer's records in its own order.
pub async fn concurrent_writers_to_one_thread_never_collide(store: Arc<dyn Store>) {
    let writers = 6;
    let batches = 15;
    let mut handles = Vec::new();
    for writer in 0..writers {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            for b in 0..batches {
                let batch: Vec<NewEvent> = (0..5)
                    .map(|i| {
                        event(
                            "t1",
                            &format!("r{writer}"),
                            "llm.error",
                            "trace",
                            json!(b * 5 + i),
                            json!({}),
                        )
                    })
                    .collect();
                store.append(&batch).await.expect("concurrent append");
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    let mut all = Vec::new();
    for writer in 0..writers {
        let run = all_events(&*store, "t1", &format!("r{writer}")).await;
        let values: Vec<i64> = run.iter().map(|e| e.content.as_i64().unwrap()).collect();
        assert_eq!(
            values,
            (0..batches * 5).collect::<Vec<_>>(),
            "writer {writer} kept its order"
        );
        all.extend(run);
    }
    let seqs: HashSet<i64> = all.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs.len(),
        (writers * batches * 5) as usize,
        "no seq shared"
    );
}

/// A realistic run history, as the runtime writes it.
pub fn full_run_history(thread: &str, run: &str) -> Vec<NewEvent> {
    let task = |chunk: Value| {
        let mapped = map_task_event(&chunk).expect("valid task event");
        event(
            thread,
            run,
            mapped.event_type.as_str(),
            mapped.category().as_str(),
            mapped.content,
            Value::Object(mapped.metadata),
        )
    };
    let usage = json!({"input_tokens": 120, "output_tokens": 30, "total_tokens": 150});
    vec![
        event(
            thread,
            run,
            EventType::RunStart.as_str(),
            "trace",
            json!({"chain": "lead_agent"}),
            json!({"caller": "lead_agent"}),
        ),
        event(
            thread,
            run,
            EventType::LlmHumanInput.as_str(),
            "message",
            json!({"type": "human", "content": "Compare three databases"}),
            json!({"caller": "lead_agent"}),
        ),
        event(
            thread,
            run,
            EventType::LlmAiResponse.as_str(),
            "message",
            json!({"type": "ai", "content": "", "tool_calls": [{"id": "call_1", "name": "task", "args": {"description": "d", "prompt": "p", "subagent_type": "general-purpose"}, "type": "tool_call"}]}),
            json!({"caller": "lead_agent", "usage": usage, "latency_ms": 12, "llm_call_index": 1}),
        ),
        task(
            json!({"type": "task_started", "task_id": "call_1", "description": "Explore", "model_name": "scripted-1"}),
        ),
        task(
            json!({"type": "task_running", "task_id": "call_1", "message_index": 1, "total_messages": 1,
                    "message": {"type": "ai", "content": "", "tool_calls": [{"id": "c2", "name": "write_file", "args": {"path": "note.md", "content": "x"}}]},
                    "usage": usage, "model_name": "scripted-1"}),
        ),
        task(
            json!({"type": "task_running", "task_id": "call_1", "message_index": 2, "total_messages": 2,
                    "message": {"type": "tool", "name": "write_file", "content": "Wrote note.md", "tool_call_id": "c2"},
                    "usage": usage, "model_name": "scripted-1"}),
        ),
        event(
            thread,
            run,
            &MiddlewareTag::LoopDetection.event_type(),
            "middleware",
            json!({"name": "LoopDetectionMiddleware", "hook": "after_model", "action": "warn",
                     "changes": {"is_subagent": true, "agent_id": "general-purpose", "detection_layer": "identical_call_set",
                                 "tool_names": ["write_file"], "count": 3, "threshold": 3}}),
            json!({}),
        ),
        task(
            json!({"type": "task_completed", "task_id": "call_1", "result": "Done", "usage": usage, "model_name": "scripted-1"}),
        ),
        event(
            thread,
            run,
            EventType::LlmToolResult.as_str(),
            "message",
            json!({"type": "tool", "content": "Task Succeeded. Result: Done", "tool_call_id": "call_1"}),
            json!({}),
        ),
        event(
            thread,
            run,
            EventType::LlmAiResponse.as_str(),
            "message",
            json!({"type": "ai", "content": "Summary", "tool_calls": []}),
            json!({"caller": "lead_agent", "usage": usage, "latency_ms": null, "llm_call_index": 2}),
        ),
        event(
            thread,
            run,
            EventType::RunEnd.as_str(),
            "outputs",
            json!({"messages": 5}),
            json!({"status": "success"}),
        ),
    ]
}

/// Every record of a full run history validates against both contracts.
pub async fn a_full_run_history_conforms_to_both_contracts(store: Arc<dyn Store>) {
    let history = full_run_history("t1", "r1");
    store.append(&history[..5]).await.unwrap();
    store.append(&history[5..]).await.unwrap();
    let back = all_events(&*store, "t1", "r1").await;
    assert_eq!(back.len(), history.len());
    assert_conforms(&back);
    for record in &back {
        let created = time::OffsetDateTime::parse(
            &record.created_at,
            &time::format_description::well_known::Rfc3339,
        );
        assert!(
            created.is_ok(),
            "created_at {} is RFC 3339",
            record.created_at
        );
    }
}

/// The same history gives the same pages on this backend as on the in-memory reference
/// (all but `created_at`, the write time).
pub async fn identical_histories_give_identical_results(store: Arc<dyn Store>) {
    let reference = crate::MemoryStore::new();
    let mut history = full_run_history("t1", "r1");
    for (n, record) in history.iter_mut().enumerate() {
        record.event_id = Uuid::from_u128(n as u128 + 1);
    }
    for part in [&history[..3], &history[3..4], &history[4..]] {
        store.append(part).await.unwrap();
        reference.append(part).await.unwrap();
    }
    let strip = |mut records: Vec<RunEvent>| {
        for record in &mut records {
            record.created_at.clear();
        }
        records
    };
    let mut queries = vec![EventQuery::run("t1", "r1")];
    let mut by_task = EventQuery::run("t1", "r1");
    by_task.task_id = Some("call_1".into());
    by_task.limit = 2;
    queries.push(by_task.clone());
    by_task.after_seq = Some(5);
    queries.push(by_task);
    let mut by_type = EventQuery::run("t1", "r1");
    by_type.event_types = Some(vec![
        "subagent.end".into(),
        "middleware:loop_detection".into(),
    ]);
    queries.push(by_type);
    for query in queries {
        let ours = strip(store.list_events(&query).await.unwrap());
        let theirs = strip(reference.list_events(&query).await.unwrap());
        assert_eq!(
            serde_json::to_string(&ours).unwrap(),
            serde_json::to_string(&theirs).unwrap(),
            "{query:?}"
        );
    }
    let ours = strip(store.list_messages("t1").await.unwrap());
    let theirs = strip(reference.list_messages("t1").await.unwrap());
    assert_eq!(ours, theirs);
}

// ---------------------------------------------------------------------------------
// Record cases

fn new_thread(id: &str, owner: &str, metadata: Value) -> NewThread {
    let Value::Object(metadata) = metadata else {
        panic!("object")
    };
    NewThread {
        thread_id: id.into(),
        owner: owner.into(),
        metadata,
    }
}

fn new_run(run: &str, thread: &str) -> NewRun {
    NewRun {
        run_id: run.into(),
        thread_id: thread.into(),
        owner: "u1".into(),
        assistant_id: "lead_agent".into(),
        model_name: Some("scripted".into()),
        trace_id: Some("0af7651916cd43dd8448eb211c80319c".into()),
        metadata: Map::from_iter([("origin".to_owned(), json!("test"))]),
        multitask_strategy: "reject".into(),
        kwargs: json!({"stream_mode": ["values"]}),
    }
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
        status: RunStatus::Running,
        stop_reason: None,
        error: None,
    };
    assert!(store.update_run_status("r1", &running).await.unwrap());
    let done = RunStatusUpdate {
        status: RunStatus::Success,
        stop_reason: Some(RunStopReason::LoopCapped),
        error: None,
    };
    assert!(store.update_run_status("r1", &done).await.unwrap());
    let late = RunStatusUpdate {
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
                },
            ),
            (
                "claude-x".to_owned(),
                ModelUsage {
                    input_tokens: 100,
                    output_tokens: 100,
                    total_tokens: 200,
                    cache_read_tokens: None,
                },
            ),
        ]
        .into(),
    };
    assert!(store.save_run_usage("r1", &usage).await.unwrap());
    assert!(!store.save_run_usage("nope", &usage).await.unwrap());
    assert_eq!(
        store.get_run("t1", "r1").await.unwrap().unwrap().usage,
        usage
    );

    let listed: Vec<String> = store
        .list_runs("t1", None, 10, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(listed, ["r2", "r1"]);
    let pending: Vec<String> = store
        .list_runs("t1", Some(RunStatus::Pending), 10, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(pending, ["r2"]);
    assert_eq!(store.list_runs("t1", None, 1, 1).await.unwrap().len(), 1);

    store
        .append(&[trace("t1", "r2", 1), trace("t1", "r1", 2)])
        .await
        .unwrap();
    assert!(store.delete_run("t1", "r2").await.unwrap());
    assert_eq!(store.get_run("t1", "r2").await.unwrap(), None);
    assert!(all_events(&*store, "t1", "r2").await.is_empty());
    assert_eq!(all_events(&*store, "t1", "r1").await.len(), 1);
}

// ---------------------------------------------------------------------------------
// Checkpoint cases

/// Checkpoint `n` of `thread`: values and metadata with keys deliberately out of
/// alphabetical order, so a backend that reorders keys is caught.
fn checkpoint(thread: &str, id: &str, parent: Option<&str>, run: Option<&str>) -> NewCheckpoint {
    let values = json!({
        "title": format!("Thread {thread}"),
        "messages": [
            {"type": "human", "content": format!("question at {id}"), "id": format!("h-{id}")},
            {"type": "ai", "content": "", "tool_calls": [
                {"name": "task", "id": "call_1", "args": {"zeta": 1, "alpha": [1.5, null, true]}}
            ], "id": format!("a-{id}")}
        ],
        "b": {"z": 1, "a": 2}
    });
    let Value::Object(metadata) = json!({
        "step": 3,
        "deerflow_trace_id": "0af7651916cd43dd8448eb211c80319c",
        "source": "loop",
        "checkpoint_ns": ""
    }) else {
        unreachable!()
    };
    NewCheckpoint {
        thread_id: thread.into(),
        checkpoint_id: id.into(),
        parent_checkpoint_id: parent.map(Into::into),
        run_id: run.map(Into::into),
        values,
        metadata,
    }
}

/// Writes `count` chained checkpoints `{prefix}{n}` (n from 1) to `thread` in `run`.
async fn put_chain(store: &dyn Store, thread: &str, prefix: &str, run: &str, count: usize) {
    let mut parent: Option<String> = None;
    for n in 1..=count {
        let id = format!("{prefix}{n}");
        store
            .put_checkpoint(checkpoint(thread, &id, parent.as_deref(), Some(run)))
            .await
            .expect("put_checkpoint");
        parent = Some(id);
    }
}

fn checkpoint_ids(checkpoints: &[Checkpoint]) -> Vec<&str> {
    checkpoints
        .iter()
        .map(|c| c.checkpoint_id.as_str())
        .collect()
}

/// Every field of a checkpoint but `created_at`, with the JSON as its exact text.
fn checkpoint_text(checkpoint: &Checkpoint) -> String {
    format!(
        "{}|{}|{:?}|{:?}|{}|{}",
        checkpoint.thread_id,
        checkpoint.checkpoint_id,
        checkpoint.parent_checkpoint_id,
        checkpoint.run_id,
        serde_json::to_string(&checkpoint.values).unwrap(),
        serde_json::to_string(&checkpoint.metadata).unwrap()
    )
}

/// A checkpoint comes back exactly as written, JSON key order included, and the latest
/// is the one written last.
pub async fn checkpoints_round_trip_and_latest_is_the_newest(store: Arc<dyn Store>) {
    assert_eq!(store.latest_checkpoint("t1").await.unwrap(), None);
    let first = checkpoint("t1", "c1", None, None);
    let stored = store.put_checkpoint(first.clone()).await.unwrap();
    assert_eq!(
        (
            &stored.thread_id,
            &stored.checkpoint_id,
            &stored.parent_checkpoint_id,
            &stored.run_id,
            &stored.values,
            &stored.metadata
        ),
        (
            &first.thread_id,
            &first.checkpoint_id,
            &first.parent_checkpoint_id,
            &first.run_id,
            &first.values,
            &first.metadata
        )
    );
    let created = time::OffsetDateTime::parse(
        &stored.created_at,
        &time::format_description::well_known::Rfc3339,
    );
    assert!(
        created.is_ok(),
        "created_at {} is RFC 3339",
        stored.created_at
    );
    let latest = store.latest_checkpoint("t1").await.unwrap().unwrap();
    assert_eq!(latest, stored, "read back as written");
    assert_eq!(
        serde_json::to_string(&latest.values).unwrap(),
        serde_json::to_string(&first.values).unwrap(),
        "values key order is kept"
    );
    assert_eq!(
        serde_json::to_string(&latest.metadata).unwrap(),
        serde_json::to_string(&first.metadata).unwrap(),
        "metadata key order is kept"
    );

    let mut second = checkpoint("t1", "c2", Some("c1"), Some("r1"));
    second.values = json!({"messages": [], "title": null});
    second.metadata = Map::new();
    let stored = store.put_checkpoint(second.clone()).await.unwrap();
    let latest = store.latest_checkpoint("t1").await.unwrap().unwrap();
    assert_eq!(latest, stored);
    assert_eq!(latest.parent_checkpoint_id.as_deref(), Some("c1"));
    assert_eq!(latest.run_id.as_deref(), Some("r1"));
    assert_eq!(
        serde_json::to_string(&latest.values).unwrap(),
        r#"{"messages":[],"title":null}"#
    );
    // An id that does not sort last is still the newest once written last.
    store
        .put_checkpoint(checkpoint("t1", "a0", Some("c2"), Some("r1")))
        .await
        .unwrap();
    let latest = store.latest_checkpoint("t1").await.unwrap().unwrap();
    assert_eq!(
        latest.checkpoint_id, "a0",
        "newest by write order, not by id"
    );
}

/// Listing is newest first; `limit` caps it and `before` starts after a checkpoint.
pub async fn checkpoints_list_newest_first_with_limit_and_before(store: Arc<dyn Store>) {
    put_chain(&*store, "t1", "c", "r1", 7).await;
    let all = store.list_checkpoints("t1", 100, None).await.unwrap();
    assert_eq!(
        checkpoint_ids(&all),
        ["c7", "c6", "c5", "c4", "c3", "c2", "c1"]
    );
    assert_eq!(
        all[0],
        store.latest_checkpoint("t1").await.unwrap().unwrap()
    );
    let first = store.list_checkpoints("t1", 3, None).await.unwrap();
    assert_eq!(checkpoint_ids(&first), ["c7", "c6", "c5"]);
    let next = store.list_checkpoints("t1", 3, Some("c5")).await.unwrap();
    assert_eq!(checkpoint_ids(&next), ["c4", "c3", "c2"]);
    let older = store.list_checkpoints("t1", 100, Some("c2")).await.unwrap();
    assert_eq!(checkpoint_ids(&older), ["c1"]);
    assert!(
        store
            .list_checkpoints("t1", 100, Some("c1"))
            .await
            .unwrap()
            .is_empty(),
        "nothing is older than the first"
    );
    assert!(
        store
            .list_checkpoints("t1", 100, Some("missing"))
            .await
            .unwrap()
            .is_empty(),
        "an unknown `before` gives nothing"
    );
    assert!(
        store
            .list_checkpoints("t1", 0, None)
            .await
            .unwrap()
            .is_empty(),
        "limit 0 gives nothing"
    );
    assert!(
        store
            .list_checkpoints("nope", 10, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.latest_checkpoint("nope").await.unwrap(), None);
}

/// Paging with `limit = 1` from each last checkpoint id yields exactly the full list.
pub async fn checkpoint_paging_with_limit_one_equals_the_full_list(store: Arc<dyn Store>) {
    for round in 0..4 {
        put_chain(
            &*store,
            "t1",
            &format!("r{round}-"),
            &format!("r{round}"),
            3,
        )
        .await;
        put_chain(
            &*store,
            "t2",
            &format!("r{round}-"),
            &format!("r{round}"),
            1,
        )
        .await;
    }
    let full = store.list_checkpoints("t1", 1000, None).await.unwrap();
    assert_eq!(full.len(), 12);
    let mut paged = Vec::new();
    let mut before: Option<String> = None;
    loop {
        let page = store
            .list_checkpoints("t1", 1, before.as_deref())
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        assert_eq!(page.len(), 1);
        before = Some(page[0].checkpoint_id.clone());
        paged.extend(page);
        assert!(
            paged.len() <= full.len(),
            "paging must end: {before:?} repeats"
        );
    }
    assert_eq!(paged, full);
}

/// A checkpoint with an invalid thread id is a typed error and writes nothing.
pub async fn an_invalid_checkpoint_thread_id_is_a_typed_error(store: Arc<dyn Store>) {
    let too_long = "t".repeat(65);
    for thread in ["bad thread!", "", too_long.as_str(), "t/1"] {
        let error = store
            .put_checkpoint(checkpoint(thread, "c1", None, Some("r1")))
            .await
            .expect_err("an invalid thread id must fail");
        assert!(
            matches!(error, Error::InvalidThreadId(_)),
            "unexpected error {error:?}"
        );
        assert!(error.is_invalid_input());
        assert_eq!(store.latest_checkpoint(thread).await.unwrap(), None);
        assert!(
            store
                .list_checkpoints(thread, 10, None)
                .await
                .unwrap()
                .is_empty()
        );
    }
    let longest = "t".repeat(64);
    store
        .put_checkpoint(checkpoint(&longest, "c1", None, None))
        .await
        .expect("64 characters are allowed");
}

/// Reads are scoped to the thread, even when checkpoint and run ids repeat across threads.
pub async fn checkpoints_of_other_threads_never_appear(store: Arc<dyn Store>) {
    put_chain(&*store, "t1", "c", "r1", 3).await;
    put_chain(&*store, "t2", "c", "r1", 2).await;
    put_chain(&*store, "t1x", "d", "r1", 1).await;
    store
        .put_checkpoint(checkpoint("t1", "only-t1", Some("c3"), Some("r1")))
        .await
        .unwrap();
    let t1 = store.list_checkpoints("t1", 100, None).await.unwrap();
    assert_eq!(checkpoint_ids(&t1), ["only-t1", "c3", "c2", "c1"]);
    assert!(t1.iter().all(|c| c.thread_id == "t1"));
    let t2 = store.list_checkpoints("t2", 100, None).await.unwrap();
    assert_eq!(checkpoint_ids(&t2), ["c2", "c1"]);
    assert!(t2.iter().all(|c| c.thread_id == "t2"));
    let latest = store.latest_checkpoint("t2").await.unwrap().unwrap();
    assert_eq!(
        (latest.thread_id.as_str(), latest.checkpoint_id.as_str()),
        ("t2", "c2")
    );
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t2", 100, Some("c2")).await.unwrap()),
        ["c1"],
        "`before` names a checkpoint of this thread"
    );
    assert!(
        store
            .list_checkpoints("t2", 100, Some("only-t1"))
            .await
            .unwrap()
            .is_empty(),
        "a checkpoint of another thread is unknown here"
    );
    assert!(
        store
            .list_checkpoints("t", 100, None)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Rollback deletes the run's checkpoints of that thread only and returns how many.
pub async fn deleting_run_checkpoints_removes_only_that_run(store: Arc<dyn Store>) {
    put_chain(&*store, "t1", "a", "r1", 3).await;
    put_chain(&*store, "t1", "b", "r2", 2).await;
    store
        .put_checkpoint(checkpoint("t1", "none", Some("b2"), None))
        .await
        .unwrap();
    put_chain(&*store, "t1", "c", "r1", 1).await;
    put_chain(&*store, "t2", "a", "r1", 2).await;
    assert_eq!(store.delete_run_checkpoints("t1", "r1").await.unwrap(), 4);
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t1", 100, None).await.unwrap()),
        ["none", "b2", "b1"]
    );
    assert_eq!(
        store
            .latest_checkpoint("t1")
            .await
            .unwrap()
            .unwrap()
            .checkpoint_id,
        "none"
    );
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t2", 100, None).await.unwrap()),
        ["a2", "a1"],
        "the same run id in another thread is kept"
    );
    assert_eq!(store.delete_run_checkpoints("t1", "r1").await.unwrap(), 0);
    assert_eq!(store.delete_run_checkpoints("t1", "nope").await.unwrap(), 0);
    assert_eq!(store.delete_run_checkpoints("t3", "r2").await.unwrap(), 0);
    assert_eq!(store.delete_run_checkpoints("t1", "r2").await.unwrap(), 2);
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t1", 100, None).await.unwrap()),
        ["none"]
    );
    // A checkpoint id freed by a rollback may be written again, and is then the newest.
    store
        .put_checkpoint(checkpoint("t1", "a1", Some("none"), Some("r3")))
        .await
        .unwrap();
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t1", 100, None).await.unwrap()),
        ["a1", "none"]
    );
}

/// Deleting a thread deletes its checkpoints and no other thread's.
pub async fn deleting_a_thread_removes_its_checkpoints(store: Arc<dyn Store>) {
    store
        .create_thread(new_thread("t1", "u1", json!({})))
        .await
        .unwrap();
    store
        .create_thread(new_thread("t2", "u1", json!({})))
        .await
        .unwrap();
    put_chain(&*store, "t1", "c", "r1", 3).await;
    put_chain(&*store, "t2", "c", "r2", 2).await;
    assert!(store.delete_thread("t1").await.unwrap());
    assert_eq!(store.latest_checkpoint("t1").await.unwrap(), None);
    assert!(
        store
            .list_checkpoints("t1", 100, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t2", 100, None).await.unwrap()),
        ["c2", "c1"],
        "other threads keep their checkpoints"
    );
    // The thread id is free again, with no stale state behind it.
    store
        .create_thread(new_thread("t1", "u1", json!({})))
        .await
        .unwrap();
    assert_eq!(store.latest_checkpoint("t1").await.unwrap(), None);
    put_chain(&*store, "t1", "c", "r3", 1).await;
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t1", 100, None).await.unwrap()),
        ["c1"]
    );
}

/// The same sequence of checkpoint calls gives the same results on this backend as on
/// the in-memory reference (all but `created_at`, the write time).
pub async fn identical_checkpoint_histories_give_identical_results(store: Arc<dyn Store>) {
    let reference = crate::MemoryStore::new();
    let stores: [&dyn Store; 2] = [&*store, &reference];
    for target in stores {
        target
            .create_thread(new_thread("t1", "u1", json!({})))
            .await
            .unwrap();
        put_chain(target, "t1", "a", "r1", 4).await;
        put_chain(target, "t2", "a", "r1", 2).await;
        put_chain(target, "t1", "b", "r2", 3).await;
        let mut odd = checkpoint("t1", "odd", Some("b3"), None);
        odd.values = json!({"messages": [{"type": "ai", "content": "é \u{0} \"q\" 😀", "n": 1e-7}],
                            "title": "Ünïcode", "big": u64::MAX, "neg": i64::MIN});
        target.put_checkpoint(odd).await.unwrap();
        assert!(
            target
                .put_checkpoint(checkpoint("no good", "x", None, None))
                .await
                .is_err()
        );
        assert_eq!(target.delete_run_checkpoints("t1", "r1").await.unwrap(), 4);
        put_chain(target, "t1", "c", "r3", 2).await;
        put_chain(target, "t3", "a", "r9", 1).await;
        assert!(
            !target.delete_thread("t3").await.unwrap(),
            "t3 has no record"
        );
    }
    type Reads = Vec<(String, Vec<String>)>;
    async fn reads(store: &dyn Store) -> Reads {
        let mut out = Vec::new();
        for thread in ["t1", "t2", "t3", "nope"] {
            let latest = store.latest_checkpoint(thread).await.unwrap();
            out.push((
                format!("latest {thread}"),
                latest.iter().map(checkpoint_text).collect(),
            ));
            let queries: [(u32, Option<&str>); 7] = [
                (100, None),
                (2, None),
                (0, None),
                (100, Some("b2")),
                (1, Some("odd")),
                (100, Some("a1")),
                (100, Some("missing")),
            ];
            for (limit, before) in queries {
                let page = store.list_checkpoints(thread, limit, before).await.unwrap();
                out.push((
                    format!("list {thread} {limit} {before:?}"),
                    page.iter().map(checkpoint_text).collect(),
                ));
            }
        }
        out
    }
    let ours = reads(&*store).await;
    let theirs = reads(&reference).await;
    assert!(!ours[0].1.is_empty(), "t1 has checkpoints");
    for (ours, theirs) in ours.iter().zip(&theirs) {
        assert_eq!(ours, theirs);
    }
    assert_eq!(ours.len(), theirs.len());
}
