//! A runtime and a store with one thread, batches submitted as `batch_task` would, and
//! a worker over them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use subflow_batches::{AttemptEnd, Options, Step, Worker, WorkerMetrics};
use subflow_models::{ChatModel, ScriptedConfig, ScriptedModel};
use subflow_runtime::admission::AdmissionConfig;
use subflow_runtime::runtime::{Runtime, RuntimeOptions};
use subflow_runtime::subagent::{ExecutionSpec, SubagentDefinition, SubmittedBy};
use subflow_store::MemoryStore;
use subflow_store::batches::{BatchScope, Clock, ManualClock};
use subflow_store::{
    BatchItem, BatchRecord, BatchStore, ItemQuery, NewBatch, NewItem, NewThread, Store,
};
use subflow_store_sqlite::SqliteStore;

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Sqlite,
}

/// Everything a worker test needs.
pub struct Env {
    pub store: Arc<dyn Store>,
    pub runtime: Runtime,
    pub clock: Arc<ManualClock>,
    pub _dir: tempfile::TempDir,
}

/// Records how attempts ended.
#[derive(Debug, Default)]
pub struct Ends(pub Mutex<Vec<AttemptEnd>>);

impl WorkerMetrics for Ends {
    fn attempt_finished(&self, _agent: &str, end: AttemptEnd, _duration: Duration) {
        self.0.lock().unwrap().push(end);
    }
}

impl Ends {
    pub fn seen(&self) -> Vec<AttemptEnd> {
        self.0.lock().unwrap().clone()
    }
}

/// A store on `backend` with thread `t1`, and a runtime whose scripted model follows
/// `rules` for subagents (none: every subagent answers `echo: <prompt>`).
pub async fn env(backend: Backend, rules: Value, admission: AdmissionConfig) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    let store: Arc<dyn Store> = match backend {
        Backend::Memory => Arc::new(MemoryStore::with_clock(dyn_clock)),
        Backend::Sqlite => {
            let url = format!("sqlite://{}", dir.path().join("subflow.db").display());
            Arc::new(
                SqliteStore::open_with_clock(&url, 4, dyn_clock)
                    .await
                    .expect("open SQLite"),
            )
        }
    };
    store
        .create_thread(NewThread {
            thread_id: "t1".into(),
            owner: "u1".into(),
            metadata: Default::default(),
        })
        .await
        .unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(&script, json!({"rules": rules}).to_string()).unwrap();
    let model: Arc<dyn ChatModel> = Arc::new(
        ScriptedModel::new(ScriptedConfig {
            script: Some(script),
            demo_delay_ms: 0,
            ..ScriptedConfig::default()
        })
        .unwrap(),
    );
    let runtime = RuntimeOptions {
        admission,
        ..RuntimeOptions::new(store.clone(), vec![model], dir.path().to_path_buf())
    }
    .build();
    Env {
        store,
        runtime,
        clock,
        _dir: dir,
    }
}

/// The scripted rule every subagent of these tests follows.
pub fn subagent_turns(turns: Value) -> Value {
    json!([{"agent": "subagent:general-purpose", "turns": turns}])
}

impl Env {
    /// The batch store.
    pub fn batches(&self) -> Arc<dyn BatchStore> {
        self.store.clone()
    }

    /// Submits `prompts` as items `item-1…` the way `batch_task` does.
    pub async fn submit(&self, prompts: &[&str], max_attempts: u32, running: u32) -> BatchRecord {
        let spec = ExecutionSpec::new(
            &SubagentDefinition::general_purpose(600),
            "scripted",
            SubmittedBy {
                user_id: "u1".into(),
                thread_id: "t1".into(),
                run_id: Some("r1".into()),
                tool_call_id: Some("call_1".into()),
                trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
            },
        );
        let items = prompts
            .iter()
            .enumerate()
            .map(|(n, prompt)| NewItem {
                item_key: format!("item-{}", n + 1),
                prompt: (*prompt).to_owned(),
                acceptance_criteria: Vec::new(),
            })
            .collect();
        self.store
            .submit_batch(NewBatch {
                thread_id: "t1".into(),
                user_id: "u1".into(),
                run_id: Some("r1".into()),
                tool_call_id: Some("call_1".into()),
                submission_key: format!("r1:call_{}", uuid_like()),
                title: "Test batch".into(),
                subagent_type: "general-purpose".into(),
                max_live_items: 100,
                max_running_items: running,
                max_attempts,
                execution_spec: spec.to_value(),
                items,
            })
            .await
            .unwrap()
            .batch
    }

    /// A worker on this env; `edit` adjusts its options.
    pub fn worker(&self, ends: &Arc<Ends>, edit: impl FnOnce(&mut Options)) -> Worker {
        let mut options = Options::new(self.batches(), self.runtime.clone(), "test-host");
        options.metrics = ends.clone();
        edit(&mut options);
        options.build().unwrap()
    }

    /// The batch now.
    pub async fn batch(&self, id: &str) -> BatchRecord {
        self.store
            .get_batch(&BatchScope::user("u1"), id)
            .await
            .unwrap()
            .unwrap()
    }

    /// Every item of the batch, with its result.
    pub async fn items(&self, id: &str) -> Vec<BatchItem> {
        let scope = BatchScope::user("u1");
        let listed = self
            .store
            .list_items(
                &scope,
                id,
                &ItemQuery {
                    status: None,
                    offset: 0,
                    limit: 500,
                },
            )
            .await
            .unwrap();
        let mut items = Vec::new();
        for item in listed {
            items.push(
                self.store
                    .get_item(&scope, id, &item.id)
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        items
    }
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::SeqCst).to_string()
}

/// Steps `worker` until a pass claims nothing and no execution is left; returns the
/// passes that claimed something.
pub async fn run_until_idle(worker: &mut Worker) -> usize {
    let mut passes = 0;
    loop {
        let step = worker.claim_and_run_once().await.unwrap();
        worker.wait_idle().await;
        match step {
            Step::Pass { claimed: 0, .. } => return passes,
            _ => passes += 1,
        }
    }
}
