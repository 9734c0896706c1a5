//! The shared card-rule table (`web/cards.cases.json`) on the Rust port that `subflow tail`
//! uses. `node --test web/tests/unit` runs the same table on the browser's `cards.mjs`.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use subflow_contracts::task_card::{
    self, Card, CardStatus, CardUpdate, CardUsage, Step, ViewContext,
};

fn arg<T: DeserializeOwned>(args: &[Value], index: usize) -> T {
    serde_json::from_value(args[index].clone())
        .unwrap_or_else(|e| panic!("argument {index} ({}) does not parse: {e}", args[index]))
}

fn text(args: &[Value], index: usize) -> Option<&str> {
    args[index].as_str()
}

/// Calls the port's function named like the table's JavaScript function.
fn call(function: &str, args: &[Value]) -> Value {
    let to = |value: &dyn erased::Json| value.json();
    match function {
        "flattenContent" => to(&task_card::flatten_content(&args[0])),
        "readUsage" => to(&task_card::read_usage(&args[0])),
        "readToolMessage" => to(&task_card::read_tool_message(&args[0])),
        "newCard" => to(&task_card::new_card(text(args, 0).unwrap())),
        "toolCallUpdate" => to(&task_card::tool_call_update(&args[0])),
        "stepFromMessage" => to(&task_card::step_from_message(&args[0], arg(args, 1))),
        "stepFromRecord" => to(&task_card::step_from_record(&args[0])),
        "taskEventUpdate" => to(&task_card::task_event_update(&args[0])),
        "mergeSteps" => to(&task_card::merge_steps(
            &arg::<Vec<Step>>(args, 0),
            &arg::<Vec<Step>>(args, 1),
        )),
        "mergeCard" => to(&task_card::merge_card(
            &arg::<Card>(args, 0),
            &arg::<CardUpdate>(args, 1),
        )),
        "displayStatus" => to(&task_card::display_status(
            &arg::<Card>(args, 0),
            arg(args, 1),
        )),
        "displaySteps" => to(&task_card::display_steps(
            &arg::<Vec<Step>>(args, 0),
            arg::<CardStatus>(args, 1),
        )),
        "formatTokenCount" => to(&task_card::format_token_count(arg(args, 0))),
        "tokenLabel" => to(&task_card::token_label(
            arg::<Option<CardUsage>>(args, 0).as_ref(),
            arg(args, 1),
            args[2] == json!(true),
        )),
        "modelLabel" => to(&task_card::model_label(text(args, 0), &args[1])),
        "headerText" => to(&task_card::header_text(&arg::<Card>(args, 0), arg(args, 1))),
        "groupHeader" => to(&task_card::group_header(arg(args, 0))),
        "stopReasonLabel" => to(&text(args, 0).and_then(task_card::stop_reason_label)),
        "cardView" => to(&task_card::card_view(
            &arg::<Card>(args, 0),
            &arg::<ViewContext>(args, 1),
        )),
        "messageCardUpdates" => to(&task_card::message_card_updates(&args[0])),
        "shouldBackfill" => {
            let context = &args[1];
            to(&task_card::should_backfill(
                &arg::<Card>(args, 0),
                context["expanded"] == json!(true),
                context["threadId"].as_str(),
                context["runId"].as_str(),
            ))
        }
        "backfillPath" => to(&task_card::backfill_path(
            text(args, 0).unwrap(),
            text(args, 1).unwrap(),
            text(args, 2).unwrap(),
            arg(args, 3),
        )),
        "backfillSteps" => to(&task_card::backfill_steps(&args[0], text(args, 1).unwrap())),
        "backfillNext" => to(&task_card::backfill_next(
            &args[0],
            arg(args, 1),
            args.get(2)
                .map_or(task_card::BACKFILL_LIMIT, |_| arg(args, 2)),
        )),
        "summaryUpdate" => to(&task_card::summary_update(&args[0])),
        "listedSteps" => to(&task_card::listed_steps(
            &arg::<Card>(args, 0),
            arg(args, 1),
        )),
        "stepLine" => to(&task_card::step_line(
            arg::<Option<task_card::Brief>>(args, 0).as_ref(),
        )),
        "stoppedRunsLine" => to(&task_card::stopped_runs_line(&args[0])),
        "priceOf" => to(&task_card::price_of(text(args, 0), &args[1])),
        "hasPrices" => to(&task_card::has_prices(&args[0])),
        "usageCost" => to(&task_card::usage_cost(
            &arg::<CardUsage>(args, 0),
            &arg::<task_card::Price>(args, 1),
        )),
        "cardCost" => to(&task_card::card_cost(
            arg::<Option<CardUsage>>(args, 0).as_ref(),
            text(args, 1),
            &args[2],
        )),
        "formatCost" => to(&task_card::format_cost(
            arg(args, 0),
            text(args, 1).unwrap(),
        )),
        "costLabel" => to(&task_card::cost_label(
            arg::<Option<CardUsage>>(args, 0).as_ref(),
            text(args, 1),
            &args[2],
        )),
        other => panic!("the table names {other}, which the port does not have"),
    }
}

/// Lets one `match` arm serialise whatever a function returns.
mod erased {
    pub trait Json {
        fn json(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> serde_json::Value {
            serde_json::to_value(self).expect("serialises")
        }
    }
}

/// `value` with whole floats as integers: JSON (and JavaScript) do not tell `2.0` from
/// `2`, serde_json's `Value` does.
fn normalised(value: Value) -> Value {
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9e15 => json!(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(normalised).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, normalised(v))).collect())
        }
        other => other,
    }
}

fn table() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../web/cards.cases.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let table: Value = serde_json::from_str(&text).expect("the table is JSON");
    table["cases"].as_array().expect("a list of cases").clone()
}

#[test]
fn every_case_of_the_shared_table_gives_the_expected_json() {
    let cases = table();
    assert!(cases.len() > 100, "the table has its cases");
    let mut failures = Vec::new();
    for case in &cases {
        let function = case["fn"].as_str().unwrap();
        let args = case["args"].as_array().unwrap();
        let actual = normalised(call(function, args));
        if actual != normalised(case["expected"].clone()) {
            failures.push(format!(
                "{function}: {}\n  expected {}\n  actual   {actual}",
                case["name"].as_str().unwrap(),
                case["expected"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_table_covers_every_rule_of_the_port() {
    let names: std::collections::BTreeSet<String> = table()
        .iter()
        .map(|case| case["fn"].as_str().unwrap().to_owned())
        .collect();
    for function in [
        "flattenContent",
        "readUsage",
        "readToolMessage",
        "newCard",
        "toolCallUpdate",
        "stepFromMessage",
        "stepFromRecord",
        "taskEventUpdate",
        "mergeSteps",
        "mergeCard",
        "displayStatus",
        "displaySteps",
        "formatTokenCount",
        "tokenLabel",
        "modelLabel",
        "headerText",
        "groupHeader",
        "stopReasonLabel",
        "cardView",
        "messageCardUpdates",
        "shouldBackfill",
        "backfillPath",
        "backfillSteps",
        "backfillNext",
        "summaryUpdate",
        "listedSteps",
        "stepLine",
        "stoppedRunsLine",
        "priceOf",
        "hasPrices",
        "usageCost",
        "cardCost",
        "formatCost",
        "costLabel",
    ] {
        assert!(names.contains(function), "no case calls {function}");
    }
}

#[test]
fn large_counts_round_like_javascript_to_fixed() {
    // Exact binary ties round away from zero in JavaScript; others follow the binary value.
    for (count, expected) in [
        (10_250, "10.3K"),
        (10_750, "10.8K"),
        (10_350, "10.3K"),
        (10_450, "10.4K"),
        (1_000_000, "1000.0K"),
    ] {
        assert_eq!(task_card::format_token_count(count), expected, "{count}");
    }
}
