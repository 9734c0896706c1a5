//! The task tool-result contract (docs/events.md#tool-result-contract): producer key sets and text bodies over every
//! status, stop reason and text shape, the exception path, and the card reader (docs/workspace.md#task-card).

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use subflow_contracts::messages::{ToolMessage, ToolStatus};
use subflow_contracts::task_result::{
    CardState, TASK_TEXT_CAP, TaskCardStatus, TaskOutcome, TokenUsage, WireStatus, bound_text,
    read_task_status, read_task_tool_message, task_tool_exception, task_tool_message,
    unknown_subagent_type_error,
};
use subflow_contracts::{SubagentStatus, SubagentStopReason};

// ---------------------------------------------------------------------------------------
// Producer

/// One text input with the bounded form the contract expects of it, written out by hand.
struct Text {
    name: &'static str,
    raw: Option<String>,
    /// `None` when the input is absent or blank.
    bounded: Option<String>,
}

fn text(name: &'static str, raw: Option<String>, bounded: Option<String>) -> Text {
    Text { name, raw, bounded }
}

fn texts() -> Vec<Text> {
    let same = |name, value: &str| text(name, Some(value.into()), Some(value.into()));
    vec![
        text("absent", None, None),
        text("empty", Some(String::new()), None),
        text("blank", Some("  \n\t ".into()), None),
        same("short", "all good"),
        // Stripped for display, hashed untrimmed.
        text(
            "padded",
            Some("  spaced out \n".into()),
            Some("spaced out".into()),
        ),
        text(
            "long",
            Some(format!("{}{}", "a".repeat(2500), "b".repeat(2500))),
            Some(format!("{}\n...\n{}", "a".repeat(1333), "b".repeat(662))),
        ),
        same("unicode", "héllo 日本語 🚀 done"),
        text(
            "long unicode",
            Some(format!(" {}{} ", "é".repeat(1500), "🚀".repeat(1500))),
            Some(format!("{}\n...\n{}", "é".repeat(1333), "🚀".repeat(662))),
        ),
        // Exactly at the cap: kept whole, no elision.
        same("at cap", &"日".repeat(TASK_TEXT_CAP)),
        // The cancelled body shows this once rather than twice.
        same("cancel default", "Task cancelled by user."),
        same("executor cancel", "Cancelled by user"),
    ]
}

fn sha256_of(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn label(reason: SubagentStopReason) -> &'static str {
    match reason.as_str() {
        "token_capped" => "token budget",
        "turn_capped" => "turn budget",
        "loop_capped" => "repeated tool-call loop",
        other => panic!("no label for {other}"),
    }
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// The message a producer must build: its status, text body and kwargs (in key order).
struct Expected {
    status: ToolStatus,
    content: String,
    kwargs: Vec<(&'static str, Value)>,
}

fn check(message: &ToolMessage, expected: &Expected, case: &str) {
    assert_eq!(message.name.as_deref(), Some("task"), "{case}");
    assert_eq!(message.tool_call_id, "call_1", "{case}");
    assert_eq!(message.status, expected.status, "{case}");
    assert_eq!(message.content, json!(expected.content), "{case}");
    let keys: Vec<&str> = message
        .additional_kwargs
        .keys()
        .map(String::as_str)
        .collect();
    let expected_keys: Vec<&str> = expected.kwargs.iter().map(|(key, _)| *key).collect();
    assert_eq!(keys, expected_keys, "{case}");
    for (key, value) in &expected.kwargs {
        assert_eq!(&message.additional_kwargs[*key], value, "{case}: {key}");
    }
    for key in ["subagent_error", "subagent_result_brief"] {
        if let Some(text) = message.additional_kwargs.get(key) {
            let text = text.as_str().unwrap();
            assert!(!text.trim().is_empty(), "{case}: blank {key}");
            assert!(text.chars().count() <= TASK_TEXT_CAP, "{case}: long {key}");
        }
    }
}

/// The docs/events.md#tool-result-contract expectation for one matrix cell, spelled out per status.
fn expected_for(
    status: SubagentStatus,
    stop: Option<SubagentStopReason>,
    input: &Text,
    extras: &Extras,
) -> Expected {
    let capped =
        stop.filter(|_| matches!(status, SubagentStatus::Completed | SubagentStatus::Failed));
    let d = input.bounded.clone();
    let mut kwargs = vec![("subagent_status", json!(status.as_str()))];
    if let Some(reason) = capped {
        kwargs.push(("subagent_stop_reason", json!(reason.as_str())));
    }
    let (content, error) = match status {
        SubagentStatus::Completed => {
            let r = d.clone().unwrap_or_default();
            let content = match capped {
                Some(reason) => format!("Task Succeeded (capped: {}). Result: {r}", label(reason)),
                None => format!("Task Succeeded. Result: {r}"),
            };
            (content, None)
        }
        SubagentStatus::Failed => {
            let lead = match capped {
                Some(reason) => format!("Task failed (capped: {}).", label(reason)),
                None => "Task failed.".to_owned(),
            };
            match d {
                Some(d) => (format!("{lead} Error: {d}"), Some(d)),
                None => (lead, Some("Task failed.".to_owned())),
            }
        }
        SubagentStatus::Cancelled => match d.as_deref() {
            None | Some("Task cancelled by user.") => (
                "Task cancelled by user.".to_owned(),
                Some("Task cancelled by user.".to_owned()),
            ),
            Some(d) => (
                format!("Task cancelled by user. Error: {d}"),
                Some(d.to_owned()),
            ),
        },
        SubagentStatus::TimedOut => match d {
            Some(d) => (format!("Task timed out. Error: {d}"), Some(d)),
            None => (
                "Task timed out.".to_owned(),
                Some("Task timed out.".to_owned()),
            ),
        },
        SubagentStatus::PollingTimedOut => match d {
            Some(d) => (d.clone(), Some(d)),
            None => ("Task polling timed out.".to_owned(), None),
        },
    };
    if let Some(error) = error {
        kwargs.push(("subagent_error", json!(error)));
    }
    if status == SubagentStatus::Completed
        && let Some(brief) = &input.bounded
    {
        kwargs.push(("subagent_result_brief", json!(brief)));
        let raw = input.raw.as_deref().unwrap();
        kwargs.push(("subagent_result_sha256", json!(sha256_of(raw))));
    }
    if let Some(model) = extras.model_expected {
        kwargs.push(("subagent_model_name", json!(model)));
    }
    if let Some(usage) = &extras.usage_expected {
        kwargs.push(("subagent_token_usage", usage.clone()));
    }
    Expected {
        status: ToolStatus::Success,
        content,
        kwargs,
    }
}

struct Extras {
    model: Option<&'static str>,
    model_expected: Option<&'static str>,
    usage: Option<TokenUsage>,
    usage_expected: Option<Value>,
}

fn extras() -> [Extras; 3] {
    [
        Extras {
            model: Some("  gpt-x  "),
            model_expected: Some("gpt-x"),
            usage: Some(TokenUsage::new(10, 5, 15)),
            usage_expected: Some(
                json!({"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}),
            ),
        },
        Extras {
            model: Some("   "),
            model_expected: None,
            usage: None,
            usage_expected: None,
        },
        // A zero usage that exists is stamped; only a missing one is left out.
        Extras {
            model: None,
            model_expected: None,
            usage: Some(TokenUsage::default()),
            usage_expected: Some(json!({"input_tokens": 0, "output_tokens": 0, "total_tokens": 0})),
        },
    ]
}

/// Every producer input of the matrix with the message it yields and the one it must.
fn matrix() -> Vec<(String, ToolMessage, Expected)> {
    let stops = std::iter::once(None).chain(SubagentStopReason::ALL.iter().copied().map(Some));
    let stops: Vec<_> = stops.collect();
    let mut cells = Vec::new();
    for &status in SubagentStatus::ALL {
        for &stop in &stops {
            for input in texts() {
                for (index, extra) in extras().iter().enumerate() {
                    // The field the status does not use carries a decoy that must not leak.
                    let (result, error) = if status == SubagentStatus::Completed {
                        (input.raw.clone(), Some("decoy error".to_owned()))
                    } else {
                        (Some("decoy result".to_owned()), input.raw.clone())
                    };
                    let outcome = TaskOutcome {
                        status,
                        stop_reason: stop,
                        cost_capped: false,
                        result,
                        error,
                        model_name: extra.model.map(str::to_owned),
                        usage: extra.usage,
                    };
                    let case = format!("{status} / {stop:?} / {} / extras {index}", input.name);
                    let expected = expected_for(status, stop, &input, extra);
                    cells.push((case, task_tool_message("call_1", &outcome), expected));
                }
            }
        }
    }
    cells
}

#[test]
fn every_status_stop_reason_and_text_shape_yields_the_contract_keys_and_body() {
    let cells = matrix();
    assert_eq!(cells.len(), 5 * 4 * texts().len() * 3);
    for (case, message, expected) in &cells {
        check(message, expected, case);
    }
}

#[test]
fn hand_written_messages_match_exactly() {
    let long = format!("{}{}", "x".repeat(1333), "y".repeat(3667));
    let cases = [
        (
            TaskOutcome {
                stop_reason: Some(SubagentStopReason::TokenCapped),
                model_name: Some("m".into()),
                ..TaskOutcome::completed("  partial answer\n")
            },
            Expected {
                status: ToolStatus::Success,
                content: "Task Succeeded (capped: token budget). Result: partial answer".into(),
                kwargs: vec![
                    ("subagent_status", json!("completed")),
                    ("subagent_stop_reason", json!("token_capped")),
                    ("subagent_result_brief", json!("partial answer")),
                    (
                        "subagent_result_sha256",
                        json!(sha256_of("  partial answer\n")),
                    ),
                    ("subagent_model_name", json!("m")),
                ],
            },
        ),
        (
            TaskOutcome {
                stop_reason: Some(SubagentStopReason::TurnCapped),
                ..TaskOutcome::failed("Reached max_turns=3")
            },
            Expected {
                status: ToolStatus::Success,
                content: "Task failed (capped: turn budget). Error: Reached max_turns=3".into(),
                kwargs: vec![
                    ("subagent_status", json!("failed")),
                    ("subagent_stop_reason", json!("turn_capped")),
                    ("subagent_error", json!("Reached max_turns=3")),
                ],
            },
        ),
        (
            TaskOutcome {
                stop_reason: Some(SubagentStopReason::LoopCapped),
                ..TaskOutcome::new(SubagentStatus::Failed)
            },
            Expected {
                status: ToolStatus::Success,
                content: "Task failed (capped: repeated tool-call loop).".into(),
                kwargs: vec![
                    ("subagent_status", json!("failed")),
                    ("subagent_stop_reason", json!("loop_capped")),
                    ("subagent_error", json!("Task failed.")),
                ],
            },
        ),
        (
            TaskOutcome {
                error: Some("Task polling timed out after 15 minutes. This may indicate the background task is stuck. Status: running".into()),
                ..TaskOutcome::new(SubagentStatus::PollingTimedOut)
            },
            Expected {
                status: ToolStatus::Success,
                content: "Task polling timed out after 15 minutes. This may indicate the background task is stuck. Status: running".into(),
                kwargs: vec![
                    ("subagent_status", json!("polling_timed_out")),
                    ("subagent_error", json!("Task polling timed out after 15 minutes. This may indicate the background task is stuck. Status: running")),
                ],
            },
        ),
        (
            TaskOutcome {
                error: Some("Execution timed out after 900 seconds".into()),
                ..TaskOutcome::new(SubagentStatus::TimedOut)
            },
            Expected {
                status: ToolStatus::Success,
                content: "Task timed out. Error: Execution timed out after 900 seconds".into(),
                kwargs: vec![
                    ("subagent_status", json!("timed_out")),
                    ("subagent_error", json!("Execution timed out after 900 seconds")),
                ],
            },
        ),
        (
            TaskOutcome::completed(long.clone()),
            Expected {
                status: ToolStatus::Success,
                content: format!(
                    "Task Succeeded. Result: {}\n...\n{}",
                    "x".repeat(1333),
                    "y".repeat(662)
                ),
                kwargs: vec![
                    ("subagent_status", json!("completed")),
                    (
                        "subagent_result_brief",
                        json!(format!("{}\n...\n{}", "x".repeat(1333), "y".repeat(662))),
                    ),
                    ("subagent_result_sha256", json!(sha256_of(&long))),
                ],
            },
        ),
        (
            TaskOutcome::failed(unknown_subagent_type_error("poet", &["general-purpose", "bash"])),
            Expected {
                status: ToolStatus::Success,
                content: "Task failed. Error: Unknown subagent type 'poet'. Available: general-purpose, bash".into(),
                kwargs: vec![
                    ("subagent_status", json!("failed")),
                    (
                        "subagent_error",
                        json!("Unknown subagent type 'poet'. Available: general-purpose, bash"),
                    ),
                ],
            },
        ),
    ];
    for (outcome, expected) in &cases {
        check(
            &task_tool_message("call_1", outcome),
            expected,
            &format!("{outcome:?}"),
        );
    }
}

#[test]
fn the_sha256_is_of_the_untrimmed_result_and_matches_a_known_vector() {
    let message = task_tool_message("call_1", &TaskOutcome::completed("abc"));
    assert_eq!(
        message.additional_kwargs["subagent_result_sha256"],
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    let padded = task_tool_message("call_1", &TaskOutcome::completed(" abc "));
    assert_eq!(padded.additional_kwargs["subagent_result_brief"], "abc");
    assert_eq!(
        padded.additional_kwargs["subagent_result_sha256"],
        json!(sha256_of(" abc "))
    );
    assert_ne!(sha256_of(" abc "), sha256_of("abc"));
}

#[test]
fn the_message_serialises_as_a_langchain_tool_dict() {
    let message = task_tool_message("call_9", &TaskOutcome::completed("ok"));
    let wire = serde_json::to_value(&message).unwrap();
    assert_eq!(wire["name"], "task");
    assert_eq!(wire["tool_call_id"], "call_9");
    assert_eq!(wire["status"], "success");
    assert_eq!(wire["content"], "Task Succeeded. Result: ok");
    assert_eq!(
        serde_json::from_value::<ToolMessage>(wire).unwrap(),
        message
    );
}

#[test]
fn an_unexpected_tool_failure_is_an_error_message_with_a_500_character_detail() {
    let long = format!("{}{}", "d".repeat(500), "z".repeat(100));
    let cases = [
        ("ValueError", "bad input", "ValueError: bad input"),
        ("RuntimeError", "  padded \n", "RuntimeError: padded"),
        (
            "KeyError",
            long.as_str(),
            &format!("KeyError: {}", "d".repeat(500)),
        ),
        ("KeyError", "ключ 🔑", "KeyError: ключ 🔑"),
        ("Panic", "   ", "Panic"),
        ("", "boom", "Error: boom"),
    ];
    for (kind, detail, error) in cases {
        let message = task_tool_exception("call_1", kind, detail);
        check(
            &message,
            &Expected {
                status: ToolStatus::Error,
                content: format!(
                    "Task failed. Error: {error}. Continue with available context, or choose an alternative tool."
                ),
                kwargs: vec![
                    ("subagent_status", json!("failed")),
                    ("subagent_error", json!(error)),
                ],
            },
            &format!("{kind} / {detail}"),
        );
    }
}

#[test]
fn unknown_type_errors_list_the_available_types() {
    assert_eq!(
        unknown_subagent_type_error("x", &["a", "b"]),
        "Unknown subagent type 'x'. Available: a, b"
    );
    assert_eq!(
        unknown_subagent_type_error("x", &["a"]),
        "Unknown subagent type 'x'. Available: a"
    );
}

#[test]
fn bound_text_cuts_5000_characters_to_1333_plus_separator_plus_662() {
    let text: String = (0..5000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let bounded = bound_text(&text, TASK_TEXT_CAP);
    let chars: Vec<char> = text.chars().collect();
    let head: String = chars[..1333].iter().collect();
    let tail: String = chars[5000 - 662..].iter().collect();
    assert_eq!(bounded, format!("{head}\n...\n{tail}"));
    assert_eq!(bounded.chars().count(), TASK_TEXT_CAP);
}

#[test]
fn every_emitted_status_and_stop_reason_is_in_the_contract_file() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contracts/subagent_status_contract.json");
    let contract: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let allowed = |key: &str| -> BTreeSet<String> {
        contract[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|value| value.as_str().unwrap().to_owned())
            .collect()
    };
    let statuses = allowed("valid_status_values");
    let reasons = allowed("valid_stop_reason_values");

    let mut messages: Vec<ToolMessage> = matrix()
        .into_iter()
        .map(|(_, message, _)| message)
        .collect();
    messages.push(task_tool_exception("call_1", "ValueError", "x"));
    let mut emitted_statuses = BTreeSet::new();
    let mut emitted_reasons = BTreeSet::new();
    for message in &messages {
        let kwargs = &message.additional_kwargs;
        emitted_statuses.insert(kwargs["subagent_status"].as_str().unwrap().to_owned());
        if let Some(reason) = kwargs.get("subagent_stop_reason") {
            emitted_reasons.insert(reason.as_str().unwrap().to_owned());
        }
    }
    assert!(
        emitted_statuses.is_subset(&statuses),
        "{emitted_statuses:?}"
    );
    assert!(emitted_reasons.is_subset(&reasons), "{emitted_reasons:?}");
    // The matrix reaches every contract value, so the subset checks are not vacuous.
    assert_eq!(emitted_statuses, statuses);
    assert_eq!(emitted_reasons, reasons);
}

#[test]
fn the_reader_reads_back_what_the_producer_wrote() {
    for (case, message, _) in matrix() {
        let read = read_task_tool_message(&message);
        let kwargs = &message.additional_kwargs;
        let status: SubagentStatus = kwargs["subagent_status"].as_str().unwrap().parse().unwrap();
        assert_eq!(read.status, Some(WireStatus::Known(status)), "{case}");
        let state = if status == SubagentStatus::Completed {
            CardState::Completed
        } else {
            CardState::Failed
        };
        assert_eq!(read.state, state, "{case}");
        let string = |key: &str| kwargs.get(key).map(|v| v.as_str().unwrap().to_owned());
        assert_eq!(read.result, string("subagent_result_brief"), "{case}");
        assert_eq!(
            read.result_sha256,
            string("subagent_result_sha256"),
            "{case}"
        );
        assert_eq!(read.error, string("subagent_error"), "{case}");
        assert_eq!(read.model_name, string("subagent_model_name"), "{case}");
        assert_eq!(
            read.stop_reason.map(|r| r.as_str().to_owned()),
            string("subagent_stop_reason"),
            "{case}"
        );
        assert_eq!(
            read.usage.map(|usage| json!(usage)),
            kwargs.get("subagent_token_usage").cloned(),
            "{case}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Reader

const SHA: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

fn card(state: CardState) -> TaskCardStatus {
    TaskCardStatus {
        state,
        status: None,
        stop_reason: None,
        result: None,
        error: None,
        result_sha256: None,
        model_name: None,
        usage: None,
    }
}

fn known(state: CardState, status: SubagentStatus) -> TaskCardStatus {
    TaskCardStatus {
        status: Some(WireStatus::Known(status)),
        ..card(state)
    }
}

fn legacy(state: CardState) -> TaskCardStatus {
    TaskCardStatus {
        status: Some(WireStatus::MaxTurnsReached),
        stop_reason: Some(SubagentStopReason::TurnCapped),
        ..card(state)
    }
}

fn usage(input: u64, output: u64, total: u64) -> Option<TokenUsage> {
    Some(TokenUsage::new(input, output, total))
}

fn check_read(kwargs: Value, content: &str, expected: TaskCardStatus) {
    let read = read_task_status(&object(kwargs.clone()), content);
    assert_eq!(read, expected, "{kwargs} / {content:?}");
}

#[test]
fn known_statuses_map_to_completed_or_failed_with_their_fields() {
    use CardState::{Completed, Failed};
    use SubagentStatus as S;
    let cases = [
        (
            json!({"subagent_status": "completed", "subagent_result_brief": "  the answer \n",
                   "subagent_result_sha256": SHA, "subagent_model_name": "  m-1 ",
                   "subagent_token_usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
                   "subagent_error": "ignored when completed"}),
            TaskCardStatus {
                result: Some("the answer".into()),
                result_sha256: Some(SHA.into()),
                model_name: Some("m-1".into()),
                usage: usage(1, 2, 3),
                ..known(Completed, S::Completed)
            },
        ),
        (
            json!({"subagent_status": "completed", "subagent_stop_reason": "loop_capped"}),
            TaskCardStatus {
                stop_reason: Some(SubagentStopReason::LoopCapped),
                ..known(Completed, S::Completed)
            },
        ),
        (
            json!({"subagent_status": "failed", "subagent_error": "boom",
                   "subagent_result_brief": "not shown", "subagent_result_sha256": SHA,
                   "subagent_stop_reason": "turn_capped"}),
            TaskCardStatus {
                error: Some("boom".into()),
                stop_reason: Some(SubagentStopReason::TurnCapped),
                ..known(Failed, S::Failed)
            },
        ),
        (
            json!({"subagent_status": "cancelled", "subagent_error": "Cancelled by user"}),
            TaskCardStatus {
                error: Some("Cancelled by user".into()),
                ..known(Failed, S::Cancelled)
            },
        ),
        (
            json!({"subagent_status": "timed_out"}),
            known(Failed, S::TimedOut),
        ),
        (
            json!({"subagent_status": "polling_timed_out", "subagent_error": "   "}),
            known(Failed, S::PollingTimedOut),
        ),
        (
            json!({"subagent_status": "failed", "subagent_error": 42, "subagent_stop_reason": "budget_capped",
                   "subagent_model_name": "  "}),
            known(Failed, S::Failed),
        ),
    ];
    for (kwargs, expected) in cases {
        // The text is never read when structured keys exist.
        check_read(kwargs, "Task Succeeded. Result: text result", expected);
    }
}

#[test]
fn a_bad_sha_is_dropped_but_the_brief_is_kept() {
    for sha in [
        json!(SHA.to_uppercase()),
        json!(&SHA[1..]),
        json!(format!("{SHA}0")),
        json!(format!("{}g", &SHA[1..])),
        json!(5),
        json!(null),
    ] {
        check_read(
            json!({"subagent_status": "completed", "subagent_result_brief": "r", "subagent_result_sha256": sha}),
            "",
            TaskCardStatus {
                result: Some("r".into()),
                ..known(CardState::Completed, SubagentStatus::Completed)
            },
        );
    }
}

#[test]
fn usage_is_read_only_when_all_three_counts_are_non_negative_integers() {
    let cases = [
        (
            json!({"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}),
            usage(1, 2, 3),
        ),
        (
            json!({"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}),
            usage(0, 0, 0),
        ),
        (
            json!({"input_tokens": 1.0, "output_tokens": 2, "total_tokens": 3}),
            usage(1, 2, 3),
        ),
        (
            json!({"input_tokens": -1, "output_tokens": 2, "total_tokens": 3}),
            None,
        ),
        (
            json!({"input_tokens": 1.5, "output_tokens": 2, "total_tokens": 3}),
            None,
        ),
        (
            json!({"input_tokens": "1", "output_tokens": 2, "total_tokens": 3}),
            None,
        ),
        (json!({"input_tokens": 1, "output_tokens": 2}), None),
        (
            json!({"input_tokens": 1, "output_tokens": null, "total_tokens": 3}),
            None,
        ),
        (json!(1e300), None),
        (json!(null), None),
    ];
    for (value, expected) in cases {
        check_read(
            json!({"subagent_status": "failed", "subagent_token_usage": value}),
            "",
            TaskCardStatus {
                usage: expected,
                ..known(CardState::Failed, SubagentStatus::Failed)
            },
        );
    }
}

#[test]
fn legacy_max_turns_reached_is_turn_capped_completed_with_a_brief_else_failed() {
    use CardState::{Completed, Failed};
    let cases = [
        (
            json!({"subagent_status": "max_turns_reached", "subagent_result_brief": " partial ",
                   "subagent_error": "hidden"}),
            TaskCardStatus {
                result: Some("partial".into()),
                ..legacy(Completed)
            },
        ),
        (
            json!({"subagent_status": "max_turns_reached", "subagent_error": "Reached max_turns=3"}),
            TaskCardStatus {
                error: Some("Reached max_turns=3".into()),
                ..legacy(Failed)
            },
        ),
        (
            json!({"subagent_status": "max_turns_reached", "subagent_result_brief": "  "}),
            legacy(Failed),
        ),
        // A stop reason on the wire wins over the implied one.
        (
            json!({"subagent_status": "max_turns_reached", "subagent_result_brief": "p",
                   "subagent_stop_reason": "token_capped"}),
            TaskCardStatus {
                result: Some("p".into()),
                stop_reason: Some(SubagentStopReason::TokenCapped),
                ..legacy(Completed)
            },
        ),
        (
            json!({"subagent_status": "max_turns_reached", "subagent_stop_reason": "loop_capped"}),
            TaskCardStatus {
                stop_reason: Some(SubagentStopReason::LoopCapped),
                ..legacy(Failed)
            },
        ),
    ];
    for (kwargs, expected) in cases {
        check_read(kwargs, "", expected);
    }
}

#[test]
fn structured_keys_without_a_valid_status_are_in_progress_and_text_is_ignored() {
    for kwargs in [
        json!({"subagent_status": "done", "subagent_result_brief": "r", "subagent_error": "e"}),
        json!({"subagent_status": "Completed"}),
        json!({"subagent_status": 1}),
        json!({"subagent_status": null}),
        json!({"subagent_model_name": "m", "subagent_token_usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}),
        json!({"subagent_token_usage_attributed": true}),
        json!({"subagent_error": "boom"}),
    ] {
        for content in [
            "Task Succeeded. Result: r",
            "Task failed. Error: e",
            "Error: x",
        ] {
            check_read(kwargs.clone(), content, card(CardState::InProgress));
        }
    }
}

#[test]
fn messages_without_structured_keys_are_read_by_legacy_prefix_in_order() {
    use CardState::{Completed, Failed, InProgress};
    let failed = |error: &str| TaskCardStatus {
        error: Some(error.into()),
        ..card(Failed)
    };
    let cases = [
        (
            "Task Succeeded. Result:  the answer \n",
            TaskCardStatus {
                result: Some("the answer".into()),
                ..card(Completed)
            },
        ),
        ("Task Succeeded. Result:", card(Completed)),
        ("Task failed. Error: boom", failed("Error: boom")),
        ("Task failed.", card(Failed)),
        // The first matching rule decides.
        (
            "Task failed. Task Succeeded. Result: x",
            failed("Task Succeeded. Result: x"),
        ),
        (
            "Task timed out. Error: slow",
            failed("Task timed out. Error: slow"),
        ),
        ("Task timed out", failed("Task timed out")),
        ("Task cancelled by user.", failed("Task cancelled by user.")),
        (
            "Task polling timed out after 15 minutes. Status: running",
            failed("Task polling timed out after 15 minutes. Status: running"),
        ),
        ("Error: connection reset", failed("Error: connection reset")),
        ("error", failed("error")),
        ("ERROR - upstream", failed("ERROR - upstream")),
        ("  Error: padded  ", failed("Error: padded")),
        ("Errors happen", card(InProgress)),
        ("Error_code 5", card(InProgress)),
        ("Task cancelled by user", card(InProgress)),
        ("Task Succeeded", card(InProgress)),
        ("Working on it", card(InProgress)),
        ("", card(InProgress)),
    ];
    for (content, expected) in cases {
        check_read(json!({}), content, expected.clone());
        // Keys outside the contract do not make a message structured.
        check_read(json!({"foo": 1, "status": "completed"}), content, expected);
    }
}

#[test]
fn a_tool_message_is_read_from_its_flattened_content() {
    let message = ToolMessage {
        content: json!([{"type": "text", "text": "Task failed. Error: x"}]),
        tool_call_id: "call_1".into(),
        ..ToolMessage::default()
    };
    assert_eq!(
        read_task_tool_message(&message),
        TaskCardStatus {
            error: Some("Error: x".into()),
            ..card(CardState::Failed)
        }
    );
}

#[test]
fn a_money_budget_stop_says_its_kind() {
    let mut outcome = TaskOutcome::completed("partial findings");
    outcome.stop_reason = Some(SubagentStopReason::TokenCapped);
    outcome.cost_capped = true;
    let message = task_tool_message("call_1", &outcome);
    assert_eq!(message.additional_kwargs["budget_kind"], "cost");
    assert_eq!(
        message.additional_kwargs["subagent_stop_reason"],
        "token_capped"
    );
    outcome.cost_capped = false;
    let tokens = task_tool_message("call_1", &outcome);
    assert!(!tokens.additional_kwargs.contains_key("budget_kind"));
}
