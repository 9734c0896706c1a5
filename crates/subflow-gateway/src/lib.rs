//! The HTTP gateway: the LangGraph-compatible runs API with SSE framing (docs/api.md#runs), the
//! `/events` endpoint (docs/api.md#run-events), `/api/models` (docs/api.md#token-usage-and-models), the durable-batch routes and
//! `/api/features` (docs/batches.md#routes, docs/batches.md#capability), `/health`, `/metrics`
//! (docs/operations.md#metrics), and one `X-Trace-Id` on every response (docs/operations.md#trace-ids). Every `/api` route has a caller, a
//! permission and, for thread routes, an ownership check (`auth`, docs/api.md#auth-and-ownership).
//!
//! This is the only crate that knows HTTP status codes, headers and SSE framing. It
//! reaches runs through `subflow-runtime` and storage through the `subflow-store`
//! traits; the caller binds the listener and decides what stops the server.
//!
//! # Map
//!
//! `openapi.rs`, the successor of the hand-written document: `GET /api/openapi.json` is
//! generated from the handlers. Each handler carries a `#[utoipa::path]` with its path,
//! its own path and query types (`ThreadPath`, `RunPath`, `ListParams`, … deriving
//! `IntoParams`), its body and response types from `subflow_contracts::api`, and the
//! statuses it answers itself; every handler is listed once, in `api_routes!`, which
//! `api_router()` registers through `utoipa_axum::routes!` for the document and
//! `router()` registers on the same paths and methods without building the document (a
//! starting server does not need it), adding the fallback and the layers.
//! `openapi::complete` adds what the layers answer to every operation from what it
//! declares — the bearer requirement, 401 and 503 where `auth` looks tokens up (token
//! mode), 403 for a permission (`x-subflow-permission`) or the local-mode Origin check,
//! 408 and 413 for bodies — so the document is built once per auth mode and
//! `metrics.public`. SSE operations describe
//! each event (`RunFrame`: `event`, JSON `data`, `id`), which schemathesis checks event
//! by event. **A new route** is a handler with `#[utoipa::path(…)]` (its responses and
//! `extensions(("x-subflow-permission" = json!("…")))`), its bodies in
//! `subflow_contracts::api` deriving `ToSchema` under `openapi`, its path and query in
//! structs deriving `IntoParams` and read with `extract::Path` and `extract::Query` (a
//! bad value is 422 JSON; a typed query field — number, boolean, enum — is read with
//! `#[serde(default, deserialize_with = "crate::extract::value")]`, so its empty or
//! unknown values are refused by the one `QueryValue` rule, naming the parameter), and
//! one `[module::handler]` line in `api_routes!`; `scripts/schemathesis` then exercises
//! it. What keeps the document true where a derive alone would not: request bodies are
//! objects (`routes::parse_body` refuses anything else, although serde reads a struct
//! from an array); integers a request carries are read by `api::numbers` (a JSON Schema
//! `integer` includes `10.0`, serde's `u32` does not) and documented with the reader's
//! real range; unsupported run options are `type: null`; a header the server reads as
//! text is `nullable = false`; and `openapi::tests` holds one `check` that asks the
//! document and the server about the same request bodies and expects one answer.
//! `app.rs`, the one place the app is assembled: `AppOptions` (a `RuntimeOptions` plus
//! the gateway's settings, span exporters and batch worker options, named, with
//! docs/configuration.md#sources defaults) and `build`, which yields the `Application`:
//! the runtime, the metrics registry it counts into, the exporters, the worker and the
//! `AppState`; `Application::run(listener, shutdown)` serves it and stops it in order.
//! `subflow serve`, the benchmarks and the gateway tests' `spawn_app_with` differ only in
//! their options. Axum routes (`routes/<resource>.rs`), the SSE framing (`sse.rs`),
//! the `X-Trace-Id` layer (`trace.rs`) and the one place where failures become status
//! codes and `{"detail": …}` bodies (`error.rs`). `extract.rs` holds the `Path` and
//! `Query` extractors every handler takes, whose rejections are those 422s (a tidy test
//! forbids axum's own in handlers), and the 405 fallback; `routes/paging.rs` the list
//! routes' maximum limits and `json_array`, which streams a list of whole states one item
//! at a time. `server.rs` serves the connections (hyper HTTP/1.1 under our own accept
//! loop): a watcher per connection closes it when idle or stuck in a request's headers
//! past `server.*_timeout_seconds`, never while a request is answered, and request bodies
//! fail with a 408 past their deadline. `serve(listener, state, shutdown)`: the caller
//! binds the socket, so tests use port 0. `stream` owns run streams (docs/api.md):
//! `start_run` builds a new run's `RunSpec` and its execution (pricing its usage into the
//! metrics), then `launch` leases it, spawns it on the runtime and a pump that turns its
//! `RunOutput` into frames for the run's `persister` and renews the lease; the persister
//! numbers the frames, flushes the run's event buffers, appends the frames to the store's
//! log under the lease and only then publishes them to the run's `hub` (process-local;
//! watchers here are woken, never poll), which holds stored frames only; `follow` is one watcher at a cursor (the hub, else the
//! store woken by notices and re-read every second), its SSE body with heartbeats, and
//! what losing it does (the creator cancels unless `continue`; a rejoin only with
//! `cancel_on_disconnect=true`); `upkeep`, started by `serve`, relays the store's notices
//! (and remote cancel requests to runs executing here), prunes logs past the retention
//! and recovers orphaned runs (at start on a single-process store, every third of a lease
//! on a shared one). The creating stream, `GET …/runs/{run_id}/stream` and every other
//! process read the same frames. `auth.rs` is the authentication layer and the ownership
//! check (docs/api.md#auth-and-ownership): `authenticate` puts a `Caller` (user id and
//! permissions) into every `/api` request but `/api/openapi.json` — the implicit user
//! `default` in local mode, the owner of the bearer token in token mode — handlers check
//! their one permission with `Caller::require`, and every thread route calls
//! `authorize_thread` before it touches the thread, and every run route `authorize_run`
//! (the thread check, then the run in that thread, else 404 `Run {run_id} not found`).
//! `metrics.rs` serves `GET /metrics` (admin in token mode unless `metrics.public`) and
//! counts every request by matched route template; runs add their cost with the same
//! `usage::run_costs` that `/token-usage` uses. `web.rs` is the router's fallback: the
//! files of `web/assets`, embedded with `rust-embed` (`debug-embed`, so debug builds
//! embed them too), served with their content type, an ETag and `Cache-Control: no-cache`
//! (the HTML also with a strict Content-Security-Policy) for any path outside `/api`,
//! `/metrics` and `/health`, and `index.html` for paths that name no file;
//! `AppState::web_enabled` (`web.enabled`) turns it off. `routes/batches.rs` holds the
//! durable-batch routes of docs/batches.md#routes (thread checks first, then the batch
//! loaded for the caller in that thread, else 404 `Subagent batch not found`;
//! `results.jsonl` streamed from the store in pages of 500), the public projections of a
//! batch and an item (with the progress fields), `GET /api/subagent-batches/{id}` (a
//! batch by its id alone, for clients that hold only that), and `/api/features`, whose
//! `worker_running` is `AppState::batches`' worker handle or, on a shared store, a
//! heartbeat younger than the lease. `batch_progress.rs` is **the one pure function**
//! behind a batch's `usage`, `cost`, `items_per_minute`, `eta_seconds` and
//! `projected_cost` and `/token-usage`'s `batches` section, over the record and the
//! store's `BatchActivity` at a given time, pricing through `usage.rs` (`cost_of`, shared
//! with runs). `routes/messages.rs` pages the lead's `message`-category run events
//! backwards for a reloaded chat (`…/messages/page`); `routes/threads.rs` also merges
//! metadata (`PATCH`) and writes a state update as a new checkpoint (`POST …/state`,
//! refused while a run is in progress, since the run checkpoints its own state). Task
//! cancel requests for runs executing elsewhere go through the store
//! (`request_task_cancel`, announced like a run's cancel request) to the `upkeep` relay
//! of the gateway that holds the run.

mod app;
pub mod auth;
pub mod batch_progress;
pub mod budgets;
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
pub mod usage_report;
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

pub use app::{AppOptions, Application, BuildError, WorkerOptions, shut_down};
pub use auth::{AuthMode, Caller};
pub use error::ApiError;
pub use routes::batches::BatchFeatures;
pub use routes::token_usage::thread_token_usage;

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

/// Every route, once: each group is the handlers of one path (as their `#[utoipa::path]`
/// says), optionally with a layer of its own. `$build` is [`documented`] (each handler
/// with its OpenAPI operation, which `openapi::document` reads back) or [`served`] (the
/// same routes without building the document, so a starting server does not). A new
/// route is a handler with `#[utoipa::path]` added here, written `module::handler`.
macro_rules! api_routes {
    ($build:ident) => {{
        use routes::{
            account, assistants, batches, events, messages, runs, tasks, threads, token_usage,
            usage,
        };
        $build! {
            [routes::health],
            [metrics::get],
            [routes::models],
            [batches::features],
            [batches::find],
            [batches::list_all],
            [runs::list_all],
            [openapi::get],
            [routes::info],
            [account::me],
            [account::setup_status],
            [assistants::get],
            [assistants::graph],
            [assistants::schemas],
            [assistants::search],
            [threads::create],
            [threads::search],
            [threads::get, threads::delete, threads::patch],
            [threads::state, threads::update_state],
            [messages::page],
            [token_usage::get],
            [usage::get],
            [threads::history_get, threads::history_post],
            [runs::list, runs::create],
            [runs::stream],
            [runs::wait],
            [runs::get],
            [runs::cancel],
            [runs::join],
            [runs::rejoin],
            [events::list],
            [tasks::list],
            [tasks::cancel],
            // A batch submission carries a whole file of items.
            [batches::list, batches::submit] =>
                axum::extract::DefaultBodyLimit::max(routes::MAX_BATCH_BODY_BYTES),
            [batches::get],
            [batches::items],
            [batches::pause],
            [batches::resume],
            [batches::cancel],
            [batches::retry],
            [batches::results],
        }
    }};
}

/// [`api_routes`] with their OpenAPI operations, for `openapi::document`.
macro_rules! documented {
    ($([$($module:ident :: $handler:ident),+] $(=> $layer:expr)?),* $(,)?) => {
        OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
            $(.routes({
                let (schemas, paths, methods) = routes!($($module::$handler),+);
                (schemas, paths, methods $(.layer($layer))?)
            }))*
    };
}

/// [`api_routes`] as a plain router: each handler on the path and methods of its
/// `#[utoipa::path]`, without building any of the document.
macro_rules! served {
    ($([$($module:ident :: $handler:ident),+] $(=> $layer:expr)?),* $(,)?) => {
        pastey::paste! {
            Router::new()
                $(.route(
                    &group_path([$(<$module::[<__path_ $handler>] as utoipa::Path>::path()),+]),
                    {
                        let methods = axum::routing::MethodRouter::new();
                        $(let methods =
                            on_methods::<$module::[<__path_ $handler>], _, _>(methods, $module::$handler);)+
                        methods $(.layer($layer))?
                    },
                ))*
        }
    };
}

/// Every route with its OpenAPI operation, which `openapi::document` reads back.
pub(crate) fn api_router() -> OpenApiRouter<AppState> {
    api_routes!(documented)
}

/// The one path of a route group's handlers.
fn group_path<const N: usize>(paths: [String; N]) -> String {
    let [first, rest @ ..] = paths.as_slice() else {
        unreachable!("a route group names at least one handler");
    };
    assert!(
        rest.iter().all(|path| path == first),
        "a route group's handlers must share one path: {paths:?}"
    );
    first.clone()
}

/// `handler` added to `methods` on every method its `#[utoipa::path]` (`P`) names.
fn on_methods<P, H, T>(
    methods: axum::routing::MethodRouter<AppState>,
    handler: H,
) -> axum::routing::MethodRouter<AppState>
where
    P: utoipa::Path,
    H: axum::handler::Handler<T, AppState>,
    T: 'static,
{
    use utoipa_axum::PathItemExt;
    P::methods().iter().fold(methods, |methods, method| {
        methods.on(method.to_method_filter(), handler.clone())
    })
}

/// Every route and, in order, every layer: the request counter outermost, then the
/// trace-id layer around everything else, so errors carry the header too.
pub fn router(state: AppState) -> Router {
    let routes: Router<AppState> = api_routes!(served);
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
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let _upkeep = stream::upkeep::start(&state).await;
    let timeouts = state.connections;
    server::run(listener, router(state), timeouts, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::group_path;

    #[test]
    fn a_route_group_is_served_on_its_handlers_one_path() {
        let path = "/api/threads/{thread_id}".to_owned();
        assert_eq!(group_path([path.clone(), path.clone()]), path);
    }

    #[test]
    #[should_panic(expected = "must share one path")]
    fn handlers_of_different_paths_in_one_group_stop_the_router_being_built() {
        group_path(["/api/threads".to_owned(), "/api/runs".to_owned()]);
    }
}
