//! Subagents: their definitions (docs/configuration.md#subagents-and-tools), the executor that runs one subagent's
//! model and tool loop (`executor`), the `task` tool's supervisor that admits it, watches
//! it, reports its usage once and turns its end into events and the ToolMessage contract
//! (`task`, docs/events.md#the-task-tool, docs/events.md#tool-result-contract), and executions outside any run, as durable batch items run
//! them (`detached`, docs/batches.md#running-an-item) from a batch's snapshot (`spec`).

mod detached;
mod executor;
mod spec;
mod task;

use serde::{Deserialize, Serialize};

/// The target of every supervisor and executor log line, whichever file writes it, so
/// filters and readers of `subflow_runtime::subagent` lines keep working.
const LOG_TARGET: &str = "subflow_runtime::subagent";

pub use detached::{DetachedExecution, ExecutionReport};
pub(crate) use executor::error_fallback;
pub use spec::{EXECUTION_SPEC_VERSION, ExecutionSpec, SpecError, SubmittedBy};
pub(crate) use task::run_task;

/// A subagent type the lead may delegate to (docs/configuration.md#subagents-and-tools).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubagentDefinition {
    /// The `subagent_type` name.
    pub name: String,
    /// What it is for, shown to the lead.
    pub description: String,
    /// Its system prompt.
    pub system_prompt: String,
    /// Its model; the lead's when absent.
    #[serde(default)]
    pub model: Option<String>,
    /// Built-in tools it may use; all of them when absent. Never `task` or batch tools.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Model calls before it must stop.
    pub max_turns: u32,
    /// Wall-clock limit of one execution.
    pub timeout_seconds: u64,
}

impl SubagentDefinition {
    /// The built-in `general-purpose` subagent.
    pub fn general_purpose(timeout_seconds: u64) -> Self {
        SubagentDefinition {
            name: "general-purpose".to_owned(),
            description: "A capable agent for research and multi-step work in the thread's workspace.".to_owned(),
            system_prompt: "You are a subagent. Complete the task you are given with the workspace tools, then answer with your findings.".to_owned(),
            model: None,
            tools: None,
            max_turns: 150,
            timeout_seconds,
        }
    }
}
