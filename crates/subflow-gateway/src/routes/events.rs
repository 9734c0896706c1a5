//! `GET /api/threads/{thread_id}/runs/{run_id}/events` (docs/api.md#run-events).

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use subflow_contracts::api::ErrorBody;
use subflow_contracts::{Permission, RunEvent};
use subflow_store::{EventQuery, MAX_PAGE_LIMIT};
use utoipa::IntoParams;

use super::RunPath;
use crate::auth::{Caller, authorize_thread};
use crate::extract::{Path, Query};
use crate::{ApiError, AppState};

/// The query of `…/events`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventParams {
    /// Comma-separated event types; empty means all.
    event_types: Option<String>,
    /// Only events of this task.
    task_id: Option<String>,
    /// Page size, default 500.
    #[param(minimum = 1, maximum = 2000)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    limit: Option<i64>,
    /// Only events with a larger seq.
    #[param(minimum = 1)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    after_seq: Option<i64>,
}

/// One page of a run's events, ascending by `seq`, as a bare array; `[]` for an
/// unowned thread id.
#[utoipa::path(get, path = "/api/threads/{thread_id}/runs/{run_id}/events", tag = "runs", params(RunPath, EventParams),
    responses(
        (status = 200, description = "Persisted run events, ascending by seq; none for an unknown or deleted thread or run (docs/api.md#auth-and-ownership)", body = Vec<RunEvent>),
        (status = 404, description = "Another user's thread", body = ErrorBody),
        (status = 422, description = "Invalid query or thread id", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:read"))))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path(RunPath { thread_id, run_id }): Path<RunPath>,
    Query(params): Query<EventParams>,
) -> Result<Response, ApiError> {
    let owned = authorize_thread(&state, &caller, Permission::RunsRead, &thread_id).await?;
    let limit = params.limit.unwrap_or(500);
    if !(1..=i64::from(MAX_PAGE_LIMIT)).contains(&limit) {
        return Err(ApiError::Unprocessable(format!(
            "limit must be between 1 and {MAX_PAGE_LIMIT}, got {limit}"
        )));
    }
    let after_seq = params.after_seq;
    if after_seq.is_some_and(|after| after < 1) {
        return Err(ApiError::Unprocessable(
            "after_seq must be at least 1".to_owned(),
        ));
    }
    // Split on commas without trimming; an empty parameter means no filter.
    let event_types = params
        .event_types
        .filter(|t| !t.is_empty())
        .map(|t| t.split(',').map(str::to_owned).collect());
    if owned.is_none() {
        return Ok(Json(Vec::<RunEvent>::new()).into_response());
    }
    let query = EventQuery {
        thread_id,
        run_id,
        event_types,
        task_id: params.task_id,
        after_seq,
        limit: limit as u32,
    };
    // Written straight from the store's rows, without `auth_token` in metadata.
    let page = state.store.list_events_json(&query).await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], page).into_response())
}
