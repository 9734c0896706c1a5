//! Token usage (docs/usage-and-cost.md): a run's per-model buckets and the `/token-usage` body.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Token usage of one model within a run (docs/usage-and-cost.md#run-buckets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelUsage {
    /// Input tokens, cached ones included.
    pub input_tokens: i64,
    /// Output tokens.
    pub output_tokens: i64,
    /// Total tokens.
    pub total_tokens: i64,
    /// Cached input tokens, present only when > 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_tokens: Option<i64>,
}

/// `GET …/token-usage`: the thread's counted runs summed, priced, and its context usage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenUsage {
    /// Thread id.
    pub thread_id: String,
    /// Sum of total tokens.
    pub total_tokens: i64,
    /// Sum of input tokens.
    pub total_input_tokens: i64,
    /// Sum of output tokens.
    pub total_output_tokens: i64,
    /// Runs counted.
    pub total_runs: u64,
    /// Tokens and runs by model.
    pub by_model: BTreeMap<String, ModelTotals>,
    /// Tokens by caller bucket.
    pub by_caller: CallerTotals,
    /// The cost, or null when nothing is priced or currencies mix.
    pub cost: Option<Cost>,
    /// Runs that ended interrupted or timeout: never counted above, but their tokens
    /// were spent.
    pub stopped_runs: StoppedRuns,
    /// The latest state's size against the model's window; null when it cannot be read.
    pub context_usage: Option<ContextUsage>,
    /// The thread's batch items (additive): never counted above (docs/batches.md#observability), summed
    /// beside.
    pub batches: BatchSpend,
}

/// The batch items' share of [`TokenUsage`], kept out of every run total.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchSpend {
    /// Items that reported usage.
    pub items: u64,
    /// Sum of their total tokens.
    pub total_tokens: i64,
    /// Their cost at each item's model, or null when nothing is priced or currencies mix.
    pub cost: Option<Cost>,
}

/// The stopped runs' share of [`TokenUsage`], summed beside the counted totals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoppedRuns {
    /// Runs that ended `interrupted` or `timeout`.
    pub runs: u64,
    /// Sum of total tokens.
    pub total_tokens: i64,
    /// Sum of input tokens.
    pub total_input_tokens: i64,
    /// Sum of output tokens.
    pub total_output_tokens: i64,
    /// Tokens by caller bucket.
    pub by_caller: CallerTotals,
    /// Their cost, or null when nothing is priced or currencies mix.
    pub cost: Option<Cost>,
}

/// A model's share of [`TokenUsage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelTotals {
    /// Total tokens.
    pub tokens: i64,
    /// Runs that used the model.
    pub runs: u64,
}

/// The caller buckets of [`TokenUsage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CallerTotals {
    /// `lead_agent`.
    pub lead_agent: i64,
    /// `subagent:*`.
    pub subagent: i64,
    /// `middleware:*`.
    pub middleware: i64,
}

/// The priced cost of counted runs, in one currency, rounded to 6 decimals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Cost {
    /// The models' currency, upper case.
    pub currency: String,
    /// The sum.
    pub total: f64,
    /// By model.
    pub by_model: BTreeMap<String, f64>,
}

/// The price of one task's usage at its model (docs/api.md#task-summaries, docs/usage-and-cost.md#cost).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskCost {
    /// The model's currency, upper case.
    pub currency: String,
    /// Rounded to 6 decimals.
    pub total: f64,
}

/// The latest state's estimated tokens against the model's context window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContextUsage {
    /// Estimated tokens of the state's messages.
    pub token_count: u64,
    /// The model's window, when configured.
    pub max_context_tokens: Option<u64>,
    /// `token_count` as a percentage of the window, one decimal.
    pub percentage: Option<f64>,
}
