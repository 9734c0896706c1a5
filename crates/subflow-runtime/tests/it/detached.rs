//! Subagent executions outside any run, as batch items run them: the same executor,
//! nothing emitted into a run, their own trace.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use subflow_contracts::SubagentStatus;
use subflow_contracts::task_result::TokenUsage;
use subflow_runtime::spans::{AttributeValue, SpanData, SpanSink};
use subflow_runtime::subagent::{DetachedExecution, SubagentDefinition};
use subflow_store::{EventQuery, ThreadSearch};
use tokio_util::sync::CancellationToken;

use crate::harness::{Harness, Recorded, scripted_harness};

#[derive(Debug, Default)]
struct Spans(Mutex<Vec<SpanData>>);

impl SpanSink for Spans {
    fn export(&self, span: SpanData) {
        self.0.lock().unwrap().push(span);
    }
}

fn item(prompt: &str) -> DetachedExecution {
    DetachedExecution {
        definition: SubagentDefinition::general_purpose(600),
        model_name: "scripted".into(),
        prompt: prompt.into(),
        thread_id: "t1".into(),
        user_id: "u1".into(),
        trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
        scope_id: "batch-item-1:1".into(),
        label: "batch item item-1".into(),
        trace_metadata: vec![
            ("run_id".into(), "r0".into()),
            ("batch_id".into(), "subagent-batch-1".into()),
            ("item_key".into(), "item-1".into()),
        ],
        batch_spent: None,
    }
}

fn writing_subagent() -> Harness {
    let turns = json!([
        {"tool_calls": [{"name": "write_file", "args": {"path": "out.md", "content": "found"}}],
         "usage": {"input": 10, "output": 4, "cache_read": 0}},
        {"text": "All done", "usage": {"input": 20, "output": 6, "cache_read": 0}}
    ]);
    scripted_harness(
        json!([{"agent": "subagent:general-purpose", "turns": turns}]),
        |_| {},
    )
}

#[tokio::test(start_paused = true)]
async fn a_detached_execution_works_in_the_thread_workspace_and_leaves_no_run_behind() {
    let mut h = writing_subagent();
    let (spans, recorded) = (Arc::new(Spans::default()), Arc::new(Recorded::default()));
    h.runtime = h
        .runtime
        .clone()
        .with_spans(spans.clone(), Some("test".into()))
        .with_metrics(recorded.clone());
    let report = h
        .runtime
        .execute_detached(item("Write it down"), CancellationToken::new())
        .await;
    assert_eq!(report.status, SubagentStatus::Completed);
    assert_eq!(report.result.as_deref(), Some("All done"));
    assert_eq!((report.error, report.stop_reason), (None, None));
    assert_eq!(report.model_name, "scripted");
    assert_eq!(report.usage, Some(TokenUsage::new(30, 10, 40)));
    let written = h._dir.path().join("workspaces/t1/out.md");
    assert_eq!(std::fs::read_to_string(written).unwrap(), "found");

    // No run, no events, no thread: an item writes nothing a run would (docs/batches.md#observability).
    let mut query = EventQuery::run("t1", "r0");
    query.limit = 100;
    assert!(h.store.list_events(&query).await.unwrap().is_empty());
    assert!(
        h.store
            .search_threads(&ThreadSearch::owner("u1", 10))
            .await
            .unwrap()
            .is_empty()
    );
    // Usage counts under the batch caller; no subagent task is counted.
    let tokens = recorded.tokens.lock().unwrap().clone();
    assert_eq!(
        tokens,
        [
            ("batch".to_owned(), "general-purpose".to_owned(), 10),
            ("batch".to_owned(), "general-purpose".to_owned(), 20)
        ]
    );
    assert!(recorded.tasks.lock().unwrap().is_empty());

    // One trace of its own: the root span, two model calls and the tool call.
    let spans = spans.0.lock().unwrap();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "chat scripted-1",
            "execute_tool write_file",
            "chat scripted-1",
            "invoke_agent general-purpose"
        ]
    );
    assert!(spans.iter().all(|s| s.trace_id == spans[0].trace_id));
    let root = spans.last().unwrap();
    assert!(root.links.is_empty());
    let text = |key: &str| match root.attribute(key) {
        Some(AttributeValue::String(text)) => text.clone(),
        other => panic!("{key}: {other:?}"),
    };
    assert_eq!(text("langfuse.trace.name"), "subagent:general-purpose");
    assert_eq!(text("langfuse.session.id"), "t1");
    assert_eq!(text("langfuse.user.id"), "u1");
    assert_eq!(
        text("langfuse.trace.metadata.deerflow_trace_id"),
        "0af7651916cd43dd8448eb211c80319c"
    );
    assert_eq!(text("langfuse.trace.metadata.batch_id"), "subagent-batch-1");
    assert_eq!(text("langfuse.trace.metadata.item_key"), "item-1");
    assert_eq!(
        root.attribute("langfuse.trace.tags"),
        Some(&AttributeValue::StringArray(vec![
            "env:test".into(),
            "model:scripted".into()
        ]))
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_detached_execution_ends_it_cancelled_at_its_next_await() {
    let slow = json!([{"text": "late", "delay_ms": 60_000}]);
    let h = scripted_harness(
        json!([{"agent": "subagent:general-purpose", "turns": slow}]),
        |_| {},
    );
    let cancel = CancellationToken::new();
    let stop = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        cancel.cancel();
    };
    let (report, ()) = tokio::join!(
        h.runtime.execute_detached(item("Wait"), cancel.clone()),
        stop
    );
    assert_eq!(report.status, SubagentStatus::Cancelled);
    assert_eq!(report.error.as_deref(), Some("Cancelled by user"));
    assert_eq!(report.result, None);
}

#[tokio::test(start_paused = true)]
async fn a_detached_execution_times_out_and_an_unconfigured_model_fails_it() {
    let slow = json!([{"text": "late", "delay_ms": 60_000}]);
    let h = scripted_harness(
        json!([{"agent": "subagent:general-purpose", "turns": slow}]),
        |_| {},
    );
    let mut quick = item("Wait");
    quick.definition.timeout_seconds = 2;
    let report = h
        .runtime
        .execute_detached(quick, CancellationToken::new())
        .await;
    assert_eq!(report.status, SubagentStatus::TimedOut);
    assert_eq!(
        report.error.as_deref(),
        Some("Execution timed out after 2 seconds")
    );

    let mut gone = item("Anything");
    gone.model_name = "retired".into();
    let report = h
        .runtime
        .execute_detached(gone, CancellationToken::new())
        .await;
    assert_eq!(report.status, SubagentStatus::Failed);
    assert_eq!(
        report.error.as_deref(),
        Some("Model 'retired' is not configured")
    );
    assert_eq!(report.usage, None);
}
