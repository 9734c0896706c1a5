//! The Rust enums against the contract files: ours in `contracts/` and the reference
//! files vendored in `contracts/reference/`. A rename on either side fails here.

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

fn reference_events() -> Value {
    load(root().join("contracts/reference/deerflow_run_event_stream_contract.json"))
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
fn categories_and_event_types_equal_both_event_contracts() {
    for contract in [ours_events(), reference_events()] {
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
fn our_middleware_tags_are_the_reference_tags_plus_loop_detection() {
    let ours = strings(&ours_events()["dynamic_event_patterns"][0]["known_tags"]);
    assert_eq!(ours, names(MiddlewareTag::ALL));
    let mut reference = strings(&reference_events()["dynamic_event_patterns"][0]["known_tags"]);
    reference.push("loop_detection".into());
    reference.sort();
    assert_eq!(ours, reference);
}

/// Our contract may only add: every reference event keeps its category and required
/// fields, the envelope keeps its required fields, and the compatibility rules match.
#[test]
fn our_event_contract_is_a_compatible_superset_of_the_reference() {
    let ours = ours_events();
    let reference = reference_events();
    assert_eq!(ours["version"], reference["version"]);
    assert_eq!(
        ours["record_schema"]["required"],
        reference["record_schema"]["required"]
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
    assert!(ours["record_schema"]["properties"]["event_id"].is_object());
    for theirs in reference["events"].as_array().unwrap() {
        let name = &theirs["event_type"];
        let mine = ours["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| &e["event_type"] == name)
            .expect("event kept");
        assert_eq!(mine["category"], theirs["category"], "{name}");
        for schema in ["content_schema", "metadata_schema"] {
            assert_eq!(
                mine[schema]["required"], theirs[schema]["required"],
                "{name} {schema}"
            );
            assert_eq!(
                mine[schema]["type"], theirs[schema]["type"],
                "{name} {schema}"
            );
        }
    }
    let gaps: Vec<&Value> = ours["known_gaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| &g["id"])
        .collect();
    assert!(gaps.contains(&&Value::from("middleware-coverage")));
}

#[test]
fn both_event_contracts_compile_as_json_schema_2020_12() {
    for contract in [ours_events(), reference_events()] {
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
