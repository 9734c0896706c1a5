//! What `serve` and `worker` processes share: the runtime's options and the batch
//! worker's options from the configuration, and the shutdown signal.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use subflow_gateway::WorkerOptions;
use subflow_gateway::usage::{ModelFacts, Price};
use subflow_models::ChatModel;
use subflow_runtime::observers::ObserverSet;
use subflow_runtime::runtime::RuntimeOptions;
use subflow_store::Store;
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

/// The in-process or standalone batch worker's options, as `subagent_batches.*` sets
/// them.
pub fn worker_options(config: &Config) -> WorkerOptions {
    let batches = &config.subagent_batches;
    WorkerOptions {
        hostname: hostname(),
        lease: Duration::from_secs(batches.lease_seconds),
        poll_interval: Duration::from_secs_f64(batches.poll_interval_seconds),
        max_result_chars: batches.max_result_chars,
        result_preview_max_chars: batches.result_preview_max_chars,
    }
}

/// Context windows and prices for `/token-usage` and `subflow_cost_total`, the lead's
/// model first.
pub fn model_facts(config: &Config) -> Vec<ModelFacts> {
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
                input_cache_write_per_million: p.input_cache_write_per_million,
            }),
        })
        .collect();
    facts.sort_by_key(|f| f.name != lead);
    facts
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
