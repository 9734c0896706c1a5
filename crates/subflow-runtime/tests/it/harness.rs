//! A runtime over a real store with the scripted model, and helpers to read a run back.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use subflow_contracts::RunEvent;
use subflow_contracts::messages::Message;
use subflow_contracts::{RunStatus, SubagentStatus};
use subflow_models::{ChatModel, ScriptedConfig, ScriptedModel};
use subflow_runtime::metrics::{RuntimeMetrics, TokenCount};
use subflow_runtime::output::{OutputSink, RunOutput};
use subflow_runtime::run::{RunResult, RunSpec};
use subflow_runtime::runtime::{Runtime, RuntimeConfig, RuntimeOptions};
use subflow_store::{EventQuery, MemoryStore, NewRun, Store};
use subflow_store_sqlite::SqliteStore;
use tokio_util::sync::CancellationToken;

/// A runtime and the store behind it.
pub struct Harness {
    pub runtime: Runtime,
    pub store: Arc<dyn Store>,
    pub _dir: tempfile::TempDir,
}

/// A SQLite file in a temp dir.
pub async fn sqlite_store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    let url = format!("sqlite://{}", dir.path().join("subflow.db").display());
    Arc::new(SqliteStore::open(&url, 4).await.expect("open SQLite"))
}

/// The scripted model with no pacing.
pub fn scripted(script: Option<std::path::PathBuf>) -> Arc<dyn ChatModel> {
    let config = ScriptedConfig {
        script,
        demo_delay_ms: 0,
        ..ScriptedConfig::default()
    };
    Arc::new(ScriptedModel::new(config).expect("scripted model"))
}

/// A runtime over `store`, configured by `tweak`.
pub fn harness(
    store: Arc<dyn Store>,
    dir: tempfile::TempDir,
    models: Vec<Arc<dyn ChatModel>>,
    tweak: impl FnOnce(&mut RuntimeConfig),
) -> Harness {
    let mut options = RuntimeOptions::new(store.clone(), models, dir.path().to_path_buf());
    tweak(&mut options.config);
    let runtime = options.build();
    Harness {
        runtime,
        store,
        _dir: dir,
    }
}

impl Harness {
    /// Creates the run record and runs `prompt` on thread `thread`, collecting the output.
    pub async fn run(
        &self,
        thread: &str,
        run_id: &str,
        prompt: &str,
    ) -> (RunResult, Vec<RunOutput>) {
        self.run_spec(thread, run_id, prompt, |_| {}).await
    }

    /// Like [`Harness::run`], interrupted when `cancel` fires.
    pub async fn run_with_cancel(
        &self,
        thread: &str,
        run_id: &str,
        prompt: &str,
        cancel: CancellationToken,
    ) -> (RunResult, Vec<RunOutput>) {
        self.run_spec(thread, run_id, prompt, |spec| spec.cancel = cancel)
            .await
    }

    /// Like [`Harness::run`], with the run spec adjusted by `tweak`.
    pub async fn run_spec(
        &self,
        thread: &str,
        run_id: &str,
        prompt: &str,
        tweak: impl FnOnce(&mut RunSpec),
    ) -> (RunResult, Vec<RunOutput>) {
        self.store
            .create_run(NewRun {
                run_id: run_id.into(),
                thread_id: thread.into(),
                owner: "u1".into(),
                assistant_id: "lead_agent".into(),
                model_name: None,
                trace_id: Some("0af7651916cd43dd8448eb211c80319c".into()),
                metadata: Default::default(),
                multitask_strategy: "reject".into(),
                kwargs: serde_json::json!({}),
            })
            .await
            .expect("create run");
        let (sink, mut rx) = OutputSink::channel();
        let mut spec = RunSpec {
            lease_owner: None,
            thread_id: thread.into(),
            run_id: run_id.into(),
            user_id: Some("u1".into()),
            model_name: None,
            input: vec![Message::human(prompt)],
            trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
            delegation_trace: None,
            cancel: CancellationToken::new(),
            tasks: Default::default(),
            timeout: Duration::from_secs(600),
            trace: Default::default(),
        };
        tweak(&mut spec);
        let result = self.runtime.run(spec, sink).await;
        let mut outputs = Vec::new();
        while let Ok(item) = rx.try_recv() {
            outputs.push(item);
        }
        (result, outputs)
    }

    /// Every persisted event of a run.
    pub async fn events(&self, thread: &str, run_id: &str) -> Vec<RunEvent> {
        let mut query = EventQuery::run(thread, run_id);
        query.limit = 2000;
        self.store.list_events(&query).await.expect("list events")
    }
}

/// The `custom` payloads of a run's output.
pub fn custom_payloads(outputs: &[RunOutput]) -> Vec<serde_json::Value> {
    outputs
        .iter()
        .filter_map(|o| match o {
            RunOutput::Custom { event, .. } => Some(event.to_value()),
            _ => None,
        })
        .collect()
}

/// A harness whose scripted model follows `rules` (docs/configuration.md#models script format).
pub fn scripted_harness(rules: Value, tweak: impl FnOnce(&mut RuntimeConfig)) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.json");
    std::fs::write(&path, json!({"rules": rules}).to_string()).unwrap();
    harness(
        Arc::new(MemoryStore::new()),
        dir,
        vec![scripted(Some(path))],
        tweak,
    )
}

/// Records what the runtime counts.
#[derive(Debug, Default)]
pub struct Recorded {
    pub loops: std::sync::Mutex<Vec<(String, String, bool)>>,
    pub tasks: std::sync::Mutex<Vec<(String, SubagentStatus)>>,
    pub runs: std::sync::Mutex<Vec<RunStatus>>,
    pub tokens: std::sync::Mutex<Vec<(String, String, u64)>>,
}

impl RuntimeMetrics for Recorded {
    fn tokens(&self, usage: &TokenCount<'_>) {
        let entry = (usage.caller.to_owned(), usage.agent.to_owned(), usage.input);
        self.tokens.lock().unwrap().push(entry);
    }
    fn subagent_task(&self, agent: &str, status: SubagentStatus, _duration: Duration) {
        self.tasks.lock().unwrap().push((agent.to_owned(), status));
    }
    fn run_finished(&self, status: RunStatus, _duration: Duration) {
        self.runs.lock().unwrap().push(status);
    }
    fn loop_detection(&self, layer: &str, action: &str, is_subagent: bool) {
        let entry = (layer.to_owned(), action.to_owned(), is_subagent);
        self.loops.lock().unwrap().push(entry);
    }
}
