//! The `task` tool's supervisor: it admits one execution, watches it under the safety
//! net (docs/events.md#the-safety-net) and the parent's cancellation (docs/events.md#parent-cancellation), reports its usage once, and
//! turns its end into the terminal task event and the ToolMessage contract (docs/events.md#the-task-tool, docs/events.md#tool-result-contract).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use subflow_store::batches::CANCELLED_BY_USER;

use serde_json::Value;
use subflow_contracts::SubagentStatus;
use subflow_contracts::messages::{ToolCall, ToolMessage};
use subflow_contracts::task_events::DISAPPEARED_ERROR;
use subflow_contracts::task_result::{
    TASK_CANCELLED, TaskOutcome, task_tool_message, unknown_subagent_type_error,
};
use tracing::Instrument;
use uuid::Uuid;

use super::executor::{Execution, ExecutionIdentity, TaskEvents, Terminal};
use super::{LOG_TARGET, SubagentDefinition};
use crate::guarded::Guards;
use crate::observers::{ObserverOutcome, TaskInfo};
use crate::output::{TaskEmitter, TerminalEvent};
use crate::runtime::{RunContext, Runtime};
use crate::spans::{AgentTrace, SpanLink, TraceIdentity, subagent_trace_name, trace_tags};
use crate::usage::Collector;

/// Runs one `task` call to its end. Returns its ToolMessage, or `None` when the parent
/// run was cancelled meanwhile (the card then resolves by the pending rule, docs/events.md#parent-cancellation).
pub(crate) async fn run_task(
    runtime: &Runtime,
    run: &Arc<RunContext>,
    call: &ToolCall,
    link: Option<SpanLink>,
) -> Option<ToolMessage> {
    let kind = call
        .args
        .get("subagent_type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let config = runtime.config();
    let Some(definition) = config
        .definitions
        .iter()
        .find(|d| d.name == kind && config.subagents_enabled)
        .cloned()
    else {
        // An unknown type builds nothing: no events, no observer notifications.
        let names: Vec<&str> = config.definitions.iter().map(|d| d.name.as_str()).collect();
        return Some(task_tool_message(
            &call.id,
            &TaskOutcome::failed(unknown_subagent_type_error(kind, &names)),
        ));
    };
    let execution_id = Uuid::new_v4();
    // Observers hear of the task before it is built, and of its end on every path; the
    // guard reports `failed` should this future be dropped or panic in between.
    let info = TaskInfo::subagent(
        execution_id.to_string(),
        &run.run_id,
        &run.thread_id,
        &definition.name,
        false,
    );
    let observed = run.observers.start(info).await;
    let started = Instant::now();
    let agent = definition.name.clone();
    let trace = subagent_trace(runtime, run, call, &definition, link);
    let (message, status) =
        supervise(runtime, run, call, definition, execution_id, trace.clone()).await;
    runtime
        .metrics
        .subagent_task(&agent, status, started.elapsed());
    if let Some(trace) = trace {
        let failure = (status != SubagentStatus::Completed).then(|| format!("Task {status}"));
        trace.finish(failure);
    }
    observed.stop(ObserverOutcome::for_subagent(status)).await;
    message
}

/// The trace of one subagent execution (docs/operations.md#langfuse-and-otlp), when spans are exported: session
/// and user of the parent run, `subagent:<name>`, and a link to the lead's tool span.
fn subagent_trace(
    runtime: &Runtime,
    run: &RunContext,
    call: &ToolCall,
    definition: &SubagentDefinition,
    link: Option<SpanLink>,
) -> Option<AgentTrace> {
    let sink = runtime.spans.clone()?;
    let model = runtime.models.get(
        definition
            .model
            .as_deref()
            .or(Some(run.model_name.as_str())),
    );
    let identity = TraceIdentity {
        session_id: run.thread_id.clone(),
        user_id: run.user_id.clone(),
        trace_name: subagent_trace_name(&definition.name),
        tags: trace_tags(runtime.environment.as_deref(), Some(&model.info().name)),
        metadata: vec![
            ("deerflow_trace_id".to_owned(), run.trace_id.clone()),
            ("run_id".to_owned(), run.run_id.clone()),
            ("tool_call_id".to_owned(), call.id.clone()),
        ],
        conversation_id: run.thread_id.clone(),
    };
    Some(AgentTrace::start(
        sink,
        &identity,
        &definition.name,
        None,
        link,
    ))
}

/// Admits, runs and watches one execution; returns its ToolMessage (none after a parent
/// cancellation) and the status it ended with.
async fn supervise(
    runtime: &Runtime,
    run: &Arc<RunContext>,
    call: &ToolCall,
    definition: SubagentDefinition,
    execution_id: Uuid,
    agent_trace: Option<AgentTrace>,
) -> (Option<ToolMessage>, SubagentStatus) {
    let arg = |key: &str| {
        call.args
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let (description, prompt, kind) = (arg("description"), arg("prompt"), arg("subagent_type"));
    let config = runtime.config();
    let model = runtime.models.get(
        definition
            .model
            .as_deref()
            .or(Some(run.model_name.as_str())),
    );
    let model_name = model.info().name.clone();
    let trace = &run.short_trace;
    tracing::info!(
        target: LOG_TARGET,
        "[trace={trace}] task {} delegated to {} (execution {execution_id})",
        call.id,
        definition.name
    );

    let emitter = Arc::new(TaskEmitter::new(
        &call.id,
        &model_name,
        &kind,
        run.sink.clone(),
        run.subagent_buffer.clone(),
    ));
    // Cancelled with the run, or alone through the run's task controls; registered
    // before the task is announced, so a client that sees it can cancel it.
    let cancel = run.cancel.child_token();
    let _registration = run.tasks.start(&call.id, cancel.clone());
    emitter.started(&description);
    let collector = Arc::new(Collector::for_subagent(&definition.name));
    let terminal = Arc::new(OnceLock::new());
    let timeout_seconds = definition.timeout_seconds;

    let permit = tokio::select! {
        admitted = runtime.admission.admit() => Some(admitted),
        () = cancel.cancelled() => None,
    };
    if permit.is_none() && run.cancel.is_cancelled() {
        return parent_cancelled(
            run,
            &emitter,
            &collector,
            &terminal,
            None,
            config.supervision_grace,
        )
        .await;
    }
    let handle = match permit {
        None => {
            tracing::info!(target: LOG_TARGET, "[trace={trace}] task {} cancelled before it started", call.id);
            let _ = terminal.set(Terminal::new(
                SubagentStatus::Cancelled,
                TASK_CANCELLED.to_owned(),
            ));
            None
        }
        Some(Err(error)) => {
            tracing::warn!(target: LOG_TARGET, "[trace={trace}] task {} not admitted: {error}", call.id);
            let _ = terminal.set(Terminal::new(SubagentStatus::Failed, error.to_string()));
            None
        }
        Some(Ok(permit)) => {
            let execution = Execution {
                definition,
                model,
                prompt,
                workspace: run.workspace.clone(),
                guards: Guards::new(
                    &config.loop_detection,
                    &config.token_budget,
                    &kind,
                    runtime.metrics.clone(),
                )
                .with_money(run.spend.clone()),
                trace: agent_trace,
                events: Some(TaskEvents {
                    emitter: emitter.clone(),
                    run: run.clone(),
                }),
                collector: collector.clone(),
                cancel,
                identity: ExecutionIdentity {
                    scope_id: run.run_id.clone(),
                    execution_id,
                    short_trace: trace.clone(),
                    label: format!("task {}", call.id),
                },
            };
            let ended = terminal.clone();
            // The execution logs inside the run's span, so its lines carry the trace id.
            Some(tokio::spawn(
                async move {
                    let _slot = permit;
                    let _ = ended.set(execution.run().await);
                }
                .in_current_span(),
            ))
        }
    };

    if let Some(mut handle) = handle {
        let deadline = Duration::from_secs(timeout_seconds) + runtime.config().supervision_grace;
        tokio::select! {
            joined = tokio::time::timeout(deadline, &mut handle) => match joined {
                Ok(Ok(())) => {}
                Ok(Err(join_error)) => {
                    tracing::error!(target: LOG_TARGET, "[trace={trace}] task {} execution vanished: {join_error}", call.id);
                    if terminal.get().is_none() {
                        emitter.terminal(TerminalEvent::Disappeared, None, None);
                        runtime_report(run, &collector);
                        let mut outcome = TaskOutcome::failed(DISAPPEARED_ERROR);
                        outcome.usage = collector.totals();
                        return (Some(task_tool_message(&call.id, &outcome)), SubagentStatus::Failed);
                    }
                }
                Err(_) => {
                    // The safety net: no terminal status long after the executor's own timeout.
                    tracing::error!(target: LOG_TARGET, "[trace={trace}] task {} polling timed out", call.id);
                    runtime_report(run, &collector);
                    emitter.terminal(TerminalEvent::SafetyNetTimedOut, collector.totals(), None);
                    handle.abort();
                    let detail = format!("Task polling timed out after {} minutes. This may indicate the background task is stuck. Status: running", timeout_seconds / 60);
                    let mut outcome = TaskOutcome::new(SubagentStatus::PollingTimedOut);
                    outcome.error = Some(detail);
                    outcome.model_name = Some(model_name);
                    outcome.usage = collector.totals();
                    return (Some(task_tool_message(&call.id, &outcome)), SubagentStatus::PollingTimedOut);
                }
            },
            () = run.cancel.cancelled() => {
                return parent_cancelled(run, &emitter, &collector, &terminal, Some(handle), config.supervision_grace).await;
            }
        }
    }
    if run.cancel.is_cancelled() {
        return parent_cancelled(
            run,
            &emitter,
            &collector,
            &terminal,
            None,
            runtime.config().supervision_grace,
        )
        .await;
    }
    let mut ended = terminal
        .get()
        .cloned()
        .unwrap_or_else(|| Terminal::new(SubagentStatus::Failed, DISAPPEARED_ERROR.to_owned()));
    if ended.status == SubagentStatus::Cancelled {
        // Cancelled alone (the run goes on): the lead reads the contract's sentence.
        ended.error = Some(TASK_CANCELLED.to_owned());
    }
    runtime_report(run, &collector);
    let usage = collector.totals();
    let event = match ended.status {
        SubagentStatus::Completed => {
            TerminalEvent::Completed(ended.result.clone().unwrap_or_default())
        }
        SubagentStatus::Cancelled => {
            TerminalEvent::Cancelled(ended.error.clone().unwrap_or_default())
        }
        SubagentStatus::TimedOut => {
            TerminalEvent::TimedOut(ended.error.clone().unwrap_or_default())
        }
        _ => TerminalEvent::Failed(ended.error.clone().unwrap_or_default()),
    };
    emitter.terminal(event, usage, ended.stop_reason);
    tracing::info!(target: LOG_TARGET, "[trace={trace}] task {} ended {}", call.id, ended.status);
    let ended_status = ended.status;
    let outcome = TaskOutcome {
        status: ended.status,
        stop_reason: ended.stop_reason,
        cost_capped: ended.cost_capped,
        result: ended.result,
        error: ended.error,
        model_name: Some(model_name),
        usage,
    };
    (Some(task_tool_message(&call.id, &outcome)), ended_status)
}

/// Reports a task's usage records to the parent journal (once: each path calls it once).
fn runtime_report(run: &RunContext, collector: &Collector) {
    run.journal.report_external(&collector.snapshot());
}

/// docs/events.md#parent-cancellation: cancel the subagent, wait (shielded) for its terminal status, record
/// `cancelled` if none came, report usage once, emit `task_cancelled` (or the status
/// recorded first), and write no ToolMessage.
async fn parent_cancelled(
    run: &RunContext,
    emitter: &TaskEmitter,
    collector: &Collector,
    terminal: &OnceLock<Terminal>,
    handle: Option<tokio::task::JoinHandle<()>>,
    grace: Duration,
) -> (Option<ToolMessage>, SubagentStatus) {
    if let Some(handle) = handle {
        let _ = tokio::time::timeout(grace, handle).await;
    }
    let _ = terminal.set(Terminal::new(
        SubagentStatus::Cancelled,
        CANCELLED_BY_USER.to_owned(),
    ));
    runtime_report(run, collector);
    let ended = terminal.get().cloned().expect("set above if it was empty");
    let ended_status = ended.status;
    let event = match ended.status {
        SubagentStatus::Completed => TerminalEvent::Completed(ended.result.unwrap_or_default()),
        SubagentStatus::TimedOut => TerminalEvent::TimedOut(ended.error.unwrap_or_default()),
        SubagentStatus::Failed => TerminalEvent::Failed(ended.error.unwrap_or_default()),
        _ => TerminalEvent::Cancelled(ended.error.unwrap_or_default()),
    };
    emitter.terminal(event, collector.totals(), ended.stop_reason);
    tracing::info!(
        target: LOG_TARGET,
        "[trace={}] task cancelled with its parent run",
        run.short_trace
    );
    (None, ended_status)
}
