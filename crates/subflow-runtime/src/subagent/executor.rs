//! The subagent executor: one subagent's model and tool loop under its timeout and
//! cancellation, ending with exactly one terminal status (docs/events.md#terminal-statuses).
//!
//! It runs from what it is handed — definition, model, prompt, workspace, guards, trace
//! and, for `task` calls only, the task's event sink — and needs no run: a `task` call
//! and a durable batch item run this same code.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use subflow_store::batches::CANCELLED_BY_USER;

use serde_json::{Value, json};
use subflow_contracts::messages::{AiMessage, Message, ToolCall, ToolMessage};
use subflow_contracts::{SubagentStatus, SubagentStopReason};
use subflow_models::{ChatModel, ChatRequest, assemble};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{LOG_TARGET, SubagentDefinition};
use crate::guarded::{GuardStop, Guards};
use crate::journal::JournalProxy;
use crate::output::TaskEmitter;
use crate::runtime::RunContext;
use crate::spans::{AgentTrace, ChatCall, new_span_id};
use crate::tool_table::{ToolKind, ToolTable};
use crate::tools::{ToolError, Workspace, answer};
use crate::usage::Collector;

/// How an execution ended; the first write wins (docs/events.md#other-guards).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Terminal {
    pub status: SubagentStatus,
    pub stop_reason: Option<SubagentStopReason>,
    /// A money budget's hard stop (`budget_kind: "cost"`).
    pub cost_capped: bool,
    pub result: Option<String>,
    pub error: Option<String>,
}

impl Terminal {
    /// A terminal status with its text: the result when completed, else the error.
    pub fn new(status: SubagentStatus, text: String) -> Self {
        let completed = status == SubagentStatus::Completed;
        Terminal {
            status,
            stop_reason: None,
            cost_capped: false,
            result: completed.then(|| text.clone()),
            error: (!completed).then_some(text),
        }
    }
}

/// Where a `task` execution's steps and loop audits go: the live task events and the
/// parent run's journal. Batch items have none (docs/batches.md#observability).
#[derive(Debug)]
pub(crate) struct TaskEvents {
    pub emitter: Arc<TaskEmitter>,
    pub run: Arc<RunContext>,
}

/// Who an execution is, for its model requests and its log lines.
#[derive(Debug, Clone)]
pub(crate) struct ExecutionIdentity {
    /// Scopes the model's deterministic ids (`ChatRequest::run_id`): the parent run's id
    /// for a task.
    pub scope_id: String,
    /// The server-side execution id; it keys the loop detector and usage records.
    pub execution_id: Uuid,
    /// The 8-hex delegation id of log lines (docs/operations.md#trace-ids).
    pub short_trace: String,
    /// How log lines name the execution, e.g. `task call_…`.
    pub label: String,
}

/// Everything one execution runs from; moved into it.
#[derive(Debug)]
pub(crate) struct Execution {
    pub definition: SubagentDefinition,
    pub model: Arc<dyn ChatModel>,
    pub prompt: String,
    pub workspace: Workspace,
    pub guards: Guards,
    pub trace: Option<AgentTrace>,
    pub events: Option<TaskEvents>,
    pub collector: Arc<Collector>,
    pub cancel: CancellationToken,
    pub identity: ExecutionIdentity,
}

impl Execution {
    /// Runs the loop to its terminal status: cancelled when `cancel` fires, timed out
    /// after the definition's `timeout_seconds`.
    pub async fn run(mut self) -> Terminal {
        let timeout = Duration::from_secs(self.definition.timeout_seconds);
        let cancel = self.cancel.clone();
        let outcome = tokio::select! {
            biased;
            () = cancel.cancelled() => Terminal::new(SubagentStatus::Cancelled, CANCELLED_BY_USER.to_owned()),
            looped = tokio::time::timeout(timeout, self.agent_loop()) => match looped {
                Ok(outcome) => outcome,
                Err(_) => Terminal::new(SubagentStatus::TimedOut, format!("Execution timed out after {} seconds", timeout.as_secs())),
            },
        };
        let ExecutionIdentity {
            short_trace, label, ..
        } = &self.identity;
        tracing::info!(
            target: LOG_TARGET,
            "[trace={short_trace}] {label} executor finished: {}",
            outcome.status
        );
        outcome
    }

    fn step(&self, message: Message, created: Instant) {
        if let Some(events) = &self.events {
            events
                .emitter
                .step(message, self.collector.totals(), created);
        }
    }

    async fn agent_loop(&mut self) -> Terminal {
        // Each request shares the history; it is gone again (the model's stream is
        // consumed) before the history grows, so a push does not copy it.
        let mut messages = Arc::new(vec![
            Message::system(self.definition.system_prompt.clone()),
            Message::human(self.prompt.clone()),
        ]);
        let table = ToolTable::for_subagent(&self.definition);
        let tools = table.specs();
        let agent = format!("subagent:{}", self.definition.name);
        let guard_key = self.identity.execution_id.to_string();
        let mut last_ai_text = String::new();
        for turn in 1..=self.definition.max_turns {
            let injections = self.guards.injections();
            let request_messages = if injections.is_empty() {
                messages.clone()
            } else {
                let mut with = Vec::clone(&messages);
                with.extend(injections);
                Arc::new(with)
            };
            let request = ChatRequest {
                messages: request_messages,
                tools: tools.clone(),
                agent: agent.clone(),
                call_index: turn,
                run_id: self.identity.scope_id.clone(),
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
                    Arc::make_mut(&mut messages).push(Message::Ai(fallback.clone()));
                    self.step(Message::Ai(fallback), Instant::now());
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
                    .record(&format!("{guard_key}:{turn}"), model_name, usage);
            }
            let run = self.events.as_ref().map(|events| events.run.clone());
            let (ai, stopped) = self.guards.after_model(
                &guard_key,
                ai,
                |content| {
                    // Only a task has a parent journal to audit into (docs/events.md#the-loop-detection-event).
                    if let Some(run) = &run {
                        JournalProxy::new(&run.journal).loop_detection(content);
                    }
                },
                |crossed| {
                    // A batch item's crossings are its worker's to report (docs/usage-and-cost.md#budgets).
                    if let Some(run) = &run {
                        run.report_budget(crossed);
                    }
                },
            );
            last_ai_text = text_of(&ai.content);
            let calls = ai.tool_calls.clone();
            Arc::make_mut(&mut messages).push(Message::Ai(ai.clone()));
            self.step(Message::Ai(ai), created);
            if let Some(stop) = stopped {
                let mut capped = Terminal::new(SubagentStatus::Completed, last_ai_text);
                capped.stop_reason = Some(match stop {
                    GuardStop::Loop => SubagentStopReason::LoopCapped,
                    GuardStop::Token | GuardStop::Cost => SubagentStopReason::TokenCapped,
                });
                capped.cost_capped = stop == GuardStop::Cost;
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
                let tool = self.call_tool(&table, &call).await;
                if let Some(trace) = &self.trace {
                    trace.tool(span_id, started, &call, Some(&tool));
                }
                let created = Instant::now();
                Arc::make_mut(&mut messages).push(Message::Tool(tool.clone()));
                self.step(Message::Tool(tool), created);
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

    async fn call_tool(&self, table: &ToolTable, call: &ToolCall) -> ToolMessage {
        let outcome = match table.kind(&call.name) {
            Some(ToolKind::Workspace) => self.workspace.run(&call.name, &call.args).await,
            Some(ToolKind::Task | ToolKind::Batch(_)) | None => Err(ToolError(format!(
                "Tool '{}' is not available to this subagent",
                call.name
            ))),
        };
        answer(call, outcome)
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
    subflow_contracts::text::flatten_content(Some(content))
}
