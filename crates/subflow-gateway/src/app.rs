//! The one place a gateway is assembled: the runtime from its options (store, retry
//! queue, models, admission), the metrics registry the runtime counts into, and the
//! state the routes share. `subflow serve`, the benchmarks and the tests all build here.

use std::time::Duration;

use std::sync::Arc;
use subflow_runtime::runtime::RuntimeOptions;
use subflow_telemetry::Metrics;

use crate::server::ConnectionTimeouts;
use crate::stream::{StreamConfig, Streams};
use crate::{ActiveRuns, AppState, AuthMode, BatchFeatures, ModelListing, usage};

/// What a gateway is built from, by name; [`AppOptions::new`] has the defaults of docs/configuration.md#sources.
#[derive(Debug)]
pub struct AppOptions {
    /// The runtime's parts; its store is the gateway's too.
    pub runtime: RuntimeOptions,
    /// `/api/models` entries.
    pub models: Vec<ModelListing>,
    /// Context windows and prices of the configured models, the default first; none by
    /// default.
    pub model_facts: Vec<usage::ModelFacts>,
    /// `token_usage.enabled`; true by default.
    pub token_usage_enabled: bool,
    /// `runs.timeout_seconds`; one hour by default.
    pub run_timeout: Duration,
    /// `streams.heartbeat_seconds`; 15 s by default.
    pub heartbeat: Duration,
    /// `server.cors_origins`; none by default.
    pub cors_origins: Vec<String>,
    /// `auth.mode`; `local` by default.
    pub auth: AuthMode,
    /// `metrics.enabled`; true by default.
    pub metrics_enabled: bool,
    /// `metrics.public`; false by default (admin-only in token mode).
    pub metrics_public: bool,
    /// `web.enabled`; true by default.
    pub web_enabled: bool,
    /// `streams.retention_seconds` and `runs.lease_seconds`.
    pub streams: StreamConfig,
    /// `subagent_batches.enabled` and `lease_seconds`; enabled, 120 s and no worker in
    /// this process by default (set `AppState::batches.worker` once one is built on the
    /// state's runtime).
    pub batches: BatchFeatures,
    /// `server.idle_timeout_seconds`, `header_timeout_seconds`, `body_timeout_seconds`.
    pub connections: ConnectionTimeouts,
}

impl AppOptions {
    /// The defaults around a runtime's options and the `/api/models` listing.
    pub fn new(runtime: RuntimeOptions, models: Vec<ModelListing>) -> Self {
        AppOptions {
            runtime,
            models,
            model_facts: Vec::new(),
            token_usage_enabled: true,
            run_timeout: Duration::from_secs(3600),
            heartbeat: Duration::from_secs(15),
            cors_origins: Vec::new(),
            auth: AuthMode::Local,
            metrics_enabled: true,
            metrics_public: false,
            web_enabled: true,
            streams: StreamConfig::default(),
            batches: BatchFeatures::default(),
            connections: ConnectionTimeouts::default(),
        }
    }

    /// Builds the runtime (spawning its retry queue, so it needs a tokio runtime) and a
    /// fresh metrics registry it counts into, and returns the routes' state.
    pub fn build(self) -> AppState {
        let store = self.runtime.store.clone();
        let runtime = self.runtime.build();
        let metrics = Arc::new(Metrics::new(
            runtime.store_counters().clone(),
            runtime.observer_counters().clone(),
        ));
        AppState {
            runtime: runtime.with_metrics(metrics.clone()),
            store,
            models: self.models,
            token_usage_enabled: self.token_usage_enabled,
            model_facts: self.model_facts,
            run_timeout: self.run_timeout,
            heartbeat: self.heartbeat,
            active: ActiveRuns::default(),
            cors_origins: self.cors_origins,
            auth: self.auth,
            metrics,
            metrics_enabled: self.metrics_enabled,
            metrics_public: self.metrics_public,
            web_enabled: self.web_enabled,
            streams: Streams::new(self.streams),
            batches: self.batches,
            connections: self.connections,
        }
    }
}
