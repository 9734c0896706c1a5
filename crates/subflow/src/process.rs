//! What `serve` and `worker` processes share: the runtime's options from the
//! configuration, the span exporters, the batch worker built from `subagent_batches.*`,
//! the shutdown signal and the orderly stop.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use subflow_batches::{Handle, Options, Worker};
use subflow_models::ChatModel;
use subflow_runtime::observers::ObserverSet;
use subflow_runtime::runtime::{Runtime, RuntimeOptions};
use subflow_store::Store;
use subflow_telemetry::{ExporterConfig, Metrics, OtlpExporter};
use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// The runtime's options as `config` sets them, on `store` with its data in `data_dir`.
pub fn runtime_options(
    config: &Config,
    store: Arc<dyn Store>,
    models: Vec<Arc<dyn ChatModel>>,
    observers: ObserverSet,
    data_dir: &Path,
) -> RuntimeOptions {
    RuntimeOptions {
        config: config.runtime_config(data_dir),
        admission: config.subagent_runtime.clone(),
        observers,
        ..RuntimeOptions::new(store, models, data_dir.to_path_buf())
    }
}

/// Starts the configured span exporters, counting their drops into `metrics`, and
/// returns `runtime` exporting into them.
pub fn with_exporters(
    config: &Config,
    exporters: Vec<ExporterConfig>,
    metrics: &Metrics,
    runtime: Runtime,
) -> anyhow::Result<(Runtime, Vec<OtlpExporter>)> {
    let mut started = Vec::new();
    for exporter in exporters {
        tracing::info!(exporter = %exporter.name, endpoint = %exporter.endpoint, "exporting spans");
        let dropped = metrics.otlp_dropped(&exporter.name);
        started.push(OtlpExporter::spawn(exporter, dropped).context("starting a span exporter")?);
    }
    if started.is_empty() {
        return Ok((runtime, started));
    }
    let sinks = started
        .iter()
        .map(|e| Arc::new(e.clone()) as Arc<dyn subflow_runtime::spans::SpanSink>)
        .collect();
    let runtime = runtime.with_spans(
        Arc::new(subflow_runtime::spans::FanOut(sinks)),
        config.tracing.environment.clone(),
    );
    Ok((runtime, started))
}

/// A batch worker on `store` and `runtime`, as `subagent_batches.*` configures it,
/// counting into `metrics`; not yet running.
pub fn batch_worker(
    config: &Config,
    store: Arc<dyn Store>,
    runtime: Runtime,
    metrics: Arc<Metrics>,
) -> anyhow::Result<Worker> {
    let batches = &config.subagent_batches;
    let mut options = Options::new(store, runtime, hostname());
    options.lease = Duration::from_secs(batches.lease_seconds);
    options.poll_interval = Duration::from_secs_f64(batches.poll_interval_seconds);
    options.max_result_chars = batches.max_result_chars;
    options.result_preview_max_chars = batches.result_preview_max_chars;
    options.metrics = metrics;
    options.build().context("starting the batch worker")
}

/// Spawns `worker` until `shutdown` fires; the task ends at most 5 s later.
pub fn spawn_worker(
    worker: Worker,
    shutdown: CancellationToken,
) -> (Handle, tokio::task::JoinHandle<()>) {
    let handle = worker.handle();
    let task = tokio::spawn(async move {
        if let Err(error) = worker.run(shutdown.cancelled_owned()).await {
            tracing::error!(%error, "the batch worker stopped on an error");
        }
    });
    (handle, task)
}

/// Spills what the retry queue still holds and gives queued spans one last export,
/// bounded by the export timeout.
pub async fn stop(config: &Config, runtime: &Runtime, exporters: &[OtlpExporter]) {
    // Records that could not be written yet are spilled, to be re-applied at the next start.
    runtime.retry_queue().shutdown().await;
    let deadline = Duration::from_secs(config.tracing.export_timeout_seconds + 1);
    for exporter in exporters {
        let _ = tokio::time::timeout(deadline, exporter.flush()).await;
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
