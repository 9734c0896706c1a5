//! `subflow worker`: a batch worker without the gateway, for more machines sharing one
//! PostgreSQL database (docs/operations.md#commands, docs/batches.md#overview). On SQLite batches run only inside the single
//! `serve` process, so it refuses to start there with exit code 2.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use subflow_telemetry::Metrics;

use super::{DatabaseArgs, Exit};
use crate::process::{self, shutdown_on_signal};
use crate::storage::{BackendKind, data_dir, redact};

/// What `subflow worker` says on SQLite.
pub const REQUIRES_POSTGRES: &str = "subflow worker requires PostgreSQL";

/// Arguments of `subflow worker`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    database: DatabaseArgs,
}

/// Runs `subflow worker` until Ctrl-C or SIGTERM; it stops within 5 s.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let built = args
        .database
        .config()
        .load_and_build(&args.database.overrides())?;
    let config = built.config;
    if BackendKind::of(&config.database.url)? != BackendKind::Postgres {
        return Err(Exit::new(2, REQUIRES_POSTGRES).into());
    }
    if !config.subagent_batches.enabled {
        return Err(Exit::new(2, "subflow worker needs subagent_batches.enabled = true").into());
    }
    crate::logging::init(
        &config.logging.level,
        crate::logging::LineFormat::of(&config.logging),
    );
    let url = config.database.url.clone();
    let backend = super::migrate::open_and_recover(&url, config.database.max_connections).await?;
    let store = backend.store();
    let data_dir = data_dir(&url);
    let runtime = process::runtime_options(
        &config,
        store.clone(),
        built.models,
        built.observers,
        &data_dir,
    )
    .build()
    .with_budgets(subflow_gateway::budgets::budgets(
        config.budgets.clone(),
        store.clone(),
        &process::model_facts(&config),
    ));
    // No HTTP here, so nothing scrapes the registry; the runtime and worker count into
    // it all the same, and the exporters report their drops there.
    let metrics = Arc::new(Metrics::new(
        runtime.store_counters().clone(),
        runtime.observer_counters().clone(),
    ));
    let (runtime, exporters) = subflow_telemetry::export_spans(
        runtime.with_metrics(metrics.clone()),
        built.exporters,
        &metrics,
        config.tracing.environment.clone(),
    )
    .context("starting a span exporter")?;
    let worker = process::worker_options(&config)
        .worker(
            store,
            runtime.clone(),
            metrics,
            process::model_facts(&config),
        )
        .context("starting the batch worker")?;
    eprintln!(
        "subflow: batch worker {} on database {}",
        worker.handle().worker_id(),
        redact(&url)
    );
    if let Err(error) = worker.run(shutdown_on_signal().cancelled_owned()).await {
        tracing::error!(%error, "the batch worker stopped on an error");
    }
    let export_timeout = Duration::from_secs(config.tracing.export_timeout_seconds);
    subflow_gateway::shut_down(&runtime, &exporters, export_timeout).await;
    backend.close().await;
    eprintln!("subflow: stopped");
    Ok(())
}
