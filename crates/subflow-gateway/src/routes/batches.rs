//! `/api/threads/{thread_id}/subagent-batches` (SPEC §12.2) and `GET /api/features`
//! (SPEC §12.11).
//!
//! Every route runs the thread checks of SPEC §13 first (`threads:read` for GET,
//! `threads:write` for POST), then loads the batch for the caller's user in that thread:
//! a missing or foreign batch, or one of another thread, is 404 `Subagent batch not
//! found`. There is no create route: the lead submits batches with `batch_task`.

use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use subflow_contracts::{BatchItemStatus, Permission};
use subflow_store::batches::{
    ActivityQuery, BatchActivity, BatchItem, BatchQuery, BatchRecord, BatchScope, EXPORT_PAGE,
    ITEMS_MAX_LIMIT, ItemQuery, LIST_MAX_LIMIT, RetryOutcome,
};
use time::OffsetDateTime;

use crate::auth::{Caller, authorize_thread};
use crate::extract::{Path, Query};
use crate::batch_progress::{Progress, progress, window_start};
use crate::{ApiError, AppState};

/// 404 for a missing, foreign or other-thread batch.
pub const NOT_FOUND: &str = "Subagent batch not found";
/// 503 of cancel when `subagent_batches.enabled` is false.
pub const WORKER_NOT_RUNNING: &str = "Subagent batch worker is not running";
/// 409 of retry for an item that is not failed, unknown or foreign.
pub const ONLY_FAILED: &str = "Only failed items can be retried";
/// 409 of retry in a cancelled batch.
pub const CANCELLED_BATCH: &str = "Items of a cancelled batch cannot be retried";
/// 422 of an unknown `status` filter.
pub const UNKNOWN_STATUS: &str = "Unknown batch item status";

/// What the gateway knows of durable batches in this process (SPEC §12.10, §12.11).
#[derive(Debug, Clone)]
pub struct BatchFeatures {
    /// `subagent_batches.enabled`.
    pub enabled: bool,
    /// `subagent_batches.lease_seconds`: a heartbeat younger than this is a live worker.
    pub lease: Duration,
    /// This process's batch worker, when it runs one.
    pub worker: Option<subflow_batches::Handle>,
}

impl Default for BatchFeatures {
    fn default() -> Self {
        BatchFeatures {
            enabled: true,
            lease: Duration::from_secs(120),
            worker: None,
        }
    }
}

impl BatchFeatures {
    /// Whether this process runs a worker now.
    pub fn local_worker_running(&self) -> bool {
        self.worker.as_ref().is_some_and(|w| w.is_running())
    }
}

/// Whether some worker runs: this process's, or on a shared store (PostgreSQL) any whose
/// heartbeat is younger than the lease.
pub(crate) async fn worker_running(state: &AppState) -> Result<bool, ApiError> {
    let features = &state.batches;
    if !features.enabled {
        return Ok(false);
    }
    if features.local_worker_running() {
        return Ok(true);
    }
    if !state.store.is_shared() {
        return Ok(false);
    }
    let live = state
        .store
        .live_workers(features.lease)
        .await
        .map_err(store_error)?;
    Ok(live > 0)
}

/// `GET /api/features`.
pub async fn features(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let running = worker_running(&state).await?;
    // The claim capacity of a worker here: this process's, or what one started with
    // this configuration would have.
    let max_running = match &state.batches.worker {
        Some(worker) if running => worker.max_running(),
        _ if running => state.runtime.admission().max_running(),
        _ => 0,
    };
    Ok(Json(json!({"subagent_batches": {
        "enabled": running,
        "repository_available": true,
        "worker_running": running,
        "max_running": max_running,
    }})))
}

fn store_error(error: subflow_store::Error) -> ApiError {
    if error.is_invalid_input() {
        ApiError::Unprocessable(error.to_string())
    } else {
        tracing::error!(%error, "batch store call failed");
        ApiError::Unavailable("Subagent batch store not available".to_owned())
    }
}

/// The public fields of a batch (SPEC §12.3), `counts` always with all seven statuses,
/// then the additive progress fields.
pub fn public_batch(batch: &BatchRecord, progress: &Progress) -> Value {
    json!({
        "id": batch.id,
        "thread_id": batch.thread_id,
        "title": batch.title,
        "subagent_type": batch.subagent_type,
        "status": batch.status,
        "total_items": batch.total_items,
        "max_live_items": batch.max_live_items,
        "max_running_items": batch.max_running_items,
        "max_attempts": batch.max_attempts,
        "created_at": batch.created_at,
        "updated_at": batch.updated_at,
        "completed_at": batch.completed_at,
        "counts": batch.counts,
        "usage": progress.usage,
        "cost": progress.cost,
        "items_per_minute": progress.items_per_minute,
        "eta_seconds": progress.eta_seconds,
        "projected_cost": progress.projected_cost,
    })
}

/// The public batches with their progress, from one activity read of the store.
async fn present(
    state: &AppState,
    scope: &BatchScope,
    batches: &[BatchRecord],
) -> Result<Vec<Value>, ApiError> {
    if batches.is_empty() {
        return Ok(Vec::new());
    }
    let now = OffsetDateTime::now_utc();
    let query = ActivityQuery {
        batch_ids: Some(batches.iter().map(|batch| batch.id.clone()).collect()),
        completed_since: window_start(now),
    };
    let activities = state
        .store
        .batch_activity(scope, &query)
        .await
        .map_err(store_error)?;
    Ok(batches
        .iter()
        .map(|batch| {
            let activity = BatchActivity::find(&activities, &batch.id);
            public_batch(batch, &progress(batch, &activity, now, &state.model_facts))
        })
        .collect())
}

/// One public batch with its progress.
async fn present_one(
    state: &AppState,
    scope: &BatchScope,
    batch: BatchRecord,
) -> Result<Json<Value>, ApiError> {
    let mut presented = present(state, scope, std::slice::from_ref(&batch)).await?;
    Ok(Json(presented.pop().unwrap_or(Value::Null)))
}

/// The public fields of an item (SPEC §12.3); never its prompt, lease or result.
pub fn public_item(item: &BatchItem) -> Value {
    json!({
        "id": item.id,
        "batch_id": item.batch_id,
        "item_key": item.item_key,
        "position": item.position,
        "status": item.status,
        "attempt": item.attempt,
        "model_name": item.model_name,
        "result_preview": item.result_preview,
        "result_truncated": item.result_truncated,
        "error": item.error,
        "stop_reason": item.stop_reason,
        "token_usage": item.token_usage,
        "acceptance_criteria": item.acceptance_criteria,
        "acceptance_verdict": item.acceptance_verdict,
        "started_at": item.started_at,
        "completed_at": item.completed_at,
        "created_at": item.created_at,
        "updated_at": item.updated_at,
    })
}

/// One export line: the public item plus `result`.
fn export_line(item: &BatchItem) -> Vec<u8> {
    let mut value = public_item(item);
    value["result"] = json!(item.result);
    let mut line = value.to_string().into_bytes();
    line.push(b'\n');
    line
}

/// The thread checks, then the caller's scope in that thread.
async fn scope(
    state: &AppState,
    caller: &Caller,
    needed: Permission,
    thread_id: &str,
) -> Result<BatchScope, ApiError> {
    authorize_thread(state, caller, needed, thread_id).await?;
    Ok(BatchScope::thread(&caller.user_id, thread_id))
}

fn not_found() -> ApiError {
    ApiError::NotFound(NOT_FOUND.to_owned())
}

/// The batch in scope, else 404.
async fn load(
    state: &AppState,
    scope: &BatchScope,
    batch_id: &str,
) -> Result<BatchRecord, ApiError> {
    state
        .store
        .get_batch(scope, batch_id)
        .await
        .map_err(store_error)?
        .ok_or_else(not_found)
}

/// A non-negative integer query parameter, else 422 naming it.
fn integer(name: &str, raw: Option<&str>, default: u32) -> Result<u32, ApiError> {
    match raw {
        None => Ok(default),
        Some(text) => text.parse::<u32>().map_err(|_| {
            ApiError::Unprocessable(format!(
                "{name} must be a non-negative integer, got '{text}'"
            ))
        }),
    }
}

fn limit(raw: Option<&str>, default: u32, max: u32) -> Result<u32, ApiError> {
    let limit = integer("limit", raw, default)?;
    if (1..=max).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::Unprocessable(format!(
            "limit must be between 1 and {max}, got {limit}"
        )))
    }
}

/// `GET ""` parameters.
#[derive(Debug, Deserialize)]
pub struct ListParams {
    limit: Option<String>,
}

/// The caller's batches in the thread, newest first; `[]` for an unowned thread.
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path(thread_id): Path<String>,
    Query(params): Query<ListParams>,
) -> Result<Json<Vec<Value>>, ApiError> {
    let scope = scope(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    let query = BatchQuery {
        status: None,
        limit: limit(params.limit.as_deref(), 20, LIST_MAX_LIMIT)?,
    };
    let batches = state
        .store
        .list_batches(&scope, &query)
        .await
        .map_err(store_error)?;
    Ok(Json(present(&state, &scope, &batches).await?))
}

/// `GET /{batch_id}`.
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path((thread_id, batch_id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let scope = scope(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    let batch = load(&state, &scope, &batch_id).await?;
    present_one(&state, &scope, batch).await
}

/// `GET /api/subagent-batches/{batch_id}` (additive): the caller's batch in whichever of
/// their threads it is, so that a client holding only a batch id (`subflow batches
/// show`) learns its thread. Needs `threads:read`; another user's batch is 404.
pub async fn find(
    State(state): State<AppState>,
    caller: Caller,
    Path(batch_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::ThreadsRead)?;
    let batch = load(&state, &BatchScope::user(&caller.user_id), &batch_id).await?;
    let scope = BatchScope::thread(&caller.user_id, &batch.thread_id);
    present_one(&state, &scope, batch).await
}

/// `GET /{batch_id}/items` parameters.
#[derive(Debug, Deserialize)]
pub struct ItemParams {
    offset: Option<String>,
    limit: Option<String>,
    status: Option<String>,
}

/// A page of the batch's items in `position` order.
pub async fn items(
    State(state): State<AppState>,
    caller: Caller,
    Path((thread_id, batch_id)): Path<(String, String)>,
    Query(params): Query<ItemParams>,
) -> Result<Json<Vec<Value>>, ApiError> {
    let scope = scope(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    load(&state, &scope, &batch_id).await?;
    let status = params
        .status
        .as_deref()
        .map(|text| {
            text.parse::<BatchItemStatus>()
                .map_err(|_| ApiError::Unprocessable(UNKNOWN_STATUS.to_owned()))
        })
        .transpose()?;
    let query = ItemQuery {
        status,
        offset: integer("offset", params.offset.as_deref(), 0)?,
        limit: limit(params.limit.as_deref(), 100, ITEMS_MAX_LIMIT)?,
    };
    let items = state
        .store
        .list_items(&scope, &batch_id, &query)
        .await
        .map_err(store_error)?;
    Ok(Json(items.iter().map(public_item).collect()))
}

/// Which control a POST applies.
#[derive(Debug, Clone, Copy)]
enum Control {
    Pause,
    Resume,
    Cancel,
}

async fn control(
    state: &AppState,
    caller: &Caller,
    thread_id: &str,
    batch_id: &str,
    control: Control,
) -> Result<Json<Value>, ApiError> {
    let scope = scope(state, caller, Permission::ThreadsWrite, thread_id).await?;
    if matches!(control, Control::Cancel) && !state.batches.enabled {
        return Err(ApiError::Unavailable(WORKER_NOT_RUNNING.to_owned()));
    }
    let store = &state.store;
    let changed = match control {
        Control::Pause => store.pause_batch(&scope, batch_id).await,
        Control::Resume => store.resume_batch(&scope, batch_id).await,
        Control::Cancel => store.cancel_batch(&scope, batch_id).await,
    }
    .map_err(store_error)?
    .ok_or_else(not_found)?;
    tracing::info!(batch_id, ?control, status = %changed.status, user_id = %caller.user_id, "batch control");
    present_one(state, &scope, changed).await
}

/// `POST /{batch_id}/pause`: queued or running → paused, else a 200 no-op.
pub async fn pause(
    State(state): State<AppState>,
    caller: Caller,
    Path((thread_id, batch_id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    control(&state, &caller, &thread_id, &batch_id, Control::Pause).await
}

/// `POST /{batch_id}/resume`: paused → queued, else a 200 no-op.
pub async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    Path((thread_id, batch_id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    control(&state, &caller, &thread_id, &batch_id, Control::Resume).await
}

/// `POST /{batch_id}/cancel`: every unfinished item cancelled at once; workers anywhere
/// stop their executions at the next renewal.
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path((thread_id, batch_id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    control(&state, &caller, &thread_id, &batch_id, Control::Cancel).await
}

/// `POST /{batch_id}/items/{item_id}/retry`: a failed item back to `pending`.
pub async fn retry(
    State(state): State<AppState>,
    caller: Caller,
    Path((thread_id, batch_id, item_id)): Path<(String, String, String)>,
) -> Result<Json<Value>, ApiError> {
    let scope = scope(&state, &caller, Permission::ThreadsWrite, &thread_id).await?;
    match state
        .store
        .retry_item(&scope, &batch_id, &item_id)
        .await
        .map_err(store_error)?
    {
        RetryOutcome::Retried { item, .. } => {
            tracing::info!(%batch_id, %item_id, "batch item retried");
            Ok(Json(public_item(&item)))
        }
        RetryOutcome::BatchNotFound => Err(not_found()),
        RetryOutcome::NotFailed => Err(ApiError::Conflict(ONLY_FAILED.to_owned())),
        RetryOutcome::BatchCancelled => Err(ApiError::Conflict(CANCELLED_BATCH.to_owned())),
    }
}

/// `GET /{batch_id}/results.jsonl`: one line per item with its `result`, in `position`
/// order, read from the store in pages of 500 while the body streams.
pub async fn results(
    State(state): State<AppState>,
    caller: Caller,
    Path((thread_id, batch_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let scope = scope(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    let batch = load(&state, &scope, &batch_id).await?;
    let store = state.store.clone();
    let id = batch.id.clone();
    // The cursor is the last position sent; `Some(None)` starts, `None` has ended.
    let pages = futures::stream::unfold(Some(None::<u32>), move |cursor| {
        let (store, scope, id) = (store.clone(), scope.clone(), id.clone());
        async move {
            let after = cursor?;
            match store.export_items(&scope, &id, after).await {
                Ok(page) if page.is_empty() => None,
                Ok(page) => {
                    let next = (page.len() as u32 == EXPORT_PAGE)
                        .then(|| page.last().map(|item| item.position));
                    let bytes: Vec<u8> = page.iter().flat_map(export_line).collect();
                    Some((Ok::<_, std::io::Error>(Bytes::from(bytes)), next))
                }
                Err(error) => {
                    tracing::error!(%error, batch_id = %id, "batch export failed mid-stream");
                    Some((Err(std::io::Error::other(error.to_string())), None))
                }
            }
        }
    });
    let disposition = format!("attachment; filename=\"{}-results.jsonl\"", batch.id);
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson".to_owned()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        Body::from_stream(pages),
    )
        .into_response())
}
