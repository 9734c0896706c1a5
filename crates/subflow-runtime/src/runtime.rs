//! The runtime's configuration, its shared parts, and a run's context.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use subflow_models::ChatModel;
use subflow_store::Store;
use subflow_store::buffer::{
    BufferPolicy, EventBuffer, EventScope, RetryPolicy, RetryQueue, StoreCounters,
};
use subflow_store::spill::SpillFile;
use tokio_util::sync::CancellationToken;

use crate::admission::{Admission, AdmissionConfig};
use crate::guards::{LoopDetectionConfig, LoopDetector, TokenBudgetConfig};
use crate::journal::Journal;
use crate::metrics::{NoMetrics, RuntimeMetrics};
use crate::observers::{ObserverCounters, ObserverSet};
use crate::output::OutputSink;
use crate::spans::{AgentTrace, SpanSink};
use crate::subagent::SubagentDefinition;
use crate::tools::Workspace;

/// Everything the runtime is configured with (read by the binary, passed in here).
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// `lead.max_turns`.
    pub lead_max_turns: u32,
    /// The lead agent's system prompt.
    pub lead_system_prompt: String,
    /// `subagents.enabled`.
    pub subagents_enabled: bool,
    /// `subagents.max_concurrent`: task calls kept from one response.
    pub max_concurrent: usize,
    /// `subagents.max_total_per_run`.
    pub max_total_per_run: usize,
    /// Subagent definitions, the built-in `general-purpose` included.
    pub definitions: Vec<SubagentDefinition>,
    /// `token_usage.enabled`: lead attribution of subagent usage (docs/events.md#attribution).
    pub token_usage_enabled: bool,
    /// `run_events.track_token_usage`.
    pub track_token_usage: bool,
    /// `run_events.max_trace_content`, bytes.
    pub max_trace_content: usize,
    /// `run_events.flush_interval_ms`.
    pub flush_interval: Duration,
    /// Where thread workspaces live.
    pub workspace_root: PathBuf,
    /// The supervisor's grace after an executor timeout (docs/events.md#the-safety-net) and the shielded
    /// wait on parent cancellation (docs/events.md#parent-cancellation).
    pub supervision_grace: Duration,
    /// How often usage snapshots of a running run are saved (at most every 5 s).
    pub usage_snapshot_interval: Duration,
    /// `loop_detection.*`.
    pub loop_detection: LoopDetectionConfig,
    /// `token_budget.*`.
    pub token_budget: TokenBudgetConfig,
    /// `subagent_batches.*` as the lead's batch tools apply them.
    pub batches: BatchToolConfig,
}

impl RuntimeConfig {
    /// Defaults of docs/configuration.md#sources with workspaces under `workspace_root`.
    pub fn with_defaults(workspace_root: PathBuf) -> Self {
        RuntimeConfig {
            lead_max_turns: 100,
            lead_system_prompt: "You are the lead agent. Delegate independent pieces of work to subagents with the `task` tool, then answer.".to_owned(),
            subagents_enabled: true,
            max_concurrent: 3,
            max_total_per_run: 6,
            definitions: vec![SubagentDefinition::general_purpose(1800)],
            token_usage_enabled: true,
            track_token_usage: true,
            max_trace_content: 10_240,
            flush_interval: Duration::from_millis(250),
            workspace_root,
            supervision_grace: Duration::from_secs(60),
            usage_snapshot_interval: Duration::from_secs(5),
            loop_detection: LoopDetectionConfig::default(),
            token_budget: TokenBudgetConfig::default(),
            batches: BatchToolConfig::default(),
        }
    }
}

/// The configured models by name; the first is the default.
#[derive(Debug, Clone)]
pub struct Models {
    by_name: HashMap<String, Arc<dyn ChatModel>>,
    default: String,
}

impl Models {
    /// The models, the first being the default. Panics on an empty list: configuration
    /// validation guarantees at least one model.
    pub fn new(models: Vec<Arc<dyn ChatModel>>) -> Self {
        let default = models
            .first()
            .expect("at least one model")
            .info()
            .name
            .clone();
        let by_name = models
            .into_iter()
            .map(|m| (m.info().name.clone(), m))
            .collect();
        Models { by_name, default }
    }

    /// Whether a model of that configured name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// A model by name, else the default.
    pub fn get(&self, name: Option<&str>) -> Arc<dyn ChatModel> {
        name.and_then(|n| self.by_name.get(n))
            .unwrap_or_else(|| &self.by_name[&self.default])
            .clone()
    }
}

/// What a [`Runtime`] is built from, by name; [`RuntimeOptions::build`] is the one place
/// the retry queue is spawned and the parts are wired together.
#[derive(Debug)]
pub struct RuntimeOptions {
    /// The store every run writes to.
    pub store: Arc<dyn Store>,
    /// The configured models, the first being the default.
    pub models: Models,
    /// Where the retry queue's spill file lives (the data directory).
    pub spill_dir: PathBuf,
    /// The runtime configuration; by default docs/configuration.md#sources with workspaces in
    /// `<spill_dir>/workspaces`.
    pub config: RuntimeConfig,
    /// `subagent_runtime.*`.
    pub admission: AdmissionConfig,
    /// How the retry queue retries and when it spills.
    pub retry: RetryPolicy,
    /// Task observers (docs/events.md#observers); none by default.
    pub observers: ObserverSet,
    /// Where spans go (docs/operations.md#langfuse-and-otlp) and the `env:` tag; no export by default.
    pub spans: Option<(Arc<dyn SpanSink>, Option<String>)>,
}

impl RuntimeOptions {
    /// The defaults around `store` and `models`, with the data directory `data_dir`.
    pub fn new(store: Arc<dyn Store>, models: Vec<Arc<dyn ChatModel>>, data_dir: PathBuf) -> Self {
        RuntimeOptions {
            store,
            models: Models::new(models),
            config: RuntimeConfig::with_defaults(data_dir.join("workspaces")),
            spill_dir: data_dir,
            admission: AdmissionConfig::default(),
            retry: RetryPolicy::default(),
            observers: ObserverSet::new(),
            spans: None,
        }
    }

    /// Spawns the retry queue (spilling into `spill_dir`) and wires the runtime; needs a
    /// tokio runtime.
    pub fn build(self) -> Runtime {
        let counters = Arc::new(StoreCounters::default());
        let retry = RetryQueue::spawn(
            self.store.clone(),
            Arc::new(SpillFile::in_dir(&self.spill_dir)),
            self.retry,
            counters.clone(),
        );
        let lead_loops = self.config.loop_detection.enabled.then(|| {
            Arc::new(Mutex::new(LoopDetector::new(
                self.config.loop_detection.clone(),
            )))
        });
        let runtime = Runtime {
            lead_loops,
            config: Arc::new(self.config),
            store: self.store,
            models: self.models,
            admission: Admission::new(self.admission),
            retry,
            counters,
            observers: self.observers,
            spans: None,
            environment: None,
            metrics: Arc::new(NoMetrics),
            budgets: None,
        };
        match self.spans {
            Some((sink, environment)) => runtime.with_spans(sink, environment),
            None => runtime,
        }
    }
}

/// The parts every run shares: store, models, admission slots, retry queue.
#[derive(Debug, Clone)]
pub struct Runtime {
    pub(crate) config: Arc<RuntimeConfig>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) models: Models,
    pub(crate) admission: Admission,
    pub(crate) retry: RetryQueue,
    pub(crate) counters: Arc<StoreCounters>,
    pub(crate) observers: ObserverSet,
    pub(crate) spans: Option<Arc<dyn SpanSink>>,
    pub(crate) environment: Option<String>,
    pub(crate) metrics: Arc<dyn RuntimeMetrics>,
    /// The lead's loop detector, shared by every lead run of this process: its state is
    /// kept per thread across runs, the least recently used thread evicted past
    /// `loop_detection.max_tracked_threads` (docs/events.md#loop-detection). `None` when disabled.
    pub(crate) lead_loops: Option<Arc<Mutex<LoopDetector>>>,
    /// The money budgets runs and batch items are held to, when any is set.
    pub(crate) budgets: Option<Arc<crate::budget::Budgets>>,
}

impl Runtime {
    /// Holds runs and batch items to `budgets` (docs/usage-and-cost.md#budgets); a
    /// configuration that limits nothing holds nothing.
    pub fn with_budgets(mut self, budgets: crate::budget::Budgets) -> Self {
        self.budgets = budgets.config.any().then(|| Arc::new(budgets));
        self
    }

    /// The money budgets in force, if any.
    pub fn budgets(&self) -> Option<&Arc<crate::budget::Budgets>> {
        self.budgets.as_ref()
    }

    /// Records a trace per run and per subagent execution into `sink` (docs/operations.md#langfuse-and-otlp);
    /// `environment` is the `env:` tag (`tracing.environment`).
    pub fn with_spans(mut self, sink: Arc<dyn SpanSink>, environment: Option<String>) -> Self {
        self.spans = Some(sink);
        self.environment = environment;
        self
    }

    /// Counts runs, tasks, tokens and loop detections into `metrics` (docs/operations.md#metrics).
    pub fn with_metrics(mut self, metrics: Arc<dyn RuntimeMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The retry queue; shut it down last, so what it holds is spilled.
    pub fn retry_queue(&self) -> &RetryQueue {
        &self.retry
    }

    /// The event-store counters behind the `subflow_event_store_*` metrics.
    pub fn store_counters(&self) -> &Arc<StoreCounters> {
        &self.counters
    }

    /// The observer call counters behind `subflow_observer_calls_total`.
    pub fn observer_counters(&self) -> &Arc<ObserverCounters> {
        self.observers.counters()
    }

    /// The task observers every later run notifies (docs/events.md#observers).
    pub fn with_observers(mut self, observers: ObserverSet) -> Self {
        self.observers = observers;
        self
    }

    /// Whether a model of that configured name exists.
    pub fn knows_model(&self, name: &str) -> bool {
        self.models.contains(name)
    }

    /// The configured name of the model a run asking for `requested` gets: that model if
    /// it exists, else the default.
    pub fn model_name(&self, requested: Option<&str>) -> String {
        self.models.get(requested).info().name.clone()
    }

    /// The configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// The process-wide admission controller that `task` calls and batch items share.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    pub(crate) fn buffer(&self, scope: &EventScope, policy: BufferPolicy) -> EventBuffer {
        EventBuffer::spawn(
            self.store.clone(),
            scope.clone(),
            policy,
            self.retry.clone(),
            self.counters.clone(),
        )
    }
}

/// One run as its parts see it.
#[derive(Debug)]
pub struct RunContext {
    /// Thread id.
    pub thread_id: String,
    /// Run id.
    pub run_id: String,
    /// The run's trace id (docs/operations.md#trace-ids).
    pub trace_id: String,
    /// The 8-hex delegation id prefixed to task log lines (docs/operations.md#trace-ids).
    pub short_trace: String,
    /// The run's journal.
    pub journal: Journal,
    /// The subagent buffer.
    pub subagent_buffer: EventBuffer,
    /// The live output.
    pub sink: OutputSink,
    /// Cancelled when the run is interrupted or times out.
    pub cancel: CancellationToken,
    /// The run's tasks, each of which can be cancelled alone.
    pub tasks: crate::task_control::TaskControls,
    /// The thread's workspace.
    pub workspace: Workspace,
    /// The lead's effective model name.
    pub model_name: String,
    /// The observers, as they were when the run started.
    pub observers: ObserverSet,
    /// The run owner (`langfuse.user.id`).
    pub user_id: String,
    /// The lead's trace, when spans are exported.
    pub(crate) trace: Option<AgentTrace>,
    /// The first of the run's writes the store refused, if any.
    pub(crate) store_fault: StoreFault,
    /// The run lease's owner its writes are fenced by.
    pub(crate) lease_owner: Option<String>,
    /// What the run has spent against its money budgets, when any is set.
    pub(crate) spend: Option<Arc<crate::budget::SharedSpend>>,
    /// The pricing currency of budget notices.
    pub(crate) currency: String,
    /// Where budget notices queue for the observers, delivered in order by one task.
    pub(crate) budget_notices:
        Option<tokio::sync::mpsc::UnboundedSender<crate::observers::BudgetNotice>>,
}

impl RunContext {
    /// Records money budget crossings as `middleware:budget` events and queues a notice
    /// of each for the observers and webhooks, which hear them in order.
    pub(crate) fn report_budget(&self, events: Vec<crate::budget::BudgetEvent>) {
        for event in events {
            self.journal.budget(event.content());
            let notice = crate::observers::BudgetNotice {
                run_id: self.run_id.clone(),
                thread_id: self.thread_id.clone(),
                user_id: self.user_id.clone(),
                batch_id: None,
                currency: self.currency.clone(),
                event,
            };
            if let Some(notices) = &self.budget_notices {
                let _ = notices.send(notice);
            }
        }
    }

    /// A queue of budget notices and the task that tells `observers` of each in turn;
    /// the task ends once the queue's sender is dropped with the run.
    pub(crate) fn budget_queue(
        observers: &ObserverSet,
    ) -> tokio::sync::mpsc::UnboundedSender<crate::observers::BudgetNotice> {
        let (sender, mut queue) = tokio::sync::mpsc::unbounded_channel();
        let observers = observers.clone();
        tokio::spawn(async move {
            while let Some(notice) = queue.recv().await {
                observers.notify_budget(&notice).await;
            }
        });
        sender
    }
}

/// The first write of a run that the store refused: a run that lost writes ends `error`
/// with `store_unavailable`, once the store takes its final writes.
#[derive(Debug, Default)]
pub(crate) struct StoreFault(std::sync::Mutex<Option<String>>);

impl StoreFault {
    /// Notes a refused write of `what`; the first one is kept.
    pub(crate) fn note(&self, what: &str, error: impl std::fmt::Display) {
        let mut first = self.0.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert_with(|| format!("{what}: {error}"));
    }

    /// The first refused write.
    pub(crate) fn first(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The `subagent_batches.*` settings the tools apply (docs/batches.md#configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchToolConfig {
    /// `subagent_batches.enabled`: the lead gets the tools (with `subagents.enabled`).
    pub enabled: bool,
    /// Attempts per item, frozen into each batch.
    pub max_attempts: u32,
    /// Most items in one batch.
    pub max_items_per_batch: usize,
    /// `max_live_items` of a batch that gives none (or 0).
    pub default_max_live_items: u32,
    /// Largest `max_live_items` a batch may ask for.
    pub max_live_items_per_batch: u32,
    /// `max_running_items` of a batch that gives none (or 0).
    pub default_max_running_items: u32,
    /// Largest `max_running_items` a batch may ask for.
    pub max_running_items_per_batch: u32,
}

impl Default for BatchToolConfig {
    fn default() -> Self {
        BatchToolConfig {
            enabled: true,
            max_attempts: 3,
            max_items_per_batch: 5000,
            default_max_live_items: 100,
            max_live_items_per_batch: 1000,
            default_max_running_items: 3,
            max_running_items_per_batch: 64,
        }
    }
}
