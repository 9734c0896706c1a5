//! The HTTP gateway: the LangGraph-compatible runs API with SSE framing (SPEC §2), the
//! `/events` endpoint (SPEC §6), `/api/models` (SPEC §7.5), the durable-batch routes and
//! `/api/features` (SPEC §12.2, §12.11), `/health`, `/metrics`
//! (SPEC §15.1), and one `X-Trace-Id` on every response (SPEC §8.1). Every `/api` route has a caller, a
//! permission and, for thread routes, an ownership check (`auth`, SPEC §13).
//!
//! This is the only crate that knows HTTP status codes, headers and SSE framing. It
//! reaches runs through `subflow-runtime` and storage through the `subflow-store`
//! traits; the caller binds the listener and decides what stops the server.

// The OpenAPI document is one large `json!` literal.
#![recursion_limit = "256"]

mod app;
pub mod auth;
pub mod batch_progress;
mod error;
mod extract;
mod metrics;
mod openapi;
mod origin;
mod routes;
pub mod server;
mod sse;
pub mod stream;
mod trace;
pub mod usage;
mod web;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use subflow_runtime::runtime::Runtime;
use subflow_store::Store;
use subflow_telemetry::Metrics;

pub use app::AppOptions;
pub use auth::{AuthMode, Caller};
pub use error::ApiError;
pub use routes::batches::BatchFeatures;

/// A model as `/api/models` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ModelListing {
    /// Configured name.
    pub name: String,
    /// Provider model id.
    pub model: String,
    /// Display name.
    pub display_name: Option<String>,
    /// Description.
    pub description: Option<String>,
    /// Whether it supports thinking.
    pub supports_thinking: bool,
    /// Whether it supports reasoning effort.
    pub supports_reasoning_effort: bool,
}

impl ModelListing {
    /// A listing with just its names.
    pub fn named(name: impl Into<String>, model: impl Into<String>) -> Self {
        ModelListing {
            name: name.into(),
            model: model.into(),
            display_name: None,
            description: None,
            supports_thinking: false,
            supports_reasoning_effort: false,
        }
    }
}

/// Everything the routes share; built by [`AppOptions::build`].
#[derive(Debug, Clone)]
pub struct AppState {
    /// The agent runtime.
    pub runtime: Runtime,
    /// The store.
    pub store: Arc<dyn Store>,
    /// `/api/models` entries.
    pub models: Vec<ModelListing>,
    /// `token_usage.enabled`.
    pub token_usage_enabled: bool,
    /// Context windows and prices of the configured models, the first being the default.
    pub model_facts: Vec<usage::ModelFacts>,
    /// `runs.timeout_seconds`.
    pub run_timeout: Duration,
    /// `streams.heartbeat_seconds`.
    pub heartbeat: Duration,
    /// Runs executing in this process, for cancel.
    pub active: ActiveRuns,
    /// `server.cors_origins`: origins besides the gateway's own that may change state.
    pub cors_origins: Vec<String>,
    /// `auth.mode`: the implicit local user, or bearer tokens.
    pub auth: AuthMode,
    /// This process's metrics; the runtime counts into the same registry.
    pub metrics: Arc<Metrics>,
    /// `metrics.enabled`: serve `GET /metrics`.
    pub metrics_enabled: bool,
    /// `metrics.public`: serve it without `admin` in token mode.
    pub metrics_public: bool,
    /// `web.enabled`: serve the embedded web workspace at `/`.
    pub web_enabled: bool,
    /// Run streams: hubs, the durable log, leases (`streams.*`, `runs.lease_seconds`).
    pub streams: stream::Streams,
    /// Durable batches: configured or not, and whether a worker runs (SPEC §12.11).
    pub batches: BatchFeatures,
    /// `server.*_timeout_seconds`: how long a connection may wait for its client.
    pub connections: server::ConnectionTimeouts,
}

/// The runs executing in this process: their cancel tokens and a signal when they end.
#[derive(Debug, Clone, Default)]
pub struct ActiveRuns {
    runs: Arc<std::sync::Mutex<std::collections::HashMap<String, ActiveRun>>>,
}

/// One executing run.
#[derive(Debug, Clone)]
pub struct ActiveRun {
    /// Cancels the run.
    pub cancel: tokio_util::sync::CancellationToken,
    /// Becomes true when the run has ended.
    pub done: tokio::sync::watch::Receiver<bool>,
}

impl ActiveRuns {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, ActiveRun>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a run.
    pub fn insert(&self, run_id: &str, run: ActiveRun) {
        self.lock().insert(run_id.to_owned(), run);
    }

    /// Forgets a run that ended.
    pub fn remove(&self, run_id: &str) {
        self.lock().remove(run_id);
    }

    /// The run, if it executes here.
    pub fn get(&self, run_id: &str) -> Option<ActiveRun> {
        self.lock().get(run_id).cloned()
    }

    /// The ids of the runs executing here.
    pub fn run_ids(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }
}

/// The implicit user of `auth.mode = local` (SPEC §13), and the owner of what it creates.
pub const LOCAL_USER: &str = "default";

/// Every route and, in order, every layer: the request counter outermost, then the
/// trace-id layer around everything else, so errors carry the header too.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(routes::health))
        .route("/metrics", get(metrics::get))
        .route("/api/models", get(routes::models))
        .route("/api/features", get(routes::batches::features))
        .route(
            "/api/subagent-batches/{batch_id}",
            get(routes::batches::find),
        )
        .route("/api/openapi.json", get(openapi::get))
        .route("/api/info", get(routes::info))
        .route("/api/assistants/lead_agent", get(routes::assistants::get))
        .route(
            "/api/assistants/lead_agent/graph",
            get(routes::assistants::graph),
        )
        .route(
            "/api/assistants/lead_agent/schemas",
            get(routes::assistants::schemas),
        )
        .route("/api/assistants/search", post(routes::assistants::search))
        .route(
            "/api/threads/{thread_id}/runs/{run_id}/join",
            get(routes::runs::join),
        )
        .route("/api/threads", post(routes::threads::create))
        .route("/api/threads/search", post(routes::threads::search))
        .route(
            "/api/threads/{thread_id}",
            get(routes::threads::get).delete(routes::threads::delete),
        )
        .route(
            "/api/threads/{thread_id}/state",
            get(routes::threads::state),
        )
        .route(
            "/api/threads/{thread_id}/token-usage",
            get(routes::token_usage::get),
        )
        .route(
            "/api/threads/{thread_id}/history",
            get(routes::threads::history_get).post(routes::threads::history_post),
        )
        .route(
            "/api/threads/{thread_id}/runs/{run_id}/cancel",
            post(routes::runs::cancel),
        )
        .route(
            "/api/threads/{thread_id}/runs/stream",
            post(routes::runs::stream),
        )
        .route(
            "/api/threads/{thread_id}/runs/wait",
            post(routes::runs::wait),
        )
        .route(
            "/api/threads/{thread_id}/runs",
            get(routes::runs::list).post(routes::runs::create),
        )
        .route(
            "/api/threads/{thread_id}/runs/{run_id}",
            get(routes::runs::get),
        )
        .route(
            "/api/threads/{thread_id}/runs/{run_id}/events",
            get(routes::events::list),
        )
        .route(
            "/api/threads/{thread_id}/runs/{run_id}/tasks",
            get(routes::tasks::list),
        )
        .route(
            "/api/threads/{thread_id}/runs/{run_id}/stream",
            get(routes::runs::rejoin),
        )
        .route(
            "/api/threads/{thread_id}/subagent-batches",
            get(routes::batches::list),
        )
        .route(
            "/api/threads/{thread_id}/subagent-batches/{batch_id}",
            get(routes::batches::get),
        )
        .route(
            "/api/threads/{thread_id}/subagent-batches/{batch_id}/items",
            get(routes::batches::items),
        )
        .route(
            "/api/threads/{thread_id}/subagent-batches/{batch_id}/pause",
            post(routes::batches::pause),
        )
        .route(
            "/api/threads/{thread_id}/subagent-batches/{batch_id}/resume",
            post(routes::batches::resume),
        )
        .route(
            "/api/threads/{thread_id}/subagent-batches/{batch_id}/cancel",
            post(routes::batches::cancel),
        )
        .route(
            "/api/threads/{thread_id}/subagent-batches/{batch_id}/items/{item_id}/retry",
            post(routes::batches::retry),
        )
        .route(
            "/api/threads/{thread_id}/subagent-batches/{batch_id}/results.jsonl",
            get(routes::batches::results),
        )
        // After every route: it applies to the routes registered before it.
        .method_not_allowed_fallback(extract::method_not_allowed)
        .fallback(web::fallback)
        .layer(axum::extract::DefaultBodyLimit::max(routes::MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            origin::refuse_cross_origin,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .layer(axum::middleware::from_fn(trace::trace_id))
        // Outermost, so refusals by the layers above are counted too; `Router::layer`
        // wraps each route, so the matched route template is known here.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::count_requests,
        ))
        .with_state(state)
}

/// Serves `router(state)` on `listener` until `shutdown` completes. Runs left behind by
/// a stopped process are recovered first; while serving, stream logs are pruned, orphaned
/// runs recovered and remote cancel requests relayed (`stream::upkeep`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let _upkeep = stream::upkeep::start(&state).await;
    let timeouts = state.connections;
    server::run(listener, router(state), timeouts, shutdown).await
}
