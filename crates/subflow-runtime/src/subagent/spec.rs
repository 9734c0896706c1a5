//! The `execution_spec` of a durable batch (docs/batches.md#data-model): the worker-only snapshot of who
//! submitted it, what the subagent may do, which model it runs on and the run's trace
//! id. The `batch_task` tool writes it at submit; a worker rebuilds each item's
//! subagent from it, so a later configuration change never alters a submitted batch.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{DetachedExecution, SubagentDefinition};
use crate::tool_table::ToolTable;

/// The version this runtime writes and reads.
pub const EXECUTION_SPEC_VERSION: u32 = 1;

/// The snapshot a batch's items run from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionSpec {
    /// [`EXECUTION_SPEC_VERSION`].
    pub version: u32,
    /// The submitting user (`langfuse.user.id`).
    pub user_id: String,
    /// The thread whose workspace the items act in.
    pub thread_id: String,
    /// The submitting lead run.
    pub run_id: Option<String>,
    /// The `batch_task` call.
    pub tool_call_id: Option<String>,
    /// The submitting run's trace id (docs/operations.md#trace-ids).
    pub trace_id: String,
    /// The subagent definition, its `tools` resolved to the workspace tools it was
    /// allowed at submit: the items' permissions.
    pub subagent: SubagentDefinition,
    /// The configured name of the model the items run on.
    pub model_name: String,
}

/// Why a stored `execution_spec` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// It does not parse as an execution spec.
    #[error("Invalid execution_spec: {0}")]
    Malformed(String),
    /// Written by another version.
    #[error("Unsupported execution_spec version {0}")]
    Version(u32),
}

/// Who submits a batch and from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmittedBy {
    /// The submitting user.
    pub user_id: String,
    /// The thread.
    pub thread_id: String,
    /// The submitting lead run.
    pub run_id: Option<String>,
    /// The `batch_task` call.
    pub tool_call_id: Option<String>,
    /// The run's trace id.
    pub trace_id: String,
}

impl ExecutionSpec {
    /// The snapshot of `definition` running on `model_name` for `by`.
    pub fn new(definition: &SubagentDefinition, model_name: &str, by: SubmittedBy) -> Self {
        let tools = ToolTable::for_subagent(definition)
            .specs()
            .iter()
            .map(|spec| spec.name.clone())
            .collect();
        ExecutionSpec {
            version: EXECUTION_SPEC_VERSION,
            user_id: by.user_id,
            thread_id: by.thread_id,
            run_id: by.run_id,
            tool_call_id: by.tool_call_id,
            trace_id: by.trace_id,
            subagent: SubagentDefinition {
                tools: Some(tools),
                ..definition.clone()
            },
            model_name: model_name.to_owned(),
        }
    }

    /// The JSON the store keeps.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("an execution spec always serialises")
    }

    /// A stored spec, checked for its version.
    pub fn from_value(value: &Value) -> Result<Self, SpecError> {
        let spec = ExecutionSpec::deserialize(value)
            .map_err(|error| SpecError::Malformed(error.to_string()))?;
        if spec.version != EXECUTION_SPEC_VERSION {
            return Err(SpecError::Version(spec.version));
        }
        Ok(spec)
    }

    /// One execution of this subagent with `prompt`; `scope_id` must be unique per
    /// attempt, `label` names it in log lines, `trace_metadata` follows `run_id` in its
    /// trace.
    pub fn execution(
        &self,
        prompt: String,
        scope_id: String,
        label: String,
        trace_metadata: Vec<(String, String)>,
    ) -> DetachedExecution {
        let mut metadata = Vec::with_capacity(trace_metadata.len() + 1);
        if let Some(run_id) = &self.run_id {
            metadata.push(("run_id".to_owned(), run_id.clone()));
        }
        metadata.extend(trace_metadata);
        DetachedExecution {
            definition: self.subagent.clone(),
            model_name: self.model_name.clone(),
            prompt,
            thread_id: self.thread_id.clone(),
            user_id: self.user_id.clone(),
            trace_id: self.trace_id.clone(),
            scope_id,
            label,
            trace_metadata: metadata,
            batch_spent: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn by() -> SubmittedBy {
        SubmittedBy {
            user_id: "u1".into(),
            thread_id: "t1".into(),
            run_id: Some("r1".into()),
            tool_call_id: Some("call_1".into()),
            trace_id: "abc".into(),
        }
    }

    #[test]
    fn a_spec_snapshots_the_allowed_tools_and_round_trips() {
        let mut definition = SubagentDefinition::general_purpose(60);
        let spec = ExecutionSpec::new(&definition, "m", by());
        assert_eq!(
            spec.subagent.tools,
            Some(vec![
                "ls".into(),
                "read_file".into(),
                "write_file".into(),
                "str_replace".into()
            ])
        );
        assert_eq!(ExecutionSpec::from_value(&spec.to_value()), Ok(spec));
        definition.tools = Some(vec!["read_file".into(), "task".into()]);
        let narrow = ExecutionSpec::new(&definition, "m", by());
        assert_eq!(narrow.subagent.tools, Some(vec!["read_file".into()]));
    }

    #[test]
    fn a_bad_or_foreign_spec_is_refused_with_its_reason() {
        let mut value =
            ExecutionSpec::new(&SubagentDefinition::general_purpose(60), "m", by()).to_value();
        value["version"] = json!(2);
        assert_eq!(
            ExecutionSpec::from_value(&value),
            Err(SpecError::Version(2))
        );
        let error = ExecutionSpec::from_value(&json!({"version": 1})).unwrap_err();
        assert!(
            error.to_string().starts_with("Invalid execution_spec: "),
            "{error}"
        );
    }

    #[test]
    fn an_execution_carries_the_snapshot_and_the_trace_metadata_after_the_run() {
        let spec = ExecutionSpec::new(&SubagentDefinition::general_purpose(60), "m", by());
        let execution = spec.execution(
            "do it".into(),
            "item:1".into(),
            "batch item k".into(),
            vec![("batch_id".into(), "b".into())],
        );
        assert_eq!(execution.model_name, "m");
        assert_eq!(
            (execution.thread_id.as_str(), execution.user_id.as_str()),
            ("t1", "u1")
        );
        assert_eq!(
            execution.trace_metadata,
            [
                ("run_id".to_owned(), "r1".to_owned()),
                ("batch_id".to_owned(), "b".to_owned())
            ]
        );
    }
}
