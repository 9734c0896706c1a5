//! The lead agent loop: model call, `task` limits, tool execution with parallel
//! delegation, lead-side usage attribution (docs/events.md#attribution), checkpoints after every step.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use futures::future::join_all;
use serde_json::{Map, Value, json};
use subflow_contracts::RunStopReason;
use subflow_contracts::messages::{AiMessage, Message, ToolMessage, fallback_title};
use subflow_contracts::task_result::TokenUsage;
use subflow_models::{ChatRequest, assemble};
use subflow_store::NewCheckpoint;
use uuid::Uuid;

use crate::batch::{BatchTool, run_batch_tool, submit_call};
use crate::guarded::{GuardStop, Guards};
use crate::output::RunOutput;
use crate::runtime::{RunContext, Runtime};
use crate::spans::{ChatCall, new_span_id};
use crate::subagent::{error_fallback, run_task};
use crate::tool_table::{ToolKind, ToolTable};
use crate::tools::{ToolError, answer};
use crate::usage::UsageRecord;

/// How the lead loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeadEnd {
    /// The model answered without tool calls, or a cap ended the loop.
    Finished,
    /// The provider failed after its retries; the fallback message is in the history.
    ModelFailed(String),
    /// The run was cancelled.
    Cancelled,
    /// The loop panicked; the history holds what it did until then.
    Panicked,
}

/// The lead's working state.
pub(crate) struct Lead<'a> {
    pub runtime: &'a Runtime,
    pub run: &'a Arc<RunContext>,
    pub guards: Guards,
    pub messages: Vec<Message>,
    /// The thread's title: the one its state holds, else the fallback of its first human
    /// message once there is one.
    pub title: Option<String>,
    pub stop_reason: Option<RunStopReason>,
    pub checkpoint_id: Option<String>,
    /// The latest checkpoint, while the store has refused it: the run stores it before
    /// it ends.
    pub unstored: Option<NewCheckpoint>,
    pub tasks_started: usize,
    pub step: u64,
    /// The lead's tools; every dispatch decision reads it.
    pub tools: ToolTable,
}

const LIMIT_NOTE: &str = "\n\n[subagent delegation limit] Some task calls were not run because they exceed the subagent limits of this run.";

impl Lead<'_> {
    /// Runs model turns until the model stops calling tools, a cap is hit, the model
    /// fails or the run is cancelled.
    pub async fn run(&mut self) -> LeadEnd {
        let model = self.runtime.models.get(Some(&self.run.model_name));
        let max_turns = self.runtime.config().lead_max_turns;
        for turn in 1..=max_turns {
            if self.run.cancel.is_cancelled() {
                return LeadEnd::Cancelled;
            }
            let mut request_messages = vec![Message::system(
                self.runtime.config().lead_system_prompt.clone(),
            )];
            request_messages.extend(self.messages.iter().cloned());
            request_messages.extend(self.guards.injections());
            let request = ChatRequest {
                messages: Arc::new(request_messages),
                tools: self.tools.specs(),
                agent: "lead_agent".to_owned(),
                call_index: turn,
                run_id: self.run.run_id.clone(),
            };
            let started = Instant::now();
            let chat_started = SystemTime::now();
            let message_id = Uuid::now_v7().to_string();
            let sink = self.run.sink.clone();
            let info = model.info().clone();
            let call = async {
                let stream = model.stream(request).await?;
                assemble(stream, &info.model, |delta| {
                    sink.send(RunOutput::text_chunk(&message_id, delta));
                })
                .await
            };
            let answer = tokio::select! {
                answer = call => answer,
                () = self.run.cancel.cancelled() => return LeadEnd::Cancelled,
            };
            let latency_ms = u64::try_from(started.elapsed().as_millis()).ok();
            if let Some(trace) = &self.run.trace {
                trace.chat(&ChatCall::of(&info, chat_started, &answer));
            }
            let mut ai = match answer {
                Ok((ai, _)) => ai,
                Err(error) => {
                    let detail = error.to_string();
                    self.run.journal.llm_error(&detail);
                    // The answer keeps the id any text that did stream carried.
                    let fallback = Message::Ai(AiMessage {
                        id: Some(message_id),
                        ..error_fallback(&detail)
                    });
                    self.run.sink.send(RunOutput::whole(&fallback, "model"));
                    self.run
                        .sink
                        .send(RunOutput::update("model", std::slice::from_ref(&fallback)));
                    self.push(fallback).await;
                    return LeadEnd::ModelFailed(detail);
                }
            };
            let streamed = subflow_contracts::text::flatten_content(Some(&ai.content));
            ai.id = Some(message_id);
            let record = ai.usage_metadata.as_ref().and_then(|usage| {
                let model_name = ai
                    .response_metadata
                    .get("model_name")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                UsageRecord::from_call(
                    format!("{}:lead:{turn}", self.run.run_id),
                    "lead_agent",
                    model_name,
                    usage,
                )
            });
            if self.runtime.config().token_usage_enabled {
                self.attribute_subagent_usage();
            }
            match ai
                .response_metadata
                .get("finish_reason")
                .and_then(Value::as_str)
            {
                Some("length") => {
                    self.stop_reason = self.stop_reason.or(Some(RunStopReason::ModelLengthCapped))
                }
                Some("content_filter") => {
                    self.stop_reason = self.stop_reason.or(Some(RunStopReason::SafetyCapped))
                }
                _ => {}
            }
            let run = self.run;
            let (mut ai, stopped) = self.guards.after_model(
                &self.run.thread_id,
                ai,
                |content| run.journal.loop_detection(content),
                |crossed| run.report_budget(crossed),
            );
            if let Some(stop) = stopped {
                self.stop_reason = Some(match stop {
                    GuardStop::Loop => RunStopReason::LoopCapped,
                    GuardStop::Token | GuardStop::Cost => RunStopReason::TokenCapped,
                });
            }
            self.apply_task_limits(&mut ai);
            let submitted = if stopped.is_none() {
                self.submit_batches(&mut ai).await
            } else {
                HashMap::new()
            };
            self.run
                .journal
                .ai_response("lead_agent", &ai, latency_ms, record.as_ref());
            let calls = ai.tool_calls.clone();
            self.run.sink.send(RunOutput::closing_chunk(&streamed, &ai));
            let ai = Message::Ai(ai);
            self.run
                .sink
                .send(RunOutput::update("model", std::slice::from_ref(&ai)));
            self.push(ai).await;
            if calls.is_empty() || stopped.is_some() {
                return LeadEnd::Finished;
            }
            let results = self.run_tools(&calls, &submitted).await;
            let cancelled = results.iter().any(Option::is_none);
            let mut tools = Vec::with_capacity(results.len());
            for mut tool in results.into_iter().flatten() {
                tool.id.get_or_insert_with(|| Uuid::now_v7().to_string());
                self.run.journal.tool_result(&tool);
                let tool = Message::Tool(tool);
                self.run.sink.send(RunOutput::whole(&tool, "tools"));
                tools.push(tool);
            }
            if !tools.is_empty() {
                self.run.sink.send(RunOutput::update("tools", &tools));
                self.push_all(tools).await;
            }
            if cancelled || self.run.cancel.is_cancelled() {
                return LeadEnd::Cancelled;
            }
        }
        LeadEnd::Finished
    }

    /// Task calls past `max_concurrent` in this response, or past `max_total_per_run`
    /// in the run, are stripped with a visible note (docs/events.md#the-task-tool).
    fn apply_task_limits(&mut self, ai: &mut AiMessage) {
        let config = self.runtime.config();
        let mut kept_here = 0;
        let mut stripped = false;
        ai.tool_calls.retain(|call| {
            if self.tools.kind(&call.name) != Some(ToolKind::Task) {
                return true;
            }
            let keep = kept_here < config.max_concurrent
                && self.tasks_started + kept_here < config.max_total_per_run;
            if keep {
                kept_here += 1;
            } else {
                stripped = true;
            }
            keep
        });
        self.tasks_started += kept_here;
        if stripped {
            let text = subflow_contracts::text::flatten_content(Some(&ai.content));
            ai.content = Value::String(format!("{text}{LIMIT_NOTE}"));
            ai.response_metadata
                .insert("finish_reason".into(), json!("stop"));
            self.stop_reason = Some(RunStopReason::SubagentLimitCapped);
        }
    }

    /// Submits this response's `batch_task` calls before the message is recorded, so
    /// its history keeps each stored batch's id in place of the items
    /// (docs/batches.md#tools); the answers by call id.
    async fn submit_batches(&self, ai: &mut AiMessage) -> HashMap<String, ToolMessage> {
        let mut answers = HashMap::new();
        for call in &mut ai.tool_calls {
            if self.tools.kind(&call.name) == Some(ToolKind::Batch(BatchTool::Submit)) {
                let answer = submit_call(self.runtime, self.run, call).await;
                answers.insert(call.id.clone(), answer);
            }
        }
        answers
    }

    /// Runs one response's tool calls concurrently, each by the table's implementation;
    /// a `batch_task` call already submitted gets its answer. Results keep the call
    /// order; `None` marks a task ended by parent cancellation.
    async fn run_tools(
        &self,
        calls: &[subflow_contracts::messages::ToolCall],
        submitted: &HashMap<String, ToolMessage>,
    ) -> Vec<Option<ToolMessage>> {
        let runtime = self.runtime;
        let run = self.run;
        let futures = calls.iter().map(|call| async move {
            // The span id is chosen up front: a subagent's trace links to it.
            let (span_id, started) = (new_span_id(), SystemTime::now());
            let result = match self.tools.kind(&call.name) {
                Some(ToolKind::Task) => {
                    let link = run.trace.as_ref().map(|t| t.link_to(span_id));
                    run_task(runtime, run, call, link).await
                }
                Some(ToolKind::Batch(_)) if submitted.contains_key(&call.id) => {
                    submitted.get(&call.id).cloned()
                }
                Some(ToolKind::Batch(tool)) => {
                    Some(run_batch_tool(runtime, run, tool, call, true).await)
                }
                // A batch tool the lead was not offered says why it is missing.
                None if BatchTool::named(&call.name).is_some() => {
                    let tool = BatchTool::named(&call.name).unwrap_or(BatchTool::Submit);
                    Some(run_batch_tool(runtime, run, tool, call, false).await)
                }
                kind => {
                    let outcome = match kind {
                        Some(_) => run.workspace.run(&call.name, &call.args).await,
                        None => Err(ToolError(format!("Unknown tool '{}'", call.name))),
                    };
                    Some(answer(call, outcome))
                }
            };
            if let Some(trace) = &run.trace {
                trace.tool(span_id, started, call, result.as_ref());
            }
            result
        });
        join_all(futures).await
    }

    /// docs/events.md#attribution: adds each preceding task ToolMessage's valid, unattributed
    /// `subagent_token_usage` to the AI message that dispatched it, then marks it.
    fn attribute_subagent_usage(&mut self) {
        let mut found = Vec::new();
        for message in &mut self.messages {
            if let Message::Tool(tool) = message
                && tool
                    .additional_kwargs
                    .get("subagent_token_usage_attributed")
                    != Some(&json!(true))
                && let Some(usage) = tool
                    .additional_kwargs
                    .get("subagent_token_usage")
                    .and_then(TokenUsage::from_value)
            {
                tool.additional_kwargs
                    .insert("subagent_token_usage_attributed".into(), json!(true));
                found.push((tool.tool_call_id.clone(), usage));
            }
        }
        for (call_id, usage) in found {
            let owner = self.messages.iter_mut().rev().find_map(|m| match m {
                Message::Ai(ai) if ai.tool_calls.iter().any(|c| c.id == call_id) => Some(ai),
                _ => None,
            });
            if let Some(ai) = owner {
                let mut metadata = ai.usage_metadata.unwrap_or_default();
                metadata.input_tokens += usage.input_tokens;
                metadata.output_tokens += usage.output_tokens;
                metadata.total_tokens += usage.total_tokens;
                ai.usage_metadata = Some(metadata);
            }
        }
    }

    /// Appends a message (with an id from now on), checkpoints the state and emits
    /// `values`.
    pub async fn push(&mut self, message: Message) {
        self.push_all([message]).await;
    }

    /// Appends the messages of one step (each with an id from now on), then checkpoints
    /// the state and emits `values` once, as a graph does after each of its steps: a
    /// turn's tool results are one step however many tasks ran in it.
    pub async fn push_all(&mut self, messages: impl IntoIterator<Item = Message>) {
        for mut message in messages {
            message.ensure_id();
            self.messages.push(message);
        }
        self.checkpoint().await;
    }

    /// Stores the latest checkpoint if the store refused it, retrying until the store
    /// takes it, so the run's messages outlive an outage.
    pub async fn store_unstored(&mut self) {
        let Some(checkpoint) = self.unstored.take() else {
            return;
        };
        let id = checkpoint.checkpoint_id.clone();
        let store = &self.runtime.store;
        let written =
            crate::store_retry::until_stored("the final checkpoint", &self.run.run_id, || {
                store.put_checkpoint(checkpoint.clone())
            })
            .await;
        if written.is_some() {
            self.checkpoint_id = Some(id);
        }
    }

    /// Writes a checkpoint of the current messages and emits `values`.
    pub async fn checkpoint(&mut self) {
        self.step += 1;
        if self.title.is_none() {
            self.title = fallback_title(&self.messages);
        }
        let values = match &self.title {
            Some(title) => json!({"messages": self.messages, "title": title}),
            None => json!({"messages": self.messages}),
        };
        let checkpoint_id = Uuid::now_v7().to_string();
        let mut metadata = Map::new();
        metadata.insert("deerflow_trace_id".into(), json!(self.run.trace_id));
        metadata.insert("run_id".into(), json!(self.run.run_id));
        metadata.insert("step".into(), json!(self.step));
        let checkpoint = NewCheckpoint {
            lease_owner: self.run.lease_owner.clone(),
            thread_id: self.run.thread_id.clone(),
            checkpoint_id: checkpoint_id.clone(),
            parent_checkpoint_id: self.checkpoint_id.clone(),
            run_id: Some(self.run.run_id.clone()),
            values: values.clone(),
            metadata,
        };
        let stored = match self.runtime.store.put_checkpoint(checkpoint.clone()).await {
            Ok(_) => {
                self.checkpoint_id = Some(checkpoint_id.clone());
                self.unstored = None;
                Some(checkpoint_id)
            }
            Err(error) => {
                tracing::error!(%error, run_id = %self.run.run_id, "checkpoint write failed");
                self.run.store_fault.note("a checkpoint", &error);
                self.unstored = Some(checkpoint);
                None
            }
        };
        self.run.sink.send(RunOutput::Values {
            values,
            checkpoint: stored,
        });
    }
}
