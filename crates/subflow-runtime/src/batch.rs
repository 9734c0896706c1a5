//! The lead's durable-batch tools (docs/batches.md#tools) and the snapshot a batch's items run from.
//!
//! `batch_task` validates its arguments in the order of docs/batches.md#tools, resolves 0 limits to
//! the configured defaults, and submits the batch with `submission_key = "{run_id or
//! thread_id}:{tool_call_id}"`, so a repeated call returns the stored batch and inserts
//! nothing. `batch_status` and `cancel_batch` see only the run owner's batches. None of
//! them counts as a delegation: `subagents.max_total_per_run` neither limits nor is
//! relaxed by batch work.
//!
//! The batch's `execution_spec` is an [`ExecutionSpec`] of the submitting run: a worker
//! rebuilds each item's execution from it alone, whatever the configuration of the
//! process that claims the item.

use serde::Deserialize;
use serde_json::{Map, Value, json};
use subflow_contracts::messages::{ToolCall, ToolMessage, ToolStatus};
use subflow_models::ToolSpec;
use subflow_store::batches::{
    BatchRecord, BatchScope, MAX_ITEMS, NewBatch, NewItem, TITLE_MAX_CHARS,
};

use crate::runtime::{RunContext, Runtime};
use crate::subagent::{ExecutionSpec, SubmittedBy};

/// The tool that submits a batch.
pub const BATCH_TASK: &str = "batch_task";
/// The tool that reports a batch's progress.
pub const BATCH_STATUS: &str = "batch_status";
/// The tool that cancels a batch.
pub const CANCEL_BATCH: &str = "cancel_batch";

/// `batch_task`'s answer when the lead has no batch tools (docs/batches.md#tools, first check).
pub const UNAVAILABLE: &str = "Durable subagent batches are unavailable. Enable subagent_batches with a SQL database and restart Gateway.";
/// `batch_status` and `cancel_batch` when the lead has no batch tools.
pub const UNAVAILABLE_SHORT: &str = "Durable subagent batches are unavailable.";
/// `batch_task` with no items.
pub const NO_ITEMS: &str = "A batch must contain at least one item.";
/// `batch_task` with a repeated item key.
pub const DUPLICATE_KEYS: &str = "Batch item keys must be unique.";
/// `batch_task` outside a thread.
pub const NO_THREAD: &str = "Durable batches require a thread_id.";
/// `batch_status` and `cancel_batch` for a missing or foreign batch.
pub const NOT_FOUND: &str = "Batch not found.";

/// Which batch tool a call names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchTool {
    /// `batch_task`.
    Submit,
    /// `batch_status`.
    Status,
    /// `cancel_batch`.
    Cancel,
}

impl BatchTool {
    /// The tool of that name.
    pub fn named(name: &str) -> Option<BatchTool> {
        match name {
            BATCH_TASK => Some(BatchTool::Submit),
            BATCH_STATUS => Some(BatchTool::Status),
            CANCEL_BATCH => Some(BatchTool::Cancel),
            _ => None,
        }
    }

    /// All three, in the order the lead is offered them.
    pub const ALL: [BatchTool; 3] = [BatchTool::Submit, BatchTool::Status, BatchTool::Cancel];

    /// What the model is offered.
    pub fn spec(self) -> ToolSpec {
        match self {
            BatchTool::Submit => ToolSpec {
                name: BATCH_TASK.to_owned(),
                description: "Submit many independent items as one durable batch: each item runs as its own subagent execution, on a worker, at least once, and survives restarts. Use it only for items that are independent and idempotent. It returns a batch id at once; follow progress with batch_status, never with task calls.".to_owned(),
                parameters: json!({"type": "object", "properties": {
                    "title": {"type": "string", "description": "A short name shown to the user"},
                    "items": {"type": "array", "description": "The items: a stable key (1-128 characters) and a self-contained prompt each", "items": {
                        "type": "object", "properties": {
                            "key": {"type": "string"},
                            "prompt": {"type": "string"},
                            "acceptance_criteria": {"type": "array", "items": {"type": "string"}}
                        }, "required": ["key", "prompt"]}},
                    "subagent_type": {"type": "string", "description": "The subagent every item runs, e.g. general-purpose"},
                    "max_live_items": {"type": "integer", "description": "Most items queued or running at once; 0 or absent for the default"},
                    "max_running_items": {"type": "integer", "description": "Most items running at once; 0 or absent for the default"},
                    "allow_over_budget": {"type": "boolean", "description": "Submit even when the projected cost exceeds budgets.batch_max_cost"}
                }, "required": ["title", "items", "subagent_type"]}),
            },
            BatchTool::Status => ToolSpec {
                name: BATCH_STATUS.to_owned(),
                description: "A durable batch's progress: its status and how many items are in each state.".to_owned(),
                parameters: batch_id_parameters(),
            },
            BatchTool::Cancel => ToolSpec {
                name: CANCEL_BATCH.to_owned(),
                description: "Cancel every unfinished item of a durable batch.".to_owned(),
                parameters: batch_id_parameters(),
            },
        }
    }
}

fn batch_id_parameters() -> Value {
    json!({"type": "object", "properties": {
        "batch_id": {"type": "string", "description": "The id batch_task returned"}
    }, "required": ["batch_id"]})
}

/// `batch_task`'s arguments as the model sends them.
#[derive(Debug, Deserialize)]
struct SubmitArgs {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    items: Vec<ItemArg>,
    #[serde(default)]
    subagent_type: Option<String>,
    #[serde(default)]
    max_live_items: Option<i64>,
    #[serde(default)]
    max_running_items: Option<i64>,
    #[serde(default)]
    allow_over_budget: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ItemArg {
    key: String,
    prompt: String,
    #[serde(default)]
    acceptance_criteria: Option<Vec<String>>,
}

/// Runs one call of a batch tool the lead has (`available`) or lacks.
pub(crate) async fn run_batch_tool(
    runtime: &Runtime,
    run: &RunContext,
    tool: BatchTool,
    call: &ToolCall,
    available: bool,
) -> ToolMessage {
    match tool {
        BatchTool::Submit if !available => submit_answer(call, Err(UNAVAILABLE.to_owned())),
        BatchTool::Submit => submit_answer(call, submit(runtime, run, call).await),
        _ if !available => {
            ToolMessage::answering(call, UNAVAILABLE_SHORT.to_owned(), ToolStatus::Error)
        }
        BatchTool::Status => status(runtime, run, call).await,
        BatchTool::Cancel => cancel(runtime, run, call).await,
    }
}

/// Submits a lead's `batch_task` call before its AI message is recorded. Once the batch
/// holds the items, the call's `items` argument becomes `{"batch_id", "total_items"}`, so
/// the items are stored once (in the batch) instead of again in the thread's messages,
/// its run events and its stream frames. A refused call keeps its arguments.
pub(crate) async fn submit_call(
    runtime: &Runtime,
    run: &RunContext,
    call: &mut ToolCall,
) -> ToolMessage {
    let outcome = submit(runtime, run, call).await;
    if let (Ok(batch), Some(args)) = (&outcome, call.args.as_object_mut()) {
        args.insert(
            "items".into(),
            json!({"batch_id": batch.id, "total_items": batch.total_items}),
        );
    }
    submit_answer(call, outcome)
}

/// Validates and submits a lead's `batch_task` call; the batch stored (new or by an
/// earlier identical call), or the text the model gets.
async fn submit(
    runtime: &Runtime,
    run: &RunContext,
    call: &ToolCall,
) -> Result<BatchRecord, String> {
    let scope = if run.run_id.is_empty() {
        &run.thread_id
    } else {
        &run.run_id
    };
    let by = Submitter {
        user_id: run.user_id.clone(),
        thread_id: run.thread_id.clone(),
        run_id: (!run.run_id.is_empty()).then(|| run.run_id.clone()),
        tool_call_id: Some(call.id.clone()),
        trace_id: run.trace_id.clone(),
        model_name: run.model_name.clone(),
        submission_key: format!("{scope}:{}", call.id),
    };
    submit_batch(runtime, &call.args, by)
        .await
        .map(|submitted| submitted.batch)
        .map_err(|error| error.to_string())
}

/// Who submits a batch: a lead's `batch_task` call, or a client of the API.
#[derive(Debug, Clone)]
pub struct Submitter {
    /// The owner of the batch.
    pub user_id: String,
    /// Its thread.
    pub thread_id: String,
    /// The run whose lead submitted it, if one did.
    pub run_id: Option<String>,
    /// The `batch_task` call that submitted it, if one did.
    pub tool_call_id: Option<String>,
    /// The trace id its items' runs carry.
    pub trace_id: String,
    /// The model a subagent definition without one of its own runs on.
    pub model_name: String,
    /// The idempotency key: a second submission with it returns the first batch.
    pub submission_key: String,
}

/// A batch refused, with the text the model or the client reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The arguments break a rule of `batch_task`.
    #[error("{0}")]
    Invalid(String),
    /// The submission key already made a batch in another thread.
    #[error("{0}")]
    Conflict(String),
    /// The store did not take a valid batch.
    #[error("{0}")]
    Store(String),
}

/// A batch as submitted.
#[derive(Debug, Clone)]
pub struct Submitted {
    /// The batch stored.
    pub batch: BatchRecord,
    /// False when an earlier submission with the same key had stored it.
    pub created: bool,
}

/// Validates `args` (the `batch_task` arguments: title, items, subagent_type,
/// max_live_items, max_running_items) in the tool's order and with its texts, and
/// stores the batch; a submission key already used returns the batch it stored.
pub async fn submit_batch(
    runtime: &Runtime,
    args: &Value,
    by: Submitter,
) -> Result<Submitted, SubmitError> {
    let config = runtime.config();
    let limits = &config.batches;
    let failed =
        |reason: String| SubmitError::Invalid(format!("Batch submission failed: {reason}"));
    let args = SubmitArgs::deserialize(args)
        .map_err(|error| failed(format!("invalid arguments: {error}")))?;
    if args.items.is_empty() {
        return Err(SubmitError::Invalid(NO_ITEMS.to_owned()));
    }
    let mut keys = std::collections::HashSet::with_capacity(args.items.len());
    if !args.items.iter().all(|item| keys.insert(item.key.as_str())) {
        return Err(SubmitError::Invalid(DUPLICATE_KEYS.to_owned()));
    }
    let kind = args.subagent_type.unwrap_or_default();
    let Some(definition) = config
        .definitions
        .iter()
        .find(|d| d.name == kind && config.subagents_enabled)
    else {
        let names: Vec<&str> = config.definitions.iter().map(|d| d.name.as_str()).collect();
        let names = if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        };
        return Err(SubmitError::Invalid(format!(
            "Unknown or disallowed subagent type '{kind}'. Available: {names}"
        )));
    };
    if by.thread_id.is_empty() {
        return Err(SubmitError::Invalid(NO_THREAD.to_owned()));
    }
    let ceiling = limits.max_items_per_batch.min(MAX_ITEMS);
    if args.items.len() > ceiling {
        return Err(failed(format!(
            "a batch must have 1-{ceiling} items, got {}",
            args.items.len()
        )));
    }
    let items: Vec<NewItem> = args
        .items
        .into_iter()
        .map(|item| NewItem {
            item_key: item.key,
            prompt: item.prompt,
            acceptance_criteria: item.acceptance_criteria.unwrap_or_default(),
        })
        .collect();
    for (position, item) in items.iter().enumerate() {
        item.validate(position).map_err(|e| failed(e.to_string()))?;
    }
    let live = limit(
        "max_live_items",
        args.max_live_items,
        limits.default_max_live_items,
        limits.max_live_items_per_batch,
    )
    .map_err(failed)?;
    // An absent running limit is the default, but never more than the live window.
    let running = match args.max_running_items {
        None | Some(0) => limits.default_max_running_items.min(live),
        given => limit(
            "max_running_items",
            given,
            limits.default_max_running_items,
            limits.max_running_items_per_batch,
        )
        .map_err(failed)?,
    };
    if running > live {
        return Err(failed(format!(
            "max_running_items ({running}) must not exceed max_live_items ({live})"
        )));
    }
    let title = args.title.unwrap_or_default().trim().to_owned();
    let title_chars = title.chars().count();
    if title_chars > TITLE_MAX_CHARS {
        return Err(failed(format!(
            "title must have at most {TITLE_MAX_CHARS} characters, got {title_chars}"
        )));
    }
    if !args.allow_over_budget.unwrap_or(false) {
        over_budget(runtime, &by.user_id, &definition.name, items.len()).await?;
    }
    let model_name =
        runtime.model_name(Some(definition.model.as_deref().unwrap_or(&by.model_name)));
    let spec = ExecutionSpec::new(
        definition,
        &model_name,
        SubmittedBy {
            user_id: by.user_id.clone(),
            thread_id: by.thread_id.clone(),
            run_id: by.run_id.clone(),
            tool_call_id: by.tool_call_id.clone(),
            trace_id: by.trace_id.clone(),
        },
    );
    let thread_id = by.thread_id.clone();
    let batch = NewBatch {
        thread_id: by.thread_id,
        user_id: by.user_id,
        run_id: by.run_id,
        tool_call_id: by.tool_call_id,
        submission_key: by.submission_key,
        title,
        subagent_type: definition.name.clone(),
        max_live_items: live,
        max_running_items: running,
        max_attempts: limits.max_attempts,
        execution_spec: spec.to_value(),
        items,
    };
    match runtime.store.submit_batch(batch).await {
        Ok(submitted) => {
            if submitted.created {
                tracing::info!(batch_id = %submitted.batch.id, items = submitted.batch.total_items, "batch submitted");
            } else if submitted.batch.thread_id != thread_id {
                // The key is the user's; answering another thread's batch would name
                // a batch this thread's routes do not have.
                return Err(SubmitError::Conflict(format!(
                    "submission_key '{}' was already used for a batch in another thread",
                    submitted.batch.submission_key
                )));
            }
            Ok(Submitted {
                batch: submitted.batch,
                created: submitted.created,
            })
        }
        Err(subflow_store::Error::InvalidBatch(reason)) => Err(failed(reason)),
        Err(error) => Err(SubmitError::Store(format!(
            "Batch submission failed: {error}"
        ))),
    }
}

/// Refuses a batch whose projected cost exceeds `budgets.batch_max_cost`: `items` at the
/// mean cost of one item of the user's earlier batches of `subagent_type`
/// (docs/usage-and-cost.md#budgets). Without such history there is no projection to refuse.
async fn over_budget(
    runtime: &Runtime,
    user_id: &str,
    subagent_type: &str,
    items: usize,
) -> Result<(), SubmitError> {
    let Some(budgets) = runtime.budgets() else {
        return Ok(());
    };
    let Some(limit) = budgets.config.limit(crate::budget::BudgetScope::Batch) else {
        return Ok(());
    };
    let per_item = match budgets.history.item_cost(user_id, subagent_type).await {
        Ok(Some(cost)) => cost,
        Ok(None) => return Ok(()),
        Err(error) => {
            return Err(SubmitError::Store(format!(
                "Batch submission failed: the batch budget cannot be checked: {error}"
            )));
        }
    };
    let projected = subflow_contracts::cost::round6(per_item * items as f64);
    if projected > limit {
        let currency = budgets.currency();
        return Err(SubmitError::Invalid(format!(
            "Batch submission failed: projected cost {projected} {currency} ({items} items at {} {currency} each) exceeds budgets.batch_max_cost ({limit} {currency}); pass allow_over_budget to submit it anyway",
            subflow_contracts::cost::round6(per_item)
        )));
    }
    Ok(())
}

/// A limit as given: absent or 0 is `default`, else it must be 1–`ceiling`.
fn limit(name: &str, given: Option<i64>, default: u32, ceiling: u32) -> Result<u32, String> {
    match given {
        None | Some(0) => Ok(default),
        Some(n) if (1..=i64::from(ceiling)).contains(&n) => Ok(n as u32),
        Some(n) => Err(format!("{name} must be between 1 and {ceiling}, got {n}")),
    }
}

/// The `batch_task` ToolMessage (docs/batches.md#tools keys).
fn submit_answer(call: &ToolCall, outcome: Result<BatchRecord, String>) -> ToolMessage {
    let mut kwargs = Map::new();
    let (content, status) = match outcome {
        Ok(batch) => {
            kwargs.insert("subagent_batch_error".into(), json!(false));
            kwargs.insert("subagent_batch_id".into(), json!(batch.id));
            kwargs.insert("subagent_batch_status".into(), json!(batch.status));
            kwargs.insert(
                "subagent_batch_total_items".into(),
                json!(batch.total_items),
            );
            (
                format!(
                    "Batch {} accepted with {} items. It runs independently of this run and survives restarts. Follow its progress with batch_status; do not launch task calls for these items.",
                    batch.id, batch.total_items
                ),
                ToolStatus::Success,
            )
        }
        Err(text) => {
            kwargs.insert("subagent_batch_error".into(), json!(true));
            (text, ToolStatus::Error)
        }
    };
    ToolMessage {
        additional_kwargs: kwargs,
        ..ToolMessage::answering(call, content, status)
    }
}

fn batch_id(call: &ToolCall) -> &str {
    call.args
        .get("batch_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

async fn status(runtime: &Runtime, run: &RunContext, call: &ToolCall) -> ToolMessage {
    let scope = BatchScope::user(&run.user_id);
    match runtime.store.get_batch(&scope, batch_id(call)).await {
        Ok(Some(batch)) => {
            let text = json!({
                "batch_id": batch.id,
                "status": batch.status,
                "total_items": batch.total_items,
                "counts": batch.counts,
            });
            ToolMessage::answering(call, text.to_string(), ToolStatus::Success)
        }
        Ok(None) => ToolMessage::answering(call, NOT_FOUND.to_owned(), ToolStatus::Error),
        Err(error) => ToolMessage::answering(
            call,
            format!("Batch status failed: {error}"),
            ToolStatus::Error,
        ),
    }
}

async fn cancel(runtime: &Runtime, run: &RunContext, call: &ToolCall) -> ToolMessage {
    let scope = BatchScope::user(&run.user_id);
    let id = batch_id(call);
    match runtime.store.cancel_batch(&scope, id).await {
        Ok(Some(batch)) => {
            tracing::info!(batch_id = %batch.id, run_id = %run.run_id, "batch cancelled by the lead");
            ToolMessage::answering(
                call,
                format!("Batch {} cancellation requested.", batch.id),
                ToolStatus::Success,
            )
        }
        Ok(None) => ToolMessage::answering(call, NOT_FOUND.to_owned(), ToolStatus::Error),
        Err(error) => ToolMessage::answering(
            call,
            format!("Batch cancellation failed: {error}"),
            ToolStatus::Error,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_or_absent_limit_is_the_default_and_others_must_fit_the_ceiling() {
        assert_eq!(limit("max_live_items", None, 100, 1000), Ok(100));
        assert_eq!(limit("max_live_items", Some(0), 100, 1000), Ok(100));
        assert_eq!(limit("max_live_items", Some(1000), 100, 1000), Ok(1000));
        assert_eq!(
            limit("max_live_items", Some(1001), 100, 1000),
            Err("max_live_items must be between 1 and 1000, got 1001".to_owned())
        );
        assert_eq!(
            limit("max_running_items", Some(-1), 3, 64),
            Err("max_running_items must be between 1 and 64, got -1".to_owned())
        );
    }
}
