//! Durable batches (docs/batches.md): the batch and item records, their state machine, and the
//! [`BatchStore`] trait that stores them for the routes, the tools and the workers.
//!
//! The transitions of docs/batches.md#batch-states and docs/batches.md#item-states are written once, here, as functions on a loaded
//! [`BatchRecord`] and [`BatchItem`] ([`machine`]). Every backend loads the rows a call
//! needs inside one transaction (batch row first, then item rows), applies these
//! functions and writes back what changed, so the backends cannot disagree on a
//! transition. A batch row carries its items' counts by status; every transition
//! updates them in the same transaction, so `counts` always equals the items' statuses.
//!
//! Worker writes are fenced: they name the item, its batch and the `lease_owner` of the
//! claim, and change nothing unless the item is still in the expected status under that
//! owner. Lease times come from the database clock (PostgreSQL's `now()`); on the
//! single-process backends the process clock is the database clock, read through a
//! [`Clock`] that tests can replace.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
pub use subflow_contracts::api::{BatchCounts, ItemUsage};
use subflow_contracts::{BatchItemStatus, BatchStatus, SubagentStopReason, ThreadId};
use uuid::Uuid;

use crate::{Error, Result};

pub mod activity;
pub mod machine;
pub mod rows;

pub use activity::{ActivityQuery, ActivityRow, BatchActivity, ModelItemUsage, fold_activity};

/// Prefix of a batch id, followed by 32 hex digits.
pub const BATCH_ID_PREFIX: &str = "subagent-batch-";
/// Prefix of an item id, followed by 32 hex digits.
pub const ITEM_ID_PREFIX: &str = "batch-item-";
/// The title of a batch submitted without one.
pub const DEFAULT_TITLE: &str = "Subagent batch";
/// Longest title.
pub const TITLE_MAX_CHARS: usize = 256;
/// Longest item key.
pub const ITEM_KEY_MAX_CHARS: usize = 128;
/// Longest item prompt.
pub const PROMPT_MAX_CHARS: usize = 100_000;
/// Most acceptance criteria per item.
pub const MAX_CRITERIA: usize = 20;
/// Longest acceptance criterion.
pub const CRITERION_MAX_CHARS: usize = 500;
/// Most items in one batch: the ceiling of `subagent_batches.max_items_per_batch`.
pub const MAX_ITEMS: usize = 100_000;
/// Most attempts per item: the ceiling of `subagent_batches.max_attempts`.
pub const MAX_ATTEMPTS: u32 = 10;
/// Longest `submission_key`.
pub const SUBMISSION_KEY_MAX_CHARS: usize = 512;
/// Longest `lease_owner` (docs/batches.md#leases-and-fencing); a longer hostname is cut to fit.
pub const LEASE_OWNER_MAX_CHARS: usize = 128;
/// Largest page of [`BatchStore::list_batches`].
pub const LIST_MAX_LIMIT: u32 = 100;
/// Largest page of [`BatchStore::list_items`].
pub const ITEMS_MAX_LIMIT: u32 = 500;
/// The page size of [`BatchStore::export_items`].
pub const EXPORT_PAGE: u32 = 500;

/// The `error` of an item cancelled with its batch, or finalised after a cancel request.
pub const CANCELLED_BY_USER: &str = "Cancelled by user";
/// The `error` of an item whose expired lease was recovered with attempts left.
pub const LEASE_EXPIRED_RETRYING: &str = "Previous worker lease expired; retrying";
/// The `error` of an item whose expired lease was recovered at `max_attempts`.
pub const LEASE_EXPIRED_FINAL: &str = "Execution lease expired after the maximum retry count";
/// The `error` of a claim released because the worker was stopping (docs/batches.md#claim-pass).
pub const STOPPED_BEFORE_ADMISSION: &str = "Worker stopped before execution admission";
/// The `error` of a claim released after draining a stale local execution (docs/batches.md#claim-pass).
pub const DRAINED_STALE_EXECUTION: &str =
    "Worker drained a stale local execution before readmission";
/// The `error` of a claim released because the attempt's outcome could not be stored
/// (docs/batches.md#running-an-item).
pub const OUTCOME_UNSTORED: &str = "Worker could not store the attempt's outcome; running it again";
/// The `error` of a claim released because the item could not be marked `running`
/// (docs/batches.md#running-an-item).
pub const START_UNSTORED: &str = "Worker could not mark the item running; running it again";

/// A new batch id: `subagent-batch-` + 32 hex digits.
pub fn new_batch_id() -> String {
    format!("{BATCH_ID_PREFIX}{}", Uuid::new_v4().simple())
}

/// A new item id: `batch-item-` + 32 hex digits.
pub fn new_item_id() -> String {
    format!("{ITEM_ID_PREFIX}{}", Uuid::new_v4().simple())
}

/// A stored batch: the public fields of docs/batches.md#data-model, then the hidden ones.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRecord {
    /// `subagent-batch-` + 32 hex.
    pub id: String,
    /// The thread the lead ran in.
    pub thread_id: String,
    /// At most 256 characters.
    pub title: String,
    /// The subagent definition every item runs.
    pub subagent_type: String,
    /// Lifecycle status.
    pub status: BatchStatus,
    /// How many items the batch has.
    pub total_items: u64,
    /// Most items queued, leased or running at once (frozen at submit).
    pub max_live_items: u32,
    /// Most items leased or running at once (frozen at submit).
    pub max_running_items: u32,
    /// Most attempts per item (frozen at submit).
    pub max_attempts: u32,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    /// RFC 3339, once the batch is terminal.
    pub completed_at: Option<String>,
    /// Items per status.
    pub counts: BatchCounts,
    /// Why a `paused` batch is paused: `budget` when its `batch_max_cost` was reached;
    /// `None` when paused by hand, and once resumed.
    pub pause_reason: Option<String>,
    /// Hidden: how many of the budget's warn fractions (then its limit) were reported.
    pub budget_level: u32,
    /// Hidden: the owning user.
    pub user_id: String,
    /// Hidden: the lead run that submitted it.
    pub run_id: Option<String>,
    /// Hidden: the `batch_task` tool call that submitted it.
    pub tool_call_id: Option<String>,
    /// Hidden: unique per user; a repeated submission returns this batch.
    pub submission_key: String,
    /// Hidden: the worker-only snapshot of identity, permissions, subagent config, model
    /// and trace id the items run with.
    pub execution_spec: Value,
}

/// A stored item: the public fields of docs/batches.md#data-model, then the hidden ones.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchItem {
    /// `batch-item-` + 32 hex.
    pub id: String,
    /// Its batch.
    pub batch_id: String,
    /// 1–128 characters, unique in the batch: the item's idempotency identity.
    pub item_key: String,
    /// 0-based, unique in the batch.
    pub position: u32,
    /// Lifecycle status.
    pub status: BatchItemStatus,
    /// Attempts used (0 before the first claim and after a retry).
    pub attempt: u32,
    /// Manual retries: a retry resets `attempt`, this keeps count that it ran before.
    pub retries: u32,
    /// The model of the last finished attempt.
    pub model_name: Option<String>,
    /// A prefix of the result.
    pub result_preview: Option<String>,
    /// Whether the stored result was cut at the cap.
    pub result_truncated: bool,
    /// Why the last attempt did not succeed, or why the item moved.
    pub error: Option<String>,
    /// Why a guard ended the last attempt.
    pub stop_reason: Option<SubagentStopReason>,
    /// Summed usage of the last finished attempt.
    pub token_usage: Option<ItemUsage>,
    /// Advisory criteria the submitter gave.
    pub acceptance_criteria: Vec<String>,
    /// Advisory; null in this version.
    pub acceptance_verdict: Option<String>,
    /// RFC 3339: when the current or last attempt started running.
    pub started_at: Option<String>,
    /// RFC 3339: when the item became terminal.
    pub completed_at: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    /// Hidden: the task the subagent gets (after the preamble).
    pub prompt: String,
    /// Hidden: `{hostname}:{worker id}:{token}` of the claim holding it.
    pub lease_owner: Option<String>,
    /// Hidden: when the lease ends, epoch milliseconds of the database clock.
    pub lease_expires_at: Option<i64>,
    /// Hidden: RFC 3339, when cancellation was requested.
    pub cancel_requested_at: Option<String>,
    /// Hidden: the result text; only [`BatchStore::export_items`] and
    /// [`BatchStore::get_item`] read it, other reads leave it `None`.
    pub result: Option<String>,
}

impl BatchItem {
    /// The result as a row keeps it: `None` when it equals the preview (a result within
    /// the preview's length), which SQL backends then read back from the preview
    /// (`COALESCE(result, result_preview)`), so a short result is stored once.
    pub fn stored_result(&self) -> Option<&str> {
        match (&self.result, &self.result_preview) {
            (Some(result), Some(preview)) if result == preview => None,
            (result, _) => result.as_deref(),
        }
    }
}

/// An item to submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewItem {
    /// 1–128 characters, unique in the batch.
    pub item_key: String,
    /// 1–100,000 characters.
    pub prompt: String,
    /// At most 20 criteria of at most 500 characters each.
    pub acceptance_criteria: Vec<String>,
}

/// A batch to submit, in status `queued` with every item `pending`. Limits are the
/// effective values (the tool resolves 0 to the configured default) and are checked
/// against the configured ceilings by the caller; the store checks what must hold for
/// every batch.
#[derive(Debug, Clone, PartialEq)]
pub struct NewBatch {
    /// A valid thread id.
    pub thread_id: String,
    /// The owning user.
    pub user_id: String,
    /// The lead run that submits it.
    pub run_id: Option<String>,
    /// The `batch_task` tool call.
    pub tool_call_id: Option<String>,
    /// `"{run_id or thread_id}:{tool_call_id}"`, 1–512 characters.
    pub submission_key: String,
    /// At most 256 characters; blank means [`DEFAULT_TITLE`].
    pub title: String,
    /// The subagent definition.
    pub subagent_type: String,
    /// ≥ 1.
    pub max_live_items: u32,
    /// 1–`max_live_items`.
    pub max_running_items: u32,
    /// 1–10.
    pub max_attempts: u32,
    /// The worker-only snapshot the items run with.
    pub execution_spec: Value,
    /// 1–100,000 items, in position order.
    pub items: Vec<NewItem>,
}

fn invalid(message: String) -> Error {
    Error::InvalidBatch(message)
}

fn chars(text: &str) -> usize {
    text.chars().count()
}

impl NewBatch {
    /// Checks everything the store requires, in a fixed order; the first problem is the
    /// error and nothing is written.
    pub fn validate(&self) -> Result<()> {
        ThreadId::parse(&self.thread_id)?;
        if self.user_id.is_empty() {
            return Err(invalid("a batch needs a user_id".to_owned()));
        }
        let key = chars(&self.submission_key);
        if !(1..=SUBMISSION_KEY_MAX_CHARS).contains(&key) {
            return Err(invalid(format!(
                "submission_key must have 1-{SUBMISSION_KEY_MAX_CHARS} characters, got {key}"
            )));
        }
        let title = chars(&self.title);
        if title > TITLE_MAX_CHARS {
            return Err(invalid(format!(
                "title must have at most {TITLE_MAX_CHARS} characters, got {title}"
            )));
        }
        if self.title.contains('\0') {
            return Err(invalid("title must not contain NUL (\\u0000)".to_owned()));
        }
        if self.subagent_type.trim().is_empty() {
            return Err(invalid("subagent_type must not be empty".to_owned()));
        }
        if !(1..=MAX_ITEMS).contains(&self.items.len()) {
            return Err(invalid(format!(
                "a batch must have 1-{MAX_ITEMS} items, got {}",
                self.items.len()
            )));
        }
        if self.max_live_items < 1 {
            return Err(invalid(
                "max_live_items must be at least 1, got 0".to_owned(),
            ));
        }
        if self.max_running_items < 1 {
            return Err(invalid(
                "max_running_items must be at least 1, got 0".to_owned(),
            ));
        }
        if self.max_running_items > self.max_live_items {
            return Err(invalid(format!(
                "max_running_items ({}) must not exceed max_live_items ({})",
                self.max_running_items, self.max_live_items
            )));
        }
        if !(1..=MAX_ATTEMPTS).contains(&self.max_attempts) {
            return Err(invalid(format!(
                "max_attempts must be 1-{MAX_ATTEMPTS}, got {}",
                self.max_attempts
            )));
        }
        let mut keys = std::collections::HashSet::with_capacity(self.items.len());
        for (position, item) in self.items.iter().enumerate() {
            item.validate(position)?;
            if !keys.insert(item.item_key.as_str()) {
                return Err(invalid(format!(
                    "item keys must be unique: '{}' repeats at position {position}",
                    item.item_key
                )));
            }
        }
        Ok(())
    }

    /// The batch and its items as a store writes them: fresh ids, `queued`, every item
    /// `pending` at attempt 0, stamped `now`. Call after [`NewBatch::validate`].
    pub fn into_records(self, now: &str) -> (BatchRecord, Vec<BatchItem>) {
        let id = new_batch_id();
        let items: Vec<BatchItem> = self
            .items
            .into_iter()
            .enumerate()
            .map(|(position, item)| BatchItem {
                id: new_item_id(),
                batch_id: id.clone(),
                item_key: item.item_key,
                position: position as u32,
                status: BatchItemStatus::Pending,
                attempt: 0,
                retries: 0,
                model_name: None,
                result_preview: None,
                result_truncated: false,
                error: None,
                stop_reason: None,
                token_usage: None,
                acceptance_criteria: item.acceptance_criteria,
                acceptance_verdict: None,
                started_at: None,
                completed_at: None,
                created_at: now.to_owned(),
                updated_at: now.to_owned(),
                prompt: item.prompt,
                lease_owner: None,
                lease_expires_at: None,
                cancel_requested_at: None,
                result: None,
            })
            .collect();
        let title = if self.title.trim().is_empty() {
            DEFAULT_TITLE.to_owned()
        } else {
            self.title
        };
        let batch = BatchRecord {
            id,
            thread_id: self.thread_id,
            title,
            subagent_type: self.subagent_type,
            status: BatchStatus::Queued,
            total_items: items.len() as u64,
            max_live_items: self.max_live_items,
            max_running_items: self.max_running_items,
            max_attempts: self.max_attempts,
            created_at: now.to_owned(),
            updated_at: now.to_owned(),
            completed_at: None,
            counts: BatchCounts {
                pending: items.len() as u64,
                ..BatchCounts::default()
            },
            pause_reason: None,
            budget_level: 0,
            user_id: self.user_id,
            run_id: self.run_id,
            tool_call_id: self.tool_call_id,
            submission_key: self.submission_key,
            execution_spec: self.execution_spec,
        };
        (batch, items)
    }
}

impl NewItem {
    /// Checks the key, prompt and criteria of the item at `position`.
    pub fn validate(&self, position: usize) -> Result<()> {
        let key = chars(&self.item_key);
        if !(1..=ITEM_KEY_MAX_CHARS).contains(&key) {
            return Err(invalid(format!(
                "item key must have 1-{ITEM_KEY_MAX_CHARS} characters, got {key} at position {position}"
            )));
        }
        let prompt = chars(&self.prompt);
        if !(1..=PROMPT_MAX_CHARS).contains(&prompt) {
            return Err(invalid(format!(
                "item prompt must have 1-{PROMPT_MAX_CHARS} characters, got {prompt} at position {position}"
            )));
        }
        // PostgreSQL's text cannot hold NUL, so no backend takes it.
        let with_nul = [("item key", &self.item_key), ("item prompt", &self.prompt)]
            .into_iter()
            .chain(
                self.acceptance_criteria
                    .iter()
                    .map(|criterion| ("an acceptance criterion", criterion)),
            )
            .find(|(_, text)| text.contains('\0'));
        if let Some((what, _)) = with_nul {
            return Err(invalid(format!(
                "{what} must not contain NUL (\\u0000) at position {position}"
            )));
        }
        if self.acceptance_criteria.len() > MAX_CRITERIA {
            return Err(invalid(format!(
                "an item may have at most {MAX_CRITERIA} acceptance criteria, got {} at position {position}",
                self.acceptance_criteria.len()
            )));
        }
        for criterion in &self.acceptance_criteria {
            let length = chars(criterion);
            if length > CRITERION_MAX_CHARS {
                return Err(invalid(format!(
                    "an acceptance criterion may have at most {CRITERION_MAX_CHARS} characters, got {length} at position {position}"
                )));
            }
        }
        Ok(())
    }
}

/// What [`BatchStore::submit_batch`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    /// The new batch, or the one already stored under the same user and `submission_key`.
    pub batch: BatchRecord,
    /// False when the submission key was already used: nothing was inserted.
    pub created: bool,
}

/// Whose batches a call may see: one user's, in one thread or in any of theirs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchScope {
    /// The caller's user id.
    pub user_id: String,
    /// Only batches of this thread; `None` for any thread (the owner-scoped tools).
    pub thread_id: Option<String>,
}

impl BatchScope {
    /// One user's batches in one thread (the routes).
    pub fn thread(user_id: impl Into<String>, thread_id: impl Into<String>) -> Self {
        BatchScope {
            user_id: user_id.into(),
            thread_id: Some(thread_id.into()),
        }
    }

    /// One user's batches in any thread (`batch_status`, `cancel_batch`).
    pub fn user(user_id: impl Into<String>) -> Self {
        BatchScope {
            user_id: user_id.into(),
            thread_id: None,
        }
    }

    /// Whether `batch` is visible in this scope.
    pub fn sees(&self, batch: &BatchRecord) -> bool {
        batch.user_id == self.user_id
            && self
                .thread_id
                .as_deref()
                .is_none_or(|thread| batch.thread_id == thread)
    }
}

/// A page of batches, newest first (`created_at`, `id` descending).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchQuery {
    /// Only batches with this status.
    pub status: Option<BatchStatus>,
    /// 1–100.
    pub limit: u32,
    /// Batches to skip.
    pub offset: u32,
}

impl BatchQuery {
    /// Checks `limit` 1–100.
    pub fn validate(&self) -> Result<()> {
        check_limit(self.limit, LIST_MAX_LIMIT)
    }
}

/// A page of a batch's items in `position` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemQuery {
    /// Only items with this status.
    pub status: Option<BatchItemStatus>,
    /// Matching items to skip.
    pub offset: u32,
    /// 1–500.
    pub limit: u32,
}

impl ItemQuery {
    /// Checks `limit` 1–500.
    pub fn validate(&self) -> Result<()> {
        check_limit(self.limit, ITEMS_MAX_LIMIT)
    }
}

fn check_limit(limit: u32, max: u32) -> Result<()> {
    if (1..=max).contains(&limit) {
        Ok(())
    } else {
        Err(Error::InvalidQuery(format!(
            "limit must be between 1 and {max}, got {limit}"
        )))
    }
}

/// What [`BatchStore::retry_item`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryOutcome {
    /// The item is `pending` again at attempt 0; a finished batch is `queued` again.
    Retried {
        /// The batch after the retry.
        batch: Box<BatchRecord>,
        /// The item after the retry.
        item: Box<BatchItem>,
    },
    /// No such batch in the scope (404 `Subagent batch not found`).
    BatchNotFound,
    /// The item is unknown, of another batch, or not `failed` (409 `Only failed items
    /// can be retried`).
    NotFailed,
    /// The batch is cancelled (409 `Items of a cancelled batch cannot be retried`).
    BatchCancelled,
}

/// A worker asking for work (docs/batches.md#claim-pass).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The worker's host name; cut so that `lease_owner` fits 128 characters.
    pub hostname: String,
    /// The worker's id, 32 hex digits.
    pub worker_id: String,
    /// `subagent_runtime.max_running` minus the worker's local executions; 0 still
    /// recovers expired leases and promotes pending items.
    pub free_slots: u32,
    /// How long a claim holds: `subagent_batches.lease_seconds`.
    pub lease: Duration,
    /// How many of the claims start `running` in the claim's transaction, at most
    /// `free_slots`: the worker already holds an admission slot for each (docs/batches.md#item-states,
    /// `leased` → `running` on a slot acquired). The others stay `leased` until their
    /// slot comes.
    pub admitted: u32,
}

impl ClaimRequest {
    /// Checks the worker id (32 hex digits, so that every `lease_owner` fits 128
    /// characters) and that `admitted` is within `free_slots`.
    pub fn validate(&self) -> Result<()> {
        if self.worker_id.len() != 32 || !self.worker_id.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(Error::InvalidQuery(format!(
                "worker_id must be 32 hex digits, got '{}'",
                self.worker_id
            )));
        }
        if self.admitted > self.free_slots {
            return Err(Error::InvalidQuery(format!(
                "admitted ({}) must not exceed free_slots ({})",
                self.admitted, self.free_slots
            )));
        }
        Ok(())
    }

    /// `{hostname}:{worker id}:{token}` with a fresh 16-hex token, hostname cut to fit
    /// [`LEASE_OWNER_MAX_CHARS`].
    pub fn mint_lease_owner(&self) -> String {
        let token = &Uuid::new_v4().simple().to_string()[..16];
        let room = LEASE_OWNER_MAX_CHARS.saturating_sub(self.worker_id.len() + token.len() + 2);
        let host: String = self.hostname.chars().take(room).collect();
        format!("{host}:{}:{token}", self.worker_id)
    }
}

/// One item a claim pass leased to the worker, with its batch.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedItem {
    /// The batch, as the pass left it (its `execution_spec` rebuilds the subagent),
    /// shared by the pass's claims of that batch.
    pub batch: Arc<BatchRecord>,
    /// The item: `leased` (`running` when the pass used one of the worker's admission
    /// slots for it), with its prompt, the new `attempt` and `lease_owner`.
    pub item: BatchItem,
}

impl ClaimedItem {
    /// The lease the worker's writes for this item present.
    pub fn lease(&self) -> ItemLease {
        ItemLease {
            batch_id: self.item.batch_id.clone(),
            item_id: self.item.id.clone(),
            lease_owner: self.item.lease_owner.clone().unwrap_or_default(),
        }
    }
}

/// What one claim pass did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClaimPass {
    /// The lease owner minted for this pass (every claimed item carries it).
    pub lease_owner: String,
    /// The items leased to the worker, by batch (`created_at`, `id`) then `position`.
    pub claimed: Vec<ClaimedItem>,
    /// Expired leases recovered (`subflow_batch_lease_expirations_total`).
    pub expired: u64,
    /// Pending items promoted to queued.
    pub promoted: u64,
}

impl ClaimPass {
    /// Adds a batch's claims, sharing one copy of the batch as the pass left it.
    pub fn add_claims(&mut self, batch: &BatchRecord, claimed: Vec<BatchItem>) {
        if claimed.is_empty() {
            return;
        }
        let batch = Arc::new(batch.clone());
        self.claimed
            .extend(claimed.into_iter().map(|item| ClaimedItem {
                batch: batch.clone(),
                item,
            }));
    }
}

/// The fence of a worker write: the item, its batch and the claim's owner.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ItemLease {
    /// The item's batch (locked first).
    pub batch_id: String,
    /// The item.
    pub item_id: String,
    /// The `lease_owner` of the claim.
    pub lease_owner: String,
}

/// What a renewal found (docs/batches.md#leases-and-fencing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease is still this owner's and now ends at `expires_at` (epoch ms, database clock).
    Held {
        /// The new end of the lease.
        expires_at: i64,
    },
    /// The item was cancelled (a cancel was requested): stop the local execution.
    CancelRequested,
    /// Someone else holds the item, or it moved on: stop the local execution.
    Lost,
}

/// A successful attempt's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemSuccess {
    /// The result, already capped at `max_result_chars`.
    pub result: String,
    /// A prefix of at most `result_preview_max_chars`.
    pub result_preview: String,
    /// Whether `result` was cut.
    pub result_truncated: bool,
    /// The model that ran.
    pub model_name: Option<String>,
    /// Why a guard ended the attempt.
    pub stop_reason: Option<SubagentStopReason>,
    /// Summed usage.
    pub token_usage: Option<ItemUsage>,
}

/// A failed attempt's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemFailure {
    /// What went wrong, already capped at 4,000 characters.
    pub error: String,
    /// The model that ran, if one did.
    pub model_name: Option<String>,
    /// Why a guard ended the attempt.
    pub stop_reason: Option<SubagentStopReason>,
    /// Summed usage, if any.
    pub token_usage: Option<ItemUsage>,
}

/// How an attempt ended, for [`BatchStore::finish_attempts`].
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptOutcome {
    /// As [`BatchStore::finish_success`].
    Succeeded(ItemSuccess),
    /// As [`BatchStore::finish_failure`].
    Failed(ItemFailure),
}

/// Why a worker hands a claim back without an outcome. Every reason gives the attempt
/// back (floor 0) and requeues the item, or cancels it if a cancel was requested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseReason {
    /// The admission controller refused the execution or timed out; the text says why.
    AdmissionRejected(String),
    /// The worker was stopping before the execution was admitted.
    ShutdownBeforeAdmission,
    /// The worker still ran a stale execution of the item and drained it first.
    StaleExecutionDrained,
    /// The attempt's outcome write failed twice: the item runs again now rather than
    /// after its lease.
    OutcomeUnstored,
    /// Marking the item `running` failed (the store took no writes): the item runs again
    /// now rather than after its lease.
    StartUnstored,
}

impl ReleaseReason {
    /// The item's `error` after the release.
    pub fn message(&self) -> &str {
        match self {
            ReleaseReason::AdmissionRejected(message) => message,
            ReleaseReason::ShutdownBeforeAdmission => STOPPED_BEFORE_ADMISSION,
            ReleaseReason::StaleExecutionDrained => DRAINED_STALE_EXECUTION,
            ReleaseReason::OutcomeUnstored => OUTCOME_UNSTORED,
            ReleaseReason::StartUnstored => START_UNSTORED,
        }
    }
}

/// A worker's row in `subagent_batch_workers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerHeartbeat {
    /// 32 hex digits.
    pub worker_id: String,
    /// The worker's host.
    pub hostname: String,
    /// RFC 3339, when the worker started.
    pub started_at: String,
}

/// Global counts for the gauges `subflow_batches` and `subflow_batch_items` (docs/operations.md#metrics).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BatchTotals {
    /// Batches per status, all six statuses in lifecycle order.
    pub batches: Vec<(BatchStatus, u64)>,
    /// Items per status over every batch.
    pub items: BatchCounts,
}

impl BatchTotals {
    /// Totals from per-status batch counts (missing statuses are 0) and item counts.
    pub fn new(batches: impl IntoIterator<Item = (BatchStatus, u64)>, items: BatchCounts) -> Self {
        let found: Vec<(BatchStatus, u64)> = batches.into_iter().collect();
        let batches = BatchStatus::ALL
            .iter()
            .map(|status| {
                let count = found
                    .iter()
                    .filter(|(s, _)| s == status)
                    .map(|(_, n)| n)
                    .sum();
                (*status, count)
            })
            .collect();
        BatchTotals { batches, items }
    }
}

/// The clock of lease times on the backends whose database clock is the process clock.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_millis(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// A shared [`Clock`], the system clock by default.
#[derive(Debug, Clone)]
pub struct SharedClock(Arc<dyn Clock>);

impl Default for SharedClock {
    fn default() -> Self {
        SharedClock(Arc::new(SystemClock))
    }
}

impl SharedClock {
    /// Wraps a clock.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        SharedClock(clock)
    }

    /// The current moment of this clock.
    pub fn now(&self) -> machine::Now {
        machine::Now::at(self.0.now_millis())
    }
}

impl Clock for SystemClock {
    fn now_millis(&self) -> i64 {
        crate::streams::epoch_millis()
    }
}

/// A clock that moves only when told to, for tests of lease expiry.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    /// A clock reading `start` epoch milliseconds.
    pub fn new(start: i64) -> Self {
        ManualClock {
            now: AtomicI64::new(start),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now
            .fetch_add(crate::streams::millis(by), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// Storage of durable batches, their items and the workers' heartbeats.
///
/// Calls that take a [`BatchScope`] see only that user's batches; a batch outside the
/// scope reads as missing. Worker calls take an [`ItemLease`] and change nothing
/// (returning `false`, `None` or [`Renewal::Lost`]) unless the item is still in the
/// expected status under that `lease_owner`.
#[async_trait]
pub trait BatchStore: Send + Sync + fmt::Debug {
    /// Validates ([`NewBatch::validate`]) and stores a batch with its items in one
    /// transaction. A `submission_key` the user already used returns that batch with
    /// `created: false` and inserts nothing.
    async fn submit_batch(&self, batch: NewBatch) -> Result<Submitted>;

    /// A batch in the scope.
    async fn get_batch(&self, scope: &BatchScope, batch_id: &str) -> Result<Option<BatchRecord>>;

    /// The scope's batches, newest first (`created_at`, `id` descending).
    async fn list_batches(
        &self,
        scope: &BatchScope,
        query: &BatchQuery,
    ) -> Result<Vec<BatchRecord>>;

    /// A page of a batch's items in `position` order, without `result`; empty when the
    /// batch is not in the scope.
    async fn list_items(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        query: &ItemQuery,
    ) -> Result<Vec<BatchItem>>;

    /// One item of a batch in the scope, with its `result`.
    async fn get_item(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        item_id: &str,
    ) -> Result<Option<BatchItem>>;

    /// The next [`EXPORT_PAGE`] items after `after_position` (from the start when
    /// `None`), in `position` order, with their `result`; empty when the batch is not in
    /// the scope.
    async fn export_items(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        after_position: Option<u32>,
    ) -> Result<Vec<BatchItem>>;

    /// Pauses a `queued` or `running` batch; any other status is left as it is. `None`
    /// when the batch is not in the scope.
    async fn pause_batch(&self, scope: &BatchScope, batch_id: &str) -> Result<Option<BatchRecord>>;

    /// Records how far the batch's spend went against its money budget: `level` warn
    /// fractions crossed (one more once the limit is reached) is kept when above the
    /// stored level, and `pause` pauses a `queued` or `running` batch with
    /// `pause_reason` `budget`. Returns the batch and the level stored before, so one
    /// caller reports each crossing; `None` when the batch is not in the scope.
    async fn mark_budget(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        level: u32,
        pause: bool,
    ) -> Result<Option<(BatchRecord, u32)>>;

    /// Resumes a `paused` batch to `queued`; any other status is left as it is.
    async fn resume_batch(&self, scope: &BatchScope, batch_id: &str)
    -> Result<Option<BatchRecord>>;

    /// Cancels an active batch (`completed_at` set) and, at once, every item that is not
    /// terminal: `cancelled`, `cancel_requested_at` set, `Cancelled by user`, lease
    /// cleared. A terminal batch is left as it is.
    async fn cancel_batch(&self, scope: &BatchScope, batch_id: &str)
    -> Result<Option<BatchRecord>>;

    /// Retries a `failed` item: `pending`, attempt 0, result, error and verdict cleared;
    /// a `completed` or `failed` batch goes back to `queued` with `completed_at` cleared.
    async fn retry_item(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        item_id: &str,
    ) -> Result<RetryOutcome>;

    /// One claim pass (docs/batches.md#claim-pass) in one transaction: over the active batches by
    /// (`created_at`, `id`), recovers expired leases (paused batches included), then in
    /// each batch that is not paused promotes pending items up to `max_live_items`,
    /// claims up to min(free slots left, `max_running_items` − (leased + running))
    /// queued items without a cancel request in `position` order, and marks the batch
    /// `running`. Claimed items are `leased` with `attempt + 1`, the pass's new
    /// `lease_owner` and a lease of `request.lease` from the database clock.
    async fn claim_pass(&self, request: &ClaimRequest) -> Result<ClaimPass>;

    /// `leased` → `running` (`started_at` set) when the lease is owned, not expired by
    /// the database clock, and no cancel was requested.
    async fn mark_running(&self, lease: &ItemLease) -> Result<bool>;

    /// Extends a `leased` or `running` item's lease to `ttl` from the database clock;
    /// [`Renewal::CancelRequested`] or [`Renewal::Lost`] when the caller must stop.
    async fn renew_lease(&self, lease: &ItemLease, ttl: Duration) -> Result<Renewal>;

    /// Finalises several attempts, its new status (`None` when fenced out) at each
    /// outcome's index: a success makes a `leased` or `running` item `succeeded` with its
    /// result, a failure makes it `queued` again while `attempt < max_attempts`, else
    /// `failed`; either makes it `cancelled` when a cancel was requested. A batch whose
    /// items are all terminal completes. The SQL backends write the list in one
    /// transaction, each batch row once. Trying the list again is safe: an outcome
    /// already written fences its repeat out.
    async fn finish_attempts(
        &self,
        outcomes: &[(ItemLease, AttemptOutcome)],
    ) -> Result<Vec<Option<BatchItemStatus>>>;

    /// One success, as [`BatchStore::finish_attempts`] writes it.
    async fn finish_success(
        &self,
        lease: &ItemLease,
        outcome: &ItemSuccess,
    ) -> Result<Option<BatchItemStatus>> {
        let outcome = [(lease.clone(), AttemptOutcome::Succeeded(outcome.clone()))];
        Ok(self.finish_attempts(&outcome).await?.pop().flatten())
    }

    /// One failure, as [`BatchStore::finish_attempts`] writes it.
    async fn finish_failure(
        &self,
        lease: &ItemLease,
        outcome: &ItemFailure,
    ) -> Result<Option<BatchItemStatus>> {
        let outcome = [(lease.clone(), AttemptOutcome::Failed(outcome.clone()))];
        Ok(self.finish_attempts(&outcome).await?.pop().flatten())
    }

    /// Hands a `leased` or `running` claim back without an outcome ([`ReleaseReason`]):
    /// the attempt is given back (floor 0) and the item is `queued` with the reason's
    /// message, or `cancelled` when a cancel was requested.
    async fn release_claim(
        &self,
        lease: &ItemLease,
        reason: &ReleaseReason,
    ) -> Result<Option<BatchItemStatus>>;

    /// Inserts or refreshes the worker's row, `heartbeat_at` = the database clock.
    async fn heartbeat(&self, worker: &WorkerHeartbeat) -> Result<()>;

    /// Removes a stopping worker's row; false when it had none.
    async fn remove_worker(&self, worker_id: &str) -> Result<bool>;

    /// How many workers sent a heartbeat within `max_age` of the database clock.
    async fn live_workers(&self, max_age: Duration) -> Result<u64>;

    /// Batches and items per status over every user, for the gauges.
    async fn batch_totals(&self) -> Result<BatchTotals>;

    /// The spend and recent pace of the scope's batches ([`ActivityQuery`]), one entry per
    /// batch that has an item with usage or a recent completion, ordered by batch id;
    /// batches outside the scope are left out.
    async fn batch_activity(
        &self,
        scope: &BatchScope,
        query: &ActivityQuery,
    ) -> Result<Vec<BatchActivity>>;
}
