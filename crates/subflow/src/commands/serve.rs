//! `subflow serve`: loads and validates the configuration, migrates the database,
//! re-applies spilled run events, maps the configuration onto the gateway's
//! [`AppOptions`] (with the batch worker unless `--no-worker` or
//! `subagent_batches.enabled = false`), builds the application and runs it until
//! interrupted; the worker stops within 5 s of the signal.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use subflow_gateway::server::ConnectionTimeouts;
use subflow_gateway::stream::StreamConfig;
use subflow_gateway::{AppOptions, BatchFeatures, ModelListing};
use subflow_store::Store;

use super::DatabaseArgs;
use crate::config::{AuthMode, Config};
use crate::process::{self, shutdown_on_signal};
use crate::storage::{data_dir, redact};

/// Arguments of `subflow serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Address to listen on (`server.listen`).
    #[arg(long)]
    listen: Option<String>,
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

/// The gateway's options as `config` sets them, on `store` with its data in `data_dir`,
/// with the in-process batch worker unless `no_worker` or `subagent_batches.enabled =
/// false`: everything `serve` runs, decided in one place.
fn app_options(
    config: &Config,
    built: crate::config::Built,
    store: Arc<dyn Store>,
    data_dir: &std::path::Path,
    no_worker: bool,
) -> AppOptions {
    let runtime = process::runtime_options(config, store, built.models, built.observers, data_dir);
    let worker = if no_worker {
        tracing::info!("running without a batch worker (--no-worker)");
        None
    } else if !config.subagent_batches.enabled {
        tracing::info!("running without a batch worker (subagent_batches.enabled = false)");
        None
    } else {
        Some(process::worker_options(config))
    };
    AppOptions {
        model_facts: process::model_facts(config),
        token_usage_enabled: config.token_usage.enabled,
        run_timeout: Duration::from_secs(config.runs.timeout_seconds),
        heartbeat: Duration::from_secs(config.streams.heartbeat_seconds),
        cors_origins: config.server.cors_origins.clone(),
        auth: match config.auth.mode {
            AuthMode::Local => subflow_gateway::AuthMode::Local,
            AuthMode::Token => subflow_gateway::AuthMode::Token,
        },
        metrics_enabled: config.metrics.enabled,
        metrics_public: config.metrics.public,
        web_enabled: config.web.enabled,
        streams: StreamConfig {
            retention: Duration::from_secs(config.streams.retention_seconds),
            lease: Duration::from_secs(config.runs.lease_seconds),
        },
        batches: BatchFeatures {
            enabled: config.subagent_batches.enabled,
            lease: Duration::from_secs(config.subagent_batches.lease_seconds),
            worker: None,
        },
        connections: ConnectionTimeouts {
            idle: Duration::from_secs(config.server.idle_timeout_seconds),
            header: Duration::from_secs(config.server.header_timeout_seconds),
            body: Duration::from_secs(config.server.body_timeout_seconds),
        },
        exporters: built.exporters,
        environment: config.tracing.environment.clone(),
        export_timeout: Duration::from_secs(config.tracing.export_timeout_seconds),
        worker,
        budgets: config.budgets.clone(),
        ..AppOptions::new(runtime, listings(config))
    }
}

/// Runs `subflow serve`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut overrides = args.database.overrides();
    if let Some(listen) = &args.listen {
        overrides.push(("server.listen", listen.as_str()));
    }
    let built = args.database.config().load_and_build(&overrides)?;
    let config = built.config.clone();
    crate::logging::init(
        &config.logging.level,
        crate::logging::LineFormat::of(&config.logging),
    );
    let url = config.database.url.clone();
    let backend = super::migrate::open_and_recover(&url, config.database.max_connections).await?;
    let leases = backend
        .recover_item_leases()
        .await
        .context("ending the batch item leases of the previous serve")?;
    if leases > 0 {
        tracing::info!(leases, "ended the batch item leases of the previous serve");
    }
    let app = app_options(
        &config,
        built,
        backend.store(),
        &data_dir(&url),
        args.no_worker,
    )
    .build()?;
    let listener = tokio::net::TcpListener::bind(&config.server.listen)
        .await
        .with_context(|| format!("cannot listen on {} (server.listen)", config.server.listen))?;
    let address = listener
        .local_addr()
        .context("reading the listen address")?;
    eprintln!(
        "subflow: listening on http://{address} (database {})",
        redact(&url)
    );
    let served = app
        .run(listener, shutdown_on_signal())
        .await
        .context("serving HTTP");
    // Last, after every write: SQLite checkpoints and truncates its WAL here.
    backend.close().await;
    served?;
    eprintln!("subflow: stopped");
    Ok(())
}
