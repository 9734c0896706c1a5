//! Subagent executions outside any run: one attempt of a durable batch item (docs/batches.md#running-an-item).
//!
//! They share the executor, guards and models with `task`, and differ only in what they
//! leave behind: no task events, no `middleware:loop_detection` records, no observer
//! notifications (docs/batches.md#observability), and usage counted in `subflow_tokens_total` under the
//! `batch` caller instead of a parent journal. Each still gets its own trace (docs/operations.md#langfuse-and-otlp).
//! Admission is the caller's: a batch worker admits before it marks the item running.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use subflow_contracts::task_events::DISAPPEARED_ERROR;
use subflow_contracts::task_result::TokenUsage;
use subflow_contracts::{SubagentStatus, SubagentStopReason};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::executor::{Execution, ExecutionIdentity, Terminal};
use super::{LOG_TARGET, SubagentDefinition};
use crate::budget::{BudgetEvent, BudgetScope, SharedSpend, Spend};
use crate::guarded::Guards;
use crate::metrics::TokenCount;
use crate::observers::BudgetNotice;
use crate::run::short_trace;
use crate::runtime::Runtime;
use crate::spans::{AgentTrace, TraceIdentity, subagent_trace_name, trace_tags};
use crate::tools::Workspace;
use crate::usage::Collector;

/// What a detached execution runs from: the snapshot a batch keeps in its
/// `execution_spec`, plus the prompt of one item.
#[derive(Debug, Clone, PartialEq)]
pub struct DetachedExecution {
    /// The subagent as it was configured when the batch was submitted.
    pub definition: SubagentDefinition,
    /// The configured name of the model to run on (the definition's, else the lead's).
    pub model_name: String,
    /// The full prompt (for an item: the at-least-once preamble, then its prompt).
    pub prompt: String,
    /// The thread whose workspace it acts in (`langfuse.session.id`).
    pub thread_id: String,
    /// Who it acts for (`langfuse.user.id`).
    pub user_id: String,
    /// The submitting run's trace id (`deerflow_trace_id`).
    pub trace_id: String,
    /// Scopes the model's deterministic ids; unique per attempt.
    pub scope_id: String,
    /// How log lines name it, e.g. `batch item item-1`.
    pub label: String,
    /// Trace metadata after `deerflow_trace_id`: `run_id`, `batch_id`, `item_key`.
    pub trace_metadata: Vec<(String, String)>,
    /// What the item's batch had spent when it started: its calls are then held to
    /// `budgets.batch_max_cost` (docs/usage-and-cost.md#budgets). `None` checks nothing.
    pub batch_spent: Option<f64>,
}

/// How a detached execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionReport {
    /// The terminal status.
    pub status: SubagentStatus,
    /// The guard cap that ended it, if one did.
    pub stop_reason: Option<SubagentStopReason>,
    /// The untruncated result, when completed.
    pub result: Option<String>,
    /// The failure, when not completed.
    pub error: Option<String>,
    /// The model it ran on.
    pub model_name: String,
    /// Summed usage, `None` without any record.
    pub usage: Option<TokenUsage>,
    /// Whether the batch's money budget stopped it (`token_capped`).
    pub cost_capped: bool,
}

impl Runtime {
    /// Runs `execution` to its end. `cancel` stops it at its next await point with
    /// `cancelled`; the definition's timeout ends it `timed_out`. A model that is no
    /// longer configured, or a panic inside the loop, ends it `failed`. It never emits
    /// task events or notifies observers.
    pub async fn execute_detached(
        &self,
        execution: DetachedExecution,
        cancel: CancellationToken,
    ) -> ExecutionReport {
        let DetachedExecution {
            definition,
            model_name,
            prompt,
            thread_id,
            user_id,
            trace_id,
            scope_id,
            label,
            trace_metadata,
            batch_spent,
        } = execution;
        let config = self.config();
        let short_trace = short_trace(None);
        if !self.models.contains(&model_name) {
            tracing::warn!(target: LOG_TARGET, "[trace={short_trace}] {label}: model {model_name} is not configured");
            return ExecutionReport {
                status: SubagentStatus::Failed,
                stop_reason: None,
                result: None,
                error: Some(format!("Model '{model_name}' is not configured")),
                model_name,
                usage: None,
                cost_capped: false,
            };
        }
        let model = self.models.get(Some(&model_name));
        let trace = self.spans.clone().map(|sink| {
            let mut metadata = vec![("deerflow_trace_id".to_owned(), trace_id.clone())];
            metadata.extend(trace_metadata);
            let identity = TraceIdentity {
                session_id: thread_id.clone(),
                user_id,
                trace_name: subagent_trace_name(&definition.name),
                tags: trace_tags(self.environment.as_deref(), Some(&model_name)),
                metadata,
                conversation_id: thread_id.clone(),
            };
            AgentTrace::start(sink, &identity, &definition.name, None, None)
        });
        let collector = Arc::new(Collector::for_subagent(&definition.name));
        let agent = definition.name.clone();
        let money = self
            .budgets
            .clone()
            .zip(batch_spent)
            .and_then(|(budgets, spent)| {
                let spend = Spend::new(&budgets.config, &[(BudgetScope::Batch, spent)]);
                SharedSpend::new(budgets, spend)
            });
        let execution = Execution {
            guards: Guards::new(
                &config.loop_detection,
                &config.token_budget,
                &definition.name,
                self.metrics.clone(),
            )
            .with_money(money),
            definition,
            model,
            prompt,
            workspace: Workspace::for_thread(&config.workspace_root, &thread_id),
            trace: trace.clone(),
            events: None,
            collector: collector.clone(),
            cancel,
            identity: ExecutionIdentity {
                scope_id,
                execution_id: Uuid::new_v4(),
                short_trace: short_trace.clone(),
                label: label.clone(),
            },
        };
        let ended = match AssertUnwindSafe(execution.run()).catch_unwind().await {
            Ok(ended) => ended,
            Err(_) => {
                tracing::error!(target: LOG_TARGET, "[trace={short_trace}] {label} execution panicked");
                Terminal::new(SubagentStatus::Failed, DISAPPEARED_ERROR.to_owned())
            }
        };
        for record in collector.snapshot() {
            self.metrics.tokens(&TokenCount {
                caller: "batch",
                agent: &agent,
                ..TokenCount::of(&record)
            });
        }
        if let Some(trace) = trace {
            let failure = (ended.status != SubagentStatus::Completed)
                .then(|| format!("Task {}", ended.status));
            trace.finish(failure);
        }
        ExecutionReport {
            status: ended.status,
            stop_reason: ended.stop_reason,
            result: ended.result,
            error: ended.error,
            model_name,
            usage: collector.totals(),
            cost_capped: ended.cost_capped,
        }
    }

    /// Tells the observers and webhooks of a batch's budget crossings and sets its
    /// `subflow_budget_spent_ratio{scope="batch"}` (docs/usage-and-cost.md#budgets).
    pub async fn report_batch_budget(
        &self,
        batch: (&str, &str, &str),
        spent: f64,
        events: Vec<BudgetEvent>,
    ) {
        let (user_id, thread_id, batch_id) = batch;
        let Some(budgets) = &self.budgets else {
            return;
        };
        if let Some(limit) = budgets.config.limit(BudgetScope::Batch) {
            self.metrics
                .budget_spent(BudgetScope::Batch.as_str(), spent / limit);
        }
        let currency = budgets.currency();
        for event in events {
            let notice = BudgetNotice {
                run_id: String::new(),
                thread_id: thread_id.to_owned(),
                user_id: user_id.to_owned(),
                batch_id: Some(batch_id.to_owned()),
                currency: currency.clone(),
                event,
            };
            self.observers.notify_budget(&notice).await;
        }
    }
}
