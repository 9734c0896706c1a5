//! Every terminal path of a task, each guard, the limits and the unknown type, driven by
//! script files on the in-memory store (paused time where time matters).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use subflow_contracts::messages::{Message, ToolMessage};
use subflow_contracts::{RunStatus, RunStopReason, SubagentStatus};
use subflow_models::{ChatModel, ChatRequest, ChatStream, ModelInfo};
use subflow_runtime::runtime::RuntimeConfig;
use subflow_runtime::subagent::SubagentDefinition;
use subflow_store::MemoryStore;

use crate::harness::{Harness, Recorded, custom_payloads, harness, scripted, scripted_harness};

fn task_results(messages: &[Message]) -> Vec<&ToolMessage> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool(t) if t.name.as_deref() == Some("task") => Some(t),
            _ => None,
        })
        .collect()
}

fn event_types(payloads: &[Value]) -> Vec<String> {
    payloads
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_owned())
        .collect()
}

fn subagent(rule_turns: Value) -> Value {
    json!({"agent": "subagent:general-purpose", "turns": rule_turns})
}

fn with_definition(max_turns: u32, timeout_seconds: u64) -> impl FnOnce(&mut RuntimeConfig) {
    move |config| {
        let mut definition = SubagentDefinition::general_purpose(timeout_seconds);
        definition.max_turns = max_turns;
        config.definitions = vec![definition];
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_provider_fails_the_task_with_the_fallback_text() {
    let h = scripted_harness(
        json!([subagent(json!([{"error": "provider exploded"}]))]),
        |_| {},
    );
    let (result, outputs) = h
        .run("t1", "r1", "/task general-purpose Look into it")
        .await;
    assert_eq!(result.status, RunStatus::Success);
    let tool = task_results(&result.messages)[0];
    assert_eq!(tool.additional_kwargs["subagent_status"], "failed");
    assert_eq!(
        tool.additional_kwargs["subagent_error"],
        "The model request failed: provider exploded"
    );
    assert_eq!(
        tool.content,
        json!("Task failed. Error: The model request failed: provider exploded")
    );
    let payloads = custom_payloads(&outputs);
    assert_eq!(
        event_types(&payloads),
        ["task_started", "task_running", "task_failed"]
    );
    assert_eq!(
        payloads[1]["message"]["additional_kwargs"]["deerflow_error_fallback"],
        true
    );
}

#[tokio::test(start_paused = true)]
async fn a_turn_cap_with_partial_text_completes_capped_and_without_text_fails() {
    let with_text = scripted_harness(
        json!([subagent(
            json!([{"text": "partial findings", "tool_calls": [{"name": "ls", "args": {}}]}])
        )]),
        with_definition(2, 600),
    );
    let (result, _) = with_text
        .run("t1", "r1", "/task general-purpose Explore")
        .await;
    let tool = task_results(&result.messages)[0];
    assert_eq!(tool.additional_kwargs["subagent_status"], "completed");
    assert_eq!(
        tool.additional_kwargs["subagent_stop_reason"],
        "turn_capped"
    );
    assert_eq!(
        tool.content,
        json!("Task Succeeded (capped: turn budget). Result: partial findings")
    );
    // The persisted records keep what the live events do not carry, for `/tasks`.
    let summary = &with_text.store.task_summaries("t1", "r1").await.unwrap()[0];
    assert_eq!(summary.stop_reason.as_deref(), Some("turn_capped"));
    assert_eq!(summary.subagent_type.as_deref(), Some("general-purpose"));

    let without_text = scripted_harness(
        json!([subagent(
            json!([{"tool_calls": [{"name": "ls", "args": {}}]}])
        )]),
        with_definition(2, 600),
    );
    let (result, _) = without_text
        .run("t1", "r1", "/task general-purpose Explore")
        .await;
    let tool = task_results(&result.messages)[0];
    assert_eq!(tool.additional_kwargs["subagent_status"], "failed");
    assert_eq!(
        tool.additional_kwargs["subagent_stop_reason"],
        "turn_capped"
    );
    assert_eq!(
        tool.additional_kwargs["subagent_error"],
        "Reached max_turns=2"
    );
}

#[tokio::test(start_paused = true)]
async fn an_executor_timeout_ends_the_task_timed_out() {
    let h = scripted_harness(
        json!([subagent(json!([{"text": "too late", "delay_ms": 5000}]))]),
        with_definition(10, 1),
    );
    let (result, outputs) = h.run("t1", "r1", "/task general-purpose Slow work").await;
    let tool = task_results(&result.messages)[0];
    assert_eq!(tool.additional_kwargs["subagent_status"], "timed_out");
    assert_eq!(
        tool.additional_kwargs["subagent_error"],
        "Execution timed out after 1 seconds"
    );
    let last = custom_payloads(&outputs).pop().unwrap();
    assert_eq!(last["type"], "task_timed_out");
    assert_eq!(last["error"], "Execution timed out after 1 seconds");
    let ends: Vec<Value> = h
        .events("t1", "r1")
        .await
        .into_iter()
        .filter(|e| e.event_type == "subagent.end")
        .map(|e| e.content)
        .collect();
    assert_eq!(ends[0]["status"], "timed_out");
}

#[tokio::test(start_paused = true)]
async fn an_unknown_subagent_type_fails_without_any_task_event() {
    let h = scripted_harness(json!([]), |_| {});
    let (result, outputs) = h.run("t1", "r1", "/task nonexistent Do it").await;
    let tool = task_results(&result.messages)[0];
    assert_eq!(tool.additional_kwargs["subagent_status"], "failed");
    assert_eq!(
        tool.additional_kwargs["subagent_error"],
        "Unknown subagent type 'nonexistent'. Available: general-purpose"
    );
    assert!(!tool.additional_kwargs.contains_key("subagent_model_name"));
    assert!(custom_payloads(&outputs).is_empty());
    assert!(
        h.events("t1", "r1")
            .await
            .iter()
            .all(|e| e.category != "subagent")
    );
}

#[tokio::test(start_paused = true)]
async fn task_calls_over_the_concurrency_limit_are_stripped_with_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let h = harness(
        Arc::new(MemoryStore::new()),
        dir,
        vec![scripted(None)],
        |config| config.max_concurrent = 2,
    );
    let (result, outputs) = h.run("t1", "r1", "Plan a migration").await;
    assert_eq!(result.stop_reason, Some(RunStopReason::SubagentLimitCapped));
    let dispatch = result
        .messages
        .iter()
        .find_map(|m| match m {
            Message::Ai(ai) if !ai.tool_calls.is_empty() => Some(ai),
            _ => None,
        })
        .unwrap();
    assert_eq!(dispatch.tool_calls.len(), 2);
    assert_eq!(dispatch.response_metadata["finish_reason"], "stop");
    assert!(
        dispatch
            .content
            .as_str()
            .unwrap()
            .contains("subagent delegation limit")
    );
    let started = custom_payloads(&outputs)
        .iter()
        .filter(|p| p["type"] == "task_started")
        .count();
    assert_eq!(started, 2);
    let run = h.store.get_run("t1", "r1").await.unwrap().unwrap();
    assert_eq!(run.stop_reason, Some(RunStopReason::SubagentLimitCapped));
}

#[tokio::test(start_paused = true)]
async fn a_subagent_loop_warns_then_hard_stops_and_audits_through_the_parent_journal() {
    let repeat = json!([{"tool_calls": [{"name": "read_file", "args": {"path": "notes.md"}}]}]);
    let h = scripted_harness(json!([subagent(repeat)]), with_definition(20, 600));
    let (result, _) = h
        .run("t1", "r1", "/task general-purpose Keep reading")
        .await;
    let tool = task_results(&result.messages)[0];
    assert_eq!(tool.additional_kwargs["subagent_status"], "completed");
    assert_eq!(
        tool.additional_kwargs["subagent_stop_reason"],
        "loop_capped"
    );
    assert!(
        tool.additional_kwargs["subagent_result_brief"]
            .as_str()
            .unwrap()
            .contains("[FORCED STOP] Repeated tool calls exceeded the safety limit.")
    );
    let audits: Vec<Value> = h
        .events("t1", "r1")
        .await
        .into_iter()
        .filter(|e| e.event_type == "middleware:loop_detection")
        .map(|e| e.content)
        .collect();
    let actions: Vec<&str> = audits
        .iter()
        .map(|a| a["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["warn", "hard_stop"]);
    for audit in &audits {
        assert_eq!(audit["changes"]["is_subagent"], true);
        assert_eq!(audit["changes"]["agent_id"], "general-purpose");
        assert_eq!(audit["changes"]["detection_layer"], "identical_call_set");
        assert!(
            !audit.to_string().contains("notes.md"),
            "no arguments in audit events"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn loop_detections_tasks_runs_and_tokens_are_counted_where_they_happen() {
    let repeat = json!([{"tool_calls": [{"name": "read_file", "args": {"path": "notes.md"}}]}]);
    let mut h = scripted_harness(json!([subagent(repeat)]), with_definition(20, 600));
    let recorded = Arc::new(Recorded::default());
    h.runtime = h.runtime.clone().with_metrics(recorded.clone());
    let (result, _) = h
        .run("t1", "r1", "/task general-purpose Keep reading")
        .await;
    assert_eq!(result.status, RunStatus::Success);
    let layer = "identical_call_set".to_owned();
    assert_eq!(
        *recorded.loops.lock().unwrap(),
        [
            (layer.clone(), "warn".to_owned(), true),
            (layer, "hard_stop".to_owned(), true)
        ]
    );
    assert_eq!(
        *recorded.tasks.lock().unwrap(),
        [("general-purpose".to_owned(), SubagentStatus::Completed)]
    );
    assert_eq!(*recorded.runs.lock().unwrap(), [RunStatus::Success]);
    // Every ledger record is counted once: the metric's input equals the run's.
    let tokens = recorded.tokens.lock().unwrap();
    let input: u64 = tokens.iter().map(|(_, _, input)| input).sum();
    assert_eq!(input as i64, result.usage.total_input_tokens);
    assert!(
        tokens
            .iter()
            .any(|(c, a, _)| c == "subagent" && a == "general-purpose")
    );
    assert!(
        tokens
            .iter()
            .any(|(c, a, _)| c == "lead_agent" && a == "lead_agent")
    );
}

#[tokio::test(start_paused = true)]
async fn a_lead_loop_hard_stop_caps_the_run() {
    let repeat = json!([{"tool_calls": [{"name": "ls", "args": {"path": "."}}]}]);
    let h = scripted_harness(json!([{"agent": "lead_agent", "turns": repeat}]), |_| {});
    let (result, _) = h.run("t1", "r1", "Look around").await;
    assert_eq!(result.status, RunStatus::Success);
    assert_eq!(result.stop_reason, Some(RunStopReason::LoopCapped));
    let audits: Vec<Value> = h
        .events("t1", "r1")
        .await
        .into_iter()
        .filter(|e| e.event_type == "middleware:loop_detection")
        .map(|e| e.content)
        .collect();
    assert_eq!(audits.len(), 2);
    assert_eq!(audits[0]["changes"]["is_subagent"], false);
    assert_eq!(audits[0]["changes"]["agent_id"], Value::Null);
    let last = result.messages.last().unwrap();
    let Message::Ai(ai) = last else {
        panic!("ends with the capped answer")
    };
    assert!(ai.tool_calls.is_empty());
    assert_eq!(ai.response_metadata["finish_reason"], "stop");
}

#[tokio::test(start_paused = true)]
async fn a_token_budget_hard_stop_caps_the_subagent() {
    let heavy = json!([{"text": "working", "tool_calls": [{"name": "ls", "args": {}}], "usage": {"input": 900, "output": 200}}]);
    let h = scripted_harness(json!([subagent(heavy)]), |config| {
        config.token_budget.enabled = true;
        config.token_budget.max_tokens = 1000;
    });
    let (result, _) = h.run("t1", "r1", "/task general-purpose Spend").await;
    let tool = task_results(&result.messages)[0];
    assert_eq!(
        tool.additional_kwargs["subagent_stop_reason"],
        "token_capped"
    );
    assert!(
        tool.additional_kwargs["subagent_result_brief"]
            .as_str()
            .unwrap()
            .contains("[TOKEN BUDGET EXCEEDED]")
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_parent_cancels_the_task_persists_its_end_and_writes_no_tool_message() {
    let turns = json!([
        {"text": "first", "tool_calls": [{"name": "ls", "args": {}}], "usage": {"input": 40, "output": 10}},
        {"text": "never", "delay_ms": 60000}
    ]);
    let h = scripted_harness(json!([subagent(turns)]), |_| {});
    let spec_cancel = tokio_util::sync::CancellationToken::new();
    let canceller = spec_cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        canceller.cancel();
    });
    let (result, outputs) = h
        .run_with_cancel("t1", "r1", "/task general-purpose Long job", spec_cancel)
        .await;
    assert_eq!(result.status, RunStatus::Interrupted);
    assert!(
        task_results(&result.messages).is_empty(),
        "no ToolMessage for the interrupted turn"
    );
    let payloads = custom_payloads(&outputs);
    let last = payloads.last().unwrap();
    assert_eq!(last["type"], "task_cancelled");
    assert_eq!(last["error"], "Cancelled by user");
    let ends: Vec<Value> = h
        .events("t1", "r1")
        .await
        .into_iter()
        .filter(|e| e.event_type == "subagent.end")
        .map(|e| e.content)
        .collect();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0]["status"], "cancelled");
    let run = h.store.get_run("t1", "r1").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Interrupted);
    assert_eq!(
        run.usage.subagent_tokens, 50,
        "the usage collected before the cancel is reported once"
    );
}

/// A model that panics inside a call, so the execution vanishes without a status.
#[derive(Debug)]
struct Panicking(ModelInfo);

#[async_trait]
impl ChatModel for Panicking {
    fn info(&self) -> &ModelInfo {
        &self.0
    }
    async fn stream(&self, _request: ChatRequest) -> Result<ChatStream, subflow_models::Error> {
        panic!("the provider client crashed");
    }
}

/// A model that blocks its thread, so the executor cannot even observe its timeout.
#[derive(Debug)]
struct Stuck(ModelInfo);

#[async_trait]
impl ChatModel for Stuck {
    fn info(&self) -> &ModelInfo {
        &self.0
    }
    async fn stream(&self, _request: ChatRequest) -> Result<ChatStream, subflow_models::Error> {
        std::thread::sleep(Duration::from_millis(600));
        Err(subflow_models::Error::Scripted("unblocked".into()))
    }
}

fn info(name: &str) -> ModelInfo {
    ModelInfo {
        name: name.into(),
        model: name.into(),
        provider: "scripted",
    }
}

#[tokio::test(start_paused = true)]
async fn an_execution_that_vanishes_fails_as_disappeared_without_usage_or_model() {
    let dir = tempfile::tempdir().unwrap();
    let models: Vec<Arc<dyn ChatModel>> =
        vec![scripted(None), Arc::new(Panicking(info("panicky")))];
    let h = harness(Arc::new(MemoryStore::new()), dir, models, |config| {
        config.definitions[0].model = Some("panicky".into())
    });
    let (result, outputs) = h.run("t1", "r1", "/task general-purpose Crash").await;
    let tool = task_results(&result.messages)[0];
    assert_eq!(tool.additional_kwargs["subagent_status"], "failed");
    assert_eq!(
        tool.additional_kwargs["subagent_error"],
        "Task disappeared from background tasks"
    );
    let last = custom_payloads(&outputs).pop().unwrap();
    assert_eq!(
        last,
        json!({"type": "task_failed", "task_id": tool.tool_call_id, "error": "Task disappeared from background tasks"})
    );
}

#[tokio::test(start_paused = true)]
async fn a_panicking_lead_ends_the_run_error_with_its_error_event_flushed_and_observers_told() {
    let dir = tempfile::tempdir().unwrap();
    let models: Vec<Arc<dyn ChatModel>> = vec![Arc::new(Panicking(info("panicky")))];
    let mut h = harness(Arc::new(MemoryStore::new()), dir, models, |_| {});
    let recorder = Arc::new(Recorder::default());
    h.runtime = h.runtime.clone().with_observers(
        subflow_runtime::observers::ObserverSet::new().with_observer(recorder.clone()),
    );
    h.store
        .create_thread(subflow_store::NewThread {
            thread_id: "t1".into(),
            owner: "u1".into(),
            metadata: Default::default(),
        })
        .await
        .unwrap();
    let (result, _) = h.run("t1", "r1", "Hello").await;
    assert_eq!(result.status, RunStatus::Error);
    assert_eq!(result.error.as_deref(), Some("The run ended unexpectedly"));

    let run = h.store.get_run("t1", "r1").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Error);
    assert_eq!(run.error.as_deref(), Some("The run ended unexpectedly"));
    let thread = h.store.get_thread("t1").await.unwrap().unwrap();
    assert_eq!(thread.status, subflow_contracts::ThreadStatus::Error);
    // The run's record ends like any failed run's: run.error, flushed before the status,
    // then the one run.end mirroring it.
    let events = h.events("t1", "r1").await;
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        ["run.start", "llm.human.input", "run.error", "run.end"]
    );
    assert_eq!(events[3].metadata["status"], "error");
    let error = &events[2];
    assert_eq!(error.category, "error");
    assert_eq!(error.content, json!("The run ended unexpectedly"));
    assert_eq!(error.metadata["error_type"], "InternalError");
    let stops: Vec<String> = recorder
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(hook, _)| hook.clone())
        .collect();
    assert_eq!(stops, ["start", "stop:failed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_execution_is_caught_by_the_supervision_safety_net() {
    let dir = tempfile::tempdir().unwrap();
    let models: Vec<Arc<dyn ChatModel>> = vec![scripted(None), Arc::new(Stuck(info("stuck")))];
    let h = harness(Arc::new(MemoryStore::new()), dir, models, |config| {
        let mut definition = SubagentDefinition::general_purpose(0);
        definition.model = Some("stuck".into());
        config.definitions = vec![definition];
        config.supervision_grace = Duration::from_millis(100);
    });
    let (result, outputs) = h.run("t1", "r1", "/task general-purpose Hang").await;
    let tool = task_results(&result.messages)[0];
    assert_eq!(
        tool.additional_kwargs["subagent_status"],
        "polling_timed_out"
    );
    assert_eq!(
        tool.content,
        json!(
            "Task polling timed out after 0 minutes. This may indicate the background task is stuck. Status: running"
        )
    );
    let last = custom_payloads(&outputs).pop().unwrap();
    assert_eq!(last["type"], "task_timed_out");
    assert!(
        last.get("error").is_none(),
        "the safety net's event has no error key"
    );
    let ends: Vec<Value> = h
        .events("t1", "r1")
        .await
        .into_iter()
        .filter(|e| e.event_type == "subagent.end")
        .map(|e| e.content)
        .collect();
    assert_eq!(ends[0]["status"], "timed_out");
}

/// Records every observer notification.
#[derive(Debug, Default)]
struct Recorder(std::sync::Mutex<Vec<(String, subflow_runtime::observers::TaskInfo)>>);

#[async_trait]
impl subflow_runtime::observers::TaskObserver for Recorder {
    async fn on_task_start(&self, info: &subflow_runtime::observers::TaskInfo) {
        self.0.lock().unwrap().push(("start".into(), info.clone()));
    }
    async fn on_task_stop(
        &self,
        info: &subflow_runtime::observers::TaskInfo,
        outcome: subflow_runtime::observers::ObserverOutcome,
    ) {
        self.0
            .lock()
            .unwrap()
            .push((format!("stop:{}", outcome.as_str()), info.clone()));
    }
}

#[tokio::test(start_paused = true)]
async fn observers_hear_one_start_and_one_stop_per_lead_run_and_subagent() {
    let mut h = scripted_harness(json!([]), |_| {});
    let recorder = Arc::new(Recorder::default());
    h.runtime = h.runtime.clone().with_observers(
        subflow_runtime::observers::ObserverSet::new().with_observer(recorder.clone()),
    );
    let (result, _) = h
        .run("t1", "r1", "/task general-purpose Check the notes")
        .await;
    assert_eq!(result.status, RunStatus::Success);
    let seen = recorder.0.lock().unwrap().clone();
    let hooks: Vec<(&str, Option<&str>)> = seen
        .iter()
        .map(|(hook, info)| (hook.as_str(), info.agent_name.as_deref()))
        .collect();
    assert_eq!(
        hooks,
        [
            ("start", Some("lead_agent")),
            ("start", Some("general-purpose")),
            ("stop:completed", Some("general-purpose")),
            ("stop:completed", Some("lead_agent"))
        ]
    );
    let (_, lead) = &seen[0];
    assert_eq!(
        (lead.task_id.as_str(), lead.parent_task_id.as_deref()),
        ("r1", None)
    );
    let (_, sub) = &seen[1];
    let tool = task_results(&result.messages)[0];
    assert_ne!(
        sub.task_id, tool.tool_call_id,
        "observers get the execution id, never the tool_call_id"
    );
    assert_eq!(
        uuid::Uuid::parse_str(&sub.task_id)
            .unwrap()
            .get_version_num(),
        4
    );
    assert_eq!(
        (
            sub.run_id.as_str(),
            sub.thread_id.as_str(),
            sub.parent_task_id.as_deref()
        ),
        ("r1", "t1", Some("r1"))
    );
}

#[tokio::test(start_paused = true)]
async fn a_run_past_its_timeout_ends_timeout_and_cancels_its_tasks() {
    let h = scripted_harness(
        json!([subagent(json!([{"text": "slow", "delay_ms": 600000}]))]),
        |_| {},
    );
    let (result, outputs) = h
        .run_spec("t1", "r1", "/task general-purpose Slow", |spec| {
            spec.timeout = Duration::from_secs(30)
        })
        .await;
    assert_eq!(result.status, RunStatus::Timeout);
    assert_eq!(
        result.error.as_deref(),
        Some("Run timed out after 30 seconds")
    );
    assert_eq!(
        custom_payloads(&outputs).last().unwrap()["type"],
        "task_cancelled"
    );
    let rows = h.events("t1", "r1").await;
    assert!(
        rows.iter()
            .any(|r| r.event_type == "run.error" && r.metadata["error_type"] == "TimeoutError")
    );
    assert_eq!(
        h.store.get_run("t1", "r1").await.unwrap().unwrap().status,
        RunStatus::Timeout
    );
}

#[tokio::test(start_paused = true)]
async fn usage_snapshots_reach_the_run_record_while_it_runs() {
    let turns = json!([
        {"text": "step", "tool_calls": [{"name": "ls", "args": {"path": "a"}}], "usage": {"input": 100, "output": 10}},
        {"text": "done", "delay_ms": 20000, "usage": {"input": 100, "output": 10}}
    ]);
    let h = Arc::new(scripted_harness(json!([subagent(turns)]), |_| {}));
    let running = {
        let h = h.clone();
        tokio::spawn(async move { h.run("t1", "r1", "/task general-purpose Slowly").await })
    };
    tokio::time::sleep(Duration::from_secs(12)).await;
    let lead_only = h.store.get_run("t1", "r1").await.unwrap().unwrap();
    assert_eq!(lead_only.status, RunStatus::Running);
    assert!(
        lead_only.usage.lead_agent_tokens > 0,
        "the lead's first call is in a snapshot while the run is running"
    );
    let (result, _) = running.await.unwrap();
    let done = h.store.get_run("t1", "r1").await.unwrap().unwrap();
    assert_eq!(done.usage, result.usage);
    assert_eq!(done.usage.subagent_tokens, 220);
}

#[tokio::test(flavor = "current_thread")]
async fn task_log_lines_carry_the_delegation_id_whatever_the_logging_settings() {
    #[derive(Clone, Default)]
    struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // Other tests of this binary run on other threads with no subscriber; a callsite
    // they reached first may have cached "never" before this one was set.
    tracing::callsite::rebuild_interest_cache();
    let h = scripted_harness(json!([]), |_| {});
    h.run_spec("t1", "r1", "/task general-purpose Log it", |spec| {
        spec.delegation_trace = Some("0a1b2c3d".into())
    })
    .await;
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let task_lines: Vec<&str> = text.lines().filter(|l| l.contains("task call_")).collect();
    assert!(task_lines.len() >= 3, "{text}");
    assert!(
        task_lines.iter().all(|l| l.contains("[trace=0a1b2c3d]")),
        "{text}"
    );
}

/// The terminal event type, the persisted end status and the ToolMessage status (if any)
/// of the run's only task must all tell the same story.
async fn assert_one_consistent_ending(
    h: &Harness,
    result: &subflow_runtime::run::RunResult,
    outputs: &[subflow_runtime::output::RunOutput],
) -> String {
    let terminals: Vec<Value> = custom_payloads(outputs)
        .into_iter()
        .filter(|p| p["type"] != "task_started" && p["type"] != "task_running")
        .collect();
    assert_eq!(
        terminals.len(),
        1,
        "exactly one terminal event: {terminals:?}"
    );
    let status = terminals[0]["type"]
        .as_str()
        .unwrap()
        .trim_start_matches("task_")
        .to_owned();
    let ends: Vec<Value> = h
        .events("t1", "r1")
        .await
        .into_iter()
        .filter(|e| e.event_type == "subagent.end")
        .map(|e| e.content)
        .collect();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0]["status"], status.as_str());
    if let Some(tool) = task_results(&result.messages).first() {
        assert_eq!(tool.additional_kwargs["subagent_status"], status.as_str());
    }
    status
}

#[tokio::test(start_paused = true)]
async fn a_cancel_and_a_timeout_at_the_same_instant_end_the_task_once() {
    let h = scripted_harness(
        json!([subagent(json!([{"text": "late", "delay_ms": 5000}]))]),
        with_definition(10, 1),
    );
    let cancel = tokio_util::sync::CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        trigger.cancel();
    });
    let (result, outputs) = h
        .run_with_cancel("t1", "r1", "/task general-purpose Race", cancel)
        .await;
    let status = assert_one_consistent_ending(&h, &result, &outputs).await;
    assert!(status == "cancelled" || status == "timed_out", "{status}");
}

#[tokio::test(start_paused = true)]
async fn a_completion_and_a_timeout_at_the_same_instant_end_the_task_once() {
    let h = scripted_harness(
        json!([subagent(
            json!([{"text": "just in time", "delay_ms": 1000}])
        )]),
        with_definition(10, 1),
    );
    let (result, outputs) = h.run("t1", "r1", "/task general-purpose Race").await;
    let status = assert_one_consistent_ending(&h, &result, &outputs).await;
    assert!(status == "completed" || status == "timed_out", "{status}");
}

#[tokio::test(start_paused = true)]
async fn task_calls_past_the_per_run_total_are_stripped_across_turns() {
    let three_tasks = json!({"tool_calls": [
        {"name": "task", "args": {"description": "a", "prompt": "a", "subagent_type": "general-purpose"}},
        {"name": "task", "args": {"description": "b", "prompt": "b", "subagent_type": "general-purpose"}},
        {"name": "task", "args": {"description": "c", "prompt": "c", "subagent_type": "general-purpose"}}
    ]});
    let h = scripted_harness(
        json!([{"agent": "lead_agent", "turns": [three_tasks.clone(), three_tasks, {"text": "done"}]}]),
        |config| config.max_total_per_run = 4,
    );
    let (result, outputs) = h.run("t1", "r1", "Delegate a lot").await;
    assert_eq!(result.stop_reason, Some(RunStopReason::SubagentLimitCapped));
    let started = custom_payloads(&outputs)
        .iter()
        .filter(|p| p["type"] == "task_started")
        .count();
    assert_eq!(
        started, 4,
        "3 in the first response, 1 more allowed in the second"
    );
    assert_eq!(task_results(&result.messages).len(), 4);
}
