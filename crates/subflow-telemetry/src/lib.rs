//! Telemetry of a subflow process: the Prometheus metrics registry behind
//! `GET /metrics` (docs/operations.md#metrics) and the OTLP/HTTP protobuf span exporter used for
//! Langfuse and generic OTLP receivers (docs/operations.md#langfuse-and-otlp).
//!
//! The runtime produces spans and counts through its `SpanSink` and `RuntimeMetrics`
//! traits; this crate implements them. It never serves HTTP (the gateway serves the
//! metrics text) and never blocks a caller: exports are queued and sent by a background
//! task, and a span that cannot be queued is dropped and counted.
//!
//! # Map
//!
//! Implements those two traits. `otlp` is the span exporter: `OtlpExporter::export` only
//! `try_send`s into a bounded queue; a background task batches it (512 spans or 500 ms),
//! encodes `ExportTraceServiceRequest` with the generated `opentelemetry-proto` messages
//! and POSTs it with reqwest under the export timeout; refusals, failures and timeouts
//! are counted as dropped, never retried. `metrics` is the process's `prometheus-client`
//! registry, encoded as Prometheus text 0.0.4; the event-store and observer families are
//! collectors read at scrape time, the batch gauges encode the last database read
//! (`set_batch_gauges`, refreshed by `/metrics` when older than 5 s), and `Metrics`
//! implements the worker's `WorkerMetrics` (lease expirations).

pub mod metrics;
pub mod otlp;

pub use metrics::Metrics;
pub use otlp::{ExporterConfig, OtlpExporter};

use std::sync::Arc;
use std::time::Duration;

use subflow_runtime::runtime::Runtime;
use subflow_runtime::spans::{FanOut, SpanSink};

/// Starts `exporters`, counting their dropped spans into `metrics`, and returns `runtime`
/// sending its spans to all of them (tagged `env:<environment>`), with the exporters to
/// flush at the end ([`flush_all`]).
pub fn export_spans(
    runtime: Runtime,
    exporters: Vec<ExporterConfig>,
    metrics: &Metrics,
    environment: Option<String>,
) -> Result<(Runtime, Vec<OtlpExporter>), otlp::Error> {
    let mut started = Vec::with_capacity(exporters.len());
    for exporter in exporters {
        tracing::info!(exporter = %exporter.name, endpoint = %exporter.endpoint, "exporting spans");
        let dropped = metrics.otlp_dropped(&exporter.name);
        started.push(OtlpExporter::spawn(exporter, dropped)?);
    }
    if started.is_empty() {
        return Ok((runtime, started));
    }
    let sinks = started
        .iter()
        .map(|e| Arc::new(e.clone()) as Arc<dyn SpanSink>)
        .collect();
    Ok((
        runtime.with_spans(Arc::new(FanOut(sinks)), environment),
        started,
    ))
}

/// Gives the spans still queued one last export each, bounded by `export_timeout` and a
/// second.
pub async fn flush_all(exporters: &[OtlpExporter], export_timeout: Duration) {
    let deadline = export_timeout + Duration::from_secs(1);
    for exporter in exporters {
        let _ = tokio::time::timeout(deadline, exporter.flush()).await;
    }
}
