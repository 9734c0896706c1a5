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
    /// Input tokens written to the cache, present only when > 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<i64>,
}

impl ModelUsage {
    /// The counts [`crate::cost::cost`] prices.
    pub fn tokens(&self) -> crate::cost::Tokens {
        crate::cost::Tokens::of_signed(
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens.unwrap_or(0),
            self.cache_write_tokens.unwrap_or(0),
        )
    }
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
    /// The money budgets over this thread (`thread`, `user_daily`) and what was spent
    /// against each (additive); empty when none is set.
    #[serde(default)]
    pub budgets: Vec<BudgetSpend>,
}

/// One money budget and its spend so far (docs/usage-and-cost.md#budgets).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BudgetSpend {
    /// `run`, `thread`, `user_daily` or `batch`.
    pub scope: String,
    /// The limit, in `currency`.
    pub limit: f64,
    /// Spent so far, rounded to 6 places.
    pub spent: f64,
    /// The pricing currency.
    pub currency: String,
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

/// `group_by` of `GET /api/usage` (docs/usage-and-cost.md#usage-across-threads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum UsageGrouping {
    /// The UTC day a run or batch was created, `YYYY-MM-DD`.
    #[default]
    Day,
    /// The model a bucket or batch item ran on.
    Model,
    /// `lead_agent`, `subagent`, `middleware`, or `batch` for batch items.
    Caller,
    /// The thread.
    Thread,
    /// The owner.
    User,
}

/// Runs' usage within one section of `GET /api/usage`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunsUsage {
    /// Runs with a share in it.
    pub runs: u64,
    /// Total tokens.
    pub total_tokens: i64,
    /// Input tokens; null in a caller group (a run keeps only its callers' totals).
    pub total_input_tokens: Option<i64>,
    /// Output tokens; null in a caller group.
    pub total_output_tokens: Option<i64>,
    /// What they cost; null when nothing is priced, currencies mix, or in a caller group.
    pub cost: Option<Cost>,
}

/// One group of `GET /api/usage`: counted runs, stopped runs and batch items apart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageGroup {
    /// The day, model, caller, thread id or user id.
    pub key: String,
    /// Runs that ended `success` or `error`.
    pub counted: RunsUsage,
    /// Runs that ended `interrupted` or `timeout`.
    pub stopped_runs: RunsUsage,
    /// Batch items that reported usage.
    pub batches: BatchSpend,
}

/// `GET /api/usage`: usage and cost across threads, grouped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageReport {
    /// Start of the window (inclusive), RFC 3339.
    pub from: String,
    /// End of the window (exclusive), RFC 3339.
    pub to: String,
    /// How the groups are keyed.
    pub group_by: UsageGrouping,
    /// The one user reported, or null for every user an admin may see.
    pub user_id: Option<String>,
    /// At most 1,000 groups: days in order, else the most expensive first.
    pub groups: Vec<UsageGroup>,
    /// Whether groups beyond the 1,000th were left out (the sections below still count them).
    pub truncated: bool,
    /// Every counted run of the window.
    pub counted: RunsUsage,
    /// Every stopped run of the window.
    pub stopped_runs: RunsUsage,
    /// Every batch of the window.
    pub batches: BatchSpend,
    /// The `user_daily` budget and today's spend against it (additive) of the reported
    /// user, else of the caller; empty without one.
    #[serde(default)]
    pub budgets: Vec<BudgetSpend>,
}
