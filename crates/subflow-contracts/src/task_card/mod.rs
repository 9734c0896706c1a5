//! The task card rules of docs/workspace.md#task-card, ported from the web UI's `web/assets/cards.mjs` for
//! `subflow tail`: reading ToolMessages and live task events into card updates, merging
//! them, the pending rule, the steps a card lists, its labels and backfill paging.
//!
//! Both implementations run the one case table `web/cards.cases.json`; the JSON shapes
//! here (camelCase, every card key present) are the ones that table compares. Inputs
//! are untrusted JSON, so every reader tolerates any shape.

mod backfill;
mod cost;
mod summary;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::status::SubagentStopReason;
use crate::task_result::{CardState, TokenUsage, non_negative_integer, read_task_status};
use crate::text::flatten_content as flatten_optional;
use crate::text::js_trim;

pub use backfill::{BackfillNext, backfill_next, backfill_path, backfill_steps, should_backfill};
pub use cost::{
    Cost, Price, card_cost, cost_label, format_cost, has_prices, price_of, stopped_runs_line,
    usage_cost,
};
pub use summary::{Brief, CardSummary, Listed, listed_steps, step_line, summary_update};

/// Records per backfill page.
pub const BACKFILL_LIMIT: usize = 500;

/// Pages a backfill reads at most.
pub const BACKFILL_MAX_PAGES: u32 = 100;

/// How a card shows its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CardStatus {
    /// Running, or waiting for its ToolMessage.
    #[default]
    InProgress,
    /// Completed, capped or not.
    Completed,
    /// Failed, cancelled, timed out, or unanswered when its turn ended.
    Failed,
}

impl CardStatus {
    /// The wire string.
    pub const fn as_str(self) -> &'static str {
        match self {
            CardStatus::InProgress => "in_progress",
            CardStatus::Completed => "completed",
            CardStatus::Failed => "failed",
        }
    }

    /// Completed or failed.
    pub const fn is_terminal(self) -> bool {
        !matches!(self, CardStatus::InProgress)
    }
}

impl From<CardState> for CardStatus {
    fn from(state: CardState) -> Self {
        match state {
            CardState::InProgress => CardStatus::InProgress,
            CardState::Completed => CardStatus::Completed,
            CardState::Failed => CardStatus::Failed,
        }
    }
}

/// A card's cumulative token usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CardUsage {
    /// Input tokens, cached ones included.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Total tokens.
    pub total_tokens: u64,
    /// Input read from the provider's cache; present only when > 0.
    #[serde(default, skip_serializing_if = "crate::api::numbers::is_zero")]
    pub cache_read_tokens: u64,
    /// Input written to the provider's cache; present only when > 0.
    #[serde(default, skip_serializing_if = "crate::api::numbers::is_zero")]
    pub cache_write_tokens: u64,
}

impl From<TokenUsage> for CardUsage {
    fn from(usage: TokenUsage) -> Self {
        CardUsage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens,
            cache_read_tokens: usage.cache_read_tokens,
            cache_write_tokens: usage.cache_write_tokens,
        }
    }
}

/// Whether a step is a model turn or a tool result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum StepKind {
    /// A model turn, possibly requesting tools.
    Ai,
    /// A tool result.
    Tool,
}

/// A tool call requested by an AI step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepToolCall {
    /// The tool, when named.
    pub name: Option<String>,
    /// Its arguments, as sent (a prefix string when truncated).
    pub args: Value,
    /// Whether the persisted arguments were cut.
    pub args_truncated: bool,
}

/// One step of a subagent: a live `task_running` message or a persisted `subagent.step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// The 1-based position in the subagent's history.
    pub message_index: u64,
    /// Model turn or tool result.
    pub kind: StepKind,
    /// The text; untruncated when live.
    pub text: String,
    /// Whether the persisted text was cut.
    pub truncated: bool,
    /// The tool calls of an AI step; empty for tool steps.
    pub tool_calls: Vec<StepToolCall>,
    /// The tool of a tool step.
    pub tool_name: Option<String>,
}

/// A task card.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Card {
    /// The task id: the `task` tool call id.
    pub id: String,
    /// The call's `subagent_type`.
    pub subagent_type: Option<String>,
    /// The call's `description`.
    pub description: Option<String>,
    /// The call's `prompt`.
    pub prompt: Option<String>,
    /// The status its ToolMessage gave, or in progress.
    pub status: CardStatus,
    /// Whether a ToolMessage has answered the call; then it decides the status.
    pub tool_message: bool,
    /// The trimmed result brief, when completed.
    pub result: Option<String>,
    /// The error, when failed.
    pub error: Option<String>,
    /// The guard cap that ended the task.
    pub stop_reason: Option<SubagentStopReason>,
    /// The effective model's configured name.
    pub model_name: Option<String>,
    /// The cumulative usage; never decreases.
    pub usage: Option<CardUsage>,
    /// The latest live subagent message; not persisted.
    pub latest_message: Option<Value>,
    /// The steps, by `message_index`.
    pub steps: Vec<Step>,
    /// What the task's summary (`/tasks`) says of its steps, before any are loaded.
    pub summary: Option<CardSummary>,
}

/// What a source knows about a card: a shallow overlay, `None` meaning "not given".
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CardUpdate {
    /// The call's `subagent_type`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subagent_type: Option<String>,
    /// The call's `description`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The call's `prompt`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// A status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<CardStatus>,
    /// Set by a ToolMessage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_message: Option<bool>,
    /// A result brief.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// An error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A stop reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<SubagentStopReason>,
    /// A model name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
    /// A cumulative usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<CardUsage>,
    /// The latest live message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latest_message: Option<Value>,
    /// Step deltas, merged by `message_index`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<Step>>,
    /// A task summary's account of the steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<CardSummary>,
}

/// When a merge should reach the screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Publish {
    /// A terminal transition: after the current render.
    AfterRender,
    /// A live change: at once.
    Now,
    /// Nothing changed.
    None,
}

/// The outcome of [`merge_card`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Merged {
    /// The card after the update.
    pub card: Card,
    /// Whether anything changed.
    pub changed: bool,
    /// Whether the status became terminal or changed between terminal values.
    pub became_terminal: bool,
    /// When to show it.
    pub publish: Publish,
}

fn non_blank(value: Option<&Value>) -> Option<&str> {
    value
        .and_then(Value::as_str)
        .filter(|text| !js_trim(text).is_empty())
}

fn string(value: Option<&Value>) -> Option<String> {
    value.and_then(Value::as_str).map(str::to_owned)
}

/// A message `content` as text: a string as is; a list's strings and `text` fields joined
/// by `"\n"`, empties skipped; anything else empty.
pub fn flatten_content(content: &Value) -> String {
    flatten_optional(Some(content))
}

/// A wire usage whose three counts are whole and non-negative.
pub fn read_usage(value: &Value) -> Option<CardUsage> {
    TokenUsage::from_value(value).map(CardUsage::from)
}

/// The update a terminal `task` ToolMessage gives (docs/events.md#reading-the-contract, docs/workspace.md#task-card).
pub fn read_tool_message(message: &Value) -> CardUpdate {
    let empty = Map::new();
    let kwargs = message
        .get("additional_kwargs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let text = flatten_optional(message.get("content"));
    let read = read_task_status(kwargs, &text);
    CardUpdate {
        status: Some(read.state.into()),
        tool_message: Some(true),
        result: read.result,
        error: read.error,
        stop_reason: read.stop_reason,
        model_name: read.model_name,
        usage: read.usage.map(CardUsage::from),
        ..CardUpdate::default()
    }
}

/// A card that knows only its task id.
pub fn new_card(id: &str) -> Card {
    Card {
        id: id.to_owned(),
        ..Card::default()
    }
}

/// The update a `task` tool call gives: its string arguments.
pub fn tool_call_update(tool_call: &Value) -> CardUpdate {
    let args = tool_call.get("args");
    let arg = |key: &str| string(args.and_then(|args| args.get(key)));
    CardUpdate {
        subagent_type: arg("subagent_type"),
        description: arg("description"),
        prompt: arg("prompt"),
        ..CardUpdate::default()
    }
}

fn tool_calls(calls: Option<&Value>, read_truncation: bool) -> Vec<StepToolCall> {
    calls
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|call| call.is_object())
        .map(|call| StepToolCall {
            name: string(call.get("name")),
            args: call.get("args").cloned().unwrap_or(Value::Null),
            args_truncated: read_truncation
                && call.get("args_truncated") == Some(&Value::Bool(true)),
        })
        .collect()
}

fn kind_of(value: Option<&Value>) -> StepKind {
    if value.and_then(Value::as_str) == Some("tool") {
        StepKind::Tool
    } else {
        StepKind::Ai
    }
}

/// A step from a live subagent message; its text is untruncated.
pub fn step_from_message(message: &Value, message_index: u64) -> Step {
    let kind = kind_of(message.get("type"));
    Step {
        message_index,
        kind,
        text: flatten_optional(message.get("content")),
        truncated: false,
        tool_calls: match kind {
            StepKind::Ai => tool_calls(message.get("tool_calls"), false),
            StepKind::Tool => Vec::new(),
        },
        tool_name: match kind {
            StepKind::Tool => string(message.get("name")),
            StepKind::Ai => None,
        },
    }
}

/// A step from a persisted `subagent.step` record; `None` when its content is malformed.
pub fn step_from_record(record: &Value) -> Option<Step> {
    let content = record.get("content").filter(|c| c.is_object())?;
    let message_index = content
        .get("message_index")
        .and_then(non_negative_integer)?;
    let kind = kind_of(content.get("kind"));
    Some(Step {
        message_index,
        kind,
        text: string(content.get("text")).unwrap_or_default(),
        truncated: content.get("truncated") == Some(&Value::Bool(true)),
        tool_calls: match kind {
            StepKind::Ai => tool_calls(content.get("tool_calls"), true),
            StepKind::Tool => Vec::new(),
        },
        tool_name: match kind {
            StepKind::Tool => string(content.get("tool_name")),
            StepKind::Ai => None,
        },
    })
}

/// The update a live task event gives; `None` for terminal and unknown events, whose
/// status the ToolMessage carries instead.
pub fn task_event_update(event: &Value) -> Option<CardUpdate> {
    let kind = event.get("type").and_then(Value::as_str)?;
    if kind != "task_started" && kind != "task_running" {
        return None;
    }
    let mut update = CardUpdate {
        model_name: non_blank(event.get("model_name")).map(|name| js_trim(name).to_owned()),
        ..CardUpdate::default()
    };
    if kind == "task_started" {
        return Some(update);
    }
    update.usage = event.get("usage").and_then(read_usage);
    if let Some(message) = event.get("message").filter(|m| m.is_object()) {
        update.latest_message = Some(message.clone());
        if let Some(index) = event.get("message_index").and_then(non_negative_integer) {
            update.steps = Some(vec![step_from_message(message, index)]);
        }
    }
    Some(update)
}

/// Steps merged by `message_index`, the incoming step winning, sorted.
pub fn merge_steps(existing: &[Step], incoming: &[Step]) -> Vec<Step> {
    let mut by_index = BTreeMap::new();
    for step in existing.iter().chain(incoming) {
        by_index.insert(step.message_index, step.clone());
    }
    by_index.into_values().collect()
}

/// Applies an update (docs/workspace.md#task-card "Merge"): a shallow overlay in which a terminal status
/// never reverts to in progress, steps merge by `message_index`, and a usage with fewer
/// total tokens is ignored.
pub fn merge_card(card: &Card, update: &CardUpdate) -> Merged {
    let mut next = card.clone();
    let overlay = |slot: &mut Option<String>, value: &Option<String>| {
        if value.is_some() {
            slot.clone_from(value);
        }
    };
    overlay(&mut next.subagent_type, &update.subagent_type);
    overlay(&mut next.description, &update.description);
    overlay(&mut next.prompt, &update.prompt);
    overlay(&mut next.result, &update.result);
    overlay(&mut next.error, &update.error);
    overlay(&mut next.model_name, &update.model_name);
    // A terminal status never reverts to in progress.
    if let Some(status) = update.status
        && (status.is_terminal() || !card.status.is_terminal())
    {
        next.status = status;
    }
    if let Some(tool_message) = update.tool_message {
        next.tool_message = tool_message;
    }
    if update.stop_reason.is_some() {
        next.stop_reason = update.stop_reason;
    }
    if let Some(usage) = update.usage
        && card
            .usage
            .is_none_or(|old| usage.total_tokens >= old.total_tokens)
    {
        next.usage = Some(usage);
    }
    if update.latest_message.is_some() {
        next.latest_message.clone_from(&update.latest_message);
    }
    if let Some(steps) = &update.steps {
        next.steps = merge_steps(&card.steps, steps);
    }
    if update.summary.is_some() {
        next.summary.clone_from(&update.summary);
    }
    let changed = next != *card;
    let became_terminal = next.status.is_terminal() && next.status != card.status;
    let publish = if became_terminal {
        Publish::AfterRender
    } else if changed {
        Publish::Now
    } else {
        Publish::None
    };
    Merged {
        card: next,
        changed,
        became_terminal,
        publish,
    }
}

/// The pending rule: without a ToolMessage a card is in progress while its turn loads and
/// failed once the turn has ended; a ToolMessage always decides.
pub fn display_status(card: &Card, turn_loading: bool) -> CardStatus {
    match (card.tool_message, turn_loading) {
        (true, _) => card.status,
        (false, true) => CardStatus::InProgress,
        (false, false) => CardStatus::Failed,
    }
}

/// The steps a card lists: tool steps and AI steps with text, by `message_index`; a
/// completed card drops a trailing AI step without tool calls, which is its result.
pub fn display_steps(steps: &[Step], status: CardStatus) -> Vec<Step> {
    let mut visible: Vec<Step> = steps
        .iter()
        .filter(|step| step.kind == StepKind::Tool || !js_trim(&step.text).is_empty())
        .cloned()
        .collect();
    visible.sort_by_key(|step| step.message_index);
    if status == CardStatus::Completed
        && visible
            .last()
            .is_some_and(|last| last.kind == StepKind::Ai && last.tool_calls.is_empty())
    {
        visible.pop();
    }
    visible
}

/// A token count: grouped digits below 10,000, else thousands with one decimal and `K`,
/// rounded as JavaScript's `toFixed(1)` rounds.
pub fn format_token_count(count: u64) -> String {
    if count < 10_000 {
        let digits = count.to_string();
        let mut grouped = String::with_capacity(digits.len() + 1);
        for (position, digit) in digits.chars().enumerate() {
            if position > 0 && (digits.len() - position).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(digit);
        }
        return grouped;
    }
    // toFixed rounds the exact binary value to nearest with ties away from zero; Rust's
    // formatting breaks exact ties to even. count/1000 is an exact tie only at .x50 values
    // that binary represents exactly, which for whole counts means .250 and .750.
    let thousands = count as f64 / 1000.0;
    let text = if count % 1000 == 250 || count % 1000 == 750 {
        let tenths = count / 100 + 1;
        format!("{}.{}", tenths / 10, tenths % 10)
    } else {
        format!("{thousands:.1}")
    };
    format!("{text}K")
}

/// The token label, or `None` unless `token_usage.enabled`.
pub fn token_label(
    usage: Option<&CardUsage>,
    status: CardStatus,
    token_usage_enabled: bool,
) -> Option<String> {
    if !token_usage_enabled {
        return None;
    }
    Some(match (usage, status) {
        (Some(usage), _) => format!("{} Tokens", format_token_count(usage.total_tokens)),
        (None, CardStatus::InProgress) => "Collecting tokens".to_owned(),
        (None, _) => "No usage returned".to_owned(),
    })
}

/// The model label: the configured `display_name` from `/api/models`' `models` list, else
/// the raw name.
pub fn model_label(model_name: Option<&str>, models: &Value) -> Option<String> {
    let name = model_name.filter(|name| !js_trim(name).is_empty())?;
    let display = models
        .as_array()
        .into_iter()
        .flatten()
        .find(|model| model.get("name").and_then(Value::as_str) == Some(name))
        .and_then(|model| non_blank(model.get("display_name")));
    Some(display.unwrap_or(name).to_owned())
}

/// The collapsed header: the last tool call's description while in progress, else the
/// status text.
pub fn header_text(card: &Card, status: CardStatus) -> String {
    if status == CardStatus::InProgress
        && let Some(last) = card
            .latest_message
            .as_ref()
            .and_then(|message| message.get("tool_calls"))
            .and_then(Value::as_array)
            .and_then(|calls| calls.last())
        && let Some(description) =
            non_blank(last.get("args").and_then(|args| args.get("description")))
    {
        return description.to_owned();
    }
    match status {
        CardStatus::InProgress => "Running subtask",
        CardStatus::Completed => "Subtask completed",
        CardStatus::Failed => "Subtask failed",
    }
    .to_owned()
}

/// The header of a group of cards.
pub fn group_header(count: usize) -> String {
    if count == 1 {
        "Executing subtask".to_owned()
    } else {
        format!("Executing {count} subtasks in parallel")
    }
}

/// Words for a task or run stop reason.
pub fn stop_reason_label(reason: &str) -> Option<&'static str> {
    Some(match reason {
        "token_capped" => "token budget",
        "turn_capped" => "turn budget",
        "loop_capped" => "repeated tool-call loop",
        "safety_capped" => "safety limit",
        "subagent_limit_capped" => "subagent delegation limit",
        "model_length_capped" => "model output length limit",
        "orphan_recovered" => "its process stopped",
        _ => return None,
    })
}

/// What a view of a card depends on besides the card.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ViewContext {
    /// Whether the card's turn is the one loading.
    pub turn_loading: bool,
    /// `/api/models`' `token_usage.enabled`.
    pub token_usage_enabled: bool,
    /// `/api/models`' `models`.
    pub models: Value,
}

/// Everything a card shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CardView {
    /// The task id.
    pub id: String,
    /// The status after the pending rule.
    pub status: CardStatus,
    /// The collapsed header text.
    pub header: String,
    /// The call's description.
    pub description: Option<String>,
    /// The call's subagent type.
    pub subagent_type: Option<String>,
    /// The model label.
    pub model_label: Option<String>,
    /// The token label.
    pub token_label: Option<String>,
    /// Words for the stop reason.
    pub stop_reason: Option<String>,
    /// The result, when completed.
    pub result: Option<String>,
    /// The error, when failed.
    pub error: Option<String>,
    /// The cost label: usage at the model's price, when token usage is shown.
    pub cost_label: Option<String>,
    /// The steps an expanded card lists ([`listed_steps`]).
    pub step_count: u64,
    /// The latest of them in one line.
    pub latest_step: Option<String>,
    /// The steps listed.
    pub steps: Vec<Step>,
}

/// The view of a card.
pub fn card_view(card: &Card, context: &ViewContext) -> CardView {
    let status = display_status(card, context.turn_loading);
    let listed = listed_steps(card, status);
    CardView {
        id: card.id.clone(),
        status,
        header: header_text(card, status),
        description: card.description.clone(),
        subagent_type: card.subagent_type.clone(),
        model_label: model_label(card.model_name.as_deref(), &context.models),
        token_label: token_label(card.usage.as_ref(), status, context.token_usage_enabled),
        stop_reason: card
            .stop_reason
            .and_then(|reason| stop_reason_label(reason.as_str()))
            .map(str::to_owned),
        result: card
            .result
            .clone()
            .filter(|_| status == CardStatus::Completed),
        error: card.error.clone().filter(|_| status == CardStatus::Failed),
        cost_label: context
            .token_usage_enabled
            .then(|| {
                cost_label(
                    card.usage.as_ref(),
                    card.model_name.as_deref(),
                    &context.models,
                )
            })
            .flatten(),
        step_count: listed.count,
        latest_step: step_line(listed.latest.as_ref()),
        steps: display_steps(&card.steps, status),
    }
}

/// One card update found in a thread's messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnUpdate {
    /// The task id.
    pub id: String,
    /// Human messages up to the task's call.
    pub turn: u64,
    /// The update.
    pub update: CardUpdate,
}

/// The card updates of a thread's messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageCardUpdates {
    /// Human messages in total: a card is in the current turn when its `turn` equals it.
    pub turns: u64,
    /// The updates in message order.
    pub updates: Vec<TurnUpdate>,
}

/// The card updates a thread's messages give, in order: a `task` call opens its card and a
/// later ToolMessage answering it gives its status.
pub fn message_card_updates(messages: &Value) -> MessageCardUpdates {
    let mut updates = Vec::new();
    let mut turn_of_task: BTreeMap<String, u64> = BTreeMap::new();
    let mut turn = 0;
    for message in messages.as_array().into_iter().flatten() {
        match message.get("type").and_then(Value::as_str) {
            Some("human") => turn += 1,
            Some("ai") => {
                let calls = message.get("tool_calls").and_then(Value::as_array);
                for call in calls.into_iter().flatten() {
                    let is_task = call.get("name").and_then(Value::as_str) == Some("task");
                    let Some(id) = non_blank(call.get("id")).filter(|_| is_task) else {
                        continue;
                    };
                    let turn = *turn_of_task.entry(id.to_owned()).or_insert(turn);
                    updates.push(TurnUpdate {
                        id: id.to_owned(),
                        turn,
                        update: tool_call_update(call),
                    });
                }
            }
            Some("tool") => {
                let id = message.get("tool_call_id").and_then(Value::as_str);
                if let Some((id, turn)) = id.and_then(|id| turn_of_task.get_key_value(id)) {
                    updates.push(TurnUpdate {
                        id: id.clone(),
                        turn: *turn,
                        update: read_tool_message(message),
                    });
                }
            }
            _ => {}
        }
    }
    MessageCardUpdates {
        turns: turn,
        updates,
    }
}
