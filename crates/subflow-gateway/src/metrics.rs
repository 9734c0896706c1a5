//! `GET /metrics` (docs/operations.md#metrics) and the request counter behind
//! `subflow_http_requests_total`.
//!
//! The endpoint is not under `/api`, so the `auth` layer gives it no caller: in `token`
//! mode it authenticates the bearer token itself and requires `admin`, unless
//! `metrics.public` is set. With `metrics.enabled = false` it is 404 like any unknown path.

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subflow_contracts::Permission;

use crate::auth::{AuthMode, token_caller};
use crate::{ApiError, AppState};

/// The `route` label of requests no route matched (unknown paths, the UI fallback).
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// `GET /metrics`: the text exposition of this process's metrics; needs `admin` in token
/// mode unless `metrics.public`.
#[utoipa::path(get, path = "/metrics", tag = "server",
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4", content_type = "text/plain; version=0.0.4; charset=utf-8", body = String),
        (status = 401, description = "Authentication required (token mode)", body = subflow_contracts::api::ErrorBody),
        (status = 403, description = "Permission denied: admin", body = subflow_contracts::api::ErrorBody),
        (status = 404, description = "metrics.enabled is false", body = subflow_contracts::api::ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("admin"))))]
pub async fn get(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    if !state.metrics_enabled {
        return Err(ApiError::NotFound("Not Found".to_owned()));
    }
    if state.auth == AuthMode::Token && !state.metrics_public {
        token_caller(&state, &headers)
            .await?
            .require(Permission::Admin)?;
    }
    refresh_batch_gauges(&state).await;
    let mut response = state.metrics.encode().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(subflow_telemetry::metrics::CONTENT_TYPE),
    );
    Ok(response)
}

/// Reads the global batch gauges from the database when the last read is older than
/// 5 s (docs/operations.md#metrics). A failed read keeps the previous values and is logged.
async fn refresh_batch_gauges(state: &AppState) {
    use subflow_telemetry::metrics::BATCH_GAUGE_MAX_AGE;
    if state.metrics.batch_gauges_fresh(BATCH_GAUGE_MAX_AGE) {
        return;
    }
    let read = async {
        let totals = state.store.batch_totals().await?;
        let workers = state.store.live_workers(state.batches.lease).await?;
        Ok::<_, subflow_store::Error>((totals, workers))
    };
    match read.await {
        Ok((totals, workers)) => state.metrics.set_batch_gauges(totals, workers),
        Err(error) => tracing::warn!(%error, "reading the batch gauges failed"),
    }
}

/// Counts every answered request by its route template (never the raw path, so ids do
/// not become labels), method and status code.
pub async fn count_requests(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or(UNMATCHED_ROUTE, MatchedPath::as_str)
        .to_owned();
    let method = request.method().clone();
    let response = next.run(request).await;
    state
        .metrics
        .http_request(&route, method.as_str(), response.status().as_u16());
    response
}
