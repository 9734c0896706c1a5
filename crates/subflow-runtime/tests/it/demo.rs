//! The demo plan end to end: three parallel tasks, their live events, the persisted
//! `subagent.*` rows, the ToolMessage contract and the token buckets.

use std::collections::BTreeMap;

use serde_json::Value;
use subflow_contracts::RunStatus;
use subflow_contracts::messages::Message;
use subflow_contracts::task_result::{TokenUsage, sha256_hex};
use subflow_runtime::output::RunOutput;
use subflow_store::conformance::assert_conforms;

use crate::harness::{Harness, custom_payloads, harness, scripted, sqlite_store};

async fn sqlite_harness() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir).await;
    harness(store, dir, vec![scripted(None)], |_| {})
}

/// A v4 UUID (the execution id's form) anywhere in `text`.
fn contains_uuid_v4(text: &str) -> bool {
    text.char_indices().any(|(i, _)| {
        text.get(i..i + 36)
            .and_then(|candidate| uuid::Uuid::parse_str(candidate).ok())
            .is_some_and(|id| id.get_version_num() == 4)
    })
}

pub async fn check_demo_plan(h: &Harness) {
    let (result, outputs) = h
        .run(
            "t-demo",
            "run-1",
            "Compare SQLite and PostgreSQL for our event store",
        )
        .await;
    assert_eq!(result.status, RunStatus::Success, "{:?}", result.error);

    // Live task events: per task, task_started, task_running 1..=N, one terminal event.
    let payloads = custom_payloads(&outputs);
    let mut per_task: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for payload in &payloads {
        per_task
            .entry(payload["task_id"].as_str().unwrap().to_owned())
            .or_default()
            .push(payload.clone());
    }
    assert_eq!(per_task.len(), 3, "three delegations");
    for (task_id, events) in &per_task {
        assert!(
            task_id.starts_with("call_"),
            "task_id is the tool_call_id: {task_id}"
        );
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        let steps = types.len() - 2;
        assert!(steps >= 3, "write_file, read_file and an answer: {types:?}");
        assert_eq!(types[0], "task_started");
        assert!(
            types[1..=steps].iter().all(|t| *t == "task_running"),
            "{types:?}"
        );
        assert_eq!(types[steps + 1], "task_completed");
        let indexes: Vec<u64> = events[1..=steps]
            .iter()
            .map(|e| e["message_index"].as_u64().unwrap())
            .collect();
        assert_eq!(indexes, (1..=steps as u64).collect::<Vec<_>>());
        let keys: Vec<&str> = events[1]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "type",
                "task_id",
                "message",
                "message_index",
                "total_messages",
                "usage",
                "model_name"
            ]
        );
        let model = &events[0]["model_name"];
        assert!(
            events.iter().all(|e| &e["model_name"] == model),
            "model_name is constant"
        );
        let totals: Vec<u64> = events[1..]
            .iter()
            .filter_map(|e| e["usage"]["total_tokens"].as_u64())
            .collect();
        assert!(
            totals.windows(2).all(|w| w[0] <= w[1]),
            "usage never decreases: {totals:?}"
        );
        assert!(
            events[steps + 1]["result"]
                .as_str()
                .is_some_and(|r| !r.is_empty())
        );
    }

    // Persisted rows: the same lifecycle per task, valid against both contracts.
    let rows = h.events("t-demo", "run-1").await;
    assert_conforms(&rows);
    for task_id in per_task.keys() {
        let kinds: Vec<&str> = rows
            .iter()
            .filter(|r| r.metadata.get("task_id").and_then(Value::as_str) == Some(task_id))
            .map(|r| r.event_type.as_str())
            .collect();
        assert_eq!(kinds.first(), Some(&"subagent.start"));
        assert_eq!(kinds.last(), Some(&"subagent.end"));
        assert_eq!(kinds.len(), per_task[task_id].len());
    }
    for journal_type in [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "llm.tool.result",
        "run.end",
    ] {
        assert!(
            rows.iter().any(|r| r.event_type == journal_type),
            "{journal_type} recorded"
        );
    }

    // The ToolMessage contract on every task result, and lead-side attribution.
    let tools: Vec<_> = result
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool(t) if t.name.as_deref() == Some("task") => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(tools.len(), 3);
    for tool in &tools {
        let kwargs = &tool.additional_kwargs;
        assert_eq!(kwargs["subagent_status"], "completed");
        let full = per_task[&tool.tool_call_id].last().unwrap()["result"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(kwargs["subagent_result_sha256"], sha256_hex(&full));
        assert!(
            kwargs.contains_key("subagent_result_brief") && !kwargs.contains_key("subagent_error")
        );
        assert!(TokenUsage::from_value(&kwargs["subagent_token_usage"]).is_some());
        assert_eq!(kwargs["subagent_token_usage_attributed"], true);
        assert!(
            tool.content
                .as_str()
                .unwrap()
                .starts_with("Task Succeeded. Result: ")
        );
    }

    // Token buckets: caller buckets add up, subagents are counted once, on their model.
    let run = h.store.get_run("t-demo", "run-1").await.unwrap().unwrap();
    let usage = run.usage;
    assert!(usage.lead_agent_tokens > 0 && usage.subagent_tokens > 0);
    assert_eq!(
        usage.total_tokens,
        usage.lead_agent_tokens + usage.subagent_tokens + usage.middleware_tokens
    );
    assert_eq!(
        usage.total_tokens,
        usage
            .token_usage_by_model
            .values()
            .map(|b| b.total_tokens)
            .sum::<i64>()
    );
    let reported: u64 = tools
        .iter()
        .map(|t| {
            TokenUsage::from_value(&t.additional_kwargs["subagent_token_usage"])
                .unwrap()
                .total_tokens
        })
        .sum();
    assert_eq!(
        usage.subagent_tokens as u64, reported,
        "each task's usage reported exactly once"
    );
    assert_eq!(run.status, RunStatus::Success);
    assert_eq!(
        run.trace_id.as_deref(),
        Some("0af7651916cd43dd8448eb211c80319c")
    );

    // The execution id never leaves the process.
    let everything = format!(
        "{}{}{}",
        serde_json::to_string(&payloads).unwrap(),
        serde_json::to_string(&rows).unwrap(),
        serde_json::to_string(&result.messages).unwrap()
    );
    assert!(!contains_uuid_v4(&everything), "an execution id leaked");

    // The three tool results are one lead step: one `values` holds them all at once,
    // none holds only some of them.
    let tool_counts: Vec<usize> = outputs
        .iter()
        .filter_map(|output| match output {
            RunOutput::Values { values, .. } => Some(
                values["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|m| m["type"] == "tool")
                    .count(),
            ),
            _ => None,
        })
        .collect();
    assert!(tool_counts.contains(&3), "{tool_counts:?}");
    assert!(
        !tool_counts.iter().any(|n| (1..3).contains(n)),
        "{tool_counts:?}"
    );

    // The checkpoint carries the trace id and the final messages.
    let checkpoint = h.store.latest_checkpoint("t-demo").await.unwrap().unwrap();
    assert_eq!(
        checkpoint.metadata["deerflow_trace_id"],
        "0af7651916cd43dd8448eb211c80319c"
    );
    assert_eq!(
        checkpoint.values["messages"].as_array().unwrap().len(),
        result.messages.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_plan_on_sqlite_shows_delegation_steps_statuses_and_usage() {
    check_demo_plan(&sqlite_harness().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_plan_on_postgresql_shows_the_same() {
    let db = subflow_store_postgres::testing::TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let h = harness(
        std::sync::Arc::new(db.store.clone()),
        dir,
        vec![scripted(None)],
        |_| {},
    );
    check_demo_plan(&h).await;
}
