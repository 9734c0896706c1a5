//! `GET /api/threads/{thread_id}/messages/page`: the lead's persisted messages (the
//! `message`-category run events: human inputs, AI responses, tool results), paged
//! backwards by the thread-global `seq`, the way a reloaded chat loads its history.

use std::collections::{BTreeMap, BTreeSet};

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use subflow_contracts::api::{ErrorBody, MessagePage, MessageRecord};
use subflow_contracts::{EventType, Permission, RunEvent};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::IntoParams;

use super::ThreadPath;
use crate::auth::{Caller, authorize_thread};
use crate::extract::{Path, Query};
use crate::{ApiError, AppState};

/// The largest page.
pub const MESSAGES_MAX_LIMIT: u32 = 200;

/// The query of `…/messages/page`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Page size, default 50.
    #[param(minimum = 1, maximum = 200)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    limit: Option<i64>,
    /// Only records with a smaller seq: the previous page's `next_before_seq`.
    #[param(minimum = 1)]
    #[serde(default, deserialize_with = "crate::extract::value")]
    before_seq: Option<i64>,
    /// Refused: the page runs backwards only.
    #[param(ignore)]
    after_seq: Option<String>,
}

/// The newest `limit` lead messages before `before_seq`, oldest first. An unknown or
/// deleted thread has an empty page.
#[utoipa::path(get, path = "/api/threads/{thread_id}/messages/page", tag = "threads", params(ThreadPath, PageParams),
    responses(
        (status = 200, description = "A page of the lead's persisted messages, oldest first; an empty one for an unknown or deleted thread", body = MessagePage),
        (status = 404, description = "Another user's thread", body = ErrorBody),
        (status = 422, description = "Invalid query or thread id, or an after_seq", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:read"))))]
pub async fn page(
    State(state): State<AppState>,
    caller: Caller,
    Path(ThreadPath { thread_id }): Path<ThreadPath>,
    Query(params): Query<PageParams>,
) -> Result<Json<MessagePage>, ApiError> {
    let owned = authorize_thread(&state, &caller, Permission::RunsRead, &thread_id).await?;
    if params.after_seq.is_some() {
        return Err(ApiError::Unprocessable(
            "after_seq is not supported: this page runs backwards only (use before_seq)".to_owned(),
        ));
    }
    let limit = params.limit.unwrap_or(50);
    if !(1..=i64::from(MESSAGES_MAX_LIMIT)).contains(&limit) {
        return Err(ApiError::Unprocessable(format!(
            "limit must be between 1 and {MESSAGES_MAX_LIMIT}, got {limit}"
        )));
    }
    if let Some(before) = params.before_seq
        && before < 1
    {
        return Err(ApiError::Unprocessable(format!(
            "before_seq must be at least 1, got {before}"
        )));
    }
    let empty = MessagePage {
        data: Vec::new(),
        has_more: false,
        next_before_seq: None,
    };
    if owned.is_none() {
        return Ok(Json(empty));
    }
    // One more than the page says whether anything older is left.
    let mut rows = state
        .store
        .list_messages(&thread_id, params.before_seq, limit as u32 + 1)
        .await?;
    let has_more = rows.len() > limit as usize;
    if has_more {
        rows.remove(0);
    }
    let durations = run_durations(&state, &thread_id, &rows).await?;
    let data = records(rows, &durations);
    Ok(Json(MessagePage {
        next_before_seq: data.first().filter(|_| has_more).map(|r| r.event.seq),
        has_more,
        data,
    }))
}

/// Whole seconds from each run's creation to its last update, for the runs of `rows`.
async fn run_durations(
    state: &AppState,
    thread_id: &str,
    rows: &[RunEvent],
) -> Result<BTreeMap<String, i64>, ApiError> {
    let run_ids: BTreeSet<&str> = rows.iter().map(|row| row.run_id.as_str()).collect();
    let mut durations = BTreeMap::new();
    for run_id in run_ids {
        let Some(run) = state.store.get_run(thread_id, run_id).await? else {
            continue;
        };
        let at = |text: &str| OffsetDateTime::parse(text, &Rfc3339).ok();
        if let (Some(created), Some(updated)) = (at(&run.created_at), at(&run.updated_at)) {
            durations.insert(run.run_id, (updated - created).whole_seconds());
        }
    }
    Ok(durations)
}

/// The page's records: `feedback: null` on each, and the run's `turn_duration` on the
/// last AI response of each run in the page.
fn records(rows: Vec<RunEvent>, durations: &BTreeMap<String, i64>) -> Vec<MessageRecord> {
    let mut stamped = BTreeSet::new();
    let mut records: Vec<MessageRecord> = rows
        .into_iter()
        .rev()
        .map(|mut event| {
            event
                .metadata
                .remove(subflow_store::codec::HIDDEN_METADATA_KEY);
            let turn_duration = (event.event_type == EventType::LlmAiResponse.as_str()
                && stamped.insert(event.run_id.clone()))
            .then(|| durations.get(&event.run_id).copied())
            .flatten();
            MessageRecord {
                event,
                turn_duration,
                feedback: None,
            }
        })
        .collect();
    records.reverse();
    records
}
