//! What reaches an OTLP receiver, and what a bad receiver costs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prometheus_client::metrics::counter::Counter;
use subflow_contracts::RunStatus;
use subflow_runtime::spans::{
    FanOut, SpanData, SpanKind, SpanSink, SpanStatus, TraceOverrides, TraceParent, TraceRequest,
};
use subflow_telemetry::{ExporterConfig, OtlpExporter};

use crate::receiver::{Behaviour, Receiver};
use crate::{CountingSink, Harness, TRACE_ID, harness, step_counts};

const DEMO_PROMPT: &str = "Compare SQLite and PostgreSQL for our event store";

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Any> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text<'a>(span: &'a Span, key: &str) -> &'a str {
    match attr(span, key) {
        Some(Any::StringValue(value)) => value,
        other => panic!("{}: {key} is {other:?}", span.name),
    }
}

fn int(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(Any::IntValue(value)) => *value,
        other => panic!("{}: {key} is {other:?}", span.name),
    }
}

fn strings(span: &Span, key: &str) -> Vec<String> {
    match attr(span, key) {
        Some(Any::ArrayValue(array)) => array
            .values
            .iter()
            .map(|v| match &v.value {
                Some(Any::StringValue(s)) => s.clone(),
                other => panic!("{key} holds {other:?}"),
            })
            .collect(),
        other => panic!("{}: {key} is {other:?}", span.name),
    }
}

fn spans_of(receiver: &Receiver) -> Vec<Span> {
    receiver
        .received()
        .into_iter()
        .flat_map(|r| r.request.resource_spans)
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .collect()
}

fn exporter(config: ExporterConfig) -> (OtlpExporter, Counter) {
    let dropped = Counter::default();
    (
        OtlpExporter::spawn(config, dropped.clone()).unwrap(),
        dropped,
    )
}

#[tokio::test]
async fn the_demo_run_reaches_langfuse_as_one_trace_per_agent_with_genai_attributes() {
    let receiver = Receiver::start(Behaviour::Ok).await;
    let (exporter, dropped) = exporter(ExporterConfig::langfuse(
        &format!("{}/", receiver.base),
        "pk-lf-1",
        "sk-lf-1",
    ));
    let h: Harness = harness(Some(Arc::new(exporter.clone()))).await;
    let (result, _) = h
        .run("t-demo", "run-1", DEMO_PROMPT, TraceRequest::default())
        .await;
    assert_eq!(result.status, RunStatus::Success, "{:?}", result.error);
    exporter.flush().await;
    assert_eq!(dropped.get(), 0);

    // Transport: the Langfuse OTLP path, Basic auth of the key pair, ingestion version 4.
    let requests = receiver.received();
    assert!(!requests.is_empty());
    for request in &requests {
        assert_eq!(request.path, "/api/public/otel/v1/traces");
        assert_eq!(
            request.headers["authorization"],
            // base64("pk-lf-1:sk-lf-1")
            "Basic cGstbGYtMTpzay1sZi0x"
        );
        assert_eq!(request.headers["x-langfuse-ingestion-version"], "4");
        assert_eq!(request.headers["content-type"], "application/x-protobuf");
    }

    // One trace for the lead run and one per subagent execution.
    let spans = spans_of(&receiver);
    let mut traces: BTreeMap<Vec<u8>, Vec<&Span>> = BTreeMap::new();
    for span in &spans {
        traces.entry(span.trace_id.clone()).or_default().push(span);
    }
    assert_eq!(traces.len(), 4, "lead + 3 subagents");
    let names: Vec<(&str, &Vec<&Span>)> = traces
        .values()
        .map(|spans| (text(spans[0], "langfuse.trace.name"), spans))
        .collect();
    let lead = names
        .iter()
        .find(|(name, _)| *name == "lead_agent")
        .expect("a lead_agent trace")
        .1;
    let subagents: Vec<&Vec<&Span>> = names
        .iter()
        .filter(|(name, _)| *name == "subagent:general-purpose")
        .map(|(_, spans)| *spans)
        .collect();
    assert_eq!(subagents.len(), 3);

    // Trace attributes on every span.
    for span in &spans {
        assert_eq!(text(span, "langfuse.session.id"), "t-demo", "{}", span.name);
        assert_eq!(text(span, "langfuse.user.id"), "u1");
        assert_eq!(
            strings(span, "langfuse.trace.tags"),
            ["env:test", "model:scripted"]
        );
        assert_eq!(
            text(span, "langfuse.trace.metadata.deerflow_trace_id"),
            TRACE_ID
        );
        assert_eq!(text(span, "langfuse.trace.metadata.run_id"), "run-1");
        assert_eq!(text(span, "gen_ai.conversation.id"), "t-demo");
    }

    // Each trace: one root `invoke_agent` span, every other span its child.
    let root_of = |spans: &[&Span]| -> Span {
        let roots: Vec<&&Span> = spans
            .iter()
            .filter(|s| s.name.starts_with("invoke_agent "))
            .collect();
        assert_eq!(roots.len(), 1);
        for span in spans {
            if span.span_id != roots[0].span_id {
                assert_eq!(span.parent_span_id, roots[0].span_id, "{}", span.name);
            }
        }
        (*roots[0]).clone()
    };
    let lead_root = root_of(lead);
    assert_eq!(lead_root.name, "invoke_agent lead_agent");
    assert!(lead_root.parent_span_id.is_empty());
    assert!(
        lead.iter()
            .all(|s| attr(s, "langfuse.trace.metadata.tool_call_id").is_none())
    );

    // The lead's task tool spans, by tool call id; each subagent root links to one.
    let task_spans: BTreeMap<&str, &Span> = lead
        .iter()
        .filter(|s| s.name == "execute_tool task")
        .map(|s| (text(s, "gen_ai.tool.call.id"), *s))
        .collect();
    assert_eq!(task_spans.len(), 3);
    let mut linked = BTreeSet::new();
    for spans in &subagents {
        let root = root_of(spans);
        assert_eq!(root.name, "invoke_agent general-purpose");
        let call_id = text(&root, "langfuse.trace.metadata.tool_call_id").to_owned();
        for span in spans.iter() {
            assert_eq!(text(span, "langfuse.trace.metadata.tool_call_id"), call_id);
        }
        let parent = task_spans[call_id.as_str()];
        assert_eq!(root.links.len(), 1);
        assert_eq!(root.links[0].trace_id, lead_root.trace_id);
        assert_eq!(root.links[0].span_id, parent.span_id);
        linked.insert(call_id);
        // Two workspace tool steps, then the answer: tool spans with name and call id.
        let tools: Vec<&str> = spans
            .iter()
            .filter(|s| s.name.starts_with("execute_tool "))
            .map(|s| text(s, "gen_ai.tool.name"))
            .collect();
        assert_eq!(tools.len(), 2, "{tools:?}");
        assert!(tools.contains(&"write_file") && tools.contains(&"read_file"));
        for span in spans.iter().filter(|s| s.name.starts_with("execute_tool ")) {
            assert!(text(span, "gen_ai.tool.call.id").starts_with("call_"));
            assert_eq!(text(span, "gen_ai.operation.name"), "execute_tool");
        }
    }
    assert_eq!(
        linked.len(),
        3,
        "each subagent trace links to its own task span"
    );

    // Generations: GenAI attributes, and usage that adds up to the run's ledger.
    let chats: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.starts_with("chat "))
        .collect();
    assert!(chats.len() >= 3 * 3 + 2, "{}", chats.len());
    let (mut input, mut output, mut cached) = (0i64, 0i64, 0i64);
    for chat in &chats {
        assert_eq!(chat.name, "chat scripted-1");
        assert_eq!(text(chat, "langfuse.observation.type"), "generation");
        assert_eq!(text(chat, "gen_ai.operation.name"), "chat");
        assert_eq!(text(chat, "gen_ai.provider.name"), "scripted");
        assert_eq!(text(chat, "gen_ai.request.model"), "scripted-1");
        assert!(!text(chat, "gen_ai.response.model").is_empty());
        assert!(!strings(chat, "gen_ai.response.finish_reasons").is_empty());
        let uncached = int(chat, "gen_ai.usage.input_tokens");
        let cache_read = int(chat, "gen_ai.usage.cache_read.input_tokens");
        let out = int(chat, "gen_ai.usage.output_tokens");
        let details: serde_json::Value =
            serde_json::from_str(text(chat, "langfuse.observation.usage_details")).unwrap();
        assert_eq!(
            details,
            serde_json::json!({"input": uncached, "output": out, "input_cache_read": cache_read})
        );
        input += uncached + cache_read;
        output += out;
        cached += cache_read;
    }
    let usage = &result.usage;
    assert_eq!(
        input, usage.total_input_tokens,
        "uncached + cache reads = input"
    );
    assert_eq!(output, usage.total_output_tokens);
    let ledger_cached: i64 = usage
        .token_usage_by_model
        .values()
        .filter_map(|b| b.cache_read_tokens)
        .sum();
    assert!(cached > 0, "the demo reads repeated prefixes from cache");
    assert_eq!(cached, ledger_cached);
}

#[tokio::test]
async fn a_traceparent_and_caller_overrides_shape_the_lead_trace_only() {
    let receiver = Receiver::start(Behaviour::Ok).await;
    let (exporter, _) = exporter(ExporterConfig::otlp(
        &format!("{}/v1/traces", receiver.base),
        vec![("x-team".into(), "agents".into())],
    ));
    let h = harness(Some(Arc::new(exporter.clone()))).await;
    let parent =
        TraceParent::from_hex("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7").unwrap();
    let trace = TraceRequest {
        parent: Some(parent),
        overrides: TraceOverrides {
            session_id: Some("caller-session".into()),
            user_id: Some("caller-user".into()),
            trace_name: Some("nightly-report".into()),
            tags: Some(vec!["team:agents".into()]),
        },
    };
    let (result, _) = h
        .run(
            "t-parent",
            "run-2",
            "/task general-purpose Summarise the notes",
            trace,
        )
        .await;
    assert_eq!(result.status, RunStatus::Success, "{:?}", result.error);
    exporter.flush().await;
    let requests = receiver.received();
    assert!(
        requests
            .iter()
            .all(|r| r.path == "/v1/traces" && r.headers["x-team"] == "agents")
    );
    assert!(
        requests
            .iter()
            .all(|r| !r.headers.contains_key("authorization"))
    );

    let spans = spans_of(&receiver);
    let (lead, sub): (Vec<&Span>, Vec<&Span>) = spans
        .iter()
        .partition(|s| s.trace_id == parent.trace_id.to_vec());
    assert!(!lead.is_empty() && !sub.is_empty());
    let root = lead
        .iter()
        .find(|s| s.name == "invoke_agent lead_agent")
        .unwrap();
    assert_eq!(
        root.parent_span_id,
        parent.span_id.to_vec(),
        "adopts the parent span"
    );
    for span in &lead {
        assert_eq!(text(span, "langfuse.session.id"), "caller-session");
        assert_eq!(text(span, "langfuse.user.id"), "caller-user");
        assert_eq!(text(span, "langfuse.trace.name"), "nightly-report");
        assert_eq!(strings(span, "langfuse.trace.tags"), ["team:agents"]);
    }
    for span in &sub {
        assert_ne!(span.trace_id, parent.trace_id.to_vec());
        assert_eq!(text(span, "langfuse.session.id"), "t-parent");
        assert_eq!(text(span, "langfuse.user.id"), "u1");
        assert_eq!(
            text(span, "langfuse.trace.name"),
            "subagent:general-purpose"
        );
        assert_eq!(
            strings(span, "langfuse.trace.tags"),
            ["env:test", "model:scripted"]
        );
    }
}

#[tokio::test]
async fn a_hanging_receiver_neither_slows_nor_stops_a_run_and_its_spans_are_counted_as_dropped() {
    // The same demo run with export off, for the comparison.
    let off = harness(None).await;
    let started = Instant::now();
    let (baseline, baseline_outputs) = off
        .run("t-off", "run-off", DEMO_PROMPT, TraceRequest::default())
        .await;
    let baseline_time = started.elapsed();
    assert_eq!(baseline.status, RunStatus::Success);

    let receiver = Receiver::start(Behaviour::Hang).await;
    let mut config = ExporterConfig::otlp(&format!("{}/v1/traces", receiver.base), Vec::new());
    // A tiny queue, and a POST that would wait an hour for the answer.
    config.queue_size = 4;
    config.export_timeout = Duration::from_secs(3600);
    let (exporter, dropped) = exporter(config);
    let offered = Arc::new(CountingSink::default());
    let sinks: Vec<Arc<dyn SpanSink>> = vec![Arc::new(exporter.clone()), offered.clone()];
    let on = harness(Some(Arc::new(FanOut(sinks)))).await;

    // One span goes out in a POST that never returns: the exporter is stuck from here on.
    exporter.export(synthetic_spans(1).remove(0));
    receiver.wait_for_request().await;
    assert_eq!(dropped.get(), 0, "nothing was waiting yet");

    // With the exporter stuck, the run fills the queue and the rest is dropped.
    let started = Instant::now();
    let (second, outputs) = tokio::time::timeout(
        Duration::from_secs(120),
        on.run("t-on", "run-on", DEMO_PROMPT, TraceRequest::default()),
    )
    .await
    .expect("export never holds a run up");
    let export_time = started.elapsed();
    assert_eq!(second.status, RunStatus::Success, "{:?}", second.error);
    assert_eq!(
        step_counts(&outputs),
        step_counts(&baseline_outputs),
        "the same steps as with export off"
    );
    let offered_second = offered.0.load(Ordering::SeqCst) as u64;
    assert!(offered_second > 4);
    assert_eq!(
        dropped.get(),
        offered_second - 4,
        "all but a queue's worth dropped and counted"
    );
    // Generous on purpose: a run waiting on the receiver would take an hour.
    assert!(
        export_time < baseline_time * 10 + Duration::from_secs(5),
        "{export_time:?} against {baseline_time:?} with export off"
    );
}

fn synthetic_spans(count: usize) -> Vec<SpanData> {
    (0..count)
        .map(|i| SpanData {
            trace_id: [1; 16],
            span_id: [i as u8 + 1; 8],
            parent_span_id: None,
            name: format!("execute_tool t{i}"),
            kind: SpanKind::Internal,
            start: SystemTime::now(),
            end: SystemTime::now(),
            attributes: Vec::new(),
            links: Vec::new(),
            status: SpanStatus::Unset,
        })
        .collect()
}

#[tokio::test]
async fn a_failing_receiver_costs_the_spans_of_each_failed_post_and_nothing_else() {
    let receiver = Receiver::start(Behaviour::Fail).await;
    let (exporter, dropped) = exporter(ExporterConfig::otlp(
        &format!("{}/v1/traces", receiver.base),
        Vec::new(),
    ));
    let offered = Arc::new(CountingSink::default());
    let sinks: Vec<Arc<dyn SpanSink>> = vec![Arc::new(exporter.clone()), offered.clone()];
    let h = harness(Some(Arc::new(FanOut(sinks)))).await;
    let (result, _) = h
        .run("t-500", "run-500", DEMO_PROMPT, TraceRequest::default())
        .await;
    assert_eq!(result.status, RunStatus::Success);
    exporter.flush().await;
    let posted: usize = receiver
        .received()
        .iter()
        .map(|r| r.request.resource_spans[0].scope_spans[0].spans.len())
        .sum();
    let offered = offered.0.load(Ordering::SeqCst);
    assert!(offered > 0);
    assert_eq!(
        posted, offered,
        "every span was attempted once, never retried"
    );
    assert_eq!(
        dropped.get(),
        offered as u64,
        "every refused span is counted"
    );
}

#[tokio::test]
async fn a_post_that_outlives_the_export_timeout_drops_its_batch() {
    let receiver = Receiver::start(Behaviour::Hang).await;
    let mut config = ExporterConfig::otlp(&format!("{}/v1/traces", receiver.base), Vec::new());
    config.export_timeout = Duration::from_millis(300);
    let (exporter, dropped) = exporter(config);
    for span in synthetic_spans(5) {
        exporter.export(span);
    }
    exporter.flush().await;
    assert_eq!(receiver.received().len(), 1);
    assert_eq!(dropped.get(), 5);
}
