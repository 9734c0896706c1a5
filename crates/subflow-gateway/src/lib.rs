//! The HTTP gateway: the LangGraph-compatible runs API with SSE framing (docs/api.md#runs), the
//! `/events` endpoint (docs/api.md#run-events), `/api/models` (docs/api.md#token-usage-and-models), the durable-batch routes and
//! `/api/features` (docs/batches.md#routes, docs/batches.md#capability), `/health`, `/metrics`
//! (docs/operations.md#metrics), and one `X-Trace-Id` on every response (docs/operations.md#trace-ids). Every `/api` route has a caller, a
//! permission and, for thread routes, an ownership check (`auth`, docs/api.md#auth-and-ownership).
//!
//! This is the only crate that knows HTTP status codes, headers and SSE framing. It
//! reaches runs through `subflow-runtime` and storage through the `subflow-store`
//! traits; the caller binds the listener and decides what stops the server.

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
use subflow_runtime::runtime::Runtime;
use subflow_store::Store;
use subflow_telemetry::Metrics;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use app::AppOptions;
pub use auth::{AuthMode, Caller};
pub use error::ApiError;
pub use routes::batches::BatchFeatures;

/// A model as `/api/models` lists it.
pub use subflow_contracts::api::ModelListing;

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
    /// Durable batches: configured or not, and whether a worker runs (docs/batches.md#capability).
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
    /// Cancels one of its tasks.
    pub tasks: subflow_runtime::task_control::TaskControls,
    /// Becomes true when the run has ended.
    pub done: tokio::sync::watch::Receiver<bool>,
}

impl ActiveRun {
    /// Waits until the run has ended (its log stored and its lease released).
    pub async fn ended(&self) {
        let _ = self.done.clone().wait_for(|ended| *ended).await;
    }
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

/// The implicit user of `auth.mode = local` (docs/api.md#auth-and-ownership), and the owner of what it creates.
pub const LOCAL_USER: &str = "default";

/// Every route, each registered with its OpenAPI operation, which `openapi::document`
/// reads back: a new route is a handler with `#[utoipa::path]` added here.
pub(crate) fn api_router() -> OpenApiRouter<AppState> {
    use routes::{
        account, assistants, batches, events, messages, runs, tasks, threads, token_usage,
    };
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(routes::health))
        .routes(routes!(metrics::get))
        .routes(routes!(routes::models))
        .routes(routes!(batches::features))
        .routes(routes!(batches::find))
        .routes(routes!(batches::list_all))
        .routes(routes!(runs::list_all))
        .routes(routes!(openapi::get))
        .routes(routes!(routes::info))
        .routes(routes!(account::me))
        .routes(routes!(account::setup_status))
        .routes(routes!(assistants::get))
        .routes(routes!(assistants::graph))
        .routes(routes!(assistants::schemas))
        .routes(routes!(assistants::search))
        .routes(routes!(threads::create))
        .routes(routes!(threads::search))
        .routes(routes!(threads::get, threads::delete, threads::patch))
        .routes(routes!(threads::state, threads::update_state))
        .routes(routes!(messages::page))
        .routes(routes!(token_usage::get))
        .routes(routes!(threads::history_get, threads::history_post))
        .routes(routes!(runs::list, runs::create))
        .routes(routes!(runs::stream))
        .routes(routes!(runs::wait))
        .routes(routes!(runs::get))
        .routes(routes!(runs::cancel))
        .routes(routes!(runs::join))
        .routes(routes!(runs::rejoin))
        .routes(routes!(events::list))
        .routes(routes!(tasks::list))
        .routes(routes!(tasks::cancel))
        .routes({
            // A batch submission carries a whole file of items.
            let (schemas, paths, methods) = routes!(batches::list, batches::submit);
            let limit = axum::extract::DefaultBodyLimit::max(routes::MAX_BATCH_BODY_BYTES);
            (schemas, paths, methods.layer(limit))
        })
        .routes(routes!(batches::get))
        .routes(routes!(batches::items))
        .routes(routes!(batches::pause))
        .routes(routes!(batches::resume))
        .routes(routes!(batches::cancel))
        .routes(routes!(batches::retry))
        .routes(routes!(batches::results))
}

/// Every route and, in order, every layer: the request counter outermost, then the
/// trace-id layer around everything else, so errors carry the header too.
pub fn router(state: AppState) -> Router {
    let (routes, _) = api_router().split_for_parts();
    routes
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
