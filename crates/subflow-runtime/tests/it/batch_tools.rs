//! The lead's durable-batch tools (docs/batches.md#tools) end to end: the scripted lead calls them,
//! the store holds what they submitted, and bad input is refused with the exact text
//! and nothing written.

use std::sync::Arc;

use serde_json::{Value, json};
use subflow_contracts::messages::{Message, ToolMessage, ToolStatus};
use subflow_contracts::{BatchItemStatus, BatchStatus, RunStopReason};
use subflow_runtime::output::RunOutput;
use subflow_runtime::runtime::RuntimeConfig;
use subflow_runtime::subagent::ExecutionSpec;
use subflow_store::batches::{BatchQuery, BatchScope, ItemQuery, NewBatch, NewItem};
use subflow_store::{MemoryStore, Store};

use crate::harness::{Harness, custom_payloads, harness, scripted};

fn tool_messages<'a>(messages: &'a [Message], name: &str) -> Vec<&'a ToolMessage> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool(tool) if tool.name.as_deref() == Some(name) => Some(tool),
            _ => None,
        })
        .collect()
}

fn text(tool: &ToolMessage) -> &str {
    tool.content.as_str().unwrap()
}

/// A lead rule for prompts containing `marker`: one response with `calls`, then "done".
fn lead_rule(marker: &str, calls: Value) -> Value {
    json!({"agent": "lead_agent", "contains": marker, "turns": [
        {"tool_calls": calls},
        {"text": "done"}
    ]})
}

fn submit_call(args: Value) -> Value {
    json!([{"name": "batch_task", "args": args}])
}

fn items(n: usize) -> Vec<Value> {
    (1..=n)
        .map(|i| json!({"key": format!("k{i}"), "prompt": format!("prompt {i}")}))
        .collect()
}

/// A runtime on `store` whose scripted model follows `rules`.
fn scripted_on(
    store: Arc<dyn Store>,
    rules: Value,
    tweak: impl FnOnce(&mut RuntimeConfig),
) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.json");
    std::fs::write(&path, json!({"rules": rules}).to_string()).unwrap();
    harness(store, dir, vec![scripted(Some(path))], tweak)
}

/// Every batch of `user`, newest first.
async fn batches_of(store: &Arc<dyn Store>, user: &str) -> Vec<subflow_store::BatchRecord> {
    store
        .list_batches(
            &BatchScope::user(user),
            &BatchQuery {
                status: None,
                limit: 100,
                offset: 0,
            },
        )
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slash_batch_submits_one_keyed_item_per_line_and_the_lead_reports_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let h = harness(store.clone(), dir, vec![scripted(None)], |_| {});
    let (result, outputs) = h
        .run(
            "t1",
            "r1",
            "/batch general-purpose\nSummarise chapter 1\n\nSummarise chapter 2\n",
        )
        .await;
    let tool = tool_messages(&result.messages, "batch_task")[0];
    assert_eq!(tool.status, ToolStatus::Success);
    let kwargs = &tool.additional_kwargs;
    assert_eq!(kwargs["subagent_batch_error"], false);
    assert_eq!(kwargs["subagent_batch_status"], "queued");
    assert_eq!(kwargs["subagent_batch_total_items"], 2);
    let id = kwargs["subagent_batch_id"].as_str().unwrap();
    assert!(text(tool).contains(id), "{}", text(tool));
    assert!(text(tool).contains("batch_status"), "{}", text(tool));

    let batches = batches_of(&store, "u1").await;
    assert_eq!(batches.len(), 1);
    let batch = &batches[0];
    assert_eq!(batch.id, id);
    assert_eq!(
        (batch.thread_id.as_str(), batch.status),
        ("t1", BatchStatus::Queued)
    );
    assert_eq!(batch.title, "general-purpose batch of 2 item(s)");
    assert_eq!(
        (
            batch.max_live_items,
            batch.max_running_items,
            batch.max_attempts
        ),
        (100, 3, 3)
    );
    assert_eq!(batch.submission_key, format!("r1:{}", tool.tool_call_id));
    assert_eq!(batch.run_id.as_deref(), Some("r1"));
    let spec = ExecutionSpec::from_value(&batch.execution_spec).unwrap();
    assert_eq!(
        (
            spec.user_id.as_str(),
            spec.thread_id.as_str(),
            spec.model_name.as_str()
        ),
        ("u1", "t1", "scripted")
    );
    assert_eq!(spec.trace_id, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(spec.run_id.as_deref(), Some("r1"));
    assert_eq!(
        spec.tool_call_id.as_deref(),
        Some(tool.tool_call_id.as_str())
    );
    assert_eq!(spec.subagent.name, "general-purpose");
    assert_eq!(
        spec.subagent.tools.as_deref().unwrap(),
        ["ls", "read_file", "write_file", "str_replace"]
    );
    let stored = store
        .list_items(
            &BatchScope::thread("u1", "t1"),
            id,
            &ItemQuery {
                status: None,
                offset: 0,
                limit: 10,
            },
        )
        .await
        .unwrap();
    let keys: Vec<(&str, &str, BatchItemStatus)> = stored
        .iter()
        .map(|i| (i.item_key.as_str(), i.prompt.as_str(), i.status))
        .collect();
    assert_eq!(
        keys,
        [
            ("item-1", "Summarise chapter 1", BatchItemStatus::Pending),
            ("item-2", "Summarise chapter 2", BatchItemStatus::Pending)
        ]
    );
    // The items are stored once, in the batch: the lead's call, its `llm.ai.response`
    // record and its stream frames name the batch instead.
    let call = result
        .messages
        .iter()
        .find_map(|m| match m {
            Message::Ai(ai) => ai.tool_calls.iter().find(|c| c.name == "batch_task"),
            _ => None,
        })
        .expect("the lead's batch_task call");
    assert_eq!(
        call.args["items"],
        json!({"batch_id": id, "total_items": 2})
    );
    assert_eq!(call.args["subagent_type"], "general-purpose");
    let responses: Vec<String> = h
        .events("t1", "r1")
        .await
        .into_iter()
        .filter(|e| e.event_type == "llm.ai.response")
        .map(|e| e.content.to_string())
        .collect();
    assert!(responses.iter().any(|r| r.contains(id)), "{responses:?}");
    let model_frames: Vec<String> = outputs
        .iter()
        .filter_map(|output| match output {
            RunOutput::Message {
                message,
                node: "model",
            } => Some(message.to_string()),
            RunOutput::Update(update) if update.get("model").is_some() => Some(update.to_string()),
            _ => None,
        })
        .collect();
    assert!(
        model_frames.iter().any(|f| f.contains(id)),
        "{model_frames:?}"
    );
    for written in responses.iter().chain(&model_frames) {
        assert!(!written.contains("Summarise chapter"), "{written}");
    }
    // A submission is no delegation: no task events, and the lead answers at once.
    assert!(custom_payloads(&outputs).is_empty());
    let Some(Message::Ai(last)) = result.messages.last() else {
        panic!("the lead answers last");
    };
    assert!(
        last.content
            .as_str()
            .unwrap()
            .starts_with("Batch of 2 general-purpose item(s)")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_tool_call_submitted_twice_returns_the_stored_batch_and_inserts_nothing() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let call = json!({"name": "batch_task", "id": "call_same", "args": {
        "title": "Twice", "subagent_type": "general-purpose", "items": items(3)}});
    let rules = json!([{"agent": "lead_agent", "turns": [
        {"tool_calls": [call.clone()]}, {"tool_calls": [call]}, {"text": "done"}
    ]}]);
    let h = scripted_on(store.clone(), rules, |_| {});
    let (result, _) = h.run("t1", "r1", "go").await;
    let answers = tool_messages(&result.messages, "batch_task");
    assert_eq!(answers.len(), 2);
    assert_eq!(
        answers[0].additional_kwargs["subagent_batch_id"],
        answers[1].additional_kwargs["subagent_batch_id"]
    );
    assert_eq!(answers[1].additional_kwargs["subagent_batch_error"], false);
    let batches = batches_of(&store, "u1").await;
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].submission_key, "r1:call_same");
    assert_eq!(batches[0].total_items, 3);
}

/// One refused submission: the arguments and the exact text the lead gets.
struct Refusal {
    args: Value,
    message: String,
}

fn refusal(args: Value, message: &str) -> Refusal {
    Refusal {
        args,
        message: message.to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_submissions_are_refused_in_the_specified_order_with_exact_texts_and_write_nothing() {
    let gp = "general-purpose";
    let long_key = "k".repeat(129);
    let long_prompt = "p".repeat(100_001);
    let criteria: Vec<String> = (0..21).map(|i| format!("c{i}")).collect();
    let failed = |reason: &str| format!("Batch submission failed: {reason}");
    let cases = vec![
        // Order: emptiness before the type, keys before the type, the type before sizes.
        refusal(
            json!({"title": "t", "subagent_type": "nope", "items": []}),
            "A batch must contain at least one item.",
        ),
        refusal(
            json!({"title": "t", "subagent_type": "nope",
                "items": [{"key": "a", "prompt": "x"}, {"key": "a", "prompt": "y"}]}),
            "Batch item keys must be unique.",
        ),
        refusal(
            json!({"title": "t", "subagent_type": "nope", "items": [{"key": long_key, "prompt": "x"}]}),
            "Unknown or disallowed subagent type 'nope'. Available: general-purpose",
        ),
        refusal(
            json!({"title": "t", "subagent_type": gp, "items": items(5001)}),
            &failed("a batch must have 1-5000 items, got 5001"),
        ),
        refusal(
            json!({"title": "t", "subagent_type": gp, "items": [{"key": "a", "prompt": "x"}, {"key": long_key, "prompt": "x"}]}),
            &failed("item key must have 1-128 characters, got 129 at position 1"),
        ),
        refusal(
            json!({"title": "t", "subagent_type": gp, "items": [{"key": "", "prompt": "x"}]}),
            &failed("item key must have 1-128 characters, got 0 at position 0"),
        ),
        refusal(
            json!({"title": "t", "subagent_type": gp, "items": [{"key": "a", "prompt": long_prompt}]}),
            &failed("item prompt must have 1-100000 characters, got 100001 at position 0"),
        ),
        refusal(
            json!({"title": "t", "subagent_type": gp, "items": [{"key": "a", "prompt": ""}]}),
            &failed("item prompt must have 1-100000 characters, got 0 at position 0"),
        ),
        refusal(
            json!({"title": "t", "subagent_type": gp, "items": [{"key": "a", "prompt": "x", "acceptance_criteria": criteria}]}),
            &failed("an item may have at most 20 acceptance criteria, got 21 at position 0"),
        ),
        refusal(
            json!({"title": "t", "subagent_type": gp, "items": [{"key": "a", "prompt": "x", "acceptance_criteria": ["c".repeat(501)]}]}),
            &failed(
                "an acceptance criterion may have at most 500 characters, got 501 at position 0",
            ),
        ),
        refusal(
            json!({"title": "t", "subagent_type": gp, "items": items(1), "max_live_items": 1001}),
            &failed("max_live_items must be between 1 and 1000, got 1001"),
        ),
        refusal(
            json!({"title": "t", "subagent_type": gp, "items": items(1), "max_running_items": 65}),
            &failed("max_running_items must be between 1 and 64, got 65"),
        ),
        refusal(
            json!({"title": "t", "subagent_type": gp, "items": items(1), "max_live_items": -2}),
            &failed("max_live_items must be between 1 and 1000, got -2"),
        ),
        refusal(
            json!({"title": "t", "subagent_type": gp, "items": items(1), "max_live_items": 2, "max_running_items": 3}),
            &failed("max_running_items (3) must not exceed max_live_items (2)"),
        ),
    ];
    let rules: Vec<Value> = cases
        .iter()
        .enumerate()
        .map(|(i, case)| lead_rule(&format!("case-{i}."), submit_call(case.args.clone())))
        .collect();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let h = scripted_on(store.clone(), Value::Array(rules), |_| {});
    for (i, case) in cases.iter().enumerate() {
        let (result, _) = h
            .run(&format!("t{i}"), &format!("r{i}"), &format!("case-{i}."))
            .await;
        let answers = tool_messages(&result.messages, "batch_task");
        assert_eq!(answers.len(), 1, "case {i}");
        let tool = answers[0];
        assert_eq!(text(tool), case.message, "case {i}");
        assert_eq!(tool.status, ToolStatus::Error, "case {i}");
        assert_eq!(
            Value::Object(tool.additional_kwargs.clone()),
            json!({"subagent_batch_error": true}),
            "case {i}"
        );
    }
    assert!(batches_of(&store, "u1").await.is_empty(), "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_or_absent_limits_mean_the_defaults_and_a_small_window_caps_the_default_running() {
    let rules = json!([
        lead_rule(
            "zeros.",
            submit_call(json!({"title": "  ", "subagent_type": "general-purpose",
            "items": items(2), "max_live_items": 0, "max_running_items": 0}))
        ),
        lead_rule(
            "window.",
            submit_call(json!({"title": "Small", "subagent_type": "general-purpose",
            "items": items(2), "max_live_items": 2}))
        ),
    ]);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let h = scripted_on(store.clone(), rules, |config| {
        config.batches.default_max_live_items = 50;
        config.batches.default_max_running_items = 4;
        config.batches.max_attempts = 2;
    });
    // Each run in its own thread: script rules match a thread's first human message.
    h.run("t1", "r1", "zeros.").await;
    h.run("t2", "r2", "window.").await;
    let batches = batches_of(&store, "u1").await;
    let limits: Vec<(&str, u32, u32, u32)> = batches
        .iter()
        .map(|b| {
            (
                b.title.as_str(),
                b.max_live_items,
                b.max_running_items,
                b.max_attempts,
            )
        })
        .collect();
    assert_eq!(
        limits,
        [("Small", 2, 2, 2), ("Subagent batch", 50, 4, 2)],
        "newest first"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_batch_tools_the_lead_is_told_batches_are_unavailable() {
    let rules = json!([lead_rule(
        "try.",
        json!([
            {"name": "batch_task", "args": {"title": "t", "subagent_type": "general-purpose", "items": items(1)}},
            {"name": "batch_status", "args": {"batch_id": "subagent-batch-x"}},
            {"name": "cancel_batch", "args": {"batch_id": "subagent-batch-x"}}
        ])
    )]);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let h = scripted_on(store.clone(), rules, |config| {
        config.batches.enabled = false
    });
    let (result, _) = h.run("t1", "r1", "try.").await;
    let submit = tool_messages(&result.messages, "batch_task")[0];
    assert_eq!(
        text(submit),
        "Durable subagent batches are unavailable. Enable subagent_batches with a SQL database and restart Gateway."
    );
    assert_eq!(submit.additional_kwargs["subagent_batch_error"], true);
    for name in ["batch_status", "cancel_batch"] {
        assert_eq!(
            text(tool_messages(&result.messages, name)[0]),
            "Durable subagent batches are unavailable."
        );
    }
    assert!(batches_of(&store, "u1").await.is_empty());
}

async fn submit_for(store: &Arc<dyn Store>, user: &str, key: &str) -> String {
    store
        .submit_batch(NewBatch {
            thread_id: "t1".into(),
            user_id: user.into(),
            run_id: None,
            tool_call_id: None,
            submission_key: key.into(),
            title: String::new(),
            subagent_type: "general-purpose".into(),
            max_live_items: 10,
            max_running_items: 2,
            max_attempts: 3,
            execution_spec: json!({}),
            items: vec![NewItem {
                item_key: "a".into(),
                prompt: "x".into(),
                acceptance_criteria: vec![],
            }],
        })
        .await
        .unwrap()
        .batch
        .id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_cancel_see_only_the_owners_batches() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mine = submit_for(&store, "u1", "mine").await;
    let theirs = submit_for(&store, "u2", "theirs").await;
    let rules = json!([lead_rule(
        "look.",
        json!([
            {"name": "batch_status", "args": {"batch_id": mine}},
            {"name": "batch_status", "args": {"batch_id": theirs}},
            {"name": "cancel_batch", "args": {"batch_id": theirs}},
            {"name": "cancel_batch", "args": {"batch_id": "subagent-batch-unknown"}},
            {"name": "cancel_batch", "args": {"batch_id": mine}}
        ])
    )]);
    let h = scripted_on(store.clone(), rules, |_| {});
    let (result, _) = h.run("t9", "r1", "look.").await;
    let status = tool_messages(&result.messages, "batch_status");
    let seen: Value = serde_json::from_str(text(status[0])).unwrap();
    assert_eq!(
        seen,
        json!({"batch_id": mine, "status": "queued", "total_items": 1, "counts": {
            "pending": 1, "queued": 0, "leased": 0, "running": 0,
            "succeeded": 0, "failed": 0, "cancelled": 0}})
    );
    assert_eq!(text(status[1]), "Batch not found.");
    let cancels: Vec<&str> = tool_messages(&result.messages, "cancel_batch")
        .into_iter()
        .map(text)
        .collect();
    assert_eq!(
        cancels,
        [
            "Batch not found.".to_owned(),
            "Batch not found.".to_owned(),
            format!("Batch {mine} cancellation requested."),
        ]
    );
    let scope = BatchScope::user("u1");
    let cancelled = store.get_batch(&scope, &mine).await.unwrap().unwrap();
    assert_eq!(cancelled.status, BatchStatus::Cancelled);
    let untouched = store
        .get_batch(&BatchScope::user("u2"), &theirs)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(untouched.status, BatchStatus::Queued);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_work_neither_uses_nor_relaxes_the_per_run_task_limit() {
    let submit = json!({"name": "batch_task", "args": {"title": "t", "subagent_type": "general-purpose", "items": items(4)}});
    let task = |n: u32| json!({"name": "task", "args": {"description": format!("t{n}"), "prompt": format!("/echo {n}"), "subagent_type": "general-purpose"}});
    let rules = json!([
        lead_rule("uses.", json!([submit.clone(), task(1)])),
        lead_rule("relaxes.", json!([submit, task(1), task(2)])),
    ]);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let h = scripted_on(store.clone(), rules, |config| config.max_total_per_run = 1);
    // A submission next to one task leaves room for that task.
    let (result, _) = h.run("t1", "r1", "uses.").await;
    assert_eq!(result.stop_reason, None);
    assert_eq!(tool_messages(&result.messages, "task").len(), 1);
    assert_eq!(tool_messages(&result.messages, "batch_task").len(), 1);
    // And it does not let a second task through.
    let (result, _) = h.run("t2", "r2", "relaxes.").await;
    assert_eq!(result.stop_reason, Some(RunStopReason::SubagentLimitCapped));
    assert_eq!(tool_messages(&result.messages, "task").len(), 1);
    assert_eq!(tool_messages(&result.messages, "batch_task").len(), 1);
    assert_eq!(batches_of(&store, "u1").await.len(), 2);
}
