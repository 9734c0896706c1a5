//! The terminal `task` ToolMessage (docs/events.md#tool-result-contract): the producer that stamps the status
//! contract into `additional_kwargs` with its display text body, and the reader that
//! maps such a message to a task card status (docs/events.md#reading-the-contract, docs/workspace.md#task-card).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::messages::{ToolMessage, ToolStatus};
use crate::status::{SubagentStatus, SubagentStopReason};
use crate::text::flatten_content;
use crate::text::{cap_chars, js_trim};

/// Cap, in characters, on `subagent_error`, `subagent_result_brief` and the `{r}`/`{d}` of text bodies.
/// The text of a cancelled task's ToolMessage, and its error when nothing else is said.
pub const TASK_CANCELLED: &str = "Task cancelled by user.";

pub const TASK_TEXT_CAP: usize = 2000;

/// Cap, in characters, on the detail of an unexpected tool failure (docs/events.md#text-body).
pub const EXCEPTION_DETAIL_CAP: usize = 500;

/// The `name` of the delegation tool and of its ToolMessages.
pub const TASK_TOOL_NAME: &str = "task";

/// The pre-v2 status that readers still accept (docs/events.md#reading-the-contract).
pub const LEGACY_MAX_TURNS_REACHED: &str = "max_turns_reached";

/// The separator between the head and the tail of a bounded text.
const ELISION: &str = "\n...\n";

/// Strips `text` and bounds it to `cap` characters, keeping its head and tail (docs/events.md#bounding).
pub fn bound_text(text: &str, cap: usize) -> String {
    let text = text.trim();
    let count = text.chars().count();
    if count <= cap {
        return text.to_owned();
    }
    let head = 2 * cap / 3;
    let separator = ELISION.chars().count();
    // A cap too small to hold both ends around the separator degrades to a prefix.
    let tail = match cap.checked_sub(head + separator) {
        Some(tail) if cap > separator && tail > 0 => tail,
        _ => return cap_chars(text, cap).0.to_owned(),
    };
    let (head_text, _) = cap_chars(text, head);
    let tail_start = text
        .char_indices()
        .nth(count - tail)
        .map_or(text.len(), |(index, _)| index);
    format!("{head_text}{ELISION}{}", &text[tail_start..])
}

/// Cumulative token usage of a subagent: `{input_tokens, output_tokens, total_tokens}`,
/// plus `cache_read_tokens` and `cache_write_tokens` when > 0 (additive: they split the
/// input so it is priced exactly, docs/usage-and-cost.md#cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = TaskUsage))]
pub struct TokenUsage {
    /// Input tokens, cached ones included.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Total tokens.
    pub total_tokens: u64,
    /// Input tokens read from the provider's cache; present only when > 0.
    #[serde(default, skip_serializing_if = "crate::api::numbers::is_zero")]
    pub cache_read_tokens: u64,
    /// Input tokens written to the provider's cache; present only when > 0.
    #[serde(default, skip_serializing_if = "crate::api::numbers::is_zero")]
    pub cache_write_tokens: u64,
}

impl TokenUsage {
    /// The three counts, without a cache split.
    pub fn new(input_tokens: u64, output_tokens: u64, total_tokens: u64) -> TokenUsage {
        TokenUsage {
            input_tokens,
            output_tokens,
            total_tokens,
            ..TokenUsage::default()
        }
    }

    /// Reads a usage object whose three counts are all finite, non-negative integers; a
    /// cache count that is absent or not one reads as 0.
    pub fn from_value(value: &Value) -> Option<TokenUsage> {
        let count = |key| value.get(key).and_then(non_negative_integer);
        Some(TokenUsage {
            input_tokens: count("input_tokens")?,
            output_tokens: count("output_tokens")?,
            total_tokens: count("total_tokens")?,
            cache_read_tokens: count("cache_read_tokens").unwrap_or(0),
            cache_write_tokens: count("cache_write_tokens").unwrap_or(0),
        })
    }

    /// The counts [`crate::cost::cost`] prices.
    pub fn tokens(&self) -> crate::cost::Tokens {
        crate::cost::Tokens {
            input: self.input_tokens,
            output: self.output_tokens,
            cache_read: self.cache_read_tokens,
            cache_write: self.cache_write_tokens,
        }
    }
}

/// A JSON number that is a whole, non-negative count; `3.0` counts, as it does in JavaScript.
pub(crate) fn non_negative_integer(value: &Value) -> Option<u64> {
    if let Some(count) = value.as_u64() {
        return Some(count);
    }
    let float = value.as_f64()?;
    // Larger floats cannot be exact counts; the bound also keeps the cast lossless in range.
    let exact = float.is_finite() && float >= 0.0 && float.fract() == 0.0 && float < 2f64.powi(64);
    exact.then_some(float as u64)
}

/// What a finished task produced: the inputs of its terminal ToolMessage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskOutcome {
    /// The terminal status.
    pub status: SubagentStatus,
    /// The guard cap that ended the run; stamped only on completed and failed runs.
    pub stop_reason: Option<SubagentStopReason>,
    /// Whether the cap was a money budget's (`budget_kind: "cost"` beside `token_capped`).
    pub cost_capped: bool,
    /// The full, untrimmed result text; used only when completed.
    pub result: Option<String>,
    /// The error text; used only when not completed.
    pub error: Option<String>,
    /// The effective model, unknown on the unknown-type and disappeared paths.
    pub model_name: Option<String>,
    /// The cumulative usage, `None` when no usage record exists.
    pub usage: Option<TokenUsage>,
}

impl TaskOutcome {
    /// An outcome with the given status and nothing else known.
    pub fn new(status: SubagentStatus) -> Self {
        TaskOutcome {
            status,
            stop_reason: None,
            cost_capped: false,
            result: None,
            error: None,
            model_name: None,
            usage: None,
        }
    }

    /// A completed outcome with its full result.
    pub fn completed(result: impl Into<String>) -> Self {
        TaskOutcome {
            result: Some(result.into()),
            ..TaskOutcome::new(SubagentStatus::Completed)
        }
    }

    /// A failed outcome with its error, e.g. [`unknown_subagent_type_error`].
    pub fn failed(error: impl Into<String>) -> Self {
        TaskOutcome {
            error: Some(error.into()),
            ..TaskOutcome::new(SubagentStatus::Failed)
        }
    }
}

/// Builds the terminal `task` ToolMessage of docs/events.md#tool-result-contract, docs/events.md#text-body.
///
/// The body's `{r}` is the bounded result brief and its `{d}` the bounded error, the
/// same strings as `subagent_result_brief` and `subagent_error`, so a body never exceeds
/// the cap by more than its fixed wording however long the subagent's output was. The
/// full result reaches the lead only through the `task_completed` event and the sha256.
pub fn task_tool_message(tool_call_id: &str, outcome: &TaskOutcome) -> ToolMessage {
    let status = outcome.status;
    // A cancel or a timeout ends a run before any cap can, so only these two carry one.
    let stop_reason = outcome
        .stop_reason
        .filter(|_| matches!(status, SubagentStatus::Completed | SubagentStatus::Failed));
    let result = bounded_non_blank(outcome.result.as_deref());
    let detail = bounded_non_blank(outcome.error.as_deref());

    let mut kwargs = Map::new();
    kwargs.insert("subagent_status".into(), json!(status.as_str()));
    if let Some(reason) = stop_reason {
        kwargs.insert("subagent_stop_reason".into(), json!(reason.as_str()));
        if outcome.cost_capped && reason == SubagentStopReason::TokenCapped {
            kwargs.insert("budget_kind".into(), json!("cost"));
        }
    }

    let (content, error) = match status {
        SubagentStatus::Completed => {
            let r = result.as_deref().unwrap_or("");
            let content = match stop_reason {
                Some(reason) => format!("Task Succeeded (capped: {}). Result: {r}", reason.label()),
                None => format!("Task Succeeded. Result: {r}"),
            };
            (content, None)
        }
        SubagentStatus::Failed => {
            let lead = match stop_reason {
                Some(reason) => format!("Task failed (capped: {}).", reason.label()),
                None => "Task failed.".to_owned(),
            };
            with_error(lead, detail, "Task failed.")
        }
        SubagentStatus::Cancelled => {
            // The default would repeat the lead sentence, so it is shown once.
            match detail {
                Some(d) if d != TASK_CANCELLED => (format!("{TASK_CANCELLED} Error: {d}"), Some(d)),
                _ => (TASK_CANCELLED.to_owned(), Some(TASK_CANCELLED.to_owned())),
            }
        }
        SubagentStatus::TimedOut => {
            with_error("Task timed out.".to_owned(), detail, "Task timed out.")
        }
        // The text body table (docs/events.md#text-body) gives the default to the body only: `subagent_error` is `d`.
        SubagentStatus::PollingTimedOut => match detail {
            Some(d) => (d.clone(), Some(d)),
            None => ("Task polling timed out.".to_owned(), None),
        },
    };

    if let Some(error) = error {
        kwargs.insert("subagent_error".into(), json!(error));
    }
    if status == SubagentStatus::Completed
        && let Some(brief) = result
        && let Some(full) = outcome.result.as_deref()
    {
        kwargs.insert("subagent_result_brief".into(), json!(brief));
        kwargs.insert("subagent_result_sha256".into(), json!(sha256_hex(full)));
    }
    if let Some(model) = outcome.model_name.as_deref().map(str::trim)
        && !model.is_empty()
    {
        kwargs.insert("subagent_model_name".into(), json!(model));
    }
    if let Some(usage) = outcome.usage {
        kwargs.insert("subagent_token_usage".into(), json!(usage));
    }

    task_message(tool_call_id, content, kwargs, ToolStatus::Success)
}

/// `{lead}` or `{lead} Error: {d}`, with `subagent_error` set to `d` or `default`.
fn with_error(lead: String, detail: Option<String>, default: &str) -> (String, Option<String>) {
    match detail {
        Some(d) => (format!("{lead} Error: {d}"), Some(d)),
        None => (lead, Some(default.to_owned())),
    }
}

/// Builds the ToolMessage for a `task` tool that failed unexpectedly (docs/events.md#text-body).
///
/// The detail is stripped and cut to its first 500 characters in both the key and the
/// body. A blank kind reads `Error`; a blank detail leaves just the kind, so the text
/// never ends in a dangling `": "`.
pub fn task_tool_exception(tool_call_id: &str, error_kind: &str, detail: &str) -> ToolMessage {
    let kind = match error_kind.trim() {
        "" => "Error",
        kind => kind,
    };
    let (detail, _) = cap_chars(detail.trim(), EXCEPTION_DETAIL_CAP);
    let error = if detail.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}: {detail}")
    };
    // A pathological kind must still not break the ≤ 2,000 character contract of the key.
    let error = bound_text(&error, TASK_TEXT_CAP);
    let content = format!(
        "Task failed. Error: {error}. Continue with available context, or choose an alternative tool."
    );
    let mut kwargs = Map::new();
    kwargs.insert(
        "subagent_status".into(),
        json!(SubagentStatus::Failed.as_str()),
    );
    kwargs.insert("subagent_error".into(), json!(error));
    task_message(tool_call_id, content, kwargs, ToolStatus::Error)
}

/// The error of a `task` call naming an unknown or disabled subagent type (docs/events.md#the-task-tool).
pub fn unknown_subagent_type_error(requested: &str, available: &[&str]) -> String {
    format!(
        "Unknown subagent type '{requested}'. Available: {}",
        available.join(", ")
    )
}

fn task_message(
    tool_call_id: &str,
    content: String,
    additional_kwargs: Map<String, Value>,
    status: ToolStatus,
) -> ToolMessage {
    ToolMessage {
        content: Value::String(content),
        name: Some(TASK_TOOL_NAME.to_owned()),
        additional_kwargs,
        tool_call_id: tool_call_id.to_owned(),
        status,
        ..ToolMessage::default()
    }
}

/// The bounded text, or `None` when it is absent or blank.
fn bounded_non_blank(text: Option<&str>) -> Option<String> {
    text.map(|text| bound_text(text, TASK_TEXT_CAP))
        .filter(|text| !text.is_empty())
}

/// Lowercase hex SHA-256 of the UTF-8 bytes of `text`.
pub fn sha256_hex(text: &str) -> String {
    use std::fmt::Write as _;
    Sha256::digest(text.as_bytes())
        .iter()
        .fold(String::with_capacity(64), |mut hex, byte| {
            // Writing to a String cannot fail.
            let _ = write!(hex, "{byte:02x}");
            hex
        })
}

/// How a task card shows a task (docs/workspace.md#task-card).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CardState {
    /// No decisive ToolMessage yet.
    InProgress,
    /// The task completed, capped or not.
    Completed,
    /// The task failed, was cancelled or timed out.
    Failed,
}

/// A `subagent_status` a reader accepts: a contract value or the legacy `max_turns_reached`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireStatus {
    /// One of the contract's `valid_status_values`.
    Known(SubagentStatus),
    /// The pre-v2 turn-cap status.
    MaxTurnsReached,
}

impl WireStatus {
    /// Parses a wire string; unknown values are `None` (docs/events.md#reading-the-contract).
    pub fn parse(text: &str) -> Option<WireStatus> {
        if text == LEGACY_MAX_TURNS_REACHED {
            return Some(WireStatus::MaxTurnsReached);
        }
        text.parse().ok().map(WireStatus::Known)
    }

    /// The wire string.
    pub const fn as_str(self) -> &'static str {
        match self {
            WireStatus::Known(status) => status.as_str(),
            WireStatus::MaxTurnsReached => LEGACY_MAX_TURNS_REACHED,
        }
    }
}

/// What a `task` ToolMessage says about its task, normalised for the card (docs/events.md#reading-the-contract, docs/workspace.md#task-card).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskCardStatus {
    /// Completed, failed or still in progress.
    pub state: CardState,
    /// The accepted `subagent_status`; `None` for legacy text and unknown values.
    pub status: Option<WireStatus>,
    /// A known stop reason; legacy `max_turns_reached` implies `turn_capped`.
    pub stop_reason: Option<SubagentStopReason>,
    /// The trimmed brief, only when completed.
    pub result: Option<String>,
    /// The error, only when failed.
    pub error: Option<String>,
    /// A well-formed `subagent_result_sha256`, only alongside the result.
    pub result_sha256: Option<String>,
    /// The trimmed, non-blank model name.
    pub model_name: Option<String>,
    /// The usage, only when all three counts are valid.
    pub usage: Option<TokenUsage>,
}

impl TaskCardStatus {
    fn bare(state: CardState) -> Self {
        TaskCardStatus {
            state,
            status: None,
            stop_reason: None,
            result: None,
            error: None,
            result_sha256: None,
            model_name: None,
            usage: None,
        }
    }
}

/// Reads a `task` ToolMessage's kwargs and flattened text as the card shows them (docs/workspace.md#task-card).
///
/// Any `subagent_*` key makes the message structured: its status decides, and a
/// structured message without a valid status is in progress with nothing else read.
/// Only a message with no such key is classified by the legacy text prefixes, matched
/// after stripping the text. Blankness and trimming follow JavaScript's `trim`, so the
/// web UI reads every message the same way.
pub fn read_task_status(
    additional_kwargs: &Map<String, Value>,
    content_text: &str,
) -> TaskCardStatus {
    let structured = additional_kwargs
        .keys()
        .any(|key| key.starts_with("subagent_"));
    if !structured {
        return read_legacy_text(content_text);
    }
    let Some(status) = additional_kwargs
        .get("subagent_status")
        .and_then(Value::as_str)
        .and_then(WireStatus::parse)
    else {
        return TaskCardStatus::bare(CardState::InProgress);
    };
    let text = |key: &str| {
        additional_kwargs
            .get(key)
            .and_then(Value::as_str)
            .filter(|text| !js_trim(text).is_empty())
    };

    let brief = text("subagent_result_brief").map(|brief| js_trim(brief).to_owned());
    let mut stop_reason = text("subagent_stop_reason").and_then(|reason| reason.parse().ok());
    let state = match status {
        WireStatus::Known(SubagentStatus::Completed) => CardState::Completed,
        WireStatus::Known(_) => CardState::Failed,
        WireStatus::MaxTurnsReached => {
            stop_reason = stop_reason.or(Some(SubagentStopReason::TurnCapped));
            if brief.is_some() {
                CardState::Completed
            } else {
                CardState::Failed
            }
        }
    };
    let completed = state == CardState::Completed;
    let result = brief.filter(|_| completed);
    let result_sha256 = text("subagent_result_sha256")
        .filter(|hash| result.is_some() && is_sha256_hex(hash))
        .map(str::to_owned);

    TaskCardStatus {
        state,
        status: Some(status),
        stop_reason,
        error: text("subagent_error")
            .filter(|_| !completed)
            .map(str::to_owned),
        result,
        result_sha256,
        model_name: text("subagent_model_name").map(|name| js_trim(name).to_owned()),
        usage: additional_kwargs
            .get("subagent_token_usage")
            .and_then(TokenUsage::from_value),
    }
}

/// [`read_task_status`] of a ToolMessage, its content flattened to text.
pub fn read_task_tool_message(message: &ToolMessage) -> TaskCardStatus {
    read_task_status(
        &message.additional_kwargs,
        &flatten_content(Some(&message.content)),
    )
}

/// Classifies a message without structured keys by its text prefix, in docs/workspace.md#task-card order.
fn read_legacy_text(content_text: &str) -> TaskCardStatus {
    let text = js_trim(content_text);
    let non_blank = |rest: &str| Some(js_trim(rest).to_owned()).filter(|rest| !rest.is_empty());
    let (state, result, error) = if let Some(rest) = text.strip_prefix("Task Succeeded. Result:") {
        (CardState::Completed, non_blank(rest), None)
    } else if let Some(rest) = text.strip_prefix("Task failed.") {
        (CardState::Failed, None, non_blank(rest))
    } else if [
        "Task timed out",
        "Task cancelled by user.",
        "Task polling timed out",
    ]
    .iter()
    .any(|prefix| text.starts_with(prefix))
        || starts_with_error_word(text)
    {
        (CardState::Failed, None, Some(text.to_owned()))
    } else {
        (CardState::InProgress, None, None)
    };
    TaskCardStatus {
        result,
        error,
        ..TaskCardStatus::bare(state)
    }
}

/// `/^Error\b/i` with JavaScript's ASCII word characters.
fn starts_with_error_word(text: &str) -> bool {
    let Some(head) = text.get(..5) else {
        return false;
    };
    head.eq_ignore_ascii_case("error")
        && !text[5..]
            .chars()
            .next()
            .is_some_and(|next| next.is_ascii_alphanumeric() || next == '_')
}

fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bound_text_keeps_head_and_tail_around_the_elision() {
        let cases: &[(&str, usize, &str)] = &[
            ("  fits  ", 10, "fits"),
            ("abcdefghijklmnopqrst", 16, "abcdefghij\n...\nt"),
            ("abcdefghijklmnopqrst", 19, "abcdefghijkl\n...\nst"),
            // Degenerate caps: c ≤ 5, or a tail of zero or less.
            ("abcdefgh", 5, "abcde"),
            ("abcdefgh", 0, ""),
            ("abcdefghijklmnopqrst", 15, "abcdefghijklmno"),
            ("abcdefghijklmnopqrst", 8, "abcdefgh"),
            ("ééééééééééééééééé🚀🚀🚀", 16, "éééééééééé\n...\n🚀"),
        ];
        for (text, cap, expected) in cases {
            assert_eq!(bound_text(text, *cap), *expected, "{text:?} at {cap}");
        }
        let long = format!("{}{}", "a".repeat(2500), "b".repeat(2500));
        let bounded = bound_text(&long, TASK_TEXT_CAP);
        assert_eq!(
            bounded,
            format!("{}\n...\n{}", "a".repeat(1333), "b".repeat(662))
        );
    }

    #[test]
    fn error_word_matches_like_the_javascript_regex() {
        for (text, matches) in [
            ("Error", true),
            ("error: boom", true),
            ("ERROR!", true),
            ("Errors happened", false),
            ("Error_x", false),
            ("Error1", false),
            ("Erroré", true),
            ("Err", false),
            ("é", false),
            (" Error", false),
        ] {
            assert_eq!(starts_with_error_word(text), matches, "{text:?}");
        }
    }

    #[test]
    fn the_digest_is_lowercase_hex() {
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(is_sha256_hex(&sha256_hex("")));
        assert!(!is_sha256_hex(&sha256_hex("").to_uppercase()));
    }

    proptest! {
        #[test]
        fn a_bounded_text_never_exceeds_its_cap(text in "\\PC{0,80}", cap in 0usize..60) {
            let bounded = bound_text(&text, cap);
            prop_assert!(bounded.chars().count() <= cap);
            let stripped = text.trim();
            if stripped.chars().count() <= cap {
                prop_assert_eq!(bounded.as_str(), stripped);
            } else {
                prop_assert_eq!(bounded.chars().count(), cap);
                let head: String = stripped.chars().take(2 * cap / 3).collect();
                prop_assert!(bounded.starts_with(&head));
            }
        }
    }
}
