//! `subflow serve`: loads and validates the configuration, migrates the database,
//! re-applies spilled run events, then serves the gateway until interrupted.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use subflow_gateway::usage::{ModelFacts, Price};
use subflow_gateway::{AppState, BatchFeatures, ModelListing};
use subflow_runtime::admission::Admission;
use subflow_runtime::runtime::{Models, Runtime};
use subflow_store::buffer::{RetryPolicy, RetryQueue, StoreCounters};
use subflow_store::spill::SpillFile;
use subflow_telemetry::{Metrics, OtlpExporter};

use super::config::ConfigArgs;
use crate::config::{AuthMode, Config};
use crate::storage::{data_dir, redact};

/// Arguments of `subflow serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArgs,
    /// Address to listen on (`server.listen`).
    #[arg(long)]
    listen: Option<String>,
    /// Database URL (`database.url`).
    #[arg(long = "database-url")]
    database_url: Option<String>,
    /// Do not run the in-process batch worker.
    #[arg(long)]
    no_worker: bool,
}

fn listings(config: &Config) -> Vec<ModelListing> {
    config
        .models
        .iter()
        .map(|m| ModelListing {
            name: m.name.clone(),
            model: m.model_id().to_owned(),
            display_name: m.display_name.clone(),
            description: m.description.clone(),
            supports_thinking: m.supports_thinking,
            supports_reasoning_effort: m.supports_reasoning_effort,
        })
        .collect()
}

/// Context windows and prices for `/token-usage`, the lead's model first.
fn facts(config: &Config) -> Vec<ModelFacts> {
    let lead = config.lead_model().name.clone();
    let mut facts: Vec<ModelFacts> = config
        .models
        .iter()
        .map(|m| ModelFacts {
            name: m.name.clone(),
            model: m.model_id().to_owned(),
            context_window: m.context_window,
            pricing: m.pricing.as_ref().map(|p| Price {
                currency: p.currency.clone(),
                input_per_million: p.input_per_million,
                output_per_million: p.output_per_million,
                input_cache_hit_per_million: p.input_cache_hit_per_million,
            }),
        })
        .collect();
    facts.sort_by_key(|f| f.name != lead);
    facts
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

/// Runs `subflow serve`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut overrides = Vec::new();
    if let Some(listen) = &args.listen {
        overrides.push(("server.listen", listen.as_str()));
    }
    if let Some(url) = &args.database_url {
        overrides.push(("database.url", url.as_str()));
    }
    let built = args.config.load_and_build(&overrides)?;
    let config = built.config;
    crate::logging::init(
        &config.logging.level,
        crate::logging::LineFormat::of(&config.logging),
    );
    let url = config.database.url.clone();
    let backend = super::migrate::open_and_recover(&url, config.database.max_connections).await?;
    let store = backend.store();
    let data_dir = data_dir(&url);
    let counters = Arc::new(StoreCounters::default());
    let spill = Arc::new(SpillFile::in_dir(&data_dir));
    let retry = RetryQueue::spawn(
        store.clone(),
        spill,
        RetryPolicy::default(),
        counters.clone(),
    );
    // One registry for the process: the runtime, the gateway and the exporters count into it.
    let metrics = Arc::new(Metrics::new(
        counters.clone(),
        built.observers.counters().clone(),
    ));
    let mut runtime = Runtime::new(
        config.runtime_config(&data_dir),
        store.clone(),
        Models::new(built.models),
        Admission::new(config.subagent_runtime.clone()),
        retry.clone(),
        counters,
    )
    .with_observers(built.observers)
    .with_metrics(metrics.clone());
    let mut exporters = Vec::new();
    for exporter in built.exporters {
        tracing::info!(exporter = %exporter.name, endpoint = %exporter.endpoint, "exporting spans");
        let dropped = metrics.otlp_dropped(&exporter.name);
        exporters.push(OtlpExporter::spawn(exporter, dropped).context("starting a span exporter")?);
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
    let state = AppState {
        runtime,
        store,
        models: listings(&config),
        token_usage_enabled: config.token_usage.enabled,
        model_facts: facts(&config),
        run_timeout: Duration::from_secs(config.runs.timeout_seconds),
        heartbeat: Duration::from_secs(config.streams.heartbeat_seconds),
        active: Default::default(),
        cors_origins: config.server.cors_origins.clone(),
        auth: match config.auth.mode {
            AuthMode::Local => subflow_gateway::AuthMode::Local,
            AuthMode::Token => subflow_gateway::AuthMode::Token,
        },
        web_enabled: config.web.enabled,
        metrics,
        metrics_enabled: config.metrics.enabled,
        metrics_public: config.metrics.public,
        streams: subflow_gateway::stream::Streams::new(subflow_gateway::stream::StreamConfig {
            retention: Duration::from_secs(config.streams.retention_seconds),
            lease: Duration::from_secs(config.runs.lease_seconds),
        }),
        batches: BatchFeatures::new(
            config.subagent_batches.enabled,
            Duration::from_secs(config.subagent_batches.lease_seconds),
            config.subagent_runtime.max_running,
        ),
    };
    let listener = tokio::net::TcpListener::bind(&config.server.listen)
        .await
        .with_context(|| format!("cannot listen on {} (server.listen)", config.server.listen))?;
    let address = listener
        .local_addr()
        .context("reading the listen address")?;
    if args.no_worker {
        tracing::info!("running without a batch worker");
    }
    eprintln!(
        "subflow: listening on http://{address} (database {})",
        redact(&url)
    );
    subflow_gateway::serve(listener, state, shutdown_signal())
        .await
        .context("serving HTTP")?;
    // Records that could not be written yet are spilled, to be re-applied at the next start.
    retry.shutdown().await;
    // Spans still queued get one last export, bounded by the export timeout.
    let deadline = Duration::from_secs(config.tracing.export_timeout_seconds + 1);
    for exporter in &exporters {
        let _ = tokio::time::timeout(deadline, exporter.flush()).await;
    }
    eprintln!("subflow: stopped");
    Ok(())
}
