//! What `serve` and `worker` processes share: the store, the runtime with its retry
//! queue, metrics and span exporters, the batch worker built from `subagent_batches.*`,
//! the shutdown signal, and the orderly stop.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use subflow_batches::{Handle, Options, Worker};
use subflow_runtime::admission::Admission;
use subflow_runtime::runtime::{Models, Runtime};
use subflow_store::Store;
use subflow_store::buffer::{RetryPolicy, RetryQueue, StoreCounters};
use subflow_store::spill::SpillFile;
use subflow_telemetry::{Metrics, OtlpExporter};
use tokio_util::sync::CancellationToken;

use crate::config::{Built, Config};
use crate::storage::data_dir;

/// A running process's shared parts.
#[derive(Debug)]
pub struct Process {
    /// The validated configuration.
    pub config: Config,
    /// The store behind the traits.
    pub store: Arc<dyn Store>,
    /// The agent runtime.
    pub runtime: Runtime,
    /// The process's one metrics registry.
    pub metrics: Arc<Metrics>,
    retry: RetryQueue,
    exporters: Vec<OtlpExporter>,
}

impl Process {
    /// Migrates the database, re-applies spilled events and builds the runtime, with
    /// its metrics and span exporters, from `built`.
    pub async fn start(built: Built) -> anyhow::Result<Process> {
        let Built {
            config,
            models,
            observers,
            exporters: exporter_configs,
        } = built;
        let url = config.database.url.clone();
        let backend =
            crate::commands::migrate::open_and_recover(&url, config.database.max_connections)
                .await?;
        let store = backend.store();
        let data_dir = data_dir(&url);
        let counters = Arc::new(StoreCounters::default());
        let retry = RetryQueue::spawn(
            store.clone(),
            Arc::new(SpillFile::in_dir(&data_dir)),
            RetryPolicy::default(),
            counters.clone(),
        );
        // One registry for the process: the runtime, the gateway, the worker and the
        // exporters count into it.
        let metrics = Arc::new(Metrics::new(counters.clone(), observers.counters().clone()));
        let mut runtime = Runtime::new(
            config.runtime_config(&data_dir),
            store.clone(),
            Models::new(models),
            Admission::new(config.subagent_runtime.clone()),
            retry.clone(),
            counters,
        )
        .with_observers(observers)
        .with_metrics(metrics.clone());
        let mut exporters = Vec::new();
        for exporter in exporter_configs {
            tracing::info!(exporter = %exporter.name, endpoint = %exporter.endpoint, "exporting spans");
            let dropped = metrics.otlp_dropped(&exporter.name);
            exporters
                .push(OtlpExporter::spawn(exporter, dropped).context("starting a span exporter")?);
        }
        if !exporters.is_empty() {
            let sinks = exporters
                .iter()
                .map(|e| Arc::new(e.clone()) as Arc<dyn subflow_runtime::spans::SpanSink>)
                .collect();
            runtime = runtime.with_spans(
                Arc::new(subflow_runtime::spans::FanOut(sinks)),
                config.tracing.environment.clone(),
            );
        }
        Ok(Process {
            config,
            store,
            runtime,
            metrics,
            retry,
            exporters,
        })
    }

    /// A batch worker on this process's store and runtime, as `subagent_batches.*`
    /// configures it; not yet running.
    pub fn batch_worker(&self) -> anyhow::Result<Worker> {
        let batches = &self.config.subagent_batches;
        let mut options = Options::new(self.store.clone(), self.runtime.clone(), hostname());
        options.lease = Duration::from_secs(batches.lease_seconds);
        options.poll_interval = Duration::from_secs_f64(batches.poll_interval_seconds);
        options.max_result_chars = batches.max_result_chars;
        options.result_preview_max_chars = batches.result_preview_max_chars;
        options.metrics = self.metrics.clone();
        options.build().context("starting the batch worker")
    }

    /// Spawns `worker` until `shutdown` fires; the task ends at most 5 s later.
    pub fn spawn_worker(
        worker: Worker,
        shutdown: CancellationToken,
    ) -> (Handle, tokio::task::JoinHandle<()>) {
        let handle = worker.handle();
        tracing::info!(worker_id = %handle.worker_id(), max_running = handle.max_running(), "batch worker started");
        let task = tokio::spawn(async move {
            if let Err(error) = worker.run(shutdown.cancelled_owned()).await {
                tracing::error!(error = %error, "the batch worker stopped on an error");
            }
        });
        (handle, task)
    }

    /// Spills what the retry queue still holds and gives queued spans one last export.
    pub async fn stop(self) {
        // Records that could not be written yet are spilled, to be re-applied at the next start.
        self.retry.shutdown().await;
        // Spans still queued get one last export, bounded by the export timeout.
        let deadline = Duration::from_secs(self.config.tracing.export_timeout_seconds + 1);
        for exporter in &self.exporters {
            let _ = tokio::time::timeout(deadline, exporter.flush()).await;
        }
    }
}

/// This machine's name for lease owners and the workers table: `$HOSTNAME`, else the
/// kernel's host name, else `localhost`.
fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// A token cancelled on Ctrl-C or SIGTERM.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        cancel.cancel();
    });
    token
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => return interrupt.await.unwrap_or(()),
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
