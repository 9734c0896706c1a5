//! The SQL backends' batch writes, written once. A backend supplies [`BatchRows`]: row
//! access inside one of its transactions (load and lock, write back, the claim pass's
//! queries); the functions here apply [`machine`](super::machine) to what it loads and
//! hand back what changed. Locks are taken batch row first, then item rows, and several
//! batches in id order, so two transactions never wait on each other in a circle.
//!
//! A backend opens the transaction, calls one function, and commits when it returns `Ok`
//! (rolls back on `Err`). Its futures keep their own `Send`-ness: PostgreSQL's are awaited
//! on the runtime, SQLite's never wait and run on its writer thread.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::Duration;

use subflow_contracts::BatchItemStatus;

use super::machine::{self, Now, RetryRefusal};
use super::{
    AttemptOutcome, BatchItem, BatchRecord, BatchScope, ClaimPass, ClaimRequest, ItemLease,
    ReleaseReason, Renewal, RetryOutcome, Submitted,
};
use crate::streams::millis;
use crate::{Error, Result};

/// Row access inside one transaction of a SQL backend. "Lock" means the row stays the
/// transaction's until it ends (`FOR UPDATE` on PostgreSQL; SQLite's single writer holds
/// every row).
#[allow(async_fn_in_trait)] // Send is left to each backend's futures (see the module docs)
pub trait BatchRows {
    /// Locks a batch row and reads the database clock; `spec` asks for the
    /// `execution_spec` too (left `null` otherwise when a backend stores it apart).
    async fn lock_batch(
        &mut self,
        batch_id: &str,
        spec: bool,
    ) -> Result<Option<(BatchRecord, Now)>>;

    /// Locks the active batches (`queued`, `running`, `paused`) by (`created_at`, `id`),
    /// skipping any another transaction holds, and reads the database clock; `None` when
    /// there are none.
    async fn lock_active_batches(&mut self) -> Result<Option<(Vec<BatchRecord>, Now)>>;

    /// Locks an item of a locked batch.
    async fn lock_item(&mut self, batch_id: &str, item_id: &str) -> Result<Option<BatchItem>>;

    /// Locks a batch's `leased` and `running` items whose lease ended by `now_millis`, in
    /// `position` order.
    async fn lock_expired_items(
        &mut self,
        batch_id: &str,
        now_millis: i64,
    ) -> Result<Vec<BatchItem>>;

    /// Locks a batch's items that are not terminal, in `position` order.
    async fn lock_unfinished_items(&mut self, batch_id: &str) -> Result<Vec<BatchItem>>;

    /// Locks up to `limit` of a batch's `queued` items without a cancel request, in
    /// `position` order, skipping any another transaction holds.
    async fn lock_claimable_items(&mut self, batch_id: &str, limit: u64) -> Result<Vec<BatchItem>>;

    /// Sets a batch's first `quota` `pending` items (by `position`) `queued` with
    /// `updated_at` now, in one statement; how many it set.
    async fn promote_pending(&mut self, batch_id: &str, quota: u64, now: &Now) -> Result<u64>;

    /// Writes a batch's status, counts and times back.
    async fn write_batch(&mut self, batch: &BatchRecord) -> Result<()>;

    /// Writes the mutable columns of `items` back.
    async fn write_items(&mut self, items: &[BatchItem]) -> Result<()>;

    /// Inserts a batch with its spec and items unless the user already used its
    /// `submission_key`; false (nothing inserted) then.
    async fn insert_batch(&mut self, batch: &BatchRecord, items: &[BatchItem]) -> Result<bool>;

    /// The batch of a user's submission key.
    async fn submitted(&mut self, user_id: &str, key: &str) -> Result<Option<BatchRecord>>;
}

/// Stores a new batch, or answers the one its `submission_key` already made.
pub async fn submit(
    rows: &mut impl BatchRows,
    record: BatchRecord,
    items: &[BatchItem],
) -> Result<Submitted> {
    if rows.insert_batch(&record, items).await? {
        return Ok(Submitted {
            batch: record,
            created: true,
        });
    }
    let batch = rows
        .submitted(&record.user_id, &record.submission_key)
        .await?
        .ok_or_else(|| Error::Corrupt {
            what: "subagent batch",
            detail: format!(
                "submission key '{}' conflicts but names no batch",
                record.submission_key
            ),
        })?;
    Ok(Submitted {
        batch,
        created: false,
    })
}

/// Locks a batch visible in `scope`.
async fn lock_scoped(
    rows: &mut impl BatchRows,
    scope: &BatchScope,
    batch_id: &str,
) -> Result<Option<(BatchRecord, Now)>> {
    Ok(rows
        .lock_batch(batch_id, true)
        .await?
        .filter(|(batch, _)| scope.sees(batch)))
}

/// Applies a user control ([`machine::pause`], [`machine::resume`]) to a scoped batch;
/// `None` when it is not in the scope.
pub async fn control(
    rows: &mut impl BatchRows,
    scope: &BatchScope,
    batch_id: &str,
    change: impl FnOnce(&mut BatchRecord, &Now) -> bool,
) -> Result<Option<BatchRecord>> {
    let Some((mut batch, now)) = lock_scoped(rows, scope, batch_id).await? else {
        return Ok(None);
    };
    if change(&mut batch, &now) {
        rows.write_batch(&batch).await?;
    }
    Ok(Some(batch))
}

/// Records a scoped batch's budget progress (see `Store::mark_budget`).
pub async fn mark_budget(
    rows: &mut impl BatchRows,
    scope: &BatchScope,
    batch_id: &str,
    level: u32,
    pause: bool,
) -> Result<Option<(BatchRecord, u32)>> {
    let Some((mut batch, now)) = lock_scoped(rows, scope, batch_id).await? else {
        return Ok(None);
    };
    let previous = batch.budget_level;
    if machine::budget(&mut batch, &now, level, pause) {
        rows.write_batch(&batch).await?;
    }
    Ok(Some((batch, previous)))
}

/// Cancels a scoped batch and its unfinished items.
pub async fn cancel(
    rows: &mut impl BatchRows,
    scope: &BatchScope,
    batch_id: &str,
) -> Result<Option<BatchRecord>> {
    let Some((mut batch, now)) = lock_scoped(rows, scope, batch_id).await? else {
        return Ok(None);
    };
    if machine::cancel(&mut batch, &now) {
        let mut items = rows.lock_unfinished_items(batch_id).await?;
        for item in &mut items {
            machine::cancel_with_batch(&mut batch, item, &now);
        }
        rows.write_items(&items).await?;
        rows.write_batch(&batch).await?;
    }
    Ok(Some(batch))
}

/// Retries a failed item of a scoped batch.
pub async fn retry(
    rows: &mut impl BatchRows,
    scope: &BatchScope,
    batch_id: &str,
    item_id: &str,
) -> Result<RetryOutcome> {
    let Some((mut batch, now)) = lock_scoped(rows, scope, batch_id).await? else {
        return Ok(RetryOutcome::BatchNotFound);
    };
    let Some(mut item) = rows.lock_item(batch_id, item_id).await? else {
        return Ok(RetryOutcome::NotFailed);
    };
    match machine::retry(&mut batch, &mut item, &now) {
        Ok(()) => {
            rows.write_items(std::slice::from_ref(&item)).await?;
            rows.write_batch(&batch).await?;
            Ok(RetryOutcome::Retried {
                batch: Box::new(batch),
                item: Box::new(item),
            })
        }
        Err(RetryRefusal::NotFailed) => Ok(RetryOutcome::NotFailed),
        Err(RetryRefusal::BatchCancelled) => Ok(RetryOutcome::BatchCancelled),
    }
}

/// One claim pass (docs/batches.md#claim-pass) over the active batches.
pub async fn claim_pass(rows: &mut impl BatchRows, request: &ClaimRequest) -> Result<ClaimPass> {
    let mut pass = ClaimPass {
        lease_owner: request.mint_lease_owner(),
        ..ClaimPass::default()
    };
    let Some((batches, now)) = rows.lock_active_batches().await? else {
        return Ok(pass);
    };
    let expires_at = now.millis.saturating_add(millis(request.lease));
    let mut free = u64::from(request.free_slots);
    let mut admitted = request.admitted;
    for mut batch in batches {
        let before = batch.clone();
        if batch.counts.leased_or_running() > 0 {
            let mut expired = rows.lock_expired_items(&batch.id, now.millis).await?;
            for item in &mut expired {
                machine::recover_expired(&mut batch, item, &now);
            }
            pass.expired += expired.len() as u64;
            // Written before the queue is read, so the claim sees them queued, in
            // position order with the rest.
            rows.write_items(&expired).await?;
        }
        let quota = machine::promotion_quota(&batch);
        if quota > 0 {
            let promoted = rows.promote_pending(&batch.id, quota, &now).await?;
            machine::promoted(&mut batch, promoted, &now);
            pass.promoted += promoted;
        }
        let quota = machine::claim_quota(&batch, free);
        let mut claimed = Vec::new();
        if quota > 0 {
            claimed = rows.lock_claimable_items(&batch.id, quota).await?;
            for item in &mut claimed {
                machine::claim(
                    &mut batch,
                    item,
                    &pass.lease_owner,
                    expires_at,
                    &mut admitted,
                    &now,
                );
            }
            rows.write_items(&claimed).await?;
        }
        if batch != before {
            rows.write_batch(&batch).await?;
        }
        free -= claimed.len() as u64;
        pass.add_claims(&batch, claimed);
    }
    Ok(pass)
}

/// `leased` → `running` under the lease ([`machine::mark_running`]).
pub async fn mark_running(rows: &mut impl BatchRows, lease: &ItemLease) -> Result<bool> {
    worker_write(rows, lease, false, |batch, item, now| {
        let changed = machine::mark_running(batch, item, lease, now);
        (changed, changed)
    })
    .await
}

/// Extends a held lease to `ttl` from the database clock ([`machine::renew`]).
pub async fn renew_lease(
    rows: &mut impl BatchRows,
    lease: &ItemLease,
    ttl: Duration,
) -> Result<Renewal> {
    worker_write(rows, lease, Renewal::Lost, |_, item, now| {
        let expires_at = now.millis.saturating_add(millis(ttl));
        let renewal = machine::renew(item, lease, expires_at, now);
        (renewal, matches!(renewal, Renewal::Held { .. }))
    })
    .await
}

/// Hands a held claim back ([`machine::release`]).
pub async fn release_claim(
    rows: &mut impl BatchRows,
    lease: &ItemLease,
    reason: &ReleaseReason,
) -> Result<Option<BatchItemStatus>> {
    worker_write(rows, lease, None, |batch, item, now| {
        let status = machine::release(batch, item, lease, reason, now);
        (status, status.is_some())
    })
    .await
}

/// A worker write on the item `lease` names: `write` applies the machine and says
/// whether it changed anything, and the item and batch are written back when it did.
/// `missing` is the answer when the batch or item does not exist.
async fn worker_write<T>(
    rows: &mut impl BatchRows,
    lease: &ItemLease,
    missing: T,
    write: impl FnOnce(&mut BatchRecord, &mut BatchItem, &Now) -> (T, bool),
) -> Result<T> {
    let Some((mut batch, now)) = rows.lock_batch(&lease.batch_id, false).await? else {
        return Ok(missing);
    };
    let Some(mut item) = rows.lock_item(&lease.batch_id, &lease.item_id).await? else {
        return Ok(missing);
    };
    let (answer, changed) = write(&mut batch, &mut item, &now);
    if changed {
        rows.write_items(std::slice::from_ref(&item)).await?;
        rows.write_batch(&batch).await?;
    }
    Ok(answer)
}

/// Finalises several attempts: the batch rows locked in id order, then the items; each
/// batch and item written once. A repeated lease sees the first outcome's change (and
/// is fenced out by it).
pub async fn finish_attempts(
    rows: &mut impl BatchRows,
    outcomes: &[(ItemLease, AttemptOutcome)],
) -> Result<Vec<Option<BatchItemStatus>>> {
    let mut batch_ids: Vec<&str> = outcomes
        .iter()
        .map(|(lease, _)| lease.batch_id.as_str())
        .collect();
    batch_ids.sort_unstable();
    batch_ids.dedup();
    // Each batch as locked, and whether an outcome changed it.
    let mut batches = HashMap::new();
    for id in batch_ids {
        if let Some((batch, now)) = rows.lock_batch(id, false).await? {
            batches.insert(id, (batch, now, false));
        }
    }
    // Each item as the outcomes so far left it, and whether one changed it.
    let mut items: HashMap<&str, (BatchItem, bool)> = HashMap::new();
    let mut statuses = Vec::with_capacity(outcomes.len());
    for (lease, outcome) in outcomes {
        let Some((batch, now, batch_changed)) = batches.get_mut(lease.batch_id.as_str()) else {
            statuses.push(None);
            continue;
        };
        let (item, item_changed) = match items.entry(lease.item_id.as_str()) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => match rows.lock_item(&lease.batch_id, &lease.item_id).await? {
                Some(item) => entry.insert((item, false)),
                None => {
                    statuses.push(None);
                    continue;
                }
            },
        };
        let status = match outcome {
            AttemptOutcome::Succeeded(success) => {
                machine::finish_success(batch, item, lease, success, now)
            }
            AttemptOutcome::Failed(failure) => {
                machine::finish_failure(batch, item, lease, failure, now)
            }
        };
        *batch_changed |= status.is_some();
        *item_changed |= status.is_some();
        statuses.push(status);
    }
    let written: Vec<BatchItem> = items
        .into_values()
        .filter_map(|(item, changed)| changed.then_some(item))
        .collect();
    rows.write_items(&written).await?;
    for (batch, _, changed) in batches.values() {
        if *changed {
            rows.write_batch(batch).await?;
        }
    }
    Ok(statuses)
}
