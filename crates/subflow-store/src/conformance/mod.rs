//! The one conformance suite every backend runs (docs/events.md#run-events, docs/api.md#run-events, docs/operations.md#storage).
//!
//! A backend's integration tests invoke [`conformance_tests!`](crate::conformance_tests)
//! with an async factory returning a fresh, empty [`Fixture`]; the macro expands to one
//! test per case. Every record a case reads back is validated against subflow's event
//! contract and against both versions of the reference contract vendored in
//! `contracts/reference/`.

use std::any::Any;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use subflow_contracts::task_events::map_task_event;
use subflow_contracts::{NewEvent, RunEvent};

pub mod auth;
pub mod batch_history;
pub mod batches;
pub mod checkpoints;
pub mod events;
pub mod records;
pub mod streams;
pub mod tasks;

use crate::{EventQuery, NewRun, NewThread, Store};

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
        $crate::event_conformance_tests!($factory);
        $crate::task_conformance_tests!($factory);
        $crate::record_conformance_tests!($factory);
        $crate::checkpoint_conformance_tests!($factory);
        $crate::auth_conformance_tests!($factory);
        $crate::stream_conformance_tests!($factory);
        $crate::batch_conformance_tests!($factory);
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

/// DeerFlow's contract from before its 2.1 release, vendored in `contracts/reference/`.
pub fn reference_contract() -> ContractValidator {
    ContractValidator::load(
        &repository_root().join("contracts/reference/deerflow_run_event_stream_contract.json"),
    )
}

/// DeerFlow's 2.1 contract, vendored in `contracts/reference/`.
pub fn reference_contract_2_1() -> ContractValidator {
    ContractValidator::load(
        &repository_root()
            .join("contracts/reference/deerflow_run_event_stream_contract.v2026-09.json"),
    )
}

/// Asserts every record validates against our contract and both reference versions.
///
/// The one record the older reference cannot describe is a `run.end` whose status is
/// not `success`: before 2.1 the reference froze `run.end` as a success marker
/// (`metadata.status` const `success`) and wrote none for other endings (its known gap
/// `terminal-run-status`). Such a record must validate against 2.1 and fail the older
/// file on that constant alone.
pub fn assert_conforms(records: &[RunEvent]) {
    let before_2_1 = reference_contract();
    let name = before_2_1.name.clone();
    for contract in [our_contract(), before_2_1, reference_contract_2_1()] {
        for record in records {
            let result = contract.check(record);
            if contract.name == name && ends_without_success(record) {
                let problem = result.expect_err("the older reference knows only a success run.end");
                assert!(
                    problem.starts_with("metadata:")
                        && problem.contains("\"success\" was expected"),
                    "record seq {} (run.end) fails {name} on more than its status: {problem}",
                    record.seq
                );
                continue;
            }
            if let Err(problem) = result {
                panic!(
                    "record seq {} ({}) violates {}: {problem}\n{record:#?}",
                    record.seq, record.event_type, contract.name
                );
            }
        }
    }
}

/// A `run.end` of a run that did not succeed.
pub fn ends_without_success(record: &RunEvent) -> bool {
    record.event_type == "run.end"
        && record.metadata.get("status").and_then(Value::as_str) != Some("success")
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
    mapped.into_event(thread, run).with_user(Some("u1".into()))
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
