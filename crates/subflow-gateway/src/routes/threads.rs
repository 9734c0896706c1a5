//! `POST /api/threads` and `GET /api/threads/{thread_id}` (SPEC §2.1, §2.3).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use subflow_store::{NewThread, ThreadRecord};

use super::{checked_thread_id, parse_body};
use crate::{ApiError, AppState, LOCAL_USER};

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

/// `POST /api/threads`.
pub async fn create(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
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
        owner: LOCAL_USER.to_owned(),
        metadata: request.metadata,
    };
    let thread = match state.store.create_thread(new).await {
        Ok(thread) => thread,
        Err(subflow_store::Error::ThreadExists(_)) if !raise => state
            .store
            .get_thread(&thread_id)
            .await?
            .ok_or_else(|| not_found(&thread_id))?,
        Err(subflow_store::Error::ThreadExists(_)) => {
            return Err(ApiError::Conflict(format!(
                "Thread {thread_id} already exists"
            )));
        }
        Err(error) => return Err(error.into()),
    };
    Ok(Json(thread_json(&state, &thread).await?))
}

/// `GET /api/threads/{thread_id}`.
pub async fn get(
    State(state): State<AppState>,
    Path(thread_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    checked_thread_id(&thread_id)?;
    let thread = state
        .store
        .get_thread(&thread_id)
        .await?
        .ok_or_else(|| not_found(&thread_id))?;
    Ok(Json(thread_json(&state, &thread).await?))
}

/// 404 `Thread {thread_id} not found`.
pub fn not_found(thread_id: &str) -> ApiError {
    ApiError::NotFound(format!("Thread {thread_id} not found"))
}
