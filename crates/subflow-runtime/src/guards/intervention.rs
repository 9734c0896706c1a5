//! What a guard does to the conversation: queue warnings for the next model call, or
//! turn the last AI message into a final answer (docs/events.md#warnings-and-hard-stops).

use serde_json::{Value, json};
use subflow_contracts::messages::{AiMessage, HumanMessage, Message};

/// The `name` of the human message carrying loop warnings (docs/events.md#warnings-and-hard-stops).
pub const LOOP_WARNING_NAME: &str = "loop_warning";

/// The `name` the reference gives the human message carrying token-budget warnings.
pub const BUDGET_WARNING_NAME: &str = "budget_warning";

/// Most warning entries injected over one run (docs/events.md#warnings-and-hard-stops).
pub const MAX_INJECTED_WARNINGS_PER_RUN: usize = 4;

/// Keys of `additional_kwargs` that carry a provider's raw tool-call data.
const RAW_TOOL_CALL_KEYS: [&str; 2] = ["tool_calls", "function_call"];

/// Content block types that are raw tool calls rather than text.
const RAW_TOOL_CALL_BLOCKS: [&str; 2] = ["tool_use", "function_call"];

/// Warnings waiting for the next model call of one (thread, run).
// Warnings are not added right after the AI message that triggered them: its tool calls
// have no results yet, and a message between calls and results breaks providers'
// call/result pairing. They go after the results, at the next call.
#[derive(Debug, Clone)]
pub struct WarningQueue {
    name: &'static str,
    pending: Vec<String>,
    injected: usize,
}

impl WarningQueue {
    /// An empty queue whose injections are human messages named `name`.
    pub fn new(name: &'static str) -> Self {
        WarningQueue {
            name,
            pending: Vec::new(),
            injected: 0,
        }
    }

    /// An empty queue for loop warnings (`loop_warning`).
    pub fn loop_warnings() -> Self {
        Self::new(LOOP_WARNING_NAME)
    }

    /// Queues one warning text; a text already pending is not queued twice.
    pub fn push(&mut self, text: impl Into<String>) {
        let text = text.into();
        if !self.pending.contains(&text) {
            self.pending.push(text);
        }
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Warning entries injected so far in this run.
    pub fn injected(&self) -> usize {
        self.injected
    }

    /// Drains the queue into one trailing human message for the next model request, if any.
    pub fn take_injection(&mut self) -> Option<Message> {
        let pending = std::mem::take(&mut self.pending);
        // Past the run's allowance, the most recent entries are kept: they carry the
        // latest counts.
        let remaining = MAX_INJECTED_WARNINGS_PER_RUN.saturating_sub(self.injected);
        let skip = pending.len().saturating_sub(remaining);
        let entries = &pending[skip..];
        if entries.is_empty() {
            return None;
        }
        self.injected += entries.len();
        Some(Message::Human(HumanMessage {
            content: Value::String(entries.join("\n\n")),
            name: Some(self.name.to_owned()),
            ..HumanMessage::default()
        }))
    }
}

/// `message` as a final answer: no tool calls, `finish_reason` `stop`, `stop_text` appended (docs/events.md#warnings-and-hard-stops).
pub fn hard_stop(message: &AiMessage, stop_text: &str) -> AiMessage {
    let mut stopped = message.clone();
    stopped.tool_calls.clear();
    stopped.invalid_tool_calls.clear();
    for key in RAW_TOOL_CALL_KEYS {
        stopped.additional_kwargs.remove(key);
    }
    stopped
        .response_metadata
        .insert("finish_reason".to_owned(), Value::String("stop".to_owned()));
    stopped.content = append_text(&message.content, stop_text);
    stopped
}

/// `content` with `text` appended: after a blank line for a string, as a new text block
/// for a list (whose raw tool-call blocks are dropped, since the calls no longer exist).
fn append_text(content: &Value, text: &str) -> Value {
    match content {
        Value::Null => Value::String(text.to_owned()),
        Value::String(existing) if existing.is_empty() => Value::String(text.to_owned()),
        Value::String(existing) => Value::String(format!("{existing}\n\n{text}")),
        Value::Array(blocks) => {
            let mut blocks: Vec<Value> = blocks
                .iter()
                .filter(|block| {
                    let kind = block.get("type").and_then(Value::as_str);
                    !kind.is_some_and(|kind| RAW_TOOL_CALL_BLOCKS.contains(&kind))
                })
                .cloned()
                .collect();
            blocks.push(json!({"type": "text", "text": text}));
            Value::Array(blocks)
        }
        // Not a shape providers produce; keep what was there readable rather than drop it.
        other => Value::String(format!("{other}\n\n{text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use subflow_contracts::messages::ToolCall;

    fn human(message: Option<Message>) -> HumanMessage {
        match message {
            Some(Message::Human(human)) => human,
            other => panic!("expected a human message, got {other:?}"),
        }
    }

    #[test]
    fn an_injection_dedupes_and_joins_with_blank_lines() {
        let mut queue = WarningQueue::loop_warnings();
        assert!(queue.take_injection().is_none(), "nothing pending");
        queue.push("a");
        queue.push("b");
        queue.push("a");
        let message = human(queue.take_injection());
        assert_eq!(message.content, json!("a\n\nb"));
        assert_eq!(message.name.as_deref(), Some("loop_warning"));
        assert!(queue.is_empty());
        assert!(queue.take_injection().is_none(), "drained");
    }

    #[test]
    fn at_most_four_entries_are_injected_per_run() {
        let mut queue = WarningQueue::loop_warnings();
        for text in ["w1", "w2", "w3"] {
            queue.push(text);
        }
        assert_eq!(
            human(queue.take_injection()).content,
            json!("w1\n\nw2\n\nw3")
        );
        queue.push("w4");
        queue.push("w5");
        assert_eq!(
            human(queue.take_injection()).content,
            json!("w5"),
            "one left: the latest wins"
        );
        assert_eq!(queue.injected(), MAX_INJECTED_WARNINGS_PER_RUN);
        queue.push("w6");
        assert!(queue.take_injection().is_none(), "allowance spent");
        assert!(queue.is_empty(), "spent warnings are dropped, not kept");
    }

    #[test]
    fn a_budget_queue_names_its_message() {
        let mut queue = WarningQueue::new(BUDGET_WARNING_NAME);
        queue.push("x");
        assert_eq!(
            human(queue.take_injection()).name.as_deref(),
            Some("budget_warning")
        );
    }

    fn tool_calling(content: Value) -> AiMessage {
        let mut message = AiMessage {
            content,
            id: Some("m1".into()),
            tool_calls: vec![ToolCall::new("c1", "bash", json!({"command": "ls"}))],
            invalid_tool_calls: vec![json!({"name": "bash", "args": "{"})],
            ..AiMessage::default()
        };
        message
            .additional_kwargs
            .insert("tool_calls".into(), json!([{"id": "c1"}]));
        message
            .additional_kwargs
            .insert("function_call".into(), json!({"name": "bash"}));
        message.additional_kwargs.insert("keep".into(), json!(true));
        message
            .response_metadata
            .insert("finish_reason".into(), json!("tool_calls"));
        message
            .response_metadata
            .insert("model_name".into(), json!("m"));
        message
    }

    #[test]
    fn a_hard_stop_strips_calls_sets_stop_and_appends_text() {
        let check = |content: Value, expected: Value| {
            let stopped = hard_stop(&tool_calling(content.clone()), "STOP");
            assert_eq!(stopped.content, expected, "content {content}");
            assert!(stopped.tool_calls.is_empty());
            assert!(stopped.invalid_tool_calls.is_empty());
            assert_eq!(
                Value::Object(stopped.additional_kwargs.clone()),
                json!({"keep": true})
            );
            assert_eq!(stopped.response_metadata["finish_reason"], json!("stop"));
            assert_eq!(stopped.response_metadata["model_name"], json!("m"));
            assert_eq!(stopped.id.as_deref(), Some("m1"));
        };
        check(json!("Working on it"), json!("Working on it\n\nSTOP"));
        check(json!(""), json!("STOP"));
        check(Value::Null, json!("STOP"));
        check(
            json!([{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Working"}]),
            json!([{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Working"},
                   {"type": "text", "text": "STOP"}]),
        );
        check(
            json!([{"type": "tool_use", "id": "c1", "name": "bash", "input": {}}]),
            json!([{"type": "text", "text": "STOP"}]),
        );
        check(json!([]), json!([{"type": "text", "text": "STOP"}]));
    }
}
