//! The run journal (docs/events.md#buffering-and-durability, docs/usage-and-cost.md#run-buckets): the run's own events, written through the journal
//! buffer, and its token ledger. Subagents reach it only through [`JournalProxy`].

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};
use subflow_contracts::messages::{AiMessage, HumanMessage, ToolMessage};
use subflow_contracts::{EventCategory, EventType, MiddlewareTag, NewEvent};
use subflow_store::RunUsage;
use subflow_store::buffer::EventBuffer;

use crate::metrics::{NoMetrics, RuntimeMetrics, TokenCount};
use crate::usage::{UsageLedger, UsageRecord};

/// The event type of a money budget crossing (docs/usage-and-cost.md#budgets).
pub const BUDGET_EVENT_TYPE: &str = "middleware:budget";

/// The recorder of one run.
#[derive(Debug)]
pub struct Journal {
    buffer: EventBuffer,
    ledger: Mutex<UsageLedger>,
    llm_calls: AtomicU32,
    track_token_usage: bool,
    max_trace_content: usize,
    metrics: Arc<dyn RuntimeMetrics>,
}

fn metadata(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

impl Journal {
    /// A journal writing through `buffer`.
    pub fn new(buffer: EventBuffer, track_token_usage: bool, max_trace_content: usize) -> Self {
        Journal {
            buffer,
            ledger: Mutex::new(UsageLedger::default()),
            llm_calls: AtomicU32::new(0),
            track_token_usage,
            max_trace_content,
            metrics: Arc::new(NoMetrics),
        }
    }

    /// Counts every usage record the ledger takes in `metrics` (`subflow_tokens_total`),
    /// whether or not `run_events.track_token_usage` keeps it on the run record.
    pub fn with_metrics(mut self, metrics: Arc<dyn RuntimeMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The buffer, for the final flush.
    pub fn buffer(&self) -> &EventBuffer {
        &self.buffer
    }

    fn record(
        &self,
        event_type: &str,
        category: EventCategory,
        content: Value,
        metadata: Map<String, Value>,
    ) {
        if let Err(error) = self
            .buffer
            .record(event_type, category.as_str(), content, metadata)
        {
            tracing::error!(%error, event_type, "journal event refused");
        }
    }

    /// Trace content truncated to `run_events.max_trace_content` bytes, on a char boundary.
    fn trace_text(&self, text: &str) -> String {
        if text.len() <= self.max_trace_content {
            return text.to_owned();
        }
        let mut end = self.max_trace_content;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text[..end].to_owned()
    }

    /// `run.start`, for the run to write before anything else (docs/events.md#catalogue).
    pub fn run_start(&self) -> NewEvent {
        let scope = self.buffer.scope();
        NewEvent::new(
            scope.thread_id.as_str(),
            scope.run_id.as_str(),
            EventType::RunStart.as_str(),
            EventCategory::Trace.as_str(),
            json!({"chain": "lead_agent"}),
            metadata(json!({"caller": "lead_agent"})),
        )
        .with_user(scope.user_id.clone())
    }

    /// `llm.human.input` for the run's first human message, with the id it has in the
    /// thread state (so a client merging pages with live messages knows it).
    pub fn human_input(&self, message: &HumanMessage) {
        self.record(
            EventType::LlmHumanInput.as_str(),
            EventCategory::Message,
            json!({"type": "human", "content": message.content, "id": message.id}),
            metadata(json!({"caller": "lead_agent"})),
        );
    }

    /// `llm.ai.response` of one of the run's own model calls, and its usage record.
    pub fn ai_response(
        &self,
        caller: &str,
        message: &AiMessage,
        latency_ms: Option<u64>,
        record: Option<&UsageRecord>,
    ) {
        let index = self.llm_calls.fetch_add(1, Ordering::SeqCst) + 1;
        let usage = message.usage_metadata.map(|u| json!({"input_tokens": u.input_tokens, "output_tokens": u.output_tokens, "total_tokens": u.total_tokens})).unwrap_or_else(|| json!({}));
        let content = json!({
            "type": "ai", "id": message.id, "content": message.content, "tool_calls": message.tool_calls,
            "additional_kwargs": message.additional_kwargs, "response_metadata": message.response_metadata,
        });
        self.record(EventType::LlmAiResponse.as_str(), EventCategory::Message, content,
            metadata(json!({"caller": caller, "usage": usage, "latency_ms": latency_ms, "llm_call_index": index})));
        if let Some(record) = record {
            let counted = self
                .ledger
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .add_own(record);
            if counted {
                self.metrics.tokens(&TokenCount::of(record));
            }
        }
    }

    /// `llm.tool.result`.
    pub fn tool_result(&self, message: &ToolMessage) {
        let content = json!({"type": "tool", "id": message.id, "content": message.content, "tool_call_id": message.tool_call_id, "name": message.name, "status": message.status});
        self.record(
            EventType::LlmToolResult.as_str(),
            EventCategory::Message,
            content,
            Map::new(),
        );
    }

    /// `llm.error`.
    pub fn llm_error(&self, text: &str) {
        self.record(
            EventType::LlmError.as_str(),
            EventCategory::Trace,
            json!(self.trace_text(text)),
            Map::new(),
        );
    }

    /// `run.error`.
    pub fn run_error(&self, text: &str, error_type: &str) {
        self.record(
            EventType::RunError.as_str(),
            EventCategory::Error,
            json!(text),
            metadata(json!({"error_type": error_type})),
        );
    }

    /// A `middleware:loop_detection` event; failures are swallowed (logged).
    pub fn loop_detection(&self, content: Value) {
        self.record(
            &MiddlewareTag::LoopDetection.event_type(),
            EventCategory::Middleware,
            content,
            Map::new(),
        );
    }

    /// A `middleware:budget` event (docs/usage-and-cost.md#budgets), subflow's own tag;
    /// failures are swallowed (logged).
    pub fn budget(&self, content: Value) {
        self.record(
            BUDGET_EVENT_TYPE,
            EventCategory::Middleware,
            content,
            Map::new(),
        );
    }

    /// Usage records a subagent reports once it ends; ids already counted are skipped.
    pub fn report_external(&self, records: &[UsageRecord]) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        for record in records {
            if ledger.add_external_one(record) {
                self.metrics.tokens(&TokenCount::of(record));
            }
        }
    }

    /// The run record's rollups now; only the message count when
    /// `run_events.track_token_usage` is off (nothing is recorded then).
    pub fn usage(&self, message_count: i64) -> RunUsage {
        if !self.track_token_usage {
            return RunUsage {
                message_count,
                ..RunUsage::default()
            };
        }
        self.ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .snapshot(message_count)
    }
}

/// The narrow handle a subagent gets onto its parent's journal: it records only
/// `middleware:loop_detection` events (docs/events.md#the-loop-detection-event).
#[derive(Debug, Clone, Copy)]
pub struct JournalProxy<'a> {
    journal: &'a Journal,
}

impl<'a> JournalProxy<'a> {
    /// A proxy onto `journal`.
    pub fn new(journal: &'a Journal) -> Self {
        JournalProxy { journal }
    }

    /// Records a loop-detection event of the subagent.
    pub fn loop_detection(&self, content: Value) {
        self.journal.loop_detection(content);
    }
}
