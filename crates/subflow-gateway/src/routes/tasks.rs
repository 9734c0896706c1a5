//! `GET /api/threads/{thread_id}/runs/{run_id}/tasks` (docs/api.md#task-summaries): one summary per task
//! of a run, so clients paint finished and reloaded cards before any is expanded; and
//! `POST …/tasks/{task_id}/cancel`, which stops one task and lets the run go on.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use subflow_contracts::api::{ErrorBody, TaskCancelAccepted, TaskStatus, TaskStep, TaskSummary};
use subflow_contracts::task_result::{TASK_TEXT_CAP, bound_text};
use subflow_contracts::{Permission, RunStatus, TaskEndStatus};
use subflow_runtime::task_control::TaskCancel;
use subflow_store::TaskSummary as StoredSummary;
use subflow_store::tasks::StepBrief;
use utoipa::IntoParams;

use super::RunPath;
use crate::auth::{Caller, authorize_thread};
use crate::error::thread_not_found;
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
    let run = owned_run(&state, &caller, Permission::RunsRead, &thread_id, &run_id).await?;
    let summaries = state.store.task_summaries(&thread_id, &run_id).await?;
    Ok(Json(
        summaries
            .iter()
            .map(|summary| public_summary(summary, run.status, &state))
            .collect(),
    ))
}

/// A run of a thread of the caller's: `Thread … not found` for an unknown thread (a
/// client holding a thread and run from a page learns which of the two is gone), `Run …
/// not found` for an unknown run.
async fn owned_run(
    state: &AppState,
    caller: &Caller,
    needed: Permission,
    thread_id: &str,
    run_id: &str,
) -> Result<subflow_store::RunRecord, ApiError> {
    if authorize_thread(state, caller, needed, thread_id)
        .await?
        .is_none()
    {
        return Err(thread_not_found(thread_id));
    }
    state
        .store
        .get_run(thread_id, run_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("Run {run_id} not found")))
}

/// A summary's wire shape; a task without an end is `running` while its run is active
/// and `failed` once the run ended (the pending rule of docs/workspace.md#task-card).
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

/// `{thread_id}/runs/{run_id}/tasks/{task_id}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TaskPath {
    /// A thread id; another user's thread is 404.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub thread_id: String,
    /// A run of that thread.
    pub run_id: String,
    /// A task of that run: its `task` tool call id, as task events name it.
    pub task_id: String,
}

/// Cancels one task of a run: the subagent stops at its next await point and ends
/// `cancelled` with its usage so far, and the lead gets the task's ToolMessage and goes
/// on. On a shared store the request reaches the process executing the run.
#[utoipa::path(post, path = "/api/threads/{thread_id}/runs/{run_id}/tasks/{task_id}/cancel", tag = "runs", params(TaskPath),
    responses(
        (status = 202, description = "The task is being cancelled", body = TaskCancelAccepted),
        (status = 404, description = "No such thread of the caller's, run in it, or task in the run", body = ErrorBody),
        (status = 409, description = "The task has already ended", body = ErrorBody),
    ),
    extensions(("x-subflow-permission" = json!("runs:write"))))]
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(TaskPath {
        thread_id,
        run_id,
        task_id,
    }): Path<TaskPath>,
) -> Result<(StatusCode, Json<TaskCancelAccepted>), ApiError> {
    let run = owned_run(&state, &caller, Permission::RunsWrite, &thread_id, &run_id).await?;
    let ended = |status: TaskStatus| {
        ApiError::Conflict(format!("Task {task_id} has already ended ({status})"))
    };
    let accepted = || {
        Ok((
            StatusCode::ACCEPTED,
            Json(TaskCancelAccepted {
                thread_id: thread_id.clone(),
                run_id: run_id.clone(),
                task_id: task_id.clone(),
            }),
        ))
    };
    // The process executing the run knows its tasks as they start and end.
    if let Some(active) = state.active.get(&run_id) {
        match active.tasks.cancel(&task_id) {
            TaskCancel::Requested => return accepted(),
            TaskCancel::Ended => {
                let summary = state
                    .store
                    .task_summaries(&thread_id, &run_id)
                    .await?
                    .into_iter()
                    .find(|s| s.task_id == task_id);
                let status = summary.map_or(TaskStatus::Cancelled, |s| {
                    public_summary(&s, run.status, &state).status
                });
                return Err(ended(status));
            }
            TaskCancel::Unknown => return Err(unknown_task(&task_id, &run_id)),
        }
    }
    // Elsewhere, the run's stored records tell: a task still running is cancelled by
    // the process executing the run, which hears the request.
    let summary = state
        .store
        .task_summaries(&thread_id, &run_id)
        .await?
        .into_iter()
        .find(|s| s.task_id == task_id)
        .ok_or_else(|| unknown_task(&task_id, &run_id))?;
    let status = public_summary(&summary, run.status, &state).status;
    if status != TaskStatus::Running {
        return Err(ended(status));
    }
    if state.store.request_task_cancel(&run_id, &task_id).await? {
        accepted()
    } else {
        // The run ended meanwhile, and its tasks with it.
        Err(ended(TaskStatus::Failed))
    }
}

/// 404 `Task {task_id} not found in run {run_id}`.
fn unknown_task(task_id: &str, run_id: &str) -> ApiError {
    ApiError::NotFound(format!("Task {task_id} not found in run {run_id}"))
}

fn step(brief: &StepBrief) -> TaskStep {
    TaskStep {
        kind: brief.kind,
        text: brief.text.clone(),
        tool_name: brief.tool_name.clone(),
    }
}
