//! The span exporter (docs/operations.md#langfuse-and-otlp): OTLP/HTTP protobuf, to Langfuse or to any OTLP
//! receiver, never in a run's way.
//!
//! [`OtlpExporter::export`] only `try_send`s into a bounded queue (`tracing.queue_size`);
//! a background task batches the queue and POSTs each batch with a deadline
//! (`tracing.export_timeout_seconds`). A full queue, a failed or timed-out POST, or a
//! non-2xx answer drops the spans concerned and counts them in
//! `subflow_otlp_spans_dropped_total{exporter}`. Nothing is retried: a dead receiver
//! costs its spans, never a run's time.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, any_value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Link, SpanKind as ProtoKind};
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prometheus_client::metrics::counter::Counter;
use prost::Message;
use subflow_runtime::spans::{AttributeValue, SpanData, SpanKind, SpanSink, SpanStatus};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Spans sent in one request at most.
const MAX_BATCH: usize = 512;
/// How long a span waits for companions before its batch is sent.
const BATCH_DELAY: Duration = Duration::from_millis(500);

/// The Langfuse ingestion version header and value (spans are ingested as sent).
pub const LANGFUSE_INGESTION_HEADER: (&str, &str) = ("x-langfuse-ingestion-version", "4");

/// One exporter's settings.
#[derive(Clone)]
pub struct ExporterConfig {
    /// The `exporter` label of the drop counter: `langfuse` or `otlp`.
    pub name: String,
    /// The URL the batches are POSTed to, used verbatim.
    pub endpoint: String,
    /// Headers of every request (values may be secrets; `Debug` hides them).
    pub headers: Vec<(String, String)>,
    /// HTTP Basic credentials, if any (`Debug` hides the secret).
    pub basic_auth: Option<(String, String)>,
    /// `tracing.queue_size`: spans waiting beyond it are dropped.
    pub queue_size: usize,
    /// `tracing.export_timeout_seconds`: the deadline of one POST.
    pub export_timeout: Duration,
}

impl fmt::Debug for ExporterConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(name, _)| (name.as_str(), "<redacted>"))
            .collect();
        f.debug_struct("ExporterConfig")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("headers", &headers)
            .field(
                "basic_auth",
                &self
                    .basic_auth
                    .as_ref()
                    .map(|(user, _)| (user, "<redacted>")),
            )
            .field("queue_size", &self.queue_size)
            .field("export_timeout", &self.export_timeout)
            .finish()
    }
}

impl ExporterConfig {
    /// Langfuse at `base_url`: `{base_url}/api/public/otel/v1/traces`, Basic auth with
    /// the key pair, and the ingestion version header.
    pub fn langfuse(base_url: &str, public_key: &str, secret_key: &str) -> Self {
        ExporterConfig {
            name: "langfuse".to_owned(),
            endpoint: format!(
                "{}/api/public/otel/v1/traces",
                base_url.trim_end_matches('/')
            ),
            headers: vec![(
                LANGFUSE_INGESTION_HEADER.0.to_owned(),
                LANGFUSE_INGESTION_HEADER.1.to_owned(),
            )],
            basic_auth: Some((public_key.to_owned(), secret_key.to_owned())),
            queue_size: 2048,
            export_timeout: Duration::from_secs(10),
        }
    }

    /// A generic OTLP/HTTP receiver at `endpoint` (verbatim: include `/v1/traces`).
    pub fn otlp(endpoint: &str, headers: Vec<(String, String)>) -> Self {
        ExporterConfig {
            name: "otlp".to_owned(),
            endpoint: endpoint.to_owned(),
            headers,
            basic_auth: None,
            queue_size: 2048,
            export_timeout: Duration::from_secs(10),
        }
    }

    /// Checks what [`OtlpExporter::spawn`] would refuse: an endpoint that is not an
    /// `http(s)://` URL, or a header that is not valid HTTP.
    pub fn validate(&self) -> Result<(), Error> {
        if !(self.endpoint.starts_with("http://") || self.endpoint.starts_with("https://")) {
            return Err(Error::Endpoint(self.endpoint.clone()));
        }
        self.header_map().map(|_| ())
    }

    fn header_map(&self) -> Result<reqwest::header::HeaderMap, Error> {
        let mut headers = reqwest::header::HeaderMap::new();
        for (name, value) in &self.headers {
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| Error::Header(name.clone()))?;
            let mut value = reqwest::header::HeaderValue::from_str(value)
                .map_err(|_| Error::Header(name.to_string()))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            reqwest::header::HeaderValue::from_static("application/x-protobuf"),
        );
        Ok(headers)
    }
}

/// Why an exporter could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint is not an `http://` or `https://` URL.
    #[error("the endpoint must be an http:// or https:// URL, got {0:?}")]
    Endpoint(String),
    /// A header name or value is not valid HTTP.
    #[error("invalid header {0:?}")]
    Header(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// A running exporter; cheap to clone. Dropping every clone ends its task after a last
/// export of what is queued.
#[derive(Clone)]
pub struct OtlpExporter {
    name: String,
    spans: mpsc::Sender<SpanData>,
    flushes: mpsc::UnboundedSender<oneshot::Sender<()>>,
    dropped: Counter,
}

impl fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpExporter")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl OtlpExporter {
    /// Starts the exporter's task (on the current tokio runtime); drops are counted in
    /// `dropped`.
    pub fn spawn(config: ExporterConfig, dropped: Counter) -> Result<Self, Error> {
        config.validate()?;
        let headers = config.header_map()?;
        // No proxy from the environment: the endpoint is used exactly as configured.
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(config.export_timeout)
            .build()?;
        let (spans, queue) = mpsc::channel(config.queue_size.max(1));
        let (flushes, flush_requests) = mpsc::unbounded_channel();
        let worker = Worker {
            client,
            headers,
            config,
            dropped: dropped.clone(),
            failing: false,
        };
        let name = worker.config.name.clone();
        tokio::spawn(worker.run(queue, flush_requests));
        Ok(OtlpExporter {
            name,
            spans,
            flushes,
            dropped,
        })
    }

    /// Resolves once every span queued before the call has been sent or dropped.
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.flushes.send(done).is_ok() {
            let _ = wait.await;
        }
    }
}

impl SpanSink for OtlpExporter {
    fn export(&self, span: SpanData) {
        if self.spans.try_send(span).is_err() {
            self.dropped.inc();
        }
    }
}

struct Worker {
    client: reqwest::Client,
    headers: reqwest::header::HeaderMap,
    config: ExporterConfig,
    dropped: Counter,
    /// Whether the last export failed: failures are logged as warnings once per streak.
    failing: bool,
}

impl Worker {
    async fn run(
        mut self,
        mut queue: mpsc::Receiver<SpanData>,
        mut flush_requests: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    ) {
        let mut batch: Vec<SpanData> = Vec::new();
        let mut deadline: Option<Instant> = None;
        loop {
            let due = deadline.unwrap_or_else(|| Instant::now() + BATCH_DELAY);
            tokio::select! {
                span = queue.recv() => match span {
                    Some(span) => {
                        batch.push(span);
                        deadline.get_or_insert_with(|| Instant::now() + BATCH_DELAY);
                        if batch.len() >= MAX_BATCH {
                            self.send(std::mem::take(&mut batch)).await;
                            deadline = None;
                        }
                    }
                    None => break,
                },
                () = tokio::time::sleep_until(due), if deadline.is_some() => {
                    self.send(std::mem::take(&mut batch)).await;
                    deadline = None;
                }
                Some(done) = flush_requests.recv() => {
                    while let Ok(span) = queue.try_recv() {
                        batch.push(span);
                        if batch.len() >= MAX_BATCH {
                            self.send(std::mem::take(&mut batch)).await;
                        }
                    }
                    self.send(std::mem::take(&mut batch)).await;
                    deadline = None;
                    let _ = done.send(());
                }
            }
        }
        self.send(batch).await;
    }

    /// POSTs one batch; on any failure its spans are counted as dropped.
    async fn send(&mut self, batch: Vec<SpanData>) {
        if batch.is_empty() {
            return;
        }
        let count = batch.len() as u64;
        let body = encode_request(&batch).encode_to_vec();
        let mut request = self
            .client
            .post(&self.config.endpoint)
            .headers(self.headers.clone())
            .body(body);
        if let Some((user, secret)) = &self.config.basic_auth {
            request = request.basic_auth(user, Some(secret));
        }
        let failure = match request.send().await {
            Ok(response) if response.status().is_success() => None,
            Ok(response) => Some(format!("HTTP {}", response.status())),
            Err(error) => Some(error.to_string()),
        };
        match failure {
            None => {
                if self.failing {
                    tracing::info!(exporter = %self.config.name, "span export recovered");
                }
                self.failing = false;
            }
            Some(reason) => {
                self.dropped.inc_by(count);
                if self.failing {
                    tracing::debug!(exporter = %self.config.name, %reason, count, "span export failed; spans dropped");
                } else {
                    tracing::warn!(exporter = %self.config.name, endpoint = %self.config.endpoint, %reason, count,
                        "span export failed; spans dropped (further failures are logged at debug level)");
                }
                self.failing = true;
            }
        }
    }
}

fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn any_value(value: &AttributeValue) -> AnyValue {
    let value = match value {
        AttributeValue::String(text) => any_value::Value::StringValue(text.clone()),
        AttributeValue::Int(number) => any_value::Value::IntValue(*number),
        AttributeValue::Bool(flag) => any_value::Value::BoolValue(*flag),
        AttributeValue::StringArray(items) => any_value::Value::ArrayValue(ArrayValue {
            values: items
                .iter()
                .map(|item| AnyValue {
                    value: Some(any_value::Value::StringValue(item.clone())),
                })
                .collect(),
        }),
    };
    AnyValue { value: Some(value) }
}

fn key_value(key: &str, value: &AttributeValue) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(any_value(value)),
        ..KeyValue::default()
    }
}

/// The span as OTLP protobuf.
pub fn encode_span(span: &SpanData) -> Span {
    Span {
        trace_id: span.trace_id.to_vec(),
        span_id: span.span_id.to_vec(),
        parent_span_id: span.parent_span_id.map(|p| p.to_vec()).unwrap_or_default(),
        // W3C trace flags: sampled.
        flags: 1,
        name: span.name.clone(),
        kind: match span.kind {
            SpanKind::Internal => ProtoKind::Internal,
            SpanKind::Client => ProtoKind::Client,
        } as i32,
        start_time_unix_nano: unix_nanos(span.start),
        end_time_unix_nano: unix_nanos(span.end),
        attributes: span
            .attributes
            .iter()
            .map(|(key, value)| key_value(key, value))
            .collect(),
        links: span
            .links
            .iter()
            .map(|link| Link {
                trace_id: link.trace_id.to_vec(),
                span_id: link.span_id.to_vec(),
                flags: 1,
                ..Link::default()
            })
            .collect(),
        status: Some(match &span.status {
            SpanStatus::Unset => Status::default(),
            SpanStatus::Error(message) => Status {
                message: message.clone(),
                code: StatusCode::Error as i32,
            },
        }),
        ..Span::default()
    }
}

/// One export request: the `subflow` resource and instrumentation scope around `spans`.
pub fn encode_request(spans: &[SpanData]) -> ExportTraceServiceRequest {
    let version = env!("CARGO_PKG_VERSION");
    let text = |key: &str, value: &str| key_value(key, &AttributeValue::String(value.to_owned()));
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    text("service.name", "subflow"),
                    text("service.version", version),
                ],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "subflow".to_owned(),
                    version: version.to_owned(),
                    ..InstrumentationScope::default()
                }),
                spans: spans.iter().map(encode_span).collect(),
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use subflow_runtime::spans::SpanLink;

    fn span() -> SpanData {
        SpanData {
            trace_id: [7; 16],
            span_id: [1; 8],
            parent_span_id: None,
            name: "invoke_agent lead_agent".into(),
            kind: SpanKind::Internal,
            start: UNIX_EPOCH + Duration::from_secs(5),
            end: UNIX_EPOCH + Duration::from_secs(6),
            attributes: vec![
                ("a".into(), AttributeValue::Int(3)),
                ("t".into(), AttributeValue::StringArray(vec!["x".into()])),
            ],
            links: vec![SpanLink {
                trace_id: [9; 16],
                span_id: [2; 8],
            }],
            status: SpanStatus::Error("boom".into()),
        }
    }

    #[test]
    fn spans_round_trip_through_the_protobuf_encoding() {
        let request = encode_request(&[span()]);
        let bytes = request.encode_to_vec();
        let decoded = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        let span = &decoded.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.trace_id, vec![7; 16]);
        assert!(span.parent_span_id.is_empty());
        assert_eq!(span.start_time_unix_nano, 5_000_000_000);
        assert_eq!(span.links[0].span_id, vec![2; 8]);
        assert_eq!(span.status.as_ref().unwrap().code, StatusCode::Error as i32);
        assert_eq!(span.attributes[0].key, "a");
        assert_eq!(
            span.attributes[0].value.as_ref().unwrap().value,
            Some(any_value::Value::IntValue(3))
        );
    }

    #[test]
    fn langfuse_settings_derive_the_endpoint_and_hide_the_secret() {
        let config = ExporterConfig::langfuse("https://lf.example/", "pk", "sk-secret");
        assert_eq!(
            config.endpoint,
            "https://lf.example/api/public/otel/v1/traces"
        );
        let shown = format!("{config:?}");
        assert!(!shown.contains("sk-secret"), "{shown}");
    }
}
