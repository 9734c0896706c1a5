//! Telemetry of a subflow process: the Prometheus metrics registry behind
//! `GET /metrics` (docs/operations.md#metrics) and the OTLP/HTTP protobuf span exporter used for
//! Langfuse and generic OTLP receivers (docs/operations.md#langfuse-and-otlp).
//!
//! The runtime produces spans and counts through its `SpanSink` and `RuntimeMetrics`
//! traits; this crate implements them. It never serves HTTP (the gateway serves the
//! metrics text) and never blocks a caller: exports are queued and sent by a background
//! task, and a span that cannot be queued is dropped and counted.

pub mod metrics;
pub mod otlp;

pub use metrics::Metrics;
pub use otlp::{ExporterConfig, OtlpExporter};
