//! The tools an agent is offered, by name: one table maps every tool name to its spec
//! and to the implementation that runs it, so what a model is offered, how its calls are
//! dispatched and which calls count as delegations cannot disagree.
//!
//! The lead gets every workspace tool plus `task` when `subagents.enabled`; the batch
//! tools join it only when subagents and `subagent_batches.enabled` are both on (docs/batches.md#tools). A subagent gets the workspace tools its definition allows and never `task`
//! or a batch tool (docs/configuration.md#subagents-and-tools).

use std::sync::Arc;

use serde_json::json;
use subflow_contracts::task_result::TASK_TOOL_NAME;
use subflow_models::ToolSpec;

use crate::batch::BatchTool;
use crate::runtime::RuntimeConfig;
use crate::subagent::SubagentDefinition;
use crate::tools::{BUILTIN_TOOLS, builtin_specs};

/// Which implementation runs a tool's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolKind {
    /// A built-in workspace tool ([`crate::tools::Workspace::run`]).
    Workspace,
    /// The `task` tool: a subagent execution; its calls are delegations (docs/events.md#the-task-tool).
    Task,
    /// A durable-batch tool (docs/batches.md#tools); never a delegation.
    Batch(BatchTool),
}

/// The tools of one agent, in the order they are offered: each spec and, at the same
/// index, what runs it. The specs are shared with every model call of the agent.
#[derive(Debug, Clone)]
pub(crate) struct ToolTable {
    specs: Arc<[ToolSpec]>,
    kinds: Vec<ToolKind>,
}

impl ToolTable {
    /// The lead's tools under `config`.
    pub fn for_lead(config: &RuntimeConfig) -> Self {
        let mut entries: Vec<_> = builtin_specs()
            .iter()
            .map(|spec| (spec.clone(), ToolKind::Workspace))
            .collect();
        if config.subagents_enabled {
            entries.push((task_spec(), ToolKind::Task));
            if config.batches.enabled {
                entries.extend(
                    BatchTool::ALL
                        .into_iter()
                        .map(|tool| (tool.spec(), ToolKind::Batch(tool))),
                );
            }
        }
        let (specs, kinds): (Vec<_>, Vec<_>) = entries.into_iter().unzip();
        ToolTable {
            specs: specs.into(),
            kinds,
        }
    }

    /// A subagent's tools: the workspace tools `definition` allows. A definition that
    /// allows them all (the usual case) shares the one built-in list.
    pub fn for_subagent(definition: &SubagentDefinition) -> Self {
        let builtin = builtin_specs();
        let specs = if builtin.iter().all(|spec| definition.allows(&spec.name)) {
            builtin
        } else {
            builtin
                .iter()
                .filter(|spec| definition.allows(&spec.name))
                .cloned()
                .collect()
        };
        ToolTable {
            kinds: vec![ToolKind::Workspace; specs.len()],
            specs,
        }
    }

    /// The specs offered to the model.
    pub fn specs(&self) -> Arc<[ToolSpec]> {
        self.specs.clone()
    }

    /// What runs calls of `name`; `None` for a tool this agent does not have.
    pub fn kind(&self, name: &str) -> Option<ToolKind> {
        self.specs
            .iter()
            .position(|spec| spec.name == name)
            .map(|index| self.kinds[index])
    }
}

impl SubagentDefinition {
    /// Whether this subagent may use the built-in tool `tool`: every one when the
    /// definition lists none, else the listed ones.
    pub(crate) fn allows(&self, tool: &str) -> bool {
        BUILTIN_TOOLS.contains(&tool)
            && self
                .tools
                .as_ref()
                .is_none_or(|t| t.iter().any(|n| n == tool))
    }
}

fn task_spec() -> ToolSpec {
    ToolSpec {
        name: TASK_TOOL_NAME.to_owned(),
        description: "Delegate a self-contained piece of work to a subagent; it returns the subagent's result.".to_owned(),
        parameters: json!({"type": "object", "properties": {
            "description": {"type": "string", "description": "A short description of the task"},
            "prompt": {"type": "string", "description": "The full instructions for the subagent"},
            "subagent_type": {"type": "string", "description": "The subagent to use, e.g. general-purpose"}
        }, "required": ["description", "prompt", "subagent_type"]}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(table: &ToolTable) -> Vec<String> {
        table.specs().iter().map(|spec| spec.name.clone()).collect()
    }

    #[test]
    fn the_lead_gets_task_with_subagents_and_the_batch_tools_only_with_batches_too() {
        let mut config = RuntimeConfig::with_defaults("/tmp/unused".into());
        let lead = ToolTable::for_lead(&config);
        assert_eq!(
            names(&lead),
            [
                "ls",
                "read_file",
                "write_file",
                "str_replace",
                "task",
                "batch_task",
                "batch_status",
                "cancel_batch"
            ]
        );
        assert_eq!(
            lead.kind("batch_task"),
            Some(ToolKind::Batch(BatchTool::Submit))
        );
        assert_eq!(lead.kind("task"), Some(ToolKind::Task));
        assert_eq!(lead.kind("read_file"), Some(ToolKind::Workspace));
        assert_eq!(lead.kind("rm"), None);
        config.batches.enabled = false;
        let no_batches = ToolTable::for_lead(&config);
        assert_eq!(no_batches.kind("task"), Some(ToolKind::Task));
        assert_eq!(no_batches.kind("batch_task"), None);
        config.batches.enabled = true;
        config.subagents_enabled = false;
        let alone = ToolTable::for_lead(&config);
        assert_eq!(alone.kind("task"), None);
        assert_eq!(alone.kind("cancel_batch"), None);
        assert!(!names(&alone).contains(&"task".to_owned()));
    }

    #[test]
    fn a_subagent_gets_its_allowed_workspace_tools_and_never_task_or_a_batch_tool() {
        let mut definition = SubagentDefinition::general_purpose(60);
        let every = ToolTable::for_subagent(&definition);
        assert_eq!(
            names(&every),
            ["ls", "read_file", "write_file", "str_replace"]
        );
        // Every execution allowed all the built-in tools offers the one shared list.
        assert!(Arc::ptr_eq(&every.specs(), &builtin_specs()));
        assert!(Arc::ptr_eq(
            &every.specs(),
            &ToolTable::for_subagent(&definition).specs()
        ));
        definition.tools = Some(vec!["read_file".into(), "task".into(), "batch_task".into()]);
        let narrow = ToolTable::for_subagent(&definition);
        assert_eq!(names(&narrow), ["read_file"]);
        assert_eq!(narrow.kind("task"), None);
        assert_eq!(narrow.kind("batch_task"), None);
        assert_eq!(narrow.kind("write_file"), None);
    }
}
