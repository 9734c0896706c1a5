//! The batch and item state machine of docs/batches.md#batch-states, docs/batches.md#item-states, as functions on loaded
//! records. Every backend applies these inside its transaction (batch row locked before
//! item rows) and writes back what changed; each function keeps the batch's `counts`
//! equal to its items' statuses by moving exactly one item between two counts.

use subflow_contracts::{BatchItemStatus, BatchStatus};

use super::{
    BatchItem, BatchRecord, CANCELLED_BY_USER, ItemFailure, ItemLease, ItemSuccess,
    LEASE_EXPIRED_FINAL, LEASE_EXPIRED_RETRYING, ReleaseReason, Renewal,
};

/// The moment a transaction runs: the lease clock (epoch ms of the database clock) and
/// the RFC 3339 stamp written into `*_at` columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Now {
    /// Epoch milliseconds of the database clock, for lease times.
    pub millis: i64,
    /// RFC 3339, for `created_at`, `updated_at`, `started_at`, `completed_at`.
    pub stamp: String,
}

impl Now {
    /// The moment `millis` of the lease clock, stamped with the process clock.
    pub fn at(millis: i64) -> Self {
        Now {
            millis,
            stamp: crate::now_rfc3339(),
        }
    }
}

/// Moves `item` to `to`, counting it in `batch`.
fn set_status(batch: &mut BatchRecord, item: &mut BatchItem, to: BatchItemStatus, now: &Now) {
    batch.counts.shift(item.status, to);
    item.status = to;
    item.updated_at = now.stamp.clone();
    batch.updated_at = now.stamp.clone();
    if to.is_terminal() {
        item.completed_at = Some(now.stamp.clone());
    }
    if !to.is_leased() {
        item.lease_owner = None;
        item.lease_expires_at = None;
    }
}

/// Cancels an item: `cancelled`, `Cancelled by user`, lease cleared.
fn cancel_item(batch: &mut BatchRecord, item: &mut BatchItem, now: &Now) {
    item.cancel_requested_at
        .get_or_insert_with(|| now.stamp.clone());
    item.error = Some(CANCELLED_BY_USER.to_owned());
    set_status(batch, item, BatchItemStatus::Cancelled, now);
}

/// Whether `item` is held under `lease` in one of `statuses`: the fence of every worker
/// write.
pub fn holds(item: &BatchItem, lease: &ItemLease, statuses: &[BatchItemStatus]) -> bool {
    item.id == lease.item_id
        && item.batch_id == lease.batch_id
        && item.lease_owner.as_deref() == Some(lease.lease_owner.as_str())
        && statuses.contains(&item.status)
}

const HELD: &[BatchItemStatus] = &[BatchItemStatus::Leased, BatchItemStatus::Running];

/// Whether the item's lease has expired by `now` (a leased or running item only).
pub fn expired(item: &BatchItem, now: &Now) -> bool {
    item.status.is_leased() && item.lease_expires_at.is_some_and(|at| at <= now.millis)
}

/// After an item changed: a batch whose items are all terminal finishes (unless
/// cancelled, paused included): `failed` when some failed and none succeeded, else
/// `completed`. Otherwise a claim or finalise (`progressed`) moves a `queued` batch to
/// `running`.
pub fn settle(batch: &mut BatchRecord, now: &Now, progressed: bool) {
    if batch.status == BatchStatus::Cancelled {
        return;
    }
    if batch.counts.unfinished() == 0 {
        if !matches!(batch.status, BatchStatus::Completed | BatchStatus::Failed) {
            batch.status = if batch.counts.failed > 0 && batch.counts.succeeded == 0 {
                BatchStatus::Failed
            } else {
                BatchStatus::Completed
            };
            batch.completed_at = Some(now.stamp.clone());
            batch.updated_at = now.stamp.clone();
        }
    } else if progressed && batch.status == BatchStatus::Queued {
        batch.status = BatchStatus::Running;
        batch.updated_at = now.stamp.clone();
    }
}

/// Recovers an expired lease (the caller checked [`expired`]): a never-started item
/// first gets its attempt back; then `cancelled` if a cancel was requested, `failed`
/// at `max_attempts`, else `queued` to be claimed again.
pub fn recover_expired(batch: &mut BatchRecord, item: &mut BatchItem, now: &Now) {
    if item.status == BatchItemStatus::Leased {
        item.attempt = item.attempt.saturating_sub(1);
    }
    if item.cancel_requested_at.is_some() {
        cancel_item(batch, item, now);
    } else if item.attempt >= batch.max_attempts {
        item.error = Some(LEASE_EXPIRED_FINAL.to_owned());
        set_status(batch, item, BatchItemStatus::Failed, now);
    } else {
        item.error = Some(LEASE_EXPIRED_RETRYING.to_owned());
        set_status(batch, item, BatchItemStatus::Queued, now);
    }
    settle(batch, now, false);
}

/// How many pending items may be promoted now: `max_live_items` − active.
pub fn promotion_quota(batch: &BatchRecord) -> u64 {
    if batch.status == BatchStatus::Paused || !batch.status.is_active() {
        return 0;
    }
    u64::from(batch.max_live_items)
        .saturating_sub(batch.counts.active())
        .min(batch.counts.pending)
}

/// `pending` → `queued`.
pub fn promote(batch: &mut BatchRecord, item: &mut BatchItem, now: &Now) {
    set_status(batch, item, BatchItemStatus::Queued, now);
}

/// `n` pending items promoted by one statement of the backend's, which set each one
/// `queued` with `updated_at` now (what [`promote`] does to an item).
pub fn promoted(batch: &mut BatchRecord, n: u64, now: &Now) {
    if n > 0 {
        batch
            .counts
            .shift_many(BatchItemStatus::Pending, BatchItemStatus::Queued, n);
        batch.updated_at = now.stamp.clone();
    }
}

/// How many queued items may be claimed now: min(`free_slots`, `max_running_items` −
/// (leased + running)).
pub fn claim_quota(batch: &BatchRecord, free_slots: u64) -> u64 {
    if batch.status == BatchStatus::Paused || !batch.status.is_active() {
        return 0;
    }
    u64::from(batch.max_running_items)
        .saturating_sub(batch.counts.leased_or_running())
        .min(free_slots)
        .min(batch.counts.queued)
}

/// Whether a queued item may be claimed: no cancel request.
pub fn claimable(item: &BatchItem) -> bool {
    item.status == BatchItemStatus::Queued && item.cancel_requested_at.is_none()
}

/// `queued` → `leased` under `lease_owner` until `expires_at`, `attempt + 1`; then at
/// once `leased` → `running` while `admitted` (the admission slots the worker already
/// holds) is not used up, taking one.
pub fn claim(
    batch: &mut BatchRecord,
    item: &mut BatchItem,
    lease_owner: &str,
    expires_at: i64,
    admitted: &mut u32,
    now: &Now,
) {
    item.attempt += 1;
    set_status(batch, item, BatchItemStatus::Leased, now);
    item.lease_owner = Some(lease_owner.to_owned());
    item.lease_expires_at = Some(expires_at);
    if *admitted > 0 {
        *admitted -= 1;
        start(batch, item, now);
    }
    settle(batch, now, true);
}

/// `leased` → `running`, `started_at` set.
fn start(batch: &mut BatchRecord, item: &mut BatchItem, now: &Now) {
    set_status(batch, item, BatchItemStatus::Running, now);
    item.started_at = Some(now.stamp.clone());
}

/// `leased` → `running` when held, unexpired and not cancelled.
pub fn mark_running(
    batch: &mut BatchRecord,
    item: &mut BatchItem,
    lease: &ItemLease,
    now: &Now,
) -> bool {
    if !holds(item, lease, &[BatchItemStatus::Leased])
        || expired(item, now)
        || item.cancel_requested_at.is_some()
    {
        return false;
    }
    start(batch, item, now);
    true
}

/// Extends a held lease to `expires_at`.
pub fn renew(item: &mut BatchItem, lease: &ItemLease, expires_at: i64, now: &Now) -> Renewal {
    if item.cancel_requested_at.is_some() {
        return Renewal::CancelRequested;
    }
    if !holds(item, lease, HELD) {
        return Renewal::Lost;
    }
    item.lease_expires_at = Some(expires_at);
    item.updated_at = now.stamp.clone();
    Renewal::Held { expires_at }
}

/// A held item's attempt succeeded.
pub fn finish_success(
    batch: &mut BatchRecord,
    item: &mut BatchItem,
    lease: &ItemLease,
    outcome: &ItemSuccess,
    now: &Now,
) -> Option<BatchItemStatus> {
    if !holds(item, lease, HELD) {
        return None;
    }
    if item.cancel_requested_at.is_some() {
        cancel_item(batch, item, now);
    } else {
        item.result = Some(outcome.result.clone());
        item.result_preview = Some(outcome.result_preview.clone());
        item.result_truncated = outcome.result_truncated;
        item.model_name = outcome.model_name.clone();
        item.stop_reason = outcome.stop_reason;
        item.token_usage = outcome.token_usage;
        item.error = None;
        set_status(batch, item, BatchItemStatus::Succeeded, now);
    }
    settle(batch, now, true);
    Some(item.status)
}

/// A held item's attempt failed: requeued while attempts remain, else failed.
pub fn finish_failure(
    batch: &mut BatchRecord,
    item: &mut BatchItem,
    lease: &ItemLease,
    outcome: &ItemFailure,
    now: &Now,
) -> Option<BatchItemStatus> {
    if !holds(item, lease, HELD) {
        return None;
    }
    if item.cancel_requested_at.is_some() {
        cancel_item(batch, item, now);
    } else {
        item.error = Some(outcome.error.clone());
        item.model_name = outcome.model_name.clone();
        item.stop_reason = outcome.stop_reason;
        item.token_usage = outcome.token_usage;
        let to = if item.attempt < batch.max_attempts {
            BatchItemStatus::Queued
        } else {
            BatchItemStatus::Failed
        };
        set_status(batch, item, to, now);
    }
    settle(batch, now, true);
    Some(item.status)
}

/// A held claim handed back: attempt restored (floor 0), then `queued` with the
/// reason's message, or `cancelled` when a cancel was requested.
pub fn release(
    batch: &mut BatchRecord,
    item: &mut BatchItem,
    lease: &ItemLease,
    reason: &ReleaseReason,
    now: &Now,
) -> Option<BatchItemStatus> {
    if !holds(item, lease, HELD) {
        return None;
    }
    item.attempt = item.attempt.saturating_sub(1);
    if item.cancel_requested_at.is_some() {
        cancel_item(batch, item, now);
    } else {
        item.error = Some(reason.message().to_owned());
        set_status(batch, item, BatchItemStatus::Queued, now);
    }
    settle(batch, now, false);
    Some(item.status)
}

/// Pause: `queued`/`running` → `paused`; false (a no-op) otherwise.
pub fn pause(batch: &mut BatchRecord, now: &Now) -> bool {
    if !matches!(batch.status, BatchStatus::Queued | BatchStatus::Running) {
        return false;
    }
    batch.status = BatchStatus::Paused;
    batch.updated_at = now.stamp.clone();
    true
}

/// A money budget's progress: the level rises to `level`, and `pause` pauses a `queued`
/// or `running` batch with `pause_reason` `budget`; false when nothing changed.
pub fn budget(batch: &mut BatchRecord, now: &Now, level: u32, pause: bool) -> bool {
    let raised = level > batch.budget_level;
    batch.budget_level = batch.budget_level.max(level);
    let paused = pause && self::pause(batch, now);
    if paused {
        batch.pause_reason = Some(PAUSE_BUDGET.to_owned());
    }
    raised || paused
}

/// The `pause_reason` of a batch its budget paused.
pub const PAUSE_BUDGET: &str = "budget";

/// Resume: `paused` → `queued`; false (a no-op) otherwise.
pub fn resume(batch: &mut BatchRecord, now: &Now) -> bool {
    if batch.status != BatchStatus::Paused {
        return false;
    }
    batch.pause_reason = None;
    batch.status = BatchStatus::Queued;
    batch.updated_at = now.stamp.clone();
    true
}

/// Cancel: an active batch becomes `cancelled` (`completed_at` set); false otherwise.
/// The caller then passes every non-terminal item to [`cancel_with_batch`].
pub fn cancel(batch: &mut BatchRecord, now: &Now) -> bool {
    if !batch.status.is_active() {
        return false;
    }
    batch.status = BatchStatus::Cancelled;
    batch.completed_at = Some(now.stamp.clone());
    batch.updated_at = now.stamp.clone();
    true
}

/// A non-terminal item of a batch being cancelled: cancelled at once.
pub fn cancel_with_batch(batch: &mut BatchRecord, item: &mut BatchItem, now: &Now) {
    if !item.status.is_terminal() {
        cancel_item(batch, item, now);
    }
}

/// Why [`retry`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryRefusal {
    /// The item is not `failed`.
    NotFailed,
    /// The batch is cancelled.
    BatchCancelled,
}

/// Retry of a failed item: `pending`, attempt 0, one more retry counted, outcome cleared; a finished batch is
/// `queued` again. The item check comes first, then the batch's.
pub fn retry(batch: &mut BatchRecord, item: &mut BatchItem, now: &Now) -> Result<(), RetryRefusal> {
    if item.status != BatchItemStatus::Failed || item.batch_id != batch.id {
        return Err(RetryRefusal::NotFailed);
    }
    if batch.status == BatchStatus::Cancelled {
        return Err(RetryRefusal::BatchCancelled);
    }
    set_status(batch, item, BatchItemStatus::Pending, now);
    item.attempt = 0;
    item.retries = item.retries.saturating_add(1);
    item.result = None;
    item.result_preview = None;
    item.result_truncated = false;
    item.error = None;
    item.stop_reason = None;
    item.token_usage = None;
    item.model_name = None;
    item.acceptance_verdict = None;
    item.started_at = None;
    item.completed_at = None;
    if matches!(batch.status, BatchStatus::Completed | BatchStatus::Failed) {
        batch.status = BatchStatus::Queued;
        batch.completed_at = None;
    }
    Ok(())
}
