//! Cards painted from task summaries (`GET …/runs/{run_id}/tasks`, docs/api.md#task-summaries) before
//! their steps are loaded, and the one rule for how many steps a card lists and which is
//! the latest, whether its steps or only its summary are known.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Card, CardStatus, CardUpdate, Step, StepKind, display_steps, read_usage};
use crate::status::SubagentStopReason;
use crate::task_result::non_negative_integer;
use crate::text::js_trim;

/// A step as a task summary gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Brief {
    /// Model turn or tool result.
    pub kind: StepKind,
    /// Its text (a summary's is at most 2,000 characters).
    pub text: String,
    /// The tool of a tool step.
    pub tool_name: Option<String>,
}

impl Brief {
    fn of(step: &Step) -> Self {
        Brief {
            kind: step.kind,
            text: step.text.clone(),
            tool_name: step.tool_name.clone(),
        }
    }

    fn read(value: &Value) -> Option<Brief> {
        value.as_object()?;
        let text = |key| value.get(key).and_then(Value::as_str).map(str::to_owned);
        Some(Brief {
            kind: if value.get("kind").and_then(Value::as_str) == Some("tool") {
                StepKind::Tool
            } else {
                StepKind::Ai
            },
            text: text("text").unwrap_or_default(),
            tool_name: text("tool_name"),
        })
    }
}

/// What a task summary says about a card's steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CardSummary {
    /// The steps a card lists, a completed task's answer left out.
    pub step_count: u64,
    /// The last of them.
    pub latest_step: Option<Brief>,
    /// A completed task's answer, which a card not shown completed lists too.
    pub result_step: Option<Brief>,
}

fn non_blank(value: Option<&Value>) -> Option<&str> {
    value
        .and_then(Value::as_str)
        .filter(|text| !js_trim(text).is_empty())
}

/// The update a task summary gives: type, description, model, usage, stop reason, error
/// or brief, and its step count and latest step. Status still comes from the ToolMessage
/// (or the pending rule).
pub fn summary_update(summary: &Value) -> Option<CardUpdate> {
    summary.as_object()?;
    let string = |key| summary.get(key).and_then(Value::as_str).map(str::to_owned);
    Some(CardUpdate {
        subagent_type: string("subagent_type"),
        description: string("description"),
        model_name: non_blank(summary.get("model_name")).map(|m| js_trim(m).to_owned()),
        usage: summary.get("usage").and_then(read_usage),
        stop_reason: summary
            .get("stop_reason")
            .and_then(Value::as_str)
            .and_then(|reason| reason.parse::<SubagentStopReason>().ok()),
        result: non_blank(summary.get("result_brief")).map(|r| js_trim(r).to_owned()),
        error: non_blank(summary.get("error")).map(str::to_owned),
        summary: summary
            .get("step_count")
            .and_then(non_negative_integer)
            .map(|step_count| CardSummary {
                step_count,
                latest_step: summary.get("latest_step").and_then(Brief::read),
                result_step: summary.get("result_step").and_then(Brief::read),
            }),
        ..CardUpdate::default()
    })
}

/// How many steps a card lists and the last of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listed {
    /// The number of steps listed.
    pub count: u64,
    /// The last of them.
    pub latest: Option<Brief>,
}

/// The steps a card lists: from its steps once any are known, else from its summary,
/// whose count leaves out a completed task's answer, which a card not shown completed
/// lists. So a count always equals what the expanded card lists.
pub fn listed_steps(card: &Card, status: CardStatus) -> Listed {
    match &card.summary {
        Some(summary) if card.steps.is_empty() => match &summary.result_step {
            Some(answer) if status != CardStatus::Completed => Listed {
                count: summary.step_count + 1,
                latest: Some(answer.clone()),
            },
            _ => Listed {
                count: summary.step_count,
                latest: summary.latest_step.clone(),
            },
        },
        _ => {
            let listed = display_steps(&card.steps, status);
            Listed {
                count: listed.len() as u64,
                latest: listed.last().map(Brief::of),
            }
        }
    }
}

/// A step in one line: a tool step as `tool: first line`, an AI step as its first line
/// (none when blank).
pub fn step_line(step: Option<&Brief>) -> Option<String> {
    let step = step?;
    let first = js_trim(js_trim(&step.text).split('\n').next().unwrap_or(""));
    match step.kind {
        StepKind::Ai => (!first.is_empty()).then(|| first.to_owned()),
        StepKind::Tool => {
            let name = non_blank_str(step.tool_name.as_deref()).unwrap_or("tool");
            Some(if first.is_empty() {
                name.to_owned()
            } else {
                format!("{name}: {first}")
            })
        }
    }
}

fn non_blank_str(text: Option<&str>) -> Option<&str> {
    text.filter(|t| !js_trim(t).is_empty())
}
