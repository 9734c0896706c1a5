//! The span exporter against local OTLP receivers: the demo run's traces decoded from
//! the real protobuf, and receivers that hang or fail.

mod export;
mod receiver;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use subflow_contracts::messages::Message;
use subflow_contracts::task_events::TaskEvent;
use subflow_models::{ChatModel, ScriptedConfig, ScriptedModel};
use subflow_runtime::output::{OutputSink, RunOutput};
use subflow_runtime::run::{RunResult, RunSpec};
use subflow_runtime::runtime::{Runtime, RuntimeOptions};
use subflow_runtime::spans::{SpanData, SpanSink, TraceRequest};
use subflow_store::{NewRun, Store};
use tokio_util::sync::CancellationToken;

/// A runtime over a SQLite file with the scripted model (no script: the demo plan).
#[allow(missing_debug_implementations)]
pub struct Harness {
    pub runtime: Runtime,
    pub store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

/// The run's trace id in these tests (docs/operations.md#trace-ids), i.e. `deerflow_trace_id`.
pub const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

/// A runtime that exports spans into `sink` (none when `None`), with `env:test` tags.
pub async fn harness(sink: Option<Arc<dyn SpanSink>>) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("subflow.db").display());
    let store: Arc<dyn Store> = Arc::new(
        subflow_store_sqlite::SqliteStore::open(&url, 4)
            .await
            .unwrap(),
    );
    let model: Arc<dyn ChatModel> = Arc::new(
        ScriptedModel::new(ScriptedConfig {
            demo_delay_ms: 0,
            ..ScriptedConfig::default()
        })
        .unwrap(),
    );
    let runtime = RuntimeOptions {
        spans: sink.map(|sink| (sink, Some("test".to_owned()))),
        ..RuntimeOptions::new(store.clone(), vec![model], dir.path().to_path_buf())
    }
    .build();
    Harness {
        runtime,
        store,
        _dir: dir,
    }
}

impl Harness {
    /// Runs `prompt` on `thread` as user `u1`; returns the result and its output.
    pub async fn run(
        &self,
        thread: &str,
        run_id: &str,
        prompt: &str,
        trace: TraceRequest,
    ) -> (RunResult, Vec<RunOutput>) {
        self.store
            .create_run(NewRun {
                run_id: run_id.into(),
                thread_id: thread.into(),
                owner: "u1".into(),
                assistant_id: "lead_agent".into(),
                model_name: None,
                trace_id: Some(TRACE_ID.into()),
                metadata: Default::default(),
                multitask_strategy: "reject".into(),
                kwargs: serde_json::json!({}),
            })
            .await
            .unwrap();
        let (sink, mut rx) = OutputSink::channel();
        let spec = RunSpec {
            lease_owner: None,
            thread_id: thread.into(),
            run_id: run_id.into(),
            user_id: Some("u1".into()),
            model_name: None,
            input: vec![Message::human(prompt)],
            trace_id: TRACE_ID.into(),
            delegation_trace: None,
            cancel: CancellationToken::new(),
            tasks: Default::default(),
            timeout: Duration::from_secs(600),
            trace,
        };
        let result = self.runtime.run(spec, sink).await;
        let mut outputs = Vec::new();
        while let Ok(item) = rx.try_recv() {
            outputs.push(item);
        }
        (result, outputs)
    }
}

/// Counts the spans handed to it (to know how many an exporter was offered).
#[derive(Debug, Default)]
pub struct CountingSink(pub AtomicUsize);

impl SpanSink for CountingSink {
    fn export(&self, _span: SpanData) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The run's observable steps: `task_running` events and streamed messages, by kind.
pub fn step_counts(outputs: &[RunOutput]) -> (usize, usize, usize) {
    let mut counts = (0, 0, 0);
    for output in outputs {
        match output {
            RunOutput::Custom {
                event: TaskEvent::Running { .. },
                ..
            } => counts.0 += 1,
            RunOutput::Message { node: "tools", .. } => counts.1 += 1,
            RunOutput::Values { .. } => counts.2 += 1,
            _ => {}
        }
    }
    counts
}
