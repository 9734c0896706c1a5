//! What a run emits while it executes, for the gateway to frame as SSE (docs/api.md#sse-frames) and
//! for `subflow tail`; and the per-task emitter of the live task events (docs/events.md#task-events).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{Map, Value, json};
use subflow_contracts::messages::{AiMessage, Message};
use subflow_contracts::task_events::TaskEvent;
use subflow_store::buffer::{EventBuffer, Loan};
use tokio::sync::mpsc;

use subflow_contracts::status::SubagentStopReason;
use subflow_contracts::task_result::TokenUsage;

/// One item of a run's live output.
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutput {
    /// A `messages` frame: an AI text delta (`AIMessageChunk`) or a tool message, with
    /// the graph node that produced it (`model` or `tools`).
    Message {
        /// The chunk or message dict.
        message: Value,
        /// `model` or `tools`.
        node: &'static str,
    },
    /// The full state values after a lead step.
    Values {
        /// `{messages, ...}`, as checkpointed.
        values: Value,
        /// The checkpoint that stores exactly these values; `None` when writing it
        /// failed. The stream log stores a reference to it instead of a copy.
        checkpoint: Option<String>,
    },
    /// An `updates` frame: `{<node>: <state delta>}` after a lead step (docs/api.md#sse-frames).
    Update(Value),
    /// A `custom` payload: a task event, serialised by whoever frames it (its JSON is
    /// [`TaskEvent::to_value`], fields in the documented order), so a step builds no
    /// JSON tree on its way out.
    Custom {
        /// The task event.
        event: TaskEvent,
        /// When the step (or lifecycle change) it reports came into existence.
        created: Instant,
    },
}

impl RunOutput {
    /// A text delta of the AI message `id` (node `model`).
    pub fn text_chunk(id: &str, delta: &str) -> Self {
        RunOutput::Message {
            message: json!({"type": "AIMessageChunk", "content": delta, "id": id}),
            node: "model",
        }
    }

    /// The last chunk of a streamed AI message, so that its chunks concatenated are the
    /// message as it entered the state: the text its final form adds to what streamed
    /// (a limit note, a forced-stop text), its tool calls as `tool_call_chunks`, its
    /// metadata and usage.
    pub fn closing_chunk(streamed: &str, ai: &AiMessage) -> Self {
        let text = subflow_contracts::text::flatten_content(Some(&ai.content));
        let rest = text.strip_prefix(streamed).unwrap_or_default();
        let calls: Vec<Value> = ai
            .tool_calls
            .iter()
            .enumerate()
            .map(|(index, call)| {
                json!({"type": "tool_call_chunk", "id": call.id, "name": call.name,
                       "args": call.args.to_string(), "index": index})
            })
            .collect();
        let mut chunk = Map::new();
        chunk.insert("type".into(), json!("AIMessageChunk"));
        chunk.insert("content".into(), json!(rest));
        chunk.insert("id".into(), json!(ai.id));
        chunk.insert("tool_call_chunks".into(), Value::Array(calls));
        chunk.insert("additional_kwargs".into(), json!(ai.additional_kwargs));
        chunk.insert("response_metadata".into(), json!(ai.response_metadata));
        if let Some(usage) = &ai.usage_metadata {
            chunk.insert("usage_metadata".into(), json!(usage));
        }
        RunOutput::Message {
            message: Value::Object(chunk),
            node: "model",
        }
    }

    /// A whole message that did not stream as chunks (a tool result, a fallback answer).
    pub fn whole(message: &Message, node: &'static str) -> Self {
        RunOutput::Message {
            message: json!(message),
            node,
        }
    }

    /// The `updates` payload of a lead step: `{<node>: {"messages": [...]}}`.
    pub fn update(node: &'static str, messages: &[Message]) -> Self {
        let mut delta = Map::new();
        delta.insert(node.to_owned(), json!({"messages": messages}));
        RunOutput::Update(Value::Object(delta))
    }
}

/// The sending side of a run's output; sends never block and never fail the run.
#[derive(Debug, Clone)]
pub struct OutputSink {
    tx: mpsc::UnboundedSender<RunOutput>,
    barrier: EventBarrier,
}

/// The event buffers of one run, for a consumer that must not show an output item
/// before the records of what it shows are stored: the runtime records an event before
/// it sends the item that shows it, so the records of a [`EventBarrier::lend`] cover
/// every item received until then. The consumer stores them with what it writes itself
/// and settles the loan.
#[derive(Debug, Clone, Default)]
pub struct EventBarrier(Arc<Mutex<Vec<EventBuffer>>>);

impl EventBarrier {
    /// Adds one of the run's buffers.
    pub fn register(&self, buffer: EventBuffer) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(buffer);
    }

    /// What every buffer holds now, lent: the buffers store nothing until the loan is
    /// settled.
    pub async fn lend(&self) -> Loan {
        let buffers = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut loan = Loan::default();
        for buffer in &buffers {
            buffer.lend_to(&mut loan).await;
        }
        loan
    }
}

impl OutputSink {
    /// A sink and the receiver the consumer reads.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<RunOutput>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let barrier = EventBarrier::default();
        (OutputSink { tx, barrier }, rx)
    }

    /// The run's event buffers, registered by the runtime as it creates them.
    pub fn barrier(&self) -> &EventBarrier {
        &self.barrier
    }

    /// Sends an item; a consumer that went away only means nobody is watching.
    pub fn send(&self, item: RunOutput) {
        let _ = self.tx.send(item);
    }

    /// Whether a consumer still listens.
    pub fn is_open(&self) -> bool {
        !self.tx.is_closed()
    }
}

/// Emits one task's live events in order: `task_started`, one `task_running` per step,
/// then exactly one terminal event, after which nothing more is emitted. Every event
/// also goes to the run's subagent buffer (persisted as `subagent.*`).
#[derive(Debug)]
pub struct TaskEmitter {
    task_id: String,
    model_name: String,
    /// The `task` call's `subagent_type`; persisted on the start record only.
    subagent_type: String,
    sink: OutputSink,
    buffer: EventBuffer,
    state: Mutex<EmitterState>,
}

#[derive(Debug, Default)]
struct EmitterState {
    steps: u64,
    closed: bool,
}

impl TaskEmitter {
    /// An emitter for `task_id` (the tool_call_id) of type `subagent_type` running on
    /// `model_name`.
    pub fn new(
        task_id: &str,
        model_name: &str,
        subagent_type: &str,
        sink: OutputSink,
        buffer: EventBuffer,
    ) -> Self {
        TaskEmitter {
            task_id: task_id.to_owned(),
            model_name: model_name.to_owned(),
            subagent_type: subagent_type.to_owned(),
            sink,
            buffer,
            state: Mutex::new(EmitterState::default()),
        }
    }

    /// Sends `event` live and persists its record with `extra` content fields: what the
    /// record keeps beyond the live event (docs/api.md#task-summaries task summaries read them).
    fn emit(&self, event: TaskEvent, created: Instant, extra: Option<(&str, Value)>) {
        // Recorded before it is sent: a consumer that flushes the run's buffers before it
        // shows a frame (the gateway) never shows an event that is not stored.
        let mut record = event.record();
        if let Some((key, value)) = extra {
            record = record.with_content_field(key, value);
        }
        if let Err(error) = self.buffer.record_mapped(record) {
            tracing::error!(task_id = %self.task_id, %error, "task event could not be persisted");
        }
        self.sink.send(RunOutput::Custom { event, created });
    }

    /// `task_started`.
    pub fn started(&self, description: &str) {
        let event = TaskEvent::Started {
            task_id: self.task_id.clone(),
            description: description.to_owned(),
            model_name: self.model_name.clone(),
        };
        let subagent_type = Value::String(self.subagent_type.clone());
        self.emit(
            event,
            Instant::now(),
            Some(("subagent_type", subagent_type)),
        );
    }

    /// One `task_running` for a step message that exists since `created`.
    pub fn step(&self, message: Message, usage: Option<TokenUsage>, created: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.closed {
            return;
        }
        state.steps += 1;
        let index = state.steps;
        let event = TaskEvent::Running {
            task_id: self.task_id.clone(),
            message: Box::new(message),
            message_index: index,
            total_messages: index,
            usage,
            model_name: self.model_name.clone(),
        };
        self.emit(event, created, None);
    }

    /// The one terminal event, with the guard cap that ended the task if any; later
    /// calls (and later steps) are ignored.
    pub fn terminal(
        &self,
        end: TerminalEvent,
        usage: Option<TokenUsage>,
        stop_reason: Option<SubagentStopReason>,
    ) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if std::mem::replace(&mut state.closed, true) {
            return;
        }
        let (task_id, model_name) = (self.task_id.clone(), self.model_name.clone());
        let event = match end {
            TerminalEvent::Completed(result) => TaskEvent::Completed {
                task_id,
                result,
                usage,
                model_name,
            },
            TerminalEvent::Failed(error) => TaskEvent::Failed {
                task_id,
                error,
                usage,
                model_name,
            },
            TerminalEvent::Cancelled(error) => TaskEvent::Cancelled {
                task_id,
                error,
                usage,
                model_name,
            },
            TerminalEvent::TimedOut(error) => TaskEvent::TimedOut {
                task_id,
                error,
                usage,
                model_name,
            },
            TerminalEvent::SafetyNetTimedOut => TaskEvent::SafetyNetTimedOut {
                task_id,
                usage,
                model_name,
            },
            TerminalEvent::Disappeared => TaskEvent::disappeared(task_id),
        };
        let stop_reason = stop_reason.map(|reason| ("stop_reason", Value::from(reason.as_str())));
        self.emit(event, Instant::now(), stop_reason);
    }
}

/// Which terminal event a task ends with (docs/events.md#task-events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalEvent {
    /// `task_completed` with the untruncated result.
    Completed(String),
    /// `task_failed` with the error.
    Failed(String),
    /// `task_cancelled`.
    Cancelled(String),
    /// `task_timed_out` from the executor timeout.
    TimedOut(String),
    /// `task_timed_out` from the supervision safety net: no `error` key.
    SafetyNetTimedOut,
    /// `task_failed` for an execution that vanished: no `usage` or `model_name` keys.
    Disappeared,
}
