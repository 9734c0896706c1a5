//! The one place a gateway is assembled: the runtime from its options (store, retry
//! queue, models, admission), the metrics registry it counts into, the span exporters,
//! the in-process batch worker, and the state the routes share. `subflow serve`, the
//! benchmarks and the tests all build an [`Application`] here and differ only in their
//! [`AppOptions`]; [`Application::run`] serves it until shutdown and then stops the
//! worker, spills what the retry queue holds and flushes the exporters.

use std::sync::Arc;
use std::time::Duration;

use subflow_batches::{AttemptEnd, Worker, WorkerMetrics};
use subflow_contracts::task_result::TokenUsage as TaskUsage;
use subflow_runtime::runtime::{Runtime, RuntimeOptions};
use subflow_store::BatchStore;
use subflow_telemetry::{ExporterConfig, Metrics, OtlpExporter};
use tokio_util::sync::CancellationToken;

use crate::server::ConnectionTimeouts;
use crate::stream::{StreamConfig, Streams};
use subflow_runtime::budget::BudgetsConfig;

use crate::usage::{ModelFacts, priced};
use crate::{ActiveRuns, AppState, AuthMode, BatchFeatures, ModelListing, usage};

/// What a gateway is built from, by name; [`AppOptions::new`] has the defaults of docs/configuration.md#sources.
#[derive(Debug)]
pub struct AppOptions {
    /// The runtime's parts; its store is the gateway's too.
    pub runtime: RuntimeOptions,
    /// `/api/models` entries.
    pub models: Vec<ModelListing>,
    /// Context windows and prices of the configured models, the default first; none by
    /// default.
    pub model_facts: Vec<usage::ModelFacts>,
    /// `token_usage.enabled`; true by default.
    pub token_usage_enabled: bool,
    /// `runs.timeout_seconds`; one hour by default.
    pub run_timeout: Duration,
    /// `streams.heartbeat_seconds`; 15 s by default.
    pub heartbeat: Duration,
    /// `server.cors_origins`; none by default.
    pub cors_origins: Vec<String>,
    /// `auth.mode`; `local` by default.
    pub auth: AuthMode,
    /// `metrics.enabled`; true by default.
    pub metrics_enabled: bool,
    /// `metrics.public`; false by default (admin-only in token mode).
    pub metrics_public: bool,
    /// `web.enabled`; true by default.
    pub web_enabled: bool,
    /// `streams.retention_seconds` and `runs.lease_seconds`.
    pub streams: StreamConfig,
    /// `subagent_batches.enabled` and `lease_seconds`; enabled, 120 s and no worker in
    /// this process by default (set `AppState::batches.worker` once one is built on the
    /// state's runtime).
    pub batches: BatchFeatures,
    /// `server.idle_timeout_seconds`, `header_timeout_seconds`, `body_timeout_seconds`.
    pub connections: ConnectionTimeouts,
    /// Span exporters to start (Langfuse, OTLP); none by default.
    pub exporters: Vec<ExporterConfig>,
    /// `tracing.environment`, the spans' `env:` tag.
    pub environment: Option<String>,
    /// `tracing.export_timeout_seconds`: how long the last export may take at shutdown.
    pub export_timeout: Duration,
    /// The in-process batch worker, when this gateway runs one; none by default.
    pub worker: Option<WorkerOptions>,
    /// `budgets.*`: money budgets, priced at `model_facts`; none by default.
    pub budgets: BudgetsConfig,
}

/// How the in-process batch worker runs (`subagent_batches.*`); it works on the
/// gateway's store and runtime and counts into its metrics.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// This machine's name, the first part of every `lease_owner`.
    pub hostname: String,
    /// `lease_seconds`.
    pub lease: Duration,
    /// `poll_interval_seconds`.
    pub poll_interval: Duration,
    /// `max_result_chars`.
    pub max_result_chars: usize,
    /// `result_preview_max_chars`.
    pub result_preview_max_chars: usize,
}

/// The worker's metrics: the registry's, with each execution's usage priced into
/// `subflow_cost_total` by the one price function.
#[derive(Debug)]
struct PricedWorkerMetrics {
    metrics: Arc<Metrics>,
    models: Vec<ModelFacts>,
}

impl WorkerMetrics for PricedWorkerMetrics {
    fn lease_expirations(&self, count: u64) {
        self.metrics.lease_expirations(count);
    }

    fn attempt_finished(&self, agent: &str, end: AttemptEnd, duration: Duration) {
        self.metrics.attempt_finished(agent, end, duration);
    }

    fn execution_usage(&self, model: &str, usage: &TaskUsage) {
        // Labelled by the provider's model id, as runs' costs are.
        let label = self
            .models
            .iter()
            .find(|facts| facts.name == model)
            .map_or(model, |facts| facts.model.as_str());
        if let Some((model, currency, amount)) = priced(&self.models, label, &usage.tokens()) {
            self.metrics.add_cost(&model, &currency, amount);
        }
    }
}

impl WorkerOptions {
    /// A worker with these options on `store` and `runtime`, counting into `metrics` and
    /// pricing what its items spend at `models`' prices; not yet running.
    pub fn worker(
        self,
        store: Arc<dyn BatchStore>,
        runtime: Runtime,
        metrics: Arc<Metrics>,
        models: Vec<ModelFacts>,
    ) -> Result<Worker, subflow_batches::Error> {
        let mut options = subflow_batches::Options::new(store, runtime, self.hostname);
        options.lease = self.lease;
        options.poll_interval = self.poll_interval;
        options.max_result_chars = self.max_result_chars;
        options.result_preview_max_chars = self.result_preview_max_chars;
        options.metrics = Arc::new(PricedWorkerMetrics { metrics, models });
        options.build()
    }
}

/// Why a gateway could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A span exporter could not start.
    #[error("starting a span exporter: {0}")]
    Exporter(#[from] subflow_telemetry::otlp::Error),
    /// The batch worker's options are out of range.
    #[error("starting the batch worker: {0}")]
    Worker(#[from] subflow_batches::Error),
}

/// A gateway ready to serve: its state, exporters and (not yet running) batch worker.
#[derive(Debug)]
pub struct Application {
    state: AppState,
    exporters: Vec<OtlpExporter>,
    export_timeout: Duration,
    worker: Option<Worker>,
}

impl AppOptions {
    /// The defaults around a runtime's options and the `/api/models` listing.
    pub fn new(runtime: RuntimeOptions, models: Vec<ModelListing>) -> Self {
        AppOptions {
            runtime,
            models,
            model_facts: Vec::new(),
            token_usage_enabled: true,
            run_timeout: Duration::from_secs(3600),
            heartbeat: Duration::from_secs(15),
            cors_origins: Vec::new(),
            auth: AuthMode::Local,
            metrics_enabled: true,
            metrics_public: false,
            web_enabled: true,
            streams: StreamConfig::default(),
            batches: BatchFeatures::default(),
            connections: ConnectionTimeouts::default(),
            exporters: Vec::new(),
            environment: None,
            export_timeout: Duration::from_secs(10),
            worker: None,
            budgets: BudgetsConfig::default(),
        }
    }

    /// Builds the runtime (spawning its retry queue, so it needs a tokio runtime), a
    /// fresh metrics registry it counts into, the span exporters it sends to and the batch
    /// worker, whose handle the state holds.
    pub fn build(self) -> Result<Application, BuildError> {
        let store = self.runtime.store.clone();
        let runtime = self.runtime.build().with_budgets(crate::budgets::budgets(
            self.budgets,
            store.clone(),
            &self.model_facts,
        ));
        let metrics = Arc::new(Metrics::new(
            runtime.store_counters().clone(),
            runtime.observer_counters().clone(),
        ));
        let (runtime, exporters) = subflow_telemetry::export_spans(
            runtime.with_metrics(metrics.clone()),
            self.exporters,
            &metrics,
            self.environment,
        )?;
        let mut batches = self.batches;
        let worker = match self.worker {
            Some(options) => {
                let worker = options.worker(
                    store.clone(),
                    runtime.clone(),
                    metrics.clone(),
                    self.model_facts.clone(),
                )?;
                batches.worker = Some(worker.handle());
                Some(worker)
            }
            None => None,
        };
        let state = AppState {
            runtime,
            store,
            models: self.models,
            token_usage_enabled: self.token_usage_enabled,
            model_facts: self.model_facts,
            run_timeout: self.run_timeout,
            heartbeat: self.heartbeat,
            active: ActiveRuns::default(),
            cors_origins: self.cors_origins,
            auth: self.auth,
            metrics,
            metrics_enabled: self.metrics_enabled,
            metrics_public: self.metrics_public,
            web_enabled: self.web_enabled,
            streams: Streams::new(self.streams),
            batches,
            connections: self.connections,
        };
        Ok(Application {
            state,
            exporters,
            export_timeout: self.export_timeout,
            worker,
        })
    }
}

impl Application {
    /// What the routes share: store, runtime, metrics, settings.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The batch worker, taken out so a caller can drive it step by step; `run` then
    /// serves without one (its handle stays in the state).
    pub fn take_worker(&mut self) -> Option<Worker> {
        self.worker.take()
    }

    /// Serves on `listener` with the batch worker running until `shutdown` is cancelled
    /// (or serving fails), then stops the worker (within 5 s), spills the records the
    /// retry queue still holds, and gives queued spans one last export.
    pub async fn run(
        self,
        listener: tokio::net::TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        let worker = self.worker.map(|worker| {
            let stop = shutdown.clone().cancelled_owned();
            tokio::spawn(async move {
                if let Err(error) = worker.run(stop).await {
                    tracing::error!(%error, "the batch worker stopped on an error");
                }
            })
        });
        let runtime = self.state.runtime.clone();
        let served = crate::serve(listener, self.state, shutdown.clone().cancelled_owned()).await;
        shutdown.cancel();
        if let Some(worker) = worker {
            let _ = worker.await;
        }
        shut_down(&runtime, &self.exporters, self.export_timeout).await;
        served
    }
}

/// The end of a process that ran `runtime`: records the retry queue still holds are
/// spilled (re-applied at the next start), and queued spans get one last export.
pub async fn shut_down(runtime: &Runtime, exporters: &[OtlpExporter], export_timeout: Duration) {
    runtime.retry_queue().shutdown().await;
    subflow_telemetry::flush_all(exporters, export_timeout).await;
}
