//! Task summaries (docs/api.md#task-summaries): `GET …/runs/{run_id}/tasks`, one per task of a run, so
//! clients paint finished and reloaded cards before any is expanded.

use serde::{Deserialize, Serialize};

use super::usage::TaskCost;
use crate::task_card::StepKind;
use crate::task_result::TokenUsage;

string_enum! {
    /// A summary's status: a task without an end is `running` while its run is active
    /// and `failed` once the run ended (the pending rule of docs/workspace.md#task-card).
    pub enum TaskStatus {
        Running = "running",
        Completed = "completed",
        Failed = "failed",
        Cancelled = "cancelled",
        TimedOut = "timed_out",
    }
}

/// One task of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskSummary {
    /// The `task` tool call id.
    pub task_id: String,
    /// The call's `subagent_type`.
    pub subagent_type: Option<String>,
    /// The task's description.
    pub description: Option<String>,
    /// The effective model.
    pub model_name: Option<String>,
    /// Where the task is.
    pub status: TaskStatus,
    /// The guard cap that ended the task.
    pub stop_reason: Option<String>,
    /// The steps an expanded card lists (docs/workspace.md#task-card).
    pub step_count: u64,
    /// The last of those steps.
    pub latest_step: Option<TaskStep>,
    /// A completed task's trailing answer, which its card does not list; listed by a
    /// card shown failed.
    pub result_step: Option<TaskStep>,
    /// Cumulative usage.
    pub usage: Option<TokenUsage>,
    /// The usage priced at the task's model; null when unpriced.
    pub cost: Option<TaskCost>,
    /// RFC 3339 time of the start.
    pub started_at: Option<String>,
    /// RFC 3339 time of the end.
    pub ended_at: Option<String>,
    /// The error of a task that did not complete, bounded.
    pub error: Option<String>,
    /// The result of a completed task, bounded.
    pub result_brief: Option<String>,
}

/// A step as a summary shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskStep {
    /// `ai` or `tool`.
    pub kind: StepKind,
    /// The step's text, at most 2,000 characters.
    #[cfg_attr(feature = "openapi", schema(max_length = 2000))]
    pub text: String,
    /// The tool of a tool step.
    pub tool_name: Option<String>,
}

/// The answer to a task cancel: the task the request reached, which stops at its next
/// await point and ends `cancelled`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskCancelAccepted {
    /// Thread id.
    pub thread_id: String,
    /// Run id.
    pub run_id: String,
    /// The task (its `task` tool call id).
    pub task_id: String,
}
