//! Durable batches (docs/batches.md#routes, docs/batches.md#data-model, docs/batches.md#capability): the public projections of a batch and an
//! item, their counts and usage, and the batch half of `/api/features`.

use serde::{Deserialize, Serialize};

use super::usage::Cost;
use crate::{BatchItemStatus, BatchStatus, SubagentStopReason};

/// How many items of a batch are in each status (all seven, always).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchCounts {
    /// Waiting for promotion.
    pub pending: u64,
    /// Promoted, waiting for a claim.
    pub queued: u64,
    /// Claimed by a worker, not yet running.
    pub leased: u64,
    /// Running on a worker.
    pub running: u64,
    /// Finished with a result.
    pub succeeded: u64,
    /// Finished without one after its last attempt.
    pub failed: u64,
    /// Cancelled with the batch.
    pub cancelled: u64,
}

impl BatchCounts {
    /// The count of `status`.
    pub fn get(&self, status: BatchItemStatus) -> u64 {
        match status {
            BatchItemStatus::Pending => self.pending,
            BatchItemStatus::Queued => self.queued,
            BatchItemStatus::Leased => self.leased,
            BatchItemStatus::Running => self.running,
            BatchItemStatus::Succeeded => self.succeeded,
            BatchItemStatus::Failed => self.failed,
            BatchItemStatus::Cancelled => self.cancelled,
        }
    }

    fn slot(&mut self, status: BatchItemStatus) -> &mut u64 {
        match status {
            BatchItemStatus::Pending => &mut self.pending,
            BatchItemStatus::Queued => &mut self.queued,
            BatchItemStatus::Leased => &mut self.leased,
            BatchItemStatus::Running => &mut self.running,
            BatchItemStatus::Succeeded => &mut self.succeeded,
            BatchItemStatus::Failed => &mut self.failed,
            BatchItemStatus::Cancelled => &mut self.cancelled,
        }
    }

    /// Counts one item moving from `from` to `to`.
    pub fn shift(&mut self, from: BatchItemStatus, to: BatchItemStatus) {
        let from_slot = self.slot(from);
        *from_slot = from_slot.saturating_sub(1);
        *self.slot(to) += 1;
    }

    /// Moves `n` items from `from` to `to`.
    pub fn shift_many(&mut self, from: BatchItemStatus, to: BatchItemStatus, n: u64) {
        let from_slot = self.slot(from);
        *from_slot = from_slot.saturating_sub(n);
        *self.slot(to) += n;
    }

    /// Adds `n` items of `status`.
    pub fn add(&mut self, status: BatchItemStatus, n: u64) {
        *self.slot(status) += n;
    }

    /// The counts of a list of statuses.
    pub fn of(statuses: impl IntoIterator<Item = BatchItemStatus>) -> Self {
        let mut counts = BatchCounts::default();
        for status in statuses {
            counts.add(status, 1);
        }
        counts
    }

    /// Items in a status a worker holds or is about to take: queued, leased, running.
    pub fn active(&self) -> u64 {
        self.queued + self.leased + self.running
    }

    /// Items under a lease: leased and running.
    pub fn leased_or_running(&self) -> u64 {
        self.leased + self.running
    }

    /// Items that are not yet terminal.
    pub fn unfinished(&self) -> u64 {
        self.pending + self.active()
    }

    /// Every item.
    pub fn total(&self) -> u64 {
        self.unfinished() + self.succeeded + self.failed + self.cancelled
    }

    /// `(status, count)` for all seven statuses, in lifecycle order.
    pub fn iter(&self) -> impl Iterator<Item = (BatchItemStatus, u64)> + '_ {
        BatchItemStatus::ALL
            .iter()
            .map(|status| (*status, self.get(*status)))
    }
}

/// Summed token usage of an item's attempt (docs/batches.md#data-model `token_usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ItemUsage {
    /// Input tokens, cache reads and writes included.
    pub input_tokens: i64,
    /// Output tokens.
    pub output_tokens: i64,
    /// Total tokens.
    pub total_tokens: i64,
    /// Input read from the provider's cache; present only when > 0.
    #[serde(default, skip_serializing_if = "is_none")]
    pub cache_read_tokens: i64,
    /// Input written to the provider's cache; present only when > 0.
    #[serde(default, skip_serializing_if = "is_none")]
    pub cache_write_tokens: i64,
}

fn is_none(count: &i64) -> bool {
    *count <= 0
}

impl ItemUsage {
    /// The counts [`crate::cost::cost`] prices.
    pub fn tokens(&self) -> crate::cost::Tokens {
        crate::cost::Tokens::of_signed(
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens,
            self.cache_write_tokens,
        )
    }
}

/// A batch's public fields (docs/batches.md#data-model), then the additive progress and spend fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Batch {
    /// `subagent-batch-` + 32 hex digits.
    #[cfg_attr(feature = "openapi", schema(pattern = "^subagent-batch-[0-9a-f]{32}$"))]
    pub id: String,
    /// The thread the lead ran in.
    pub thread_id: String,
    /// At most 256 characters.
    #[cfg_attr(feature = "openapi", schema(max_length = 256))]
    pub title: String,
    /// The subagent definition every item runs.
    pub subagent_type: String,
    /// Lifecycle status.
    pub status: BatchStatus,
    /// Items in the batch.
    pub total_items: u64,
    /// Items promoted at once.
    pub max_live_items: u32,
    /// Items running at once.
    pub max_running_items: u32,
    /// Attempts per item.
    pub max_attempts: u32,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    /// RFC 3339, once terminal.
    pub completed_at: Option<String>,
    /// Items by status, all seven.
    pub counts: BatchCounts,
    /// The items' usage, summed (additive).
    pub usage: ItemUsage,
    /// The items priced at their models, or null when nothing is priced or currencies
    /// mix (additive).
    pub cost: Option<Cost>,
    /// Items finished per minute over the last five minutes, 2 decimals (additive).
    pub items_per_minute: f64,
    /// Seconds until the unfinished items are done at that rate; null while the batch
    /// is paused or ended, or nothing finished recently (additive).
    pub eta_seconds: Option<u64>,
    /// The whole batch's expected cost in `cost.currency`, or null (additive).
    pub projected_cost: Option<f64>,
    /// Why a paused batch is paused: `budget` when its `batch_max_cost` was reached,
    /// null otherwise (additive).
    pub pause_reason: Option<String>,
    /// `budgets.batch_max_cost` and the batch's spend against it (additive); null without one.
    pub budget: Option<super::usage::BudgetSpend>,
}

/// An item's public fields (docs/batches.md#data-model): never its prompt, lease or result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchItem {
    /// `batch-item-` + 32 hex digits.
    #[cfg_attr(feature = "openapi", schema(pattern = "^batch-item-[0-9a-f]{32}$"))]
    pub id: String,
    /// Its batch.
    pub batch_id: String,
    /// The submitter's key, unique in the batch.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 128))]
    pub item_key: String,
    /// 0-based order.
    pub position: u32,
    /// Lifecycle status.
    pub status: BatchItemStatus,
    /// Attempts started since the item was submitted or last retried.
    pub attempt: u32,
    /// Manual retries of the item (additive): with `attempt`, how often it ran.
    #[serde(default)]
    pub retries: u32,
    /// The model of the last attempt.
    pub model_name: Option<String>,
    /// The first characters of the result.
    pub result_preview: Option<String>,
    /// Whether the preview is shorter than the result.
    pub result_truncated: bool,
    /// The last failure.
    pub error: Option<String>,
    /// Why a guard ended the last attempt.
    pub stop_reason: Option<SubagentStopReason>,
    /// Summed usage of the last attempt.
    pub token_usage: Option<ItemUsage>,
    /// Advisory criteria the submitter gave.
    pub acceptance_criteria: Vec<String>,
    /// Advisory; null in this version.
    pub acceptance_verdict: Option<String>,
    /// RFC 3339.
    pub started_at: Option<String>,
    /// RFC 3339.
    pub completed_at: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// One line of `results.jsonl`: the public item and its result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchExportLine {
    /// The public fields.
    #[serde(flatten)]
    pub item: BatchItem,
    /// The whole result of a succeeded item.
    pub result: Option<String>,
}

/// `subagent_batches` of `/api/features`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchFeatures {
    /// An alias of `worker_running`.
    pub enabled: bool,
    /// Always true: batches are stored in the configured database.
    pub repository_available: bool,
    /// This process runs a worker, or (PostgreSQL) a worker heartbeat is younger than
    /// `subagent_batches.lease_seconds`.
    pub worker_running: bool,
    /// `subagent_runtime.max_running` while a worker runs, else 0.
    pub max_running: u32,
}

/// `POST /api/threads/{thread_id}/subagent-batches`: a batch submitted without a lead,
/// with the `batch_task` tool's arguments and an idempotency key; unknown fields are 422.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BatchSubmission {
    /// A second submission with the same key returns the first batch (1-512 characters).
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 512))]
    pub submission_key: String,
    /// A title shown with the batch (at most 256 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 256))]
    pub title: Option<String>,
    /// The items, each with a key unique in the batch (at most
    /// `subagent_batches.max_items_per_batch`).
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 100_000))]
    pub items: Vec<BatchSubmissionItem>,
    /// The subagent type every item runs as: one of the configured definitions.
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub subagent_type: String,
    /// Items claimed at once; absent or 0 is the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_live_items: Option<i64>,
    /// Items running at once; absent or 0 is the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running_items: Option<i64>,
    /// Submit even when the projected cost exceeds `budgets.batch_max_cost`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_over_budget: Option<bool>,
}

/// One item of a [`BatchSubmission`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BatchSubmissionItem {
    /// Unique in the batch (1-128 characters).
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 128))]
    pub key: String,
    /// What the subagent is asked (1-100,000 characters).
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 100_000))]
    pub prompt: String,
    /// At most 20, each at most 500 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_items = 20))]
    pub acceptance_criteria: Option<Vec<String>>,
}
