//! Threads (docs/api.md#runs, docs/api.md#objects): create, get, search, delete, state and history. Every
//! route that names a thread goes through `authorize_thread` (docs/api.md#auth-and-ownership).

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
use subflow_contracts::api::threads::{CheckpointRef, IfExists, SearchedThread};
use subflow_contracts::api::{
    ErrorBody, HistoryRequest, SortOrder, StateUpdate, StateUpdated, Thread, ThreadCreate,
    ThreadField, ThreadPatch, ThreadSearch as SearchRequest, ThreadSortBy, ThreadState,
};
use subflow_contracts::messages::Message;
use subflow_contracts::{Permission, RunStatus, ThreadStatus};
use subflow_store::{
    Checkpoint, NewCheckpoint, NewThread, RunScope, Store, ThreadRecord, ThreadSearch,
};
use utoipa::IntoParams;

use super::{ThreadPath, checked_thread_id, paging, parse_body};
use crate::auth::{Caller, authorize_thread};
use crate::error::thread_not_found;
use crate::extract::{Path, Query};
use crate::{ApiError, AppState};

/// The latest checkpoint's values of a thread; empty before the first checkpoint.
async fn latest_values(state: &AppState, thread_id: &str) -> Result<Map<String, Value>, ApiError> {
    Ok(state
        .store
        .latest_checkpoint(thread_id)
        .await?
        .and_then(|c| match c.values {
            Value::Object(values) => Some(values),
            _ => None,
        })
        .unwrap_or_default())
}

/// The Thread object of a record and its latest values.
fn thread_of(thread: &ThreadRecord, values: Map<String, Value>) -> Thread {
    Thread {
        thread_id: thread.thread_id.clone(),
        created_at: thread.created_at.clone(),
        updated_at: thread.updated_at.clone(),
        metadata: thread.metadata.clone(),
        status: thread.status,
        values,
    }
}

/// The Thread object, with the latest checkpoint's values.
pub async fn thread_body(state: &AppState, thread: &ThreadRecord) -> Result<Thread, ApiError> {
    Ok(thread_of(
        thread,
        latest_values(state, &thread.thread_id).await?,
    ))
}

/// `POST /api/threads`: a thread owned by the caller. An id taken by another user's
/// thread is 404, as on every thread route.
#[utoipa::path(post, path = "/api/threads", tag = "threads",
    request_body(content = ThreadCreate, description = "Every field optional; an empty body creates a thread with a fresh id"),
    responses(
        (status = 200, description = "The thread, new or (if_exists=do_nothing) existing", body = Thread),
        (status = 404, description = "The id is another user's thread", body = ErrorBody),
        (status = 409, description = "The thread exists and if_exists is raise", body = ErrorBody),
        (status = 422, description = "Invalid body or thread id", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:write"))))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Thread>, ApiError> {
    caller.require(Permission::ThreadsWrite)?;
    let request: ThreadCreate = parse_body(&body)?;
    let thread_id = request
        .thread_id
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    checked_thread_id(&thread_id)?;
    let raise = match request.if_exists.as_deref().map(str::parse) {
        None | Some(Ok(IfExists::Raise)) => true,
        Some(Ok(IfExists::DoNothing)) => false,
        Some(Err(_)) => {
            return Err(ApiError::Unprocessable(format!(
                "if_exists must be 'raise' or 'do_nothing', got '{}'",
                request.if_exists.unwrap_or_default()
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
                .ok_or_else(|| thread_not_found(&thread_id))?;
            if raise {
                return Err(ApiError::Conflict(format!(
                    "Thread {thread_id} already exists"
                )));
            }
            existing
        }
        Err(error) => return Err(error.into()),
    };
    Ok(Json(thread_body(&state, &thread).await?))
}

/// Makes sure the caller has the thread: an existing one must be theirs (else 404), an
/// absent one is created for them (a concurrent request may create it first: then it
/// must be theirs).
pub(crate) async fn owned_or_created(
    state: &AppState,
    caller: &Caller,
    needed: Permission,
    thread_id: &str,
) -> Result<(), ApiError> {
    if authorize_thread(state, caller, needed, thread_id)
        .await?
        .is_some()
    {
        return Ok(());
    }
    let new = NewThread {
        thread_id: thread_id.to_owned(),
        owner: caller.user_id.clone(),
        metadata: Map::new(),
    };
    match state.store.create_thread(new).await {
        Ok(_) => Ok(()),
        Err(subflow_store::Error::ThreadExists(_)) => {
            authorize_thread(state, caller, needed, thread_id)
                .await?
                .ok_or_else(|| thread_not_found(thread_id))?;
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}

/// `GET /api/threads/{thread_id}`: a thread of the caller's.
#[utoipa::path(get, path = "/api/threads/{thread_id}", tag = "threads", params(ThreadPath),
    responses(
        (status = 200, description = "The thread with its latest values", body = Thread),
        (status = 404, description = "No such thread of the caller's", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:read"))))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
) -> Result<Json<Thread>, ApiError> {
    let thread = authorize_thread(&state, &caller, Permission::ThreadsRead, &thread_id)
        .await?
        .ok_or_else(|| thread_not_found(&thread_id))?;
    Ok(Json(thread_body(&state, &thread).await?))
}

/// `POST /api/threads/search`: the caller's threads, most recently updated first unless
/// `sort_by`/`sort_order` say otherwise, streamed: each thread carries its latest values
/// (unless `select` leaves them out), so the page is written one thread at a time.
/// `query` finds words in a thread's id, title or message text.
#[utoipa::path(post, path = "/api/threads/search", tag = "threads",
    request_body(content = SearchRequest, description = "Every field optional"),
    responses(
        (status = 200, description = "The caller's matching threads in the asked order; with `select`, only the selected fields of each", body = Vec<SearchedThread>),
        (status = 422, description = "Invalid body, a limit outside 1-1000, or an unknown sort or select name", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:read"))))]
pub async fn search(
    State(state): State<AppState>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    caller.require(Permission::ThreadsRead)?;
    let request: SearchRequest = parse_body(&body)?;
    let status = request
        .status
        .map(|s| {
            s.parse()
                .map_err(|e: subflow_contracts::status::UnknownValue| {
                    ApiError::Unprocessable(e.to_string())
                })
        })
        .transpose()?;
    let limit = paging::limit(request.limit, 10, paging::SEARCH_MAX_LIMIT)?;
    let offset = request.offset.unwrap_or(0);
    let mut search = ThreadSearch {
        owner: caller.user_id,
        ids: request.ids,
        metadata: request.metadata,
        status,
        sort_by: request.sort_by.unwrap_or(ThreadSortBy::UpdatedAt),
        sort_order: request.sort_order.unwrap_or(SortOrder::Desc),
        limit,
        offset,
    };
    let select = request.select.filter(|fields| !fields.is_empty());
    let with_values = select
        .as_ref()
        .is_none_or(|fields| fields.contains(&ThreadField::Values));
    let query = request
        .query
        .as_deref()
        .map(str::trim)
        .filter(|query| !query.is_empty())
        .map(str::to_lowercase);
    let found: Vec<(ThreadRecord, Option<Map<String, Value>>)> =
        if request.values.is_empty() && query.is_none() {
            let threads = state.store.search_threads(&search).await?;
            threads.into_iter().map(|thread| (thread, None)).collect()
        } else {
            // Values and messages live in the checkpoints: every candidate's latest one is
            // read, then the page is cut.
            search.limit = u32::MAX;
            search.offset = 0;
            let mut kept = Vec::new();
            for thread in state.store.search_threads(&search).await? {
                let values = latest_values(&state, &thread.thread_id).await?;
                let pairs_hold = request
                    .values
                    .iter()
                    .all(|(key, value)| values.get(key) == Some(value));
                if pairs_hold
                    && query
                        .as_deref()
                        .is_none_or(|query| mentions(&thread.thread_id, &values, query))
                {
                    kept.push((thread, Some(values)));
                }
            }
            kept.into_iter()
                .skip(offset as usize)
                .take(limit as usize)
                .collect()
        };
    let threads = futures::stream::iter(found).then(move |(thread, values)| {
        let state = state.clone();
        async move {
            let values = match values {
                Some(values) => values,
                None if with_values => latest_values(&state, &thread.thread_id).await?,
                None => Map::new(),
            };
            Ok::<_, ApiError>(thread_of(&thread, values))
        }
    });
    match select {
        None => paging::json_array(threads).await,
        Some(fields) => {
            let names: Vec<&'static str> = fields.iter().map(|f| f.as_str()).collect();
            paging::json_array(threads.map_ok(move |thread| selected(&thread, &names))).await
        }
    }
}

/// Whether a thread's id, title or message text holds `query` (lowercase), ignoring case.
fn mentions(thread_id: &str, values: &Map<String, Value>, query: &str) -> bool {
    let holds = |text: &str| text.to_lowercase().contains(query);
    holds(thread_id)
        || values
            .get("title")
            .and_then(Value::as_str)
            .is_some_and(holds)
        || values
            .get("messages")
            .and_then(Value::as_array)
            .is_some_and(|messages| {
                messages.iter().any(|message| {
                    holds(&subflow_contracts::text::flatten_content(
                        message.get("content"),
                    ))
                })
            })
}

/// Only the `names` fields of a thread.
fn selected(thread: &Thread, names: &[&str]) -> Map<String, Value> {
    let Ok(Value::Object(mut fields)) = serde_json::to_value(thread) else {
        unreachable!("a Thread serialises to an object");
    };
    fields.retain(|name, _| names.contains(&name.as_str()));
    fields
}

/// `PATCH /api/threads/{thread_id}`: merges metadata into a thread of the caller's.
#[utoipa::path(patch, path = "/api/threads/{thread_id}", tag = "threads", params(ThreadPath),
    request_body(content = ThreadPatch, description = "The metadata pairs to merge"),
    responses(
        (status = 200, description = "The thread with its merged metadata", body = Thread),
        (status = 404, description = "No such thread of the caller's", body = ErrorBody),
        (status = 422, description = "Invalid body or thread id", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:write"))))]
pub async fn patch(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Thread>, ApiError> {
    authorize_thread(&state, &caller, Permission::ThreadsWrite, &thread_id)
        .await?
        .ok_or_else(|| thread_not_found(&thread_id))?;
    let request: ThreadPatch = parse_body(&body)?;
    let thread = state
        .store
        .update_thread_metadata(&thread_id, &request.metadata)
        .await?
        .ok_or_else(|| thread_not_found(&thread_id))?;
    Ok(Json(thread_body(&state, &thread).await?))
}

/// `POST /api/threads/{thread_id}/state`: a new checkpoint whose values are the current
/// ones with `values` written over them (`{values: {title}}` renames the thread).
#[utoipa::path(post, path = "/api/threads/{thread_id}/state", tag = "threads", params(ThreadPath),
    request_body(content = StateUpdate, description = "The values to write"),
    responses(
        (status = 200, description = "The checkpoint written", body = StateUpdated),
        (status = 404, description = "No such thread of the caller's", body = ErrorBody),
        (status = 409, description = "A run of the thread is in progress", body = ErrorBody),
        (status = 422, description = "Invalid body or thread id, or values the state cannot hold", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:write"))))]
pub async fn update_state(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<StateUpdated>, ApiError> {
    let thread = authorize_thread(&state, &caller, Permission::ThreadsWrite, &thread_id)
        .await?
        .ok_or_else(|| thread_not_found(&thread_id))?;
    let request: StateUpdate = parse_body(&body)?;
    let update = request.values.unwrap_or_default();
    if let Some(messages) = update.get("messages")
        && let Err(error) = serde_json::from_value::<Vec<Message>>(messages.clone())
    {
        return Err(ApiError::Unprocessable(format!(
            "Invalid request body: values.messages must be a list of messages: {error}"
        )));
    }
    if update
        .get("title")
        .is_some_and(|title| !(title.is_string() || title.is_null()))
    {
        return Err(ApiError::Unprocessable(
            "Invalid request body: values.title must be a string or null".to_owned(),
        ));
    }
    // A run in progress (or about to start) checkpoints its own state after every step
    // and would write over this.
    let mut active = thread.status == ThreadStatus::Busy;
    for status in [RunStatus::Pending, RunStatus::Running] {
        active = active
            || !state
                .store
                .list_runs(RunScope::Thread(&thread_id), Some(status), 1, 0)
                .await?
                .is_empty();
    }
    if active {
        return Err(ApiError::Conflict(format!(
            "Thread {thread_id} has a run in progress: update its state once the run ends"
        )));
    }
    let latest = state.store.latest_checkpoint(&thread_id).await?;
    let mut values = match latest.as_ref().map(|c| &c.values) {
        Some(Value::Object(values)) => values.clone(),
        _ => Map::from_iter([("messages".to_owned(), json!([]))]),
    };
    values.extend(update);
    let mut metadata = Map::new();
    metadata.insert("source".into(), json!("update"));
    if let Some(node) = request.as_node {
        metadata.insert("as_node".into(), json!(node));
    }
    let checkpoint_id = uuid::Uuid::now_v7().to_string();
    state
        .store
        .put_checkpoint(NewCheckpoint {
            lease_owner: None,
            thread_id: thread_id.clone(),
            checkpoint_id: checkpoint_id.clone(),
            parent_checkpoint_id: latest.map(|c| c.checkpoint_id),
            run_id: None,
            values: Value::Object(values),
            metadata,
        })
        .await?;
    Ok(Json(StateUpdated {
        checkpoint: CheckpointRef {
            thread_id,
            checkpoint_ns: String::new(),
            checkpoint_id: Some(checkpoint_id),
        },
    }))
}

/// `DELETE /api/threads/{thread_id}`: cancels its active runs, then deletes all its data.
#[utoipa::path(delete, path = "/api/threads/{thread_id}", tag = "threads", params(ThreadPath),
    responses(
        (status = 204, description = "Deleted, with its runs, events, checkpoints and batches"),
        (status = 404, description = "No such thread of the caller's", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:write"))))]
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
) -> Result<StatusCode, ApiError> {
    if authorize_thread(&state, &caller, Permission::ThreadsWrite, &thread_id)
        .await?
        .is_none()
    {
        return Err(thread_not_found(&thread_id));
    }
    // Active runs stop first, wherever they execute, so nothing writes to the thread
    // while it is deleted.
    for status in [RunStatus::Running, RunStatus::Pending] {
        for run in state
            .store
            .list_runs(RunScope::Thread(&thread_id), Some(status), 100, 0)
            .await?
        {
            crate::stream::cancel_and_wait(&state, &thread_id, &run.run_id).await;
        }
    }
    state.store.delete_thread(&thread_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A ThreadState (docs/api.md#objects) of one checkpoint.
fn state_body(checkpoint: &Checkpoint) -> ThreadState {
    let at = |checkpoint_id: &str| CheckpointRef {
        thread_id: checkpoint.thread_id.clone(),
        checkpoint_ns: String::new(),
        checkpoint_id: Some(checkpoint_id.to_owned()),
    };
    ThreadState {
        values: checkpoint.values.clone(),
        next: Vec::new(),
        checkpoint: at(&checkpoint.checkpoint_id),
        metadata: checkpoint.metadata.clone(),
        created_at: Some(checkpoint.created_at.clone()),
        parent_checkpoint: checkpoint.parent_checkpoint_id.as_deref().map(at),
        tasks: Vec::new(),
        interrupts: Vec::new(),
    }
}

/// `GET …/state`: the latest checkpoint, or an empty state for a thread without one.
#[utoipa::path(get, path = "/api/threads/{thread_id}/state", tag = "threads", params(ThreadPath),
    responses(
        (status = 200, description = "The latest state; an empty one for an unknown or deleted thread (docs/api.md#auth-and-ownership)", body = ThreadState),
        (status = 404, description = "Another user's thread", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:read"))))]
pub async fn state(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
) -> Result<Json<ThreadState>, ApiError> {
    let owned = authorize_thread(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    let latest = match owned {
        Some(_) => state.store.latest_checkpoint(&thread_id).await?,
        None => None,
    };
    let Some(checkpoint) = latest else {
        return Ok(Json(ThreadState {
            values: json!({"messages": []}),
            next: Vec::new(),
            checkpoint: CheckpointRef {
                thread_id,
                checkpoint_ns: String::new(),
                checkpoint_id: None,
            },
            metadata: serde_json::Map::new(),
            created_at: None,
            parent_checkpoint: None,
            tasks: Vec::new(),
            interrupts: Vec::new(),
        }));
    };
    Ok(Json(state_body(&checkpoint)))
}

/// `GET …/history` query.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    /// Page size, default 10, 1-1000.
    #[param(minimum = 1, maximum = 1000)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    limit: Option<u32>,
    /// A checkpoint id to page before.
    before: Option<String>,
}

/// A history request's `before`: a checkpoint id, or a checkpoint config
/// `{configurable: {checkpoint_id}}` or `{checkpoint_id}` as the SDKs send it (one without
/// an id pages from the newest); anything else is 422.
pub(crate) fn before_checkpoint(before: Option<&Value>) -> Result<Option<String>, ApiError> {
    match before {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) => Ok(Some(id.clone())),
        Some(config @ Value::Object(_)) => Ok(config
            .pointer("/configurable/checkpoint_id")
            .or_else(|| config.get("checkpoint_id"))
            .and_then(Value::as_str)
            .map(str::to_owned)),
        Some(other) => Err(ApiError::Unprocessable(format!(
            "Invalid request body: before must be a checkpoint id or a checkpoint config object, got {other}"
        ))),
    }
}

/// Checkpoints read from the store per step of a streamed history: whole states, so few.
const HISTORY_PAGE: u32 = 4;

/// The history of `thread`, as `authorize_thread` found it: none for an unowned id.
/// Written a page of states at a time, newest first, until `limit` states.
async fn history(
    state: &AppState,
    thread: Option<ThreadRecord>,
    params: HistoryRequest,
) -> Result<Response, ApiError> {
    let limit = paging::limit(params.limit, 10, paging::HISTORY_MAX_LIMIT)?;
    let before = before_checkpoint(params.before.as_ref())?;
    // The request is checked in full before an unowned id answers with nothing.
    let Some(thread) = thread else {
        return paging::json_array(futures::stream::empty::<Result<ThreadState, ApiError>>()).await;
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
) -> Result<Option<(Vec<ThreadState>, HistoryCursor)>, ApiError> {
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
    Ok(Some((page.iter().map(state_body).collect(), cursor)))
}

/// `POST …/history` `{limit=10, before?}`: ThreadStates, newest first.
#[utoipa::path(post, path = "/api/threads/{thread_id}/history", tag = "threads", params(ThreadPath),
    request_body(content = HistoryRequest, description = "Every field optional"),
    responses(
        (status = 200, description = "Thread states, newest first; none for an unknown or deleted thread (docs/api.md#auth-and-ownership)", body = Vec<ThreadState>),
        (status = 404, description = "Another user's thread", body = ErrorBody),
        (status = 422, description = "Invalid body or thread id", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:read"))))]
pub async fn history_post(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let thread = authorize_thread(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    let params: HistoryRequest = parse_body(&body)?;
    history(&state, thread, params).await
}

/// `GET …/history?limit=&before=`: ThreadStates, newest first.
#[utoipa::path(get, path = "/api/threads/{thread_id}/history", tag = "threads", params(ThreadPath, HistoryQuery),
    responses(
        (status = 200, description = "Thread states, newest first; none for an unknown or deleted thread (docs/api.md#auth-and-ownership)", body = Vec<ThreadState>),
        (status = 404, description = "Another user's thread", body = ErrorBody),
        (status = 422, description = "Invalid query or thread id", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("threads:read"))))]
pub async fn history_get(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
    Query(query): Query<HistoryQuery>,
) -> Result<Response, ApiError> {
    let thread = authorize_thread(&state, &caller, Permission::ThreadsRead, &thread_id).await?;
    let request = HistoryRequest {
        limit: query.limit,
        before: query.before.map(Value::String),
    };
    history(&state, thread, request).await
}
