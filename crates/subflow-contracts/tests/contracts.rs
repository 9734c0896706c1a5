//! The Rust enums against the contract files: ours in `contracts/` and the reference
//! files (`contracts/reference/` for the event contracts, before and since the
//! reference's 2.1 release). A rename on either side fails here.

use std::path::{Path, PathBuf};

use serde_json::Value;
use subflow_contracts::{
    EventCategory, EventType, MiddlewareTag, SubagentStatus, SubagentStopReason, TaskEndStatus,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load(path: PathBuf) -> Value {
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn ours_events() -> Value {
    load(root().join("contracts/run_event_stream_contract.json"))
}

/// The reference event contracts: before 2.1, and the 2.1 release's.
fn reference_events() -> [Value; 2] {
    [
        "deerflow_run_event_stream_contract.json",
        "deerflow_run_event_stream_contract.v2026-09.json",
    ]
    .map(|name| load(root().join("contracts/reference").join(name)))
}

/// The values a schema admits when it names them (`const` or `enum`); `None` when it
/// admits any value of its type.
fn admitted(schema: &Value) -> Option<Vec<Value>> {
    if let Some(value) = schema.get("const") {
        return Some(vec![value.clone()]);
    }
    schema
        .get("enum")
        .map(|values| values.as_array().unwrap().clone())
}

/// Whether `value` is of the JSON schema `kind` (a type name or a list of them; any
/// value when absent).
fn of_type(value: &Value, kind: &Value) -> bool {
    match kind {
        Value::Null => true,
        Value::Array(kinds) => kinds.iter().any(|k| of_type(value, k)),
        Value::String(kind) => match kind.as_str() {
            "string" => value.is_string(),
            "boolean" => value.is_boolean(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "object" => value.is_object(),
            "array" => value.is_array(),
            "null" => value.is_null(),
            _ => false,
        },
        _ => false,
    }
}

/// `mine` accepts everything `theirs` describes: the same type and required fields, and
/// every property theirs names (recursively: the same type, and every value it admits).
fn assert_accepts(mine: &Value, theirs: &Value, at: &str) {
    assert_eq!(
        mine.get("required"),
        theirs.get("required"),
        "{at} required"
    );
    assert_admits(mine, theirs, at);
}

fn assert_admits(mine: &Value, theirs: &Value, at: &str) {
    if theirs == &Value::Bool(true) || theirs.as_object().is_some_and(|o| o.is_empty()) {
        assert!(
            mine == &Value::Bool(true) || mine.get("type").is_none(),
            "{at}: the reference admits anything, ours narrows it: {mine}"
        );
        return;
    }
    match (mine.get("type"), admitted(mine)) {
        // Ours names the values it produces: each must be of the reference's type.
        (None, Some(values)) => {
            for value in values {
                assert!(
                    of_type(&value, &theirs["type"]),
                    "{at}: {value} is not {}",
                    theirs["type"]
                );
            }
        }
        (mine, _) => assert_eq!(mine, theirs.get("type"), "{at} type"),
    }
    if let Some(values) = admitted(theirs) {
        let ours = admitted(mine);
        for value in values {
            assert!(
                ours.as_ref().is_none_or(|ours| ours.contains(&value)),
                "{at}: ours does not admit {value}"
            );
        }
    }
    if let Some(properties) = theirs.get("properties").and_then(Value::as_object) {
        for (name, schema) in properties {
            let mine = mine
                .get("properties")
                .and_then(|p| p.get(name))
                .unwrap_or_else(|| panic!("{at}: property {name} dropped"));
            assert_admits(mine, schema, &format!("{at}.{name}"));
        }
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .expect("a list")
        .iter()
        .map(|v| v.as_str().expect("a string").to_owned())
        .collect()
}

fn names<T: std::fmt::Display>(all: &[T]) -> Vec<String> {
    all.iter().map(ToString::to_string).collect()
}

#[test]
fn status_enums_equal_both_status_contracts() {
    let ours = load(root().join("contracts/subagent_status_contract.json"));
    let reference = load(root().join("contracts/reference/deerflow_subagent_status_contract.json"));
    for contract in [&ours, &reference] {
        assert_eq!(contract["version"], 2);
        assert_eq!(
            strings(&contract["valid_status_values"]),
            names(SubagentStatus::ALL)
        );
        assert_eq!(
            strings(&contract["valid_stop_reason_values"]),
            names(SubagentStopReason::ALL)
        );
    }
}

#[test]
fn categories_and_event_types_equal_every_event_contract() {
    let [before, release] = reference_events();
    for contract in [ours_events(), before, release] {
        let categories: Vec<String> = contract["categories"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(categories, names(EventCategory::ALL));
        let events = contract["events"].as_array().unwrap();
        let types: Vec<String> = events
            .iter()
            .map(|e| e["event_type"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(types, names(EventType::ALL));
        for (event, event_type) in events.iter().zip(EventType::ALL) {
            assert_eq!(
                event["category"],
                event_type.category().as_str(),
                "{event_type}"
            );
        }
        let end = events
            .iter()
            .find(|e| e["event_type"] == "subagent.end")
            .unwrap();
        assert_eq!(
            strings(&end["content_schema"]["properties"]["status"]["enum"]),
            names(TaskEndStatus::ALL)
        );
        let aliases: Vec<&str> = contract["legacy_event_aliases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["event_type"].as_str().unwrap())
            .collect();
        assert_eq!(aliases, [subflow_contracts::events::LEGACY_AI_MESSAGE]);
    }
}

#[test]
fn our_middleware_tags_are_those_of_every_reference_version() {
    let ours = strings(&ours_events()["dynamic_event_patterns"][0]["known_tags"]);
    assert_eq!(ours, names(MiddlewareTag::ALL));
    let [before, release] = reference_events()
        .map(|contract| strings(&contract["dynamic_event_patterns"][0]["known_tags"]));
    for tag in before.iter().chain(&release) {
        assert!(ours.contains(tag), "{tag}");
    }
    // 2.1 knows the loop-detection and tool-promotion tags, and nothing else we lack.
    assert_eq!(ours, release);
    assert!(!before.contains(&"tool_promotion".to_owned()));
}

/// Our contract may only add: against every reference version, each event keeps its
/// category, required fields and types, and admits every value the reference admits
/// (so `run.end` takes every terminal status and `recovered`), the envelope keeps its
/// required fields, and the compatibility rules match.
#[test]
fn our_event_contract_is_a_compatible_superset_of_every_reference_version() {
    let ours = ours_events();
    for reference in reference_events() {
        assert_eq!(ours["version"], reference["version"]);
        assert_accepts(
            &ours["record_schema"],
            &reference["record_schema"],
            "record",
        );
        assert_eq!(ours["record_schema"]["additionalProperties"], true);
        assert_eq!(ours["sequence"]["scope"], reference["sequence"]["scope"]);
        assert_eq!(
            ours["sequence"]["guarantee"],
            reference["sequence"]["guarantee"]
        );
        assert_eq!(
            ours["compatibility"]["additive_changes"],
            reference["compatibility"]["additive_changes"]
        );
        assert_eq!(
            ours["compatibility"]["breaking_changes"],
            reference["compatibility"]["breaking_changes"]
        );
        for theirs in reference["events"].as_array().unwrap() {
            let name = theirs["event_type"].as_str().unwrap();
            let mine = ours["events"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["event_type"] == name)
                .expect("event kept");
            assert_eq!(mine["category"], theirs["category"], "{name}");
            for schema in ["content_schema", "metadata_schema"] {
                assert_accepts(&mine[schema], &theirs[schema], &format!("{name} {schema}"));
            }
        }
        let pattern = &reference["dynamic_event_patterns"][0];
        let mine = &ours["dynamic_event_patterns"][0];
        assert_eq!(mine["pattern"], pattern["pattern"]);
        assert_eq!(mine["event_type_schema"], pattern["event_type_schema"]);
        assert_eq!(mine["tag_schema"], pattern["tag_schema"]);
        assert_accepts(
            &mine["content_schema"],
            &pattern["content_schema"],
            "middleware content",
        );
    }
    assert!(ours["record_schema"]["properties"]["event_id"].is_object());
    let run_end = ours["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event_type"] == "run.end")
        .unwrap();
    assert_eq!(
        strings(&run_end["metadata_schema"]["properties"]["status"]["enum"]),
        ["success", "error", "timeout", "interrupted"]
    );
    let gaps: Vec<&Value> = ours["known_gaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| &g["id"])
        .collect();
    assert!(gaps.contains(&&Value::from("middleware-coverage")));
    assert!(gaps.contains(&&Value::from("terminal-event-durability")));
}

#[test]
fn every_event_contract_compiles_as_json_schema_2020_12() {
    let [before, release] = reference_events();
    for contract in [ours_events(), before, release] {
        assert_eq!(
            contract["schema_dialect"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        let mut schemas = vec![&contract["record_schema"]];
        for event in contract["events"].as_array().unwrap() {
            schemas.push(&event["content_schema"]);
            schemas.push(&event["metadata_schema"]);
        }
        for schema in schemas {
            jsonschema::options()
                .with_draft(jsonschema::Draft::Draft202012)
                .build(schema)
                .unwrap_or_else(|e| panic!("{schema} does not compile: {e}"));
        }
    }
}
