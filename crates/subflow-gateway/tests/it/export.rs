//! What a run request hands the span exporter (docs/operations.md#langfuse-and-otlp): a `traceparent` header and
//! `config.metadata.langfuse_*` reach the lead trace.

use std::sync::{Arc, Mutex};

use serde_json::json;
use subflow_runtime::spans::{AttributeValue, SpanData, SpanSink};

use crate::{Options, spawn_app_with};

/// Keeps every span.
#[derive(Debug, Default)]
struct Kept(Mutex<Vec<SpanData>>);

impl SpanSink for Kept {
    fn export(&self, span: SpanData) {
        self.0.lock().unwrap().push(span);
    }
}

fn text(span: &SpanData, key: &str) -> String {
    match span.attribute(key) {
        Some(AttributeValue::String(value)) => value.clone(),
        other => panic!("{}: {key} is {other:?}", span.name),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_and_langfuse_metadata_reach_the_lead_trace() {
    let kept = Arc::new(Kept::default());
    let sink = kept.clone();
    let app = spawn_app_with(Options {
        configure: Box::new(move |app| app.runtime.spans = Some((sink, Some("ci".into())))),
        ..Options::default()
    })
    .await;
    let response = app
        .client
        .post(app.url("/api/threads/t-trace/runs/wait"))
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .json(&json!({
            "input": {"messages": [{"role": "user", "content": "/task general-purpose Check the notes"}]},
            "config": {"metadata": {"langfuse_session_id": "s-42", "langfuse_tags": ["nightly"]}},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let spans = kept.0.lock().unwrap().clone();
    let lead_trace = [
        0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47,
        0x36,
    ];
    let root = spans
        .iter()
        .find(|s| s.name == "invoke_agent lead_agent")
        .expect("a lead root span");
    assert_eq!(root.trace_id, lead_trace, "the traceparent's trace id");
    assert_eq!(
        root.parent_span_id,
        Some([0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7])
    );
    assert_eq!(text(root, "langfuse.session.id"), "s-42");
    assert_eq!(text(root, "langfuse.user.id"), "default");
    assert_eq!(
        root.attribute("langfuse.trace.tags"),
        Some(&AttributeValue::StringArray(vec!["nightly".into()]))
    );
    // The request's trace id (from the traceparent) is the run's deerflow_trace_id.
    assert_eq!(
        text(root, "langfuse.trace.metadata.deerflow_trace_id"),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    let sub = spans
        .iter()
        .find(|s| s.name == "invoke_agent general-purpose")
        .expect("a subagent root span");
    assert_ne!(sub.trace_id, lead_trace);
    assert_eq!(text(sub, "langfuse.session.id"), "t-trace");
    assert_eq!(
        sub.attribute("langfuse.trace.tags"),
        Some(&AttributeValue::StringArray(vec![
            "env:ci".into(),
            "model:scripted".into()
        ]))
    );
}
