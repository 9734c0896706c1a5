//! Threads (SPEC §2.1, §2.3): create, get, search, delete, state and history. Every
//! route that names a thread goes through `authorize_thread` (SPEC §13).

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::Response;
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use subflow_contracts::{Permission, RunStatus};

use subflow_store::{Checkpoint, NewThread, Store, ThreadRecord, ThreadSearch};

use super::{checked_thread_id, paging, parse_body};
use crate::auth::{Caller, authorize_thread};
use crate::extract::{Path, Query};
use crate::{ApiError, AppState};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateThread {
    #[serde(default)]
    thread_id: Option<String>,
    #[serde(default)]
    metadata: Map<String, Value>,
    #[serde(default)]
    if_exists: Option<String>,
}

/// The Thread object, with the latest checkpoint's values.
pub async fn thread_json(state: &AppState, thread: &ThreadRecord) -> Result<Value, ApiError> {
    let values = state
        .store
        .latest_checkpoint(&thread.thread_id)
        .await?
        .map_or_else(|| json!({}), |c| c.values);
    Ok(json!({
        "thread_id": thread.thread_id, "created_at": thread.created_at, "updated_at": thread.updated_at,
        "metadata": thread.metadata, "status": thread.status, "values": values,
    }))
}

/// `POST /api/threads`: a thread owned by the caller. An id taken by another user's
/// thread is 404, as on every thread route.
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::ThreadsWrite)?;
    let request: CreateThread = parse_body(&body)?;
    let thread_id = request
        .thread_id
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    checked_thread_id(&thread_id)?;
    let raise = match request.if_exists.as_deref() {
        None | Some("raise") => true,
        Some("do_nothing") => false,
        Some(other) => {
            return Err(ApiError::Unprocessable(format!(
                "if_exists must be 'raise' or 'do_nothing', got '{other}'"
            )));
        }
    };
    let new = NewThread {
        thread_id: thread_id.clone(),
        owner: caller.user_id.clone(),
        metadata: request.metadata,
    };
    let thread = match state.store.create_thread(new).await {
        Ok(thread) => thread,
        Err(subflow_store::Error::ThreadExists(_)) => {
            let existing = authorize_thread(&state, &caller, Permission::ThreadsWrite, &thread_id)
                .await?
                .ok_or_else(|| not_found(&thread_id))?;
            if raise {
                return Err(ApiError::Conflict(format!(
                    "Thread {thread_id} already exists"
                )));
            }
            existing
        }
        Err(error) => return Err(error.into()),
    };
    Ok(Json(thread_json(&state, &thread).await?))
}

/// `GET /api/threads/{thread_id}`.
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(thread_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let thread = authorize_thread(&state, &caller, Permission::ThreadsRead, &thread_id)
        .await?
        .ok_or_else(|| not_found(&thread_id))?;
    Ok(Json(thread_json(&state, &thread).await?))
}

/// 404 `Thread {thread_id} not found`.
pub fn not_found(thread_id: &str) -> ApiError {
    ApiError::NotFound(format!("Thread {thread_id} not found"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchThreads {
    #[serde(default)]
    metadata: Map<String, Value>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    limit: Option<u32>,
    #[serde(default)]
    offset: Option<u32>,
}

/// `POST /api/threads/search`: the caller's threads, newest first, streamed: each
/// thread carries its latest values, so the page is written one thread at a time.
pub async fn search(
    State(state): State<AppState>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    caller.require(Permission::ThreadsRead)?;
    let request: SearchThreads = parse_body(&body)?;
    let status = request
        .status
        .map(|s| {
            s.parse()
                .map_err(|e: subflow_contracts::status::UnknownValue| {
                    ApiError::Unprocessable(e.to_string())
                })
        })
        .transpose()?;
    let search = ThreadSearch {
        owner: caller.user_id,
        metadata: request.metadata,
        status,
        limit: paging::limit(request.limit, 10, paging::SEARCH_MAX_LIMIT)?,
        offset: request.offset.unwrap_or(0),
    };
    let threads = state.store.search_threads(&search).await?;
    let items = futures::stream::iter(threads).then(move |thread| searched(state.clone(), thread));
    paging::json_array(items).await
}

/// One thread of a search result.
async fn searched(state: AppState, thread: ThreadRecord) -> Result<Value, ApiError> {
    thread_json(&state, &thread).await
}

/// `DELETE /api/threads/{thread_id}`: cancels its active runs, then deletes all its data.
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(thread_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if authorize_thread(&state, &caller, Permission::ThreadsWrite, &thread_id)
        .await?
        .is_none()
    {
        return Err(not_found(&thread_id));
    }
    // Active runs stop first, wherever they execute, so nothing writes to the thread
    // while it is deleted.
    for status in [RunStatus::Running, RunStatus::Pending] {
        for run in state
            .store
            .list_runs(&thread_id, Some(status), 100, 0)
            .await?
        {
            crate::stream::cancel_and_wait(&state, &thread_id, &run.run_id).await;
        }
    }
    state.store.delete_thread(&thread_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A ThreadState (SPEC §2.3) of one checkpoint.
fn state_json(checkpoint: &Checkpoint) -> Value {
    json!({
        "values": checkpoint.values,
        "next": [],
        "checkpoint": {"thread_id": checkpoint.thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint.checkpoint_id},
        "metadata": checkpoint.metadata,
        "created_at": checkpoint.created_at,
        "parent_checkpoint": checkpoint.parent_checkpoint_id.as_ref().map(|id| json!({"thread_id": checkpoint.thread_id, "checkpoint_ns": "", "checkpoint_id": id})),
        "tasks": [],
        "interrupts": [],
    })
}

/// `GET …/state`: the latest checkpoint, or an empty state for a thread without one.
pub async fn state(
    State(state): State<AppState>,
    caller: Caller,
    Path(thread_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let owned = authorize_thread(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    let latest = match owned {
        Some(_) => state.store.latest_checkpoint(&thread_id).await?,
        None => None,
    };
    let Some(checkpoint) = latest else {
        return Ok(Json(
            json!({"values": {"messages": []}, "next": [], "checkpoint": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": null}, "metadata": {}, "created_at": null, "parent_checkpoint": null, "tasks": [], "interrupts": []}),
        ));
    };
    Ok(Json(state_json(&checkpoint)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryParams {
    #[serde(default)]
    limit: Option<u32>,
    #[serde(default)]
    before: Option<Value>,
}

/// Checkpoints read from the store per step of a streamed history: whole states, so few.
const HISTORY_PAGE: u32 = 4;

/// The history of `thread`, as `authorize_thread` found it: none for an unowned id.
/// Written a page of states at a time, newest first, until `limit` states.
async fn history(
    state: &AppState,
    thread: Option<ThreadRecord>,
    params: HistoryParams,
) -> Result<Response, ApiError> {
    let limit = paging::limit(params.limit, 10, paging::HISTORY_MAX_LIMIT)?;
    let Some(thread) = thread else {
        return paging::json_array(futures::stream::empty()).await;
    };
    // `before` is a checkpoint id, or a checkpoint config {checkpoint_id} as the SDKs send it.
    let before = match &params.before {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(config) => config
            .pointer("/configurable/checkpoint_id")
            .or_else(|| config.get("checkpoint_id"))
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    let cursor = HistoryCursor {
        store: state.store.clone(),
        thread_id: thread.thread_id,
        left: limit,
        before,
    };
    let pages = futures::stream::try_unfold(cursor, history_page);
    paging::json_array(
        pages
            .map_ok(|page| futures::stream::iter(page.into_iter().map(Ok)))
            .try_flatten(),
    )
    .await
}

/// Where a streamed history is.
struct HistoryCursor {
    store: Arc<dyn Store>,
    thread_id: String,
    /// States still to send.
    left: u32,
    /// The last checkpoint sent.
    before: Option<String>,
}

/// The next page of a streamed history, newest first; `None` once `limit` states are
/// out or the store has no older ones.
async fn history_page(
    mut cursor: HistoryCursor,
) -> Result<Option<(Vec<Value>, HistoryCursor)>, ApiError> {
    if cursor.left == 0 {
        return Ok(None);
    }
    let wanted = cursor.left.min(HISTORY_PAGE);
    let page = cursor
        .store
        .list_checkpoints(&cursor.thread_id, wanted, cursor.before.as_deref())
        .await?;
    let Some(last) = page.last() else {
        return Ok(None);
    };
    cursor.before = Some(last.checkpoint_id.clone());
    // A short page is the end: nothing older is left.
    cursor.left = if page.len() < wanted as usize {
        0
    } else {
        cursor.left - wanted
    };
    Ok(Some((page.iter().map(state_json).collect(), cursor)))
}

/// `POST …/history` `{limit=10, before?}`: ThreadStates, newest first.
pub async fn history_post(
    State(state): State<AppState>,
    caller: Caller,
    Path(thread_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let thread = authorize_thread(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    let params: HistoryParams = parse_body(&body)?;
    history(&state, thread, params).await
}

/// The query of `GET …/history`.
#[derive(Debug, Deserialize)]
pub struct HistoryQuery {
    limit: Option<String>,
    before: Option<String>,
}

/// `GET …/history?limit=&before=`.
pub async fn history_get(
    State(state): State<AppState>,
    caller: Caller,
    Path(thread_id): Path<String>,
    Query(query): Query<HistoryQuery>,
) -> Result<Response, ApiError> {
    let thread = authorize_thread(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    let params = HistoryParams {
        limit: paging::integer("limit", query.limit.as_deref())?,
        before: query.before.map(Value::String),
    };
    history(&state, thread, params).await
}
