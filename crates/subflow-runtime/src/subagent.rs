//! The `task` tool: subagent definitions, the executor that runs a subagent's model and
//! tool loop, and the supervisor that admits it, watches it, reports its usage once and
//! turns its terminal status into events and the ToolMessage contract (SPEC §3, §4).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use serde::Deserialize;
use serde_json::{Value, json};
use subflow_contracts::messages::{AiMessage, Message, ToolCall, ToolMessage, ToolStatus};
use subflow_contracts::task_result::{TaskOutcome, task_tool_message, unknown_subagent_type_error};
use subflow_contracts::{SubagentStatus, SubagentStopReason};
use subflow_models::{ChatModel, ChatRequest, assemble};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::guarded::{GuardStop, Guards};
use crate::journal::JournalProxy;
use crate::observers::{ObserverOutcome, TaskInfo};
use crate::output::{TaskEmitter, TerminalEvent};
use crate::runtime::{RunContext, Runtime};
use crate::spans::{
    AgentTrace, ChatCall, SpanLink, TraceIdentity, new_span_id, subagent_trace_name, trace_tags,
};
use crate::tools::{BUILTIN_TOOLS, Workspace, builtin_specs};
use crate::usage::Collector;

/// A subagent type the lead may delegate to (SPEC §1.4).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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

    fn allows(&self, tool: &str) -> bool {
        BUILTIN_TOOLS.contains(&tool)
            && self
                .tools
                .as_ref()
                .is_none_or(|t| t.iter().any(|n| n == tool))
    }
}

/// How an execution ended; the first write wins (SPEC §10.5).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Terminal {
    status: SubagentStatus,
    stop_reason: Option<SubagentStopReason>,
    result: Option<String>,
    error: Option<String>,
}

impl Terminal {
    fn new(status: SubagentStatus, text: String) -> Self {
        let completed = status == SubagentStatus::Completed;
        Terminal {
            status,
            stop_reason: None,
            result: completed.then(|| text.clone()),
            error: (!completed).then_some(text),
        }
    }
}

/// What one execution needs; moved into its task.
struct Execution {
    definition: SubagentDefinition,
    model: Arc<dyn ChatModel>,
    prompt: String,
    run_id: String,
    execution_id: Uuid,
    workspace: Workspace,
    emitter: Arc<TaskEmitter>,
    collector: Arc<Collector>,
    terminal: Arc<OnceLock<Terminal>>,
    cancel: CancellationToken,
    short_trace: String,
    task_id: String,
    run: Arc<RunContext>,
    guards: Guards,
    trace: Option<AgentTrace>,
}

impl Execution {
    async fn run(mut self) {
        let timeout = Duration::from_secs(self.definition.timeout_seconds);
        let terminal = self.terminal.clone();
        let cancel = self.cancel.clone();
        let (trace, task_id) = (self.short_trace.clone(), self.task_id.clone());
        let outcome = tokio::select! {
            biased;
            () = cancel.cancelled() => Terminal::new(SubagentStatus::Cancelled, "Cancelled by user".to_owned()),
            looped = tokio::time::timeout(timeout, self.agent_loop()) => match looped {
                Ok(outcome) => outcome,
                Err(_) => Terminal::new(SubagentStatus::TimedOut, format!("Execution timed out after {} seconds", timeout.as_secs())),
            },
        };
        tracing::info!(
            "[trace={trace}] task {task_id} executor finished: {}",
            outcome.status
        );
        let _ = terminal.set(outcome);
    }

    async fn agent_loop(&mut self) -> Terminal {
        let mut messages = vec![
            Message::system(self.definition.system_prompt.clone()),
            Message::human(self.prompt.clone()),
        ];
        let tools: Vec<_> = builtin_specs()
            .into_iter()
            .filter(|t| self.definition.allows(&t.name))
            .collect();
        let agent = format!("subagent:{}", self.definition.name);
        let guard_key = self.execution_id.to_string();
        let mut last_ai_text = String::new();
        for turn in 1..=self.definition.max_turns {
            let mut request_messages = messages.clone();
            request_messages.extend(self.guards.injections());
            let request = ChatRequest {
                messages: request_messages,
                tools: tools.clone(),
                agent: agent.clone(),
                call_index: turn,
                run_id: self.run_id.clone(),
            };
            let info = self.model.info().clone();
            let chat_started = SystemTime::now();
            let answer = match self.model.stream(request).await {
                Ok(stream) => assemble(stream, &info.model, |_| {}).await,
                Err(error) => Err(error),
            };
            if let Some(trace) = &self.trace {
                trace.chat(&ChatCall::of(&info, chat_started, &answer));
            }
            let ai = match answer {
                Ok((ai, _)) => ai,
                Err(error) => {
                    let fallback = error_fallback(&error.to_string());
                    let text = fallback_text(&fallback);
                    messages.push(Message::Ai(fallback.clone()));
                    self.emitter.step(
                        Message::Ai(fallback),
                        self.collector.totals(),
                        Instant::now(),
                    );
                    return Terminal::new(SubagentStatus::Failed, text);
                }
            };
            let created = Instant::now();
            if let Some(usage) = &ai.usage_metadata {
                let model_name = ai
                    .response_metadata
                    .get("model_name")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                self.collector
                    .record(&format!("{}:{turn}", self.execution_id), model_name, usage);
            }
            let proxy = JournalProxy::new(&self.run.journal);
            let (ai, stopped) = self
                .guards
                .after_model(&guard_key, ai, |content| proxy.loop_detection(content));
            last_ai_text = text_of(&ai.content);
            let calls = ai.tool_calls.clone();
            messages.push(Message::Ai(ai.clone()));
            self.emitter
                .step(Message::Ai(ai), self.collector.totals(), created);
            if let Some(stop) = stopped {
                let mut capped = Terminal::new(SubagentStatus::Completed, last_ai_text);
                capped.stop_reason = Some(match stop {
                    GuardStop::Loop => SubagentStopReason::LoopCapped,
                    GuardStop::Token => SubagentStopReason::TokenCapped,
                });
                return capped;
            }
            if calls.is_empty() {
                let result = if last_ai_text.trim().is_empty() {
                    "No response generated".to_owned()
                } else {
                    last_ai_text
                };
                return Terminal::new(SubagentStatus::Completed, result);
            }
            for call in calls {
                let (span_id, started) = (new_span_id(), SystemTime::now());
                let tool = self.call_tool(&call).await;
                if let Some(trace) = &self.trace {
                    trace.tool(span_id, started, &call, Some(&tool));
                }
                let created = Instant::now();
                messages.push(Message::Tool(tool.clone()));
                self.emitter
                    .step(Message::Tool(tool), self.collector.totals(), created);
            }
        }
        let max_turns = self.definition.max_turns;
        let mut capped = if last_ai_text.trim().is_empty() {
            Terminal::new(
                SubagentStatus::Failed,
                format!("Reached max_turns={max_turns}"),
            )
        } else {
            Terminal::new(SubagentStatus::Completed, last_ai_text)
        };
        capped.stop_reason = Some(SubagentStopReason::TurnCapped);
        capped
    }

    async fn call_tool(&self, call: &ToolCall) -> ToolMessage {
        let outcome = if self.definition.allows(&call.name) {
            self.workspace.run(&call.name, &call.args).await
        } else {
            Err(crate::tools::ToolError(format!(
                "Tool '{}' is not available to this subagent",
                call.name
            )))
        };
        let (content, status) = match outcome {
            Ok(text) => (text, ToolStatus::Success),
            Err(error) => (format!("Error: {error}"), ToolStatus::Error),
        };
        ToolMessage {
            content: Value::String(content),
            id: Some(Uuid::now_v7().to_string()),
            name: Some(call.name.clone()),
            tool_call_id: call.id.clone(),
            status,
            ..ToolMessage::default()
        }
    }
}

/// The AI message that ends a loop whose provider still failed after its retries.
pub(crate) fn error_fallback(detail: &str) -> AiMessage {
    let mut message = AiMessage {
        content: Value::String(format!("The model request failed: {detail}")),
        id: Some(Uuid::now_v7().to_string()),
        ..AiMessage::default()
    };
    message
        .additional_kwargs
        .insert("deerflow_error_fallback".into(), json!(true));
    message
        .additional_kwargs
        .insert("error_detail".into(), json!(detail));
    message
        .response_metadata
        .insert("finish_reason".into(), json!("error"));
    message
}

/// The failure text of a fallback message: its text, else `error_detail`, else a default.
fn fallback_text(message: &AiMessage) -> String {
    let text = text_of(&message.content);
    if !text.trim().is_empty() {
        return text;
    }
    message
        .additional_kwargs
        .get("error_detail")
        .and_then(Value::as_str)
        .filter(|d| !d.trim().is_empty())
        .map_or_else(|| "LLM request failed".to_owned(), str::to_owned)
}

fn text_of(content: &Value) -> String {
    subflow_contracts::task_events::flatten_content(Some(content))
}

/// Runs one `task` call to its end. Returns its ToolMessage, or `None` when the parent
/// run was cancelled meanwhile (the card then resolves by the pending rule, SPEC §3.8).
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

/// The trace of one subagent execution (SPEC §9.2), when spans are exported: session
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
        "[trace={trace}] task {} delegated to {} (execution {execution_id})",
        call.id,
        definition.name
    );

    let emitter = Arc::new(TaskEmitter::new(
        &call.id,
        &model_name,
        run.sink.clone(),
        run.subagent_buffer.clone(),
    ));
    emitter.started(&description);
    let collector = Arc::new(Collector::for_subagent(&definition.name));
    let terminal = Arc::new(OnceLock::new());
    let timeout_seconds = definition.timeout_seconds;

    let permit = tokio::select! {
        admitted = runtime.admission.admit() => admitted,
        () = run.cancel.cancelled() => {
            return parent_cancelled(run, &emitter, &collector, &terminal, None, config.supervision_grace).await;
        }
    };
    let handle = match permit {
        Err(error) => {
            tracing::warn!("[trace={trace}] task {} not admitted: {error}", call.id);
            let _ = terminal.set(Terminal::new(SubagentStatus::Failed, error.to_string()));
            None
        }
        Ok(permit) => {
            let execution = Execution {
                definition,
                model,
                prompt,
                run_id: run.run_id.clone(),
                execution_id,
                workspace: run.workspace.clone(),
                emitter: emitter.clone(),
                collector: collector.clone(),
                terminal: terminal.clone(),
                cancel: run.cancel.child_token(),
                short_trace: trace.clone(),
                task_id: call.id.clone(),
                guards: Guards::new(
                    &config.loop_detection,
                    &config.token_budget,
                    Some(&kind),
                    runtime.metrics.clone(),
                ),
                run: run.clone(),
                trace: agent_trace,
            };
            // The execution logs inside the run's span, so its lines carry the trace id.
            Some(tokio::spawn(
                async move {
                    let _slot = permit;
                    execution.run().await;
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
                    tracing::error!("[trace={trace}] task {} execution vanished: {join_error}", call.id);
                    if terminal.get().is_none() {
                        emitter.terminal(TerminalEvent::Disappeared, None);
                        runtime_report(run, &collector);
                        let mut outcome = TaskOutcome::failed("Task disappeared from background tasks");
                        outcome.usage = collector.totals();
                        return (Some(task_tool_message(&call.id, &outcome)), SubagentStatus::Failed);
                    }
                }
                Err(_) => {
                    // The safety net: no terminal status long after the executor's own timeout.
                    tracing::error!("[trace={trace}] task {} polling timed out", call.id);
                    runtime_report(run, &collector);
                    emitter.terminal(TerminalEvent::SafetyNetTimedOut, collector.totals());
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
    let ended = terminal.get().cloned().unwrap_or_else(|| {
        Terminal::new(
            SubagentStatus::Failed,
            "Task disappeared from background tasks".to_owned(),
        )
    });
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
    emitter.terminal(event, usage);
    tracing::info!("[trace={trace}] task {} ended {}", call.id, ended.status);
    let ended_status = ended.status;
    let outcome = TaskOutcome {
        status: ended.status,
        stop_reason: ended.stop_reason,
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

/// SPEC §3.8: cancel the subagent, wait (shielded) for its terminal status, record
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
        "Cancelled by user".to_owned(),
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
    emitter.terminal(event, collector.totals());
    tracing::info!(
        "[trace={}] task cancelled with its parent run",
        run.short_trace
    );
    (None, ended_status)
}
