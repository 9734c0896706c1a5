//! The Prometheus metrics of one process (docs/operations.md#metrics), in the text exposition format
//! 0.0.4 encoded by `prometheus-client`.
//!
//! Counters and histograms that something increments live in the registry; the event
//! store and observer counts already kept elsewhere ([`StoreCounters`],
//! [`ObserverCounters`]) are read at scrape time by collectors. The batch gauges are
//! global, read from the database by whoever serves `/metrics` into a snapshot kept here
//! ([`Metrics::set_batch_gauges`], refreshed when older than [`BATCH_GAUGE_MAX_AGE`]);
//! the batch worker counts lease expirations through [`WorkerMetrics`]. Every family is registered from the first
//! scrape; a family whose labels are only known once something is counted (tokens,
//! cost, tasks, runs, HTTP requests) has no samples, and so no lines, until then.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use subflow_batches::WorkerMetrics;
use subflow_contracts::{RunStatus, SubagentStatus};
use subflow_runtime::guards::DetectionLayer;
use subflow_runtime::metrics::{RuntimeMetrics, TokenCount};
use subflow_runtime::observers::ObserverCounters;
use subflow_store::BatchTotals;
use subflow_store::buffer::{BufferKind, StoreCounters};

/// The `Content-Type` of `GET /metrics`.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A label set: fixed label names with their values.
type Labels<const N: usize> = [(&'static str, String); N];
type HistogramFamily<const N: usize> = Family<Labels<N>, Histogram, fn() -> Histogram>;

/// Upper bounds of the duration histograms, in seconds: from a quick echo to the
/// one-hour run timeout.
const DURATION_BUCKETS: [f64; 12] = [
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0,
];

/// The batch gauges are read from the database at most this often (docs/operations.md#metrics).
pub const BATCH_GAUGE_MAX_AGE: Duration = Duration::from_secs(5);

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The registry and the handles the runtime and the gateway count into.
pub struct Metrics {
    registry: Registry,
    tokens: Family<Labels<4>, Counter>,
    cost: Family<Labels<2>, Counter<f64, AtomicU64>>,
    subagent_tasks: Family<Labels<2>, Counter>,
    subagent_duration: HistogramFamily<2>,
    runs: Family<Labels<1>, Counter>,
    run_duration: HistogramFamily<1>,
    loop_detection: Family<Labels<3>, Counter>,
    otlp_dropped: Family<Labels<1>, Counter>,
    sse_streams: Gauge,
    http_requests: Family<Labels<3>, Counter>,
    lease_expirations: Counter,
    budget_spent: Family<Labels<1>, Gauge<f64, AtomicU64>>,
    batch_gauges: Arc<Mutex<BatchGaugeSnapshot>>,
}

/// The last database read behind `subflow_batches`, `subflow_batch_items` and
/// `subflow_batch_workers`.
#[derive(Debug, Default)]
struct BatchGaugeSnapshot {
    read_at: Option<Instant>,
    totals: BatchTotals,
    workers: u64,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A registry with every docs/operations.md#metrics family, reading the buffer counts from `store`
    /// and the observer call counts from `observers` at scrape time.
    pub fn new(store: Arc<StoreCounters>, observers: Arc<ObserverCounters>) -> Self {
        let mut registry = Registry::default();
        let tokens = Family::default();
        registry.register(
            "subflow_tokens",
            "Tokens used by model calls, by caller kind, agent, model and kind (input includes cached input)",
            tokens.clone(),
        );
        let cost = Family::default();
        registry.register(
            "subflow_cost",
            "Cost of finished runs by model at the configured prices",
            cost.clone(),
        );
        let subagent_tasks = Family::default();
        registry.register(
            "subflow_subagent_tasks",
            "Subagent executions by agent and terminal status",
            subagent_tasks.clone(),
        );
        let subagent_duration: HistogramFamily<2> =
            Family::new_with_constructor(duration_histogram);
        registry.register(
            "subflow_subagent_duration_seconds",
            "Wall-clock time of subagent executions by agent and terminal status",
            subagent_duration.clone(),
        );
        let runs = Family::default();
        registry.register("subflow_runs", "Lead runs by final status", runs.clone());
        let run_duration: HistogramFamily<1> = Family::new_with_constructor(duration_histogram);
        registry.register(
            "subflow_run_duration_seconds",
            "Wall-clock time of lead runs by final status",
            run_duration.clone(),
        );
        let loop_detection: Family<Labels<3>, Counter> = Family::default();
        // Every combination exists from the start, so rates and alerts see a 0 first.
        for layer in [
            DetectionLayer::IdenticalCallSet,
            DetectionLayer::ToolFrequency,
        ] {
            for action in ["warn", "hard_stop"] {
                for is_subagent in [false, true] {
                    let _ = loop_detection.get_or_create(&[
                        ("layer", layer.as_str().to_owned()),
                        ("action", action.to_owned()),
                        ("is_subagent", is_subagent.to_string()),
                    ]);
                }
            }
        }
        registry.register(
            "subflow_loop_detection",
            "Loop-detection warnings and hard stops by layer, action and whether a subagent looped",
            loop_detection.clone(),
        );
        let otlp_dropped = Family::default();
        registry.register(
            "subflow_otlp_spans_dropped",
            "Spans dropped by an exporter: queue full, export failed or timed out",
            otlp_dropped.clone(),
        );
        let sse_streams = Gauge::default();
        registry.register(
            "subflow_sse_streams",
            "SSE streams open now",
            sse_streams.clone(),
        );
        let http_requests = Family::default();
        registry.register(
            "subflow_http_requests",
            "HTTP requests by route template, method and status code",
            http_requests.clone(),
        );
        let lease_expirations = Counter::default();
        registry.register(
            "subflow_batch_lease_expirations",
            "Batch item leases this process's worker found expired and recovered",
            lease_expirations.clone(),
        );
        let budget_spent = Family::default();
        registry.register(
            "subflow_budget_spent_ratio",
            "Spend over limit of the money budget last charged, by scope (run, thread, user_daily, batch)",
            budget_spent.clone(),
        );
        registry.register_collector(Box::new(ScrapedCounts { store, observers }));
        let batch_gauges = Arc::new(Mutex::new(BatchGaugeSnapshot::default()));
        registry.register_collector(Box::new(BatchGauges(batch_gauges.clone())));
        Metrics {
            registry,
            tokens,
            cost,
            subagent_tasks,
            subagent_duration,
            runs,
            run_duration,
            loop_detection,
            otlp_dropped,
            sse_streams,
            http_requests,
            lease_expirations,
            budget_spent,
            batch_gauges,
        }
    }

    fn gauges(&self) -> std::sync::MutexGuard<'_, BatchGaugeSnapshot> {
        self.batch_gauges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the batch gauges were read from the database within `max_age`.
    pub fn batch_gauges_fresh(&self, max_age: Duration) -> bool {
        self.gauges()
            .read_at
            .is_some_and(|at| at.elapsed() < max_age)
    }

    /// Sets the batch gauges to what the database holds now: batches and items by
    /// status, and the workers whose heartbeat is live.
    pub fn set_batch_gauges(&self, totals: BatchTotals, workers: u64) {
        *self.gauges() = BatchGaugeSnapshot {
            read_at: Some(Instant::now()),
            totals,
            workers,
        };
    }

    /// A registry whose scraped counts are all zero (tests and tools).
    pub fn standalone() -> Self {
        Metrics::new(Arc::default(), Arc::default())
    }

    /// The text exposition of every family.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry);
        text
    }

    /// Adds to `subflow_cost_total{model, currency}`.
    pub fn add_cost(&self, model: &str, currency: &str, amount: f64) {
        if amount.is_finite() && amount > 0.0 {
            self.cost
                .get_or_create(&[
                    ("model", model.to_owned()),
                    ("currency", currency.to_owned()),
                ])
                .inc_by(amount);
        }
    }

    /// Counts one answered request in `subflow_http_requests_total`.
    pub fn http_request(&self, route: &str, method: &str, code: u16) {
        self.http_requests
            .get_or_create(&[
                ("route", route.to_owned()),
                ("method", method.to_owned()),
                ("code", code.to_string()),
            ])
            .inc();
    }

    /// Counts an SSE stream as open until the returned guard is dropped.
    pub fn sse_stream(&self) -> SseStreamGuard {
        self.sse_streams.inc();
        SseStreamGuard(self.sse_streams.clone())
    }

    /// The `subflow_otlp_spans_dropped_total{exporter}` counter of one exporter.
    pub fn otlp_dropped(&self, exporter: &str) -> Counter {
        self.otlp_dropped
            .get_or_create(&[("exporter", exporter.to_owned())])
            .clone()
    }
}

impl RuntimeMetrics for Metrics {
    fn budget_spent(&self, scope: &str, ratio: f64) {
        self.budget_spent
            .get_or_create(&[("scope", scope.to_owned())])
            .set(ratio);
    }

    fn tokens(&self, usage: &TokenCount<'_>) {
        for (kind, count) in [
            ("input", usage.input),
            ("output", usage.output),
            ("cache_read", usage.cache_read),
        ] {
            if count > 0 {
                self.tokens
                    .get_or_create(&[
                        ("caller", usage.caller.to_owned()),
                        ("agent", usage.agent.to_owned()),
                        ("model", usage.model.to_owned()),
                        ("kind", kind.to_owned()),
                    ])
                    .inc_by(count);
            }
        }
    }

    fn subagent_task(&self, agent: &str, status: SubagentStatus, duration: Duration) {
        let labels = [
            ("agent", agent.to_owned()),
            ("status", status.as_str().to_owned()),
        ];
        self.subagent_tasks.get_or_create(&labels).inc();
        self.subagent_duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
    }

    fn run_finished(&self, status: RunStatus, duration: Duration) {
        let labels = [("status", status.as_str().to_owned())];
        self.runs.get_or_create(&labels).inc();
        self.run_duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
    }

    fn loop_detection(&self, layer: &str, action: &str, is_subagent: bool) {
        self.loop_detection
            .get_or_create(&[
                ("layer", layer.to_owned()),
                ("action", action.to_owned()),
                ("is_subagent", is_subagent.to_string()),
            ])
            .inc();
    }
}

/// Holds one open SSE stream in `subflow_sse_streams`.
#[derive(Debug)]
pub struct SseStreamGuard(Gauge);

impl Drop for SseStreamGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The event-store buffer and observer counts, read when scraped.
#[derive(Debug)]
struct ScrapedCounts {
    store: Arc<StoreCounters>,
    observers: Arc<ObserverCounters>,
}

const BUFFERS: [BufferKind; 2] = [BufferKind::Subagent, BufferKind::Journal];

/// Reads one buffer's count from the store counters.
type ReadCount = fn(&StoreCounters, BufferKind) -> u64;

impl Collector for ScrapedCounts {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let store = &self.store;
        let counters: [(&str, &str, ReadCount); 2] = [
            (
                "subflow_event_store_flush_failures",
                "Failed batch writes of run-event buffers (the records are retried).",
                StoreCounters::flush_failures,
            ),
            (
                "subflow_event_store_spilled_events",
                "Run events written to the spill file because the store stayed unavailable.",
                StoreCounters::spilled,
            ),
        ];
        for (name, help, read) in counters {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for kind in BUFFERS {
                let labels = [("buffer", kind.as_str())];
                ConstCounter::new(read(store, kind)).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut pending = encoder.encode_descriptor(
            "subflow_event_store_pending_events",
            "Run events emitted and not yet written.",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for kind in BUFFERS {
            let labels = [("buffer", kind.as_str())];
            ConstGauge::new(store.pending(kind)).encode(pending.encode_family(&labels)?)?;
        }
        let mut calls = encoder.encode_descriptor(
            "subflow_observer_calls",
            "Observer and webhook calls by hook and result.",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (hook, result, count) in self.observers.snapshot() {
            let labels = [("hook", hook.as_str()), ("result", result.as_str())];
            ConstCounter::new(count).encode(calls.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl WorkerMetrics for Metrics {
    fn lease_expirations(&self, count: u64) {
        self.lease_expirations.inc_by(count);
    }
}

/// The durable-batch gauges (docs/operations.md#metrics), encoded from the last database read; every
/// status has a sample, 0 before the first read.
#[derive(Debug)]
struct BatchGauges(Arc<Mutex<BatchGaugeSnapshot>>);

impl Collector for BatchGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        use prometheus_client::metrics::MetricType;
        let snapshot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let totals = &snapshot.totals;
        let mut items = encoder.encode_descriptor(
            "subflow_batch_items",
            "Batch items by status, over every batch in the database.",
            None,
            MetricType::Gauge,
        )?;
        for (status, count) in totals.items.iter() {
            let labels = [("status", status.as_str())];
            ConstGauge::new(gauge_value(count)).encode(items.encode_family(&labels)?)?;
        }
        let mut batches = encoder.encode_descriptor(
            "subflow_batches",
            "Batches by status, over every batch in the database.",
            None,
            MetricType::Gauge,
        )?;
        for status in subflow_contracts::BatchStatus::ALL {
            let count = totals
                .batches
                .iter()
                .find(|(s, _)| s == status)
                .map_or(0, |(_, n)| *n);
            let labels = [("status", status.as_str())];
            ConstGauge::new(gauge_value(count)).encode(batches.encode_family(&labels)?)?;
        }
        ConstGauge::new(gauge_value(snapshot.workers)).encode(encoder.encode_descriptor(
            "subflow_batch_workers",
            "Batch workers whose heartbeat is younger than the lease.",
            None,
            MetricType::Gauge,
        )?)?;
        Ok(())
    }
}

fn gauge_value(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_end_in_total_and_histograms_have_buckets_sum_and_count() {
        let metrics = Metrics::standalone();
        metrics.run_finished(RunStatus::Success, Duration::from_millis(700));
        metrics.add_cost("gpt \"4\"\n", "USD", 0.25);
        let text = metrics.encode();
        assert!(
            text.contains("# TYPE subflow_runs_total counter\n"),
            "{text}"
        );
        assert!(text.contains("subflow_runs_total{status=\"success\"} 1\n"));
        assert!(
            text.contains("subflow_run_duration_seconds_bucket{le=\"0.5\",status=\"success\"} 0\n")
                || text.contains(
                    "subflow_run_duration_seconds_bucket{status=\"success\",le=\"0.5\"} 0\n"
                ),
            "{text}"
        );
        assert!(text.contains("le=\"+Inf\"} 1\n"), "{text}");
        assert!(text.contains("subflow_run_duration_seconds_count{status=\"success\"} 1\n"));
        // Label values are escaped.
        assert!(
            text.contains(r#"model="gpt \"4\"\n""#),
            "label escaping: {text}"
        );
        assert!(text.contains("subflow_batch_workers 0\n"), "{text}");
        assert!(
            text.contains("subflow_batch_lease_expirations_total 0\n"),
            "{text}"
        );
        assert!(
            text.contains("subflow_batches{status=\"paused\"} 0\n"),
            "{text}"
        );
    }

    #[test]
    fn batch_gauges_show_the_last_database_read_and_lease_expirations_count_up() {
        let metrics = Metrics::standalone();
        assert!(!metrics.batch_gauges_fresh(BATCH_GAUGE_MAX_AGE));
        let items = subflow_store::BatchCounts {
            pending: 4,
            running: 2,
            succeeded: 7,
            ..Default::default()
        };
        let totals = BatchTotals::new([(subflow_contracts::BatchStatus::Running, 2)], items);
        metrics.set_batch_gauges(totals, 3);
        assert!(metrics.batch_gauges_fresh(BATCH_GAUGE_MAX_AGE));
        WorkerMetrics::lease_expirations(&metrics, 5);
        let text = metrics.encode();
        for line in [
            "subflow_batch_items{status=\"pending\"} 4\n",
            "subflow_batch_items{status=\"running\"} 2\n",
            "subflow_batch_items{status=\"succeeded\"} 7\n",
            "subflow_batch_items{status=\"cancelled\"} 0\n",
            "subflow_batches{status=\"running\"} 2\n",
            "subflow_batches{status=\"completed\"} 0\n",
            "subflow_batch_workers 3\n",
            "subflow_batch_lease_expirations_total 5\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }

    #[test]
    fn an_sse_guard_holds_the_gauge_while_alive() {
        let metrics = Metrics::standalone();
        let guard = metrics.sse_stream();
        assert!(metrics.encode().contains("subflow_sse_streams 1\n"));
        drop(guard);
        assert!(metrics.encode().contains("subflow_sse_streams 0\n"));
    }
}
