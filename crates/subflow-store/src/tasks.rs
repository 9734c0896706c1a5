//! Task summaries (docs/api.md#task-summaries): one per task of a run, computed from its `subagent.*`
//! records by one store query, so a client paints finished and reloaded cards — counts,
//! usage, latest step — without paging every task's steps.
//!
//! The counting rule is the card's (docs/workspace.md#task-card step display, `task_card::display_steps`):
//! a summary's `step_count` is the number of steps an expanded card lists. Backends
//! read [`TaskRows`] — each task's start and end records, how many steps a card could
//! list, the last two of them and the latest step's usage — and [`summarize`] turns them
//! into the summary, so no backend has its own counting or dropping rule.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use subflow_contracts::task_card::{self, Step, StepKind};
use subflow_contracts::task_result::TokenUsage;
use subflow_contracts::text::{cap_chars, is_js_whitespace, js_trim};
use subflow_contracts::{EventCategory, RunEvent, TaskEndStatus};

use crate::{Result, codec};

/// Cap, in characters, on the text of a summary's steps.
pub const STEP_TEXT_CAP: usize = 2000;

/// A step as a summary shows it: `{kind, text, tool_name}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepBrief {
    /// `ai` or `tool`.
    pub kind: StepKind,
    /// The step's text, at most [`STEP_TEXT_CAP`] characters.
    pub text: String,
    /// The tool of a tool step.
    pub tool_name: Option<String>,
}

impl StepBrief {
    fn of(step: &Step) -> Self {
        StepBrief {
            kind: step.kind,
            text: cap_chars(&step.text, STEP_TEXT_CAP).0.to_owned(),
            tool_name: step.tool_name.clone(),
        }
    }

    /// `{kind, text, tool_name}`.
    pub fn to_json(&self) -> Value {
        let kind = match self.kind {
            StepKind::Ai => "ai",
            StepKind::Tool => "tool",
        };
        json!({"kind": kind, "text": self.text, "tool_name": self.tool_name})
    }
}

/// What a backend reads of one task: the raw material of its summary.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskRows {
    /// `metadata.task_id`.
    pub task_id: String,
    /// The smallest `seq` of the task's records: tasks are listed in this order.
    pub first_seq: i64,
    /// The first `subagent.start`: its content and `created_at`.
    pub start: Option<(Value, String)>,
    /// The first `subagent.end`: its content and `created_at`.
    pub end: Option<(Value, String)>,
    /// Steps a card lists before the completed-card rule: tool steps and AI steps with
    /// text, one per `message_index` (the record with the highest `seq` wins).
    pub listable: u64,
    /// The contents of the last two of those steps by `message_index`, last first.
    pub last_listable: Vec<Value>,
    /// The `usage` of the step with the highest `message_index`, if it carries one.
    pub latest_usage: Option<Value>,
}

/// One task of a run (docs/api.md#task-summaries), before the run's status and prices are applied.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskSummary {
    /// The `task` tool call id.
    pub task_id: String,
    /// The call's `subagent_type`, from the start record.
    pub subagent_type: Option<String>,
    /// The start record's description.
    pub description: Option<String>,
    /// The effective model: the end record's, else the start record's.
    pub model_name: Option<String>,
    /// The end record's status; `None` while the task has none.
    pub end_status: Option<TaskEndStatus>,
    /// The guard cap that ended the task, from the end record.
    pub stop_reason: Option<String>,
    /// The steps an expanded card lists (docs/workspace.md#task-card), with the completed-card rule
    /// applied when the task completed.
    pub step_count: u64,
    /// The last of those steps.
    pub latest_step: Option<StepBrief>,
    /// The trailing AI step without tool calls that a completed card does not list
    /// because it is the result; a card shown failed (no ToolMessage) lists it too.
    pub result_step: Option<StepBrief>,
    /// Cumulative usage: the end record's, else the latest step's.
    pub usage: Option<TokenUsage>,
    /// `created_at` of the start record.
    pub started_at: Option<String>,
    /// `created_at` of the end record.
    pub ended_at: Option<String>,
    /// The end record's error.
    pub error: Option<String>,
    /// The end record's result.
    pub result: Option<String>,
}

/// Every character JavaScript's `trim` removes, for SQL `trim(text, characters)`: a
/// backend tests blankness exactly as the card does.
pub fn js_whitespace() -> String {
    (0..=0x10FFFF_u32)
        .filter_map(char::from_u32)
        .filter(|c| is_js_whitespace(*c))
        .collect()
}

fn text(content: &Value, key: &str) -> Option<String> {
    content.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// The summary of one task from what a backend read.
pub fn summarize(rows: TaskRows) -> TaskSummary {
    let start = rows.start.as_ref().map(|(content, _)| content);
    let end = rows.end.as_ref().map(|(content, _)| content);
    let end_status = end
        .and_then(|c| c.get("status"))
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<TaskEndStatus>().ok());
    let steps: Vec<Step> = rows
        .last_listable
        .iter()
        .filter_map(|content| task_card::step_from_record(&json!({ "content": content })))
        .collect();
    let is_result = |step: &Step| step.kind == StepKind::Ai && step.tool_calls.is_empty();
    let (step_count, latest, result_step) = match steps.first() {
        Some(last) if end_status == Some(TaskEndStatus::Completed) && is_result(last) => (
            rows.listable.saturating_sub(1),
            steps.get(1),
            Some(StepBrief::of(last)),
        ),
        last => (rows.listable, last, None),
    };
    let usage = end
        .and_then(|c| c.get("usage"))
        .and_then(TokenUsage::from_value)
        .or_else(|| rows.latest_usage.as_ref().and_then(TokenUsage::from_value));
    let model_name = end
        .and_then(|c| text(c, "model_name"))
        .or_else(|| start.and_then(|c| text(c, "model_name")));
    TaskSummary {
        subagent_type: start.and_then(|c| text(c, "subagent_type")),
        description: start.and_then(|c| text(c, "description")),
        model_name,
        end_status,
        stop_reason: end.and_then(|c| text(c, "stop_reason")),
        step_count,
        latest_step: latest.map(StepBrief::of),
        result_step,
        usage,
        started_at: rows.start.as_ref().map(|(_, at)| at.clone()),
        ended_at: rows.end.as_ref().map(|(_, at)| at.clone()),
        error: end.and_then(|c| text(c, "error")),
        result: end.and_then(|c| text(c, "result")),
        task_id: rows.task_id,
    }
}

/// One row of a SQL backend's task-summary query. `part` says what it carries:
/// `first` (the task's smallest `seq`), `subagent.start` / `subagent.end` (a record's
/// `seq`, `created_at` and content), `listable` (one of the last two listable steps:
/// `seq` is its rank from the last, 1 or 2, `count` the task's listable steps) or
/// `usage` (the latest step's `usage` as JSON text).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskQueryRow {
    /// What the row carries.
    pub part: String,
    /// `metadata.task_id`.
    pub task_id: String,
    /// A `seq`, or the rank of a listable step.
    pub seq: Option<i64>,
    /// A record's `created_at`.
    pub created_at: Option<String>,
    /// JSON text: a record's content or a usage.
    pub content: Option<String>,
    /// The number of listable steps.
    pub count: Option<i64>,
}

/// Folds a SQL backend's query rows into each task's [`TaskRows`].
pub fn rows_from_query(rows: Vec<TaskQueryRow>) -> Result<Vec<TaskRows>> {
    let mut tasks: BTreeMap<String, (TaskRows, Option<i64>, Option<i64>)> = BTreeMap::new();
    let mut ranked: Vec<(String, i64, Value)> = Vec::new();
    for row in rows {
        let content = row
            .content
            .as_deref()
            .map(|text| codec::json("run_events.content", text))
            .transpose()?;
        let (task, start_seq, end_seq) = tasks.entry(row.task_id.clone()).or_insert_with(|| {
            let rows = TaskRows {
                task_id: row.task_id.clone(),
                first_seq: i64::MAX,
                ..TaskRows::default()
            };
            (rows, None, None)
        });
        let record = |content: Option<Value>| content.zip(row.created_at.clone());
        match row.part.as_str() {
            "first" => task.first_seq = row.seq.unwrap_or(i64::MAX),
            // The first record of a kind by seq decides, as in the reference reading.
            "subagent.start" if start_seq.is_none_or(|seq| row.seq < Some(seq)) => {
                *start_seq = row.seq;
                task.start = record(content);
            }
            "subagent.end" if end_seq.is_none_or(|seq| row.seq < Some(seq)) => {
                *end_seq = row.seq;
                task.end = record(content);
            }
            "listable" => {
                task.listable = row.count.unwrap_or(0).max(0) as u64;
                if let Some(content) = content {
                    ranked.push((row.task_id, row.seq.unwrap_or(0), content));
                }
            }
            "usage" => task.latest_usage = content,
            _ => {}
        }
    }
    ranked.sort_by_key(|(_, rank, _)| *rank);
    for (task_id, _, content) in ranked {
        if let Some((task, _, _)) = tasks.get_mut(&task_id) {
            task.last_listable.push(content);
        }
    }
    Ok(tasks.into_values().map(|(task, _, _)| task).collect())
}

/// The reference reading of a run's records (the memory store's, and what the
/// conformance suite expects of every backend): each task's rows, from the records of
/// `run_id` whose `metadata.task_id` is a string, read with the card's own
/// `step_from_record`, later records of one `message_index` replacing earlier ones.
pub fn task_rows<'a>(
    events: impl IntoIterator<Item = &'a RunEvent>,
    run_id: &str,
) -> Vec<TaskRows> {
    // Each task's rows so far, and its steps by `message_index` with their contents.
    type Steps<'a> = BTreeMap<u64, (Step, &'a Value)>;
    let mut tasks: BTreeMap<String, (TaskRows, Steps<'a>)> = BTreeMap::new();
    for event in events {
        if event.run_id != run_id || event.category != EventCategory::Subagent.as_str() {
            continue;
        }
        let Some(task_id) = event.metadata.get("task_id").and_then(Value::as_str) else {
            continue;
        };
        let (rows, steps) = tasks.entry(task_id.to_owned()).or_insert_with(|| {
            let rows = TaskRows {
                task_id: task_id.to_owned(),
                first_seq: event.seq,
                ..TaskRows::default()
            };
            (rows, BTreeMap::new())
        });
        rows.first_seq = rows.first_seq.min(event.seq);
        let record = || Some((event.content.clone(), event.created_at.clone()));
        match event.event_type.as_str() {
            "subagent.start" if rows.start.is_none() => rows.start = record(),
            "subagent.end" if rows.end.is_none() => rows.end = record(),
            "subagent.step" => {
                let step = task_card::step_from_record(&json!({ "content": event.content }));
                if let Some(step) = step {
                    steps.insert(step.message_index, (step, &event.content));
                }
            }
            _ => {}
        }
    }
    tasks
        .into_values()
        .map(|(mut rows, steps)| {
            rows.latest_usage = steps
                .values()
                .next_back()
                .and_then(|(_, content)| content.get("usage").cloned());
            let listable: Vec<&Value> = steps
                .values()
                .filter(|(step, _)| step.kind == StepKind::Tool || !js_trim(&step.text).is_empty())
                .map(|(_, content)| *content)
                .collect();
            rows.listable = listable.len() as u64;
            rows.last_listable = listable
                .iter()
                .rev()
                .take(2)
                .map(|c| (*c).clone())
                .collect();
            rows
        })
        .collect()
}

/// Summaries of tasks in the order of their first record.
pub fn summarize_all(mut tasks: Vec<TaskRows>) -> Vec<TaskSummary> {
    tasks.sort_by(|a, b| (a.first_seq, &a.task_id).cmp(&(b.first_seq, &b.task_id)));
    tasks.into_iter().map(summarize).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(index: u64, kind: &str, text: &str, calls: usize) -> Value {
        let mut content = json!({"task_id": "t", "message_index": index, "kind": kind, "text": text, "truncated": false});
        if kind == "ai" {
            content["tool_calls"] = json!(vec![json!({"name": "ls", "args": {}}); calls]);
        } else {
            content["tool_name"] = json!("ls");
        }
        content
    }

    fn rows(end: Option<&str>, listable: u64, last: Vec<Value>) -> TaskRows {
        TaskRows {
            task_id: "t".into(),
            first_seq: 1,
            start: Some((
                json!({"task_id": "t", "description": "d", "subagent_type": "general-purpose", "model_name": "m"}),
                "a".into(),
            )),
            end: end.map(|status| (json!({"task_id": "t", "status": status}), "b".into())),
            listable,
            last_listable: last,
            latest_usage: Some(json!({"input_tokens": 1, "output_tokens": 2, "total_tokens": 3})),
        }
    }

    #[test]
    fn a_completed_task_does_not_count_its_result_step() {
        let summary = summarize(rows(
            Some("completed"),
            3,
            vec![step(5, "ai", "The answer", 0), step(4, "tool", "x", 0)],
        ));
        assert_eq!(summary.step_count, 2);
        assert_eq!(summary.latest_step.unwrap().kind, StepKind::Tool);
        assert_eq!(summary.result_step.unwrap().text, "The answer");
        assert_eq!(summary.end_status, Some(TaskEndStatus::Completed));
    }

    #[test]
    fn other_tasks_count_every_listable_step_and_fall_back_to_the_step_usage() {
        for end in [None, Some("cancelled"), Some("failed")] {
            let summary = summarize(rows(end, 3, vec![step(5, "ai", "thinking", 0)]));
            assert_eq!(summary.step_count, 3);
            assert_eq!(summary.latest_step.unwrap().text, "thinking");
            assert_eq!(summary.result_step, None);
            assert_eq!(summary.usage.unwrap().total_tokens, 3);
            assert_eq!(summary.model_name.as_deref(), Some("m"));
        }
    }

    #[test]
    fn step_text_is_bounded() {
        let long = "é".repeat(STEP_TEXT_CAP + 5);
        let summary = summarize(rows(None, 1, vec![step(1, "tool", &long, 0)]));
        assert_eq!(
            summary.latest_step.unwrap().text.chars().count(),
            STEP_TEXT_CAP
        );
    }

    #[test]
    fn the_whitespace_set_is_what_javascript_trims() {
        let set = js_whitespace();
        assert!(set.contains('\u{feff}') && set.contains('\u{a0}') && set.contains('\u{3000}'));
        assert!(!set.contains('\u{85}'));
        assert_eq!(set.chars().count(), 25);
    }
}
