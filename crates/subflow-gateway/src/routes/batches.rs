//! `/api/threads/{thread_id}/subagent-batches` (docs/batches.md#routes) and `GET /api/features`
//! (docs/batches.md#capability).
//!
//! Every route runs the thread checks of docs/api.md#auth-and-ownership first (`threads:read` for GET,
//! `threads:write` for POST), then loads the batch for the caller's user in that thread:
//! a missing or foreign batch, or one of another thread, is 404 `Subagent batch not
//! found`. Batches are submitted by a lead's `batch_task` call, or without a lead by
//! `POST …/subagent-batches` with the same arguments and an idempotency key.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use subflow_contracts::api::{
    Batch, BatchExportLine, BatchItem as PublicItem, BatchSubmission, ErrorBody, Features,
};
use subflow_contracts::{BatchItemStatus, BatchStatus, Permission};
use subflow_store::batches::{
    ActivityQuery, BatchActivity, BatchItem, BatchQuery, BatchRecord, BatchScope, EXPORT_PAGE,
    ITEMS_MAX_LIMIT, ItemQuery, LIST_MAX_LIMIT, RetryOutcome,
};
use time::OffsetDateTime;
use utoipa::IntoParams;

use subflow_runtime::budget::{BudgetScope, Budgets};

use super::threads::owned_or_created;
use super::{MAX_BATCH_BODY_BYTES, ThreadPath, paging, parse_body_within};
use crate::auth::{Caller, authorize_thread};
use crate::batch_progress::{Progress, progress, window_start};
use crate::budgets::shown;
use crate::extract::{Path, Query};
use crate::trace::RequestTrace;
use crate::{ApiError, AppState};

/// `{thread_id}/subagent-batches/{batch_id}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct BatchPath {
    /// A thread id; another user's thread is 404.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    thread_id: String,
    /// A batch of the caller's in that thread.
    batch_id: String,
}

/// `{thread_id}/subagent-batches/{batch_id}/items/{item_id}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ItemPath {
    /// A thread id; another user's thread is 404.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    thread_id: String,
    /// A batch of the caller's in that thread.
    batch_id: String,
    /// An item of that batch.
    item_id: String,
}

/// 404 for a missing, foreign or other-thread batch.
pub const NOT_FOUND: &str = "Subagent batch not found";
/// 503 of cancel when `subagent_batches.enabled` is false.
pub const WORKER_NOT_RUNNING: &str = "Subagent batch worker is not running";
/// 409 of retry for an item that is not failed, unknown or foreign.
pub const ONLY_FAILED: &str = "Only failed items can be retried";
/// 409 of retry in a cancelled batch.
pub const CANCELLED_BATCH: &str = "Items of a cancelled batch cannot be retried";

/// What the gateway knows of durable batches in this process (docs/batches.md#configuration, docs/batches.md#capability).
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

/// `GET /api/features`: optional capabilities of this gateway.
#[utoipa::path(get, path = "/api/features", tag = "server",
    responses(
        (status = 200, description = "What this gateway offers", body = Features),
        (status = 503, description = "The batch store is not available", body = ErrorBody),
    ))]
pub async fn features(State(state): State<AppState>) -> Result<Json<Features>, ApiError> {
    let running = worker_running(&state).await?;
    // The claim capacity of a worker here: this process's, or what one started with
    // this configuration would have.
    let max_running = match &state.batches.worker {
        Some(worker) if running => worker.max_running(),
        _ if running => state.runtime.admission().max_running(),
        _ => 0,
    };
    Ok(Json(Features {
        subagent_batches: subflow_contracts::api::BatchFeatures {
            enabled: running,
            repository_available: true,
            worker_running: running,
            max_running: u32::try_from(max_running).unwrap_or(u32::MAX),
        },
    }))
}

fn store_error(error: subflow_store::Error) -> ApiError {
    if error.is_invalid_input() {
        ApiError::Unprocessable(error.to_string())
    } else {
        tracing::error!(%error, "batch store call failed");
        ApiError::Unavailable("Subagent batch store not available".to_owned())
    }
}

/// The public fields of a batch (docs/batches.md#data-model), `counts` always with all seven statuses,
/// then the additive progress fields.
pub fn public_batch(batch: &BatchRecord, progress: Progress, budgets: Option<&Budgets>) -> Batch {
    let spent = progress.cost.as_ref().map_or(0.0, |cost| cost.total);
    Batch {
        pause_reason: batch.pause_reason.clone(),
        budget: budgets.and_then(|budgets| shown(budgets, BudgetScope::Batch, spent)),
        id: batch.id.clone(),
        thread_id: batch.thread_id.clone(),
        title: batch.title.clone(),
        subagent_type: batch.subagent_type.clone(),
        status: batch.status,
        total_items: batch.total_items,
        max_live_items: batch.max_live_items,
        max_running_items: batch.max_running_items,
        max_attempts: batch.max_attempts,
        created_at: batch.created_at.clone(),
        updated_at: batch.updated_at.clone(),
        completed_at: batch.completed_at.clone(),
        counts: batch.counts,
        usage: progress.usage,
        cost: progress.cost,
        items_per_minute: progress.items_per_minute,
        eta_seconds: progress.eta_seconds,
        projected_cost: progress.projected_cost,
    }
}

/// The public batches with their progress, from one activity read of the store.
async fn present(
    state: &AppState,
    scope: &BatchScope,
    batches: &[BatchRecord],
) -> Result<Vec<Batch>, ApiError> {
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
            public_batch(
                batch,
                progress(batch, &activity, now, &state.model_facts),
                state.runtime.budgets().map(|b| &**b),
            )
        })
        .collect())
}

/// One public batch with its progress.
async fn present_one(
    state: &AppState,
    scope: &BatchScope,
    batch: BatchRecord,
) -> Result<Json<Batch>, ApiError> {
    let presented = present(state, scope, std::slice::from_ref(&batch)).await?;
    presented.into_iter().next().map(Json).ok_or_else(not_found)
}

/// The public fields of an item (docs/batches.md#data-model); never its prompt, lease or result.
pub fn public_item(item: &BatchItem) -> PublicItem {
    PublicItem {
        id: item.id.clone(),
        batch_id: item.batch_id.clone(),
        item_key: item.item_key.clone(),
        position: item.position,
        status: item.status,
        attempt: item.attempt,
        retries: item.retries,
        model_name: item.model_name.clone(),
        result_preview: item.result_preview.clone(),
        result_truncated: item.result_truncated,
        error: item.error.clone(),
        stop_reason: item.stop_reason,
        token_usage: item.token_usage,
        acceptance_criteria: item.acceptance_criteria.clone(),
        acceptance_verdict: item.acceptance_verdict.clone(),
        started_at: item.started_at.clone(),
        completed_at: item.completed_at.clone(),
        created_at: item.created_at.clone(),
        updated_at: item.updated_at.clone(),
    }
}

/// One export line: the public item plus `result`.
fn export_line(item: &BatchItem) -> Vec<u8> {
    let line = BatchExportLine {
        item: public_item(item),
        result: item.result.clone(),
    };
    // Serialising strings, numbers and enums cannot fail.
    let mut line = serde_json::to_vec(&line).unwrap_or_default();
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

/// `GET ""` parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Page size, default 20.
    #[param(minimum = 1, maximum = 100)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    limit: Option<u32>,
}

/// The caller's batches in the thread, newest first; `[]` for an unowned thread.
#[utoipa::path(get, path = "/api/threads/{thread_id}/subagent-batches", tag = "batches", params(ThreadPath, ListParams),
    responses(
        (status = 200, description = "The caller's batches in the thread, newest first (created_at, id descending); none for an unknown or deleted thread (docs/api.md#auth-and-ownership)", body = Vec<Batch>),
        (status = 404, description = "Another user's thread", body = ErrorBody),
        (status = 422, description = "Invalid query or thread id", body = ErrorBody),
        (status = 503, description = "The batch store is not available", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:read"))))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
    Query(params): Query<ListParams>,
) -> Result<Json<Vec<Batch>>, ApiError> {
    let scope = scope(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    let query = BatchQuery {
        status: None,
        limit: paging::limit(params.limit, 20, LIST_MAX_LIMIT)?,
        offset: 0,
    };
    let batches = state
        .store
        .list_batches(&scope, &query)
        .await
        .map_err(store_error)?;
    Ok(Json(present(&state, &scope, &batches).await?))
}

/// The query of `GET /api/subagent-batches`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AllParams {
    /// Page size, default 20, 1-100.
    #[param(minimum = 1, maximum = 100)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    limit: Option<u32>,
    /// Batches to skip.
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295_i64)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    offset: Option<u32>,
    /// Only batches with this status; absent means all.
    #[param(value_type = Option<BatchStatus>)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    status: Option<BatchStatus>,
}

/// `GET /api/subagent-batches` (additive): the caller's batches in every thread of
/// theirs, newest first, each with its thread id.
#[utoipa::path(get, path = "/api/subagent-batches", tag = "batches", params(AllParams),
    responses(
        (status = 200, description = "The caller's batches across their threads, newest first (created_at, id descending)", body = Vec<Batch>),
        (status = 422, description = "Invalid query", body = ErrorBody),
        (status = 503, description = "The batch store is not available", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:read"))))]
pub async fn list_all(
    State(state): State<AppState>,
    caller: Caller,
    Query(params): Query<AllParams>,
) -> Result<Json<Vec<Batch>>, ApiError> {
    caller.require(Permission::ThreadsRead)?;
    let scope = BatchScope::user(&caller.user_id);
    let query = BatchQuery {
        status: params.status,
        limit: paging::limit(params.limit, 20, LIST_MAX_LIMIT)?,
        offset: params.offset.unwrap_or(0),
    };
    let batches = state
        .store
        .list_batches(&scope, &query)
        .await
        .map_err(store_error)?;
    Ok(Json(present(&state, &scope, &batches).await?))
}

/// `POST ""`: a batch of the caller's, submitted without a lead. The body is the
/// `batch_task` tool's arguments with a `submission_key`, validated in the tool's order
/// and with its texts; a key already used in this thread returns the batch it created
/// (200, not 201), one used in another thread is 409.
/// A thread the caller does not have yet is created, as a run creates it.
#[utoipa::path(post, path = "/api/threads/{thread_id}/subagent-batches", tag = "batches", params(ThreadPath),
    request_body(content = BatchSubmission, description = "The items and limits of the batch"),
    responses(
        (status = 201, description = "The batch, created", body = Batch),
        (status = 200, description = "The batch an earlier submission with the same key created", body = Batch),
        (status = 404, description = "Another user's thread", body = ErrorBody),
        (status = 409, description = "The submission_key already made a batch in another thread", body = ErrorBody),
        (status = 422, description = "Invalid body, or a batch the batch_task rules refuse (the detail is the tool's text)", body = ErrorBody),
        (status = 503, description = "Durable batches are unavailable, or the batch store is not available", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:write"))))]
pub async fn submit(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
    Extension(trace): Extension<RequestTrace>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Batch>), ApiError> {
    // Another user's thread is 404 before the body is read, as on every thread route.
    let owned = authorize_thread(&state, &caller, Permission::RunsWrite, &thread_id).await?;
    let mut submission: BatchSubmission = parse_body_within(&body, MAX_BATCH_BODY_BYTES)?;
    if !state.batches.enabled {
        return Err(ApiError::Unavailable(
            subflow_runtime::batch::UNAVAILABLE.to_owned(),
        ));
    }
    if owned.is_none() {
        owned_or_created(&state, &caller, Permission::RunsWrite, &thread_id).await?;
    }
    let submission_key = std::mem::take(&mut submission.submission_key);
    let args = serde_json::to_value(&submission).expect("a submission always serialises");
    let by = subflow_runtime::batch::Submitter {
        user_id: caller.user_id.clone(),
        thread_id: thread_id.clone(),
        run_id: None,
        tool_call_id: None,
        trace_id: trace.id,
        model_name: state.runtime.model_name(None),
        submission_key,
    };
    let submitted = subflow_runtime::batch::submit_batch(&state.runtime, &args, by)
        .await
        .map_err(|error| match error {
            subflow_runtime::batch::SubmitError::Invalid(text) => ApiError::Unprocessable(text),
            subflow_runtime::batch::SubmitError::Conflict(text) => ApiError::Conflict(text),
            subflow_runtime::batch::SubmitError::Store(text) => ApiError::Unavailable(text),
        })?;
    let status = if submitted.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let scope = BatchScope::thread(&caller.user_id, &thread_id);
    let Json(batch) = present_one(&state, &scope, submitted.batch).await?;
    Ok((status, Json(batch)))
}

/// `GET /{batch_id}`: a batch with its counts by item status.
#[utoipa::path(get, path = "/api/threads/{thread_id}/subagent-batches/{batch_id}", tag = "batches", params(BatchPath),
    responses(
        (status = 200, description = "The batch", body = Batch),
        (status = 404, description = "No such batch of the caller's in the thread", body = ErrorBody),
        (status = 422, description = "Invalid thread id", body = ErrorBody),
        (status = 503, description = "The batch store is not available", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:read"))))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(BatchPath {
        thread_id,
        batch_id,
    }): Path<BatchPath>,
) -> Result<Json<Batch>, ApiError> {
    let scope = scope(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    let batch = load(&state, &scope, &batch_id).await?;
    present_one(&state, &scope, batch).await
}

/// `{batch_id}` of the batch lookup by id alone.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct BatchIdPath {
    /// A batch of the caller's, in any of their threads.
    batch_id: String,
}

/// `GET /api/subagent-batches/{batch_id}` (additive): the caller's batch in whichever of
/// their threads it is, so that a client holding only a batch id (`subflow batches
/// show`) learns its thread. Needs `threads:read`; another user's batch is 404.
#[utoipa::path(get, path = "/api/subagent-batches/{batch_id}", tag = "batches", params(BatchIdPath),
    description = "The caller's batch in whichever of their threads it is (additive).",
    responses(
        (status = 200, description = "The batch", body = Batch),
        (status = 404, description = "No such batch of the caller's", body = ErrorBody),
        (status = 503, description = "The batch store is not available", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:read"))))]
pub async fn find(
    State(state): State<AppState>,
    caller: Caller,
    Path(BatchIdPath { batch_id }): Path<BatchIdPath>,
) -> Result<Json<Batch>, ApiError> {
    caller.require(Permission::ThreadsRead)?;
    let batch = load(&state, &BatchScope::user(&caller.user_id), &batch_id).await?;
    let scope = BatchScope::thread(&caller.user_id, &batch.thread_id);
    present_one(&state, &scope, batch).await
}

/// `GET /{batch_id}/items` parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ItemParams {
    /// Items to skip, default 0.
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295_i64)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    offset: Option<u32>,
    /// Page size, default 100.
    #[param(minimum = 1, maximum = 500)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    limit: Option<u32>,
    /// Only items in this status.
    #[param(value_type = Option<BatchItemStatus>)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    status: Option<BatchItemStatus>,
}

/// A page of the batch's items in `position` order, without results.
#[utoipa::path(get, path = "/api/threads/{thread_id}/subagent-batches/{batch_id}/items", tag = "batches", params(BatchPath, ItemParams),
    responses(
        (status = 200, description = "A page of the batch's items in position order", body = Vec<PublicItem>),
        (status = 404, description = "No such batch of the caller's in the thread", body = ErrorBody),
        (status = 422, description = "Invalid query (Unknown batch item status) or thread id", body = ErrorBody),
        (status = 503, description = "The batch store is not available", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:read"))))]
pub async fn items(
    State(state): State<AppState>,
    caller: Caller,
    Path(BatchPath {
        thread_id,
        batch_id,
    }): Path<BatchPath>,
    Query(params): Query<ItemParams>,
) -> Result<Json<Vec<PublicItem>>, ApiError> {
    let scope = scope(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    load(&state, &scope, &batch_id).await?;
    let query = ItemQuery {
        status: params.status,
        offset: params.offset.unwrap_or(0),
        limit: paging::limit(params.limit, 100, ITEMS_MAX_LIMIT)?,
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
) -> Result<Json<Batch>, ApiError> {
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
    // Pausing or resuming a batch that has ended would change nothing it could show.
    if !matches!(control, Control::Cancel) && !changed.status.is_active() {
        return Err(ApiError::Conflict(format!(
            "Batch {batch_id} has already ended ({}): only a queued, running or paused batch can be paused or resumed",
            changed.status
        )));
    }
    tracing::info!(batch_id, ?control, status = %changed.status, user_id = %caller.user_id, "batch control");
    present_one(state, &scope, changed).await
}

/// `POST /{batch_id}/pause`: queued or running → paused; a paused batch is a 200 no-op
/// and an ended one a 409.
#[utoipa::path(post, path = "/api/threads/{thread_id}/subagent-batches/{batch_id}/pause", tag = "batches", params(BatchPath),
    description = "Pauses a queued or running batch; a 200 no-op for a paused one; 409 for a batch that has ended.",
    responses(
        (status = 200, description = "The batch after the control", body = Batch),
        (status = 404, description = "No such batch of the caller's in the thread", body = ErrorBody),
        (status = 409, description = "The batch has ended (completed, failed or cancelled)", body = ErrorBody),
        (status = 422, description = "Invalid thread id", body = ErrorBody),
        (status = 503, description = "The batch store is not available", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:write"))))]
pub async fn pause(
    State(state): State<AppState>,
    caller: Caller,
    Path(BatchPath {
        thread_id,
        batch_id,
    }): Path<BatchPath>,
) -> Result<Json<Batch>, ApiError> {
    control(&state, &caller, &thread_id, &batch_id, Control::Pause).await
}

/// `POST /{batch_id}/resume`: paused → queued; a queued or running batch is a 200
/// no-op and an ended one a 409.
#[utoipa::path(post, path = "/api/threads/{thread_id}/subagent-batches/{batch_id}/resume", tag = "batches", params(BatchPath),
    description = "Resumes a paused batch to queued; a 200 no-op for a queued or running one; 409 for a batch that has ended.",
    responses(
        (status = 200, description = "The batch after the control", body = Batch),
        (status = 404, description = "No such batch of the caller's in the thread", body = ErrorBody),
        (status = 409, description = "The batch has ended (completed, failed or cancelled)", body = ErrorBody),
        (status = 422, description = "Invalid thread id", body = ErrorBody),
        (status = 503, description = "The batch store is not available", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:write"))))]
pub async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    Path(BatchPath {
        thread_id,
        batch_id,
    }): Path<BatchPath>,
) -> Result<Json<Batch>, ApiError> {
    control(&state, &caller, &thread_id, &batch_id, Control::Resume).await
}

/// `POST /{batch_id}/cancel`: every unfinished item cancelled at once; workers anywhere
/// stop their executions at the next renewal.
#[utoipa::path(post, path = "/api/threads/{thread_id}/subagent-batches/{batch_id}/cancel", tag = "batches", params(BatchPath),
    description = "Cancels an active batch and every unfinished item at once.",
    responses(
        (status = 200, description = "The batch after the control", body = Batch),
        (status = 404, description = "No such batch of the caller's in the thread", body = ErrorBody),
        (status = 422, description = "Invalid thread id", body = ErrorBody),
        (status = 503, description = "The batch store is not available (also: Subagent batch worker is not running, when subagent_batches.enabled is false)", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:write"))))]
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(BatchPath {
        thread_id,
        batch_id,
    }): Path<BatchPath>,
) -> Result<Json<Batch>, ApiError> {
    control(&state, &caller, &thread_id, &batch_id, Control::Cancel).await
}

/// `POST /{batch_id}/items/{item_id}/retry`: a failed item back to `pending`.
#[utoipa::path(post, path = "/api/threads/{thread_id}/subagent-batches/{batch_id}/items/{item_id}/retry", tag = "batches", params(ItemPath),
    responses(
        (status = 200, description = "The item, pending again; a finished batch is queued again", body = PublicItem),
        (status = 404, description = "No such batch of the caller's in the thread", body = ErrorBody),
        (status = 409, description = "Only failed items can be retried, or Items of a cancelled batch cannot be retried", body = ErrorBody),
        (status = 422, description = "Invalid thread id", body = ErrorBody),
        (status = 503, description = "The batch store is not available", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:write"))))]
pub async fn retry(
    State(state): State<AppState>,
    caller: Caller,
    Path(ItemPath {
        thread_id,
        batch_id,
        item_id,
    }): Path<ItemPath>,
) -> Result<Json<PublicItem>, ApiError> {
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
#[utoipa::path(get, path = "/api/threads/{thread_id}/subagent-batches/{batch_id}/results.jsonl", tag = "batches", params(BatchPath),
    responses(
        (status = 200, description = "One line per item in position order, as an attachment named {batch_id}-results.jsonl", content_type = "application/x-ndjson", body = BatchExportLine),
        (status = 404, description = "No such batch of the caller's in the thread", body = ErrorBody),
        (status = 422, description = "Invalid thread id", body = ErrorBody),
        (status = 503, description = "The batch store is not available", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:read"))))]
pub async fn results(
    State(state): State<AppState>,
    caller: Caller,
    Path(BatchPath {
        thread_id,
        batch_id,
    }): Path<BatchPath>,
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
