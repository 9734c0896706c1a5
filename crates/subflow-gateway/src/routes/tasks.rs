//! `GET /api/threads/{thread_id}/runs/{run_id}/tasks` (SPEC §6.1): one summary per task
//! of a run, so clients paint finished and reloaded cards before any is expanded.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};
use subflow_contracts::task_result::{TASK_TEXT_CAP, bound_text};
use subflow_contracts::{Permission, RunStatus, TaskEndStatus};
use subflow_store::TaskSummary;

use super::threads::not_found;
use crate::auth::{Caller, authorize_thread};
use crate::extract::Path;
use crate::usage::task_cost;
use crate::{ApiError, AppState};

/// The run's task summaries in start order, as a bare array.
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path((thread_id, run_id)): Path<(String, String)>,
) -> Result<Json<Vec<Value>>, ApiError> {
    if authorize_thread(&state, &caller, Permission::RunsRead, &thread_id)
        .await?
        .is_none()
    {
        return Err(not_found(&thread_id));
    }
    let run = state
        .store
        .get_run(&thread_id, &run_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("Run {run_id} not found")))?;
    let summaries = state.store.task_summaries(&thread_id, &run_id).await?;
    Ok(Json(
        summaries
            .iter()
            .map(|summary| summary_json(summary, run.status, &state))
            .collect(),
    ))
}

/// A summary's wire shape; a task without an end is `running` while its run is active
/// and `failed` once the run ended (the pending rule of SPEC §14.1).
fn summary_json(summary: &TaskSummary, run_status: RunStatus, state: &AppState) -> Value {
    let status = match summary.end_status {
        Some(status) => status.as_str(),
        None if run_status.is_active() => "running",
        None => TaskEndStatus::Failed.as_str(),
    };
    let completed = summary.end_status == Some(TaskEndStatus::Completed);
    let brief = |text: &Option<String>| text.as_deref().map(|t| bound_text(t, TASK_TEXT_CAP));
    let cost = summary.usage.as_ref().and_then(|usage| {
        let model = summary.model_name.as_deref()?;
        task_cost(usage, model, &state.model_facts)
    });
    json!({
        "task_id": summary.task_id,
        "subagent_type": summary.subagent_type,
        "description": summary.description,
        "model_name": summary.model_name,
        "status": status,
        "stop_reason": summary.stop_reason,
        "step_count": summary.step_count,
        "latest_step": summary.latest_step.as_ref().map(|s| s.to_json()),
        "result_step": summary.result_step.as_ref().map(|s| s.to_json()),
        "usage": summary.usage,
        "cost": cost,
        "started_at": summary.started_at,
        "ended_at": summary.ended_at,
        "error": if completed { None } else { brief(&summary.error) },
        "result_brief": if completed { brief(&summary.result) } else { None },
    })
}
