//! `GET /api/threads/{thread_id}/runs/{run_id}/tasks` (SPEC §6.1): one summary per task
//! of a run, so clients paint finished and reloaded cards before any is expanded.

use axum::Json;
use axum::extract::State;
use subflow_contracts::api::{ErrorBody, TaskStatus, TaskStep, TaskSummary};
use subflow_contracts::task_result::{TASK_TEXT_CAP, bound_text};
use subflow_contracts::{Permission, RunStatus, TaskEndStatus};
use subflow_store::TaskSummary as StoredSummary;
use subflow_store::tasks::StepBrief;

use super::RunPath;
use super::threads::not_found;
use crate::auth::{Caller, authorize_thread};
use crate::extract::Path;
use crate::usage::task_cost;
use crate::{ApiError, AppState};

/// The run's task summaries in start order, as a bare array. Unlike the other run
/// routes, an unknown thread is `Thread … not found`: a client holding a thread and run
/// from a page learns which of the two is gone.
#[utoipa::path(get, path = "/api/threads/{thread_id}/runs/{run_id}/tasks", tag = "runs", params(RunPath),
    responses(
        (status = 200, description = "One summary per task of the run, in start order", body = Vec<TaskSummary>),
        (status = 404, description = "No such thread of the caller's, or no such run in it", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:read"))))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path(RunPath { thread_id, run_id }): Path<RunPath>,
) -> Result<Json<Vec<TaskSummary>>, ApiError> {
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
            .map(|summary| public_summary(summary, run.status, &state))
            .collect(),
    ))
}

/// A summary's wire shape; a task without an end is `running` while its run is active
/// and `failed` once the run ended (the pending rule of SPEC §14.1).
fn public_summary(summary: &StoredSummary, run_status: RunStatus, state: &AppState) -> TaskSummary {
    let status = match summary.end_status {
        Some(TaskEndStatus::Completed) => TaskStatus::Completed,
        Some(TaskEndStatus::Failed) => TaskStatus::Failed,
        Some(TaskEndStatus::Cancelled) => TaskStatus::Cancelled,
        Some(TaskEndStatus::TimedOut) => TaskStatus::TimedOut,
        None if run_status.is_active() => TaskStatus::Running,
        None => TaskStatus::Failed,
    };
    let completed = status == TaskStatus::Completed;
    let brief = |text: &Option<String>| text.as_deref().map(|t| bound_text(t, TASK_TEXT_CAP));
    let cost = summary.usage.as_ref().and_then(|usage| {
        let model = summary.model_name.as_deref()?;
        task_cost(usage, model, &state.model_facts)
    });
    TaskSummary {
        task_id: summary.task_id.clone(),
        subagent_type: summary.subagent_type.clone(),
        description: summary.description.clone(),
        model_name: summary.model_name.clone(),
        status,
        stop_reason: summary.stop_reason.clone(),
        step_count: summary.step_count,
        latest_step: summary.latest_step.as_ref().map(step),
        result_step: summary.result_step.as_ref().map(step),
        usage: summary.usage,
        cost,
        started_at: summary.started_at.clone(),
        ended_at: summary.ended_at.clone(),
        error: if completed {
            None
        } else {
            brief(&summary.error)
        },
        result_brief: if completed {
            brief(&summary.result)
        } else {
            None
        },
    }
}

fn step(brief: &StepBrief) -> TaskStep {
    TaskStep {
        kind: brief.kind,
        text: brief.text.clone(),
        tool_name: brief.tool_name.clone(),
    }
}
