//! [`BatchStore`] for [`MemoryStore`]: the reference semantics, under a lock of its own
//! (taken after the record lock when a thread is deleted). One lock per call is the
//! one transaction of the SQL backends.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use subflow_contracts::{BatchItemStatus, BatchStatus};

use crate::batches::machine::{self, Now};
use crate::batches::{
    ActivityQuery, ActivityRow, AttemptOutcome, BatchActivity, BatchCounts, BatchItem, BatchQuery,
    BatchRecord, BatchScope, BatchStore, BatchTotals, ClaimPass, ClaimRequest, EXPORT_PAGE,
    ItemLease, ItemQuery, ReleaseReason, Renewal, RetryOutcome, Submitted, WorkerHeartbeat,
    fold_activity,
};
use crate::streams::millis;
use crate::{MemoryStore, Result};

/// The batch tables of a [`MemoryStore`].
#[derive(Debug, Default)]
pub(super) struct MemoryBatches {
    tables: Mutex<Tables>,
}

#[derive(Debug, Default)]
struct Tables {
    /// In creation order.
    batches: Vec<Stored>,
    /// Worker id → (row, heartbeat_at in epoch ms).
    workers: HashMap<String, (WorkerHeartbeat, i64)>,
}

#[derive(Debug)]
struct Stored {
    batch: BatchRecord,
    /// In position order.
    items: Vec<BatchItem>,
    /// Item id → its index in `items` (items are only ever added with their batch).
    by_id: HashMap<String, usize>,
}

impl Stored {
    fn new(batch: BatchRecord, items: Vec<BatchItem>) -> Self {
        let by_id = items
            .iter()
            .enumerate()
            .map(|(index, item)| (item.id.clone(), index))
            .collect();
        Stored {
            batch,
            items,
            by_id,
        }
    }

    /// The item `item_id` names, and the batch it belongs to.
    fn item_mut(&mut self, item_id: &str) -> Option<(&mut BatchRecord, &mut BatchItem)> {
        let index = *self.by_id.get(item_id)?;
        Some((&mut self.batch, &mut self.items[index]))
    }
}

impl MemoryBatches {
    fn lock(&self) -> MutexGuard<'_, Tables> {
        // Every call below decides on clones-free in-place edits that cannot fail halfway.
        self.tables
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Deletes a thread's batches with their items.
    pub(super) fn forget_thread(&self, thread_id: &str) {
        self.lock()
            .batches
            .retain(|stored| stored.batch.thread_id != thread_id);
    }
}

impl Tables {
    fn scoped(&mut self, scope: &BatchScope, batch_id: &str) -> Option<&mut Stored> {
        self.batches
            .iter_mut()
            .find(|stored| stored.batch.id == batch_id && scope.sees(&stored.batch))
    }

    /// The batch and item a worker write names.
    fn leased(&mut self, lease: &ItemLease) -> Option<(&mut BatchRecord, &mut BatchItem)> {
        let stored = self
            .batches
            .iter_mut()
            .find(|stored| stored.batch.id == lease.batch_id)?;
        stored.item_mut(&lease.item_id)
    }
}

/// An item as listings return it: without its result.
fn without_result(item: &BatchItem) -> BatchItem {
    BatchItem {
        result: None,
        ..item.clone()
    }
}

impl MemoryStore {
    fn batch_now(&self) -> Now {
        self.clock.now()
    }

    /// Runs a worker write on the item `lease` names; `None` when it does not exist.
    fn worker_write<T>(
        &self,
        lease: &ItemLease,
        write: impl FnOnce(&mut BatchRecord, &mut BatchItem, &Now) -> Option<T>,
    ) -> Option<T> {
        let now = self.batch_now();
        let mut tables = self.batches.lock();
        let (batch, item) = tables.leased(lease)?;
        write(batch, item, &now)
    }
}

#[async_trait]
impl BatchStore for MemoryStore {
    async fn submit_batch(&self, batch: crate::NewBatch) -> Result<Submitted> {
        batch.validate()?;
        let now = self.batch_now();
        let mut tables = self.batches.lock();
        if let Some(existing) = tables.batches.iter().find(|stored| {
            stored.batch.user_id == batch.user_id
                && stored.batch.submission_key == batch.submission_key
        }) {
            return Ok(Submitted {
                batch: existing.batch.clone(),
                created: false,
            });
        }
        let (record, items) = batch.into_records(&now.stamp);
        tables.batches.push(Stored::new(record.clone(), items));
        Ok(Submitted {
            batch: record,
            created: true,
        })
    }

    async fn get_batch(&self, scope: &BatchScope, batch_id: &str) -> Result<Option<BatchRecord>> {
        Ok(self
            .batches
            .lock()
            .scoped(scope, batch_id)
            .map(|stored| stored.batch.clone()))
    }

    async fn list_batches(
        &self,
        scope: &BatchScope,
        query: &BatchQuery,
    ) -> Result<Vec<BatchRecord>> {
        query.validate()?;
        let tables = self.batches.lock();
        let mut found: Vec<&BatchRecord> = tables
            .batches
            .iter()
            .map(|stored| &stored.batch)
            .filter(|batch| scope.sees(batch) && query.status.is_none_or(|s| batch.status == s))
            .collect();
        found.sort_by(|a, b| (&b.created_at, &b.id).cmp(&(&a.created_at, &a.id)));
        Ok(found
            .into_iter()
            .skip(query.offset as usize)
            .take(query.limit as usize)
            .cloned()
            .collect())
    }

    async fn list_items(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        query: &ItemQuery,
    ) -> Result<Vec<BatchItem>> {
        query.validate()?;
        let mut tables = self.batches.lock();
        let Some(stored) = tables.scoped(scope, batch_id) else {
            return Ok(Vec::new());
        };
        Ok(stored
            .items
            .iter()
            .filter(|item| query.status.is_none_or(|s| item.status == s))
            .skip(query.offset as usize)
            .take(query.limit as usize)
            .map(without_result)
            .collect())
    }

    async fn get_item(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        item_id: &str,
    ) -> Result<Option<BatchItem>> {
        let mut tables = self.batches.lock();
        Ok(tables
            .scoped(scope, batch_id)
            .and_then(|stored| stored.item_mut(item_id))
            .map(|(_, item)| item.clone()))
    }

    async fn export_items(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        after_position: Option<u32>,
    ) -> Result<Vec<BatchItem>> {
        let mut tables = self.batches.lock();
        let Some(stored) = tables.scoped(scope, batch_id) else {
            return Ok(Vec::new());
        };
        Ok(stored
            .items
            .iter()
            .filter(|item| after_position.is_none_or(|after| item.position > after))
            .take(EXPORT_PAGE as usize)
            .cloned()
            .collect())
    }

    async fn pause_batch(&self, scope: &BatchScope, batch_id: &str) -> Result<Option<BatchRecord>> {
        let now = self.batch_now();
        let mut tables = self.batches.lock();
        Ok(tables.scoped(scope, batch_id).map(|stored| {
            machine::pause(&mut stored.batch, &now);
            stored.batch.clone()
        }))
    }

    async fn mark_budget(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        level: u32,
        pause: bool,
    ) -> Result<Option<(BatchRecord, u32)>> {
        let now = self.batch_now();
        let mut tables = self.batches.lock();
        Ok(tables.scoped(scope, batch_id).map(|stored| {
            let previous = stored.batch.budget_level;
            machine::budget(&mut stored.batch, &now, level, pause);
            (stored.batch.clone(), previous)
        }))
    }

    async fn resume_batch(
        &self,
        scope: &BatchScope,
        batch_id: &str,
    ) -> Result<Option<BatchRecord>> {
        let now = self.batch_now();
        let mut tables = self.batches.lock();
        Ok(tables.scoped(scope, batch_id).map(|stored| {
            machine::resume(&mut stored.batch, &now);
            stored.batch.clone()
        }))
    }

    async fn cancel_batch(
        &self,
        scope: &BatchScope,
        batch_id: &str,
    ) -> Result<Option<BatchRecord>> {
        let now = self.batch_now();
        let mut tables = self.batches.lock();
        Ok(tables.scoped(scope, batch_id).map(|stored| {
            if machine::cancel(&mut stored.batch, &now) {
                for item in &mut stored.items {
                    machine::cancel_with_batch(&mut stored.batch, item, &now);
                }
            }
            stored.batch.clone()
        }))
    }

    async fn retry_item(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        item_id: &str,
    ) -> Result<RetryOutcome> {
        let now = self.batch_now();
        let mut tables = self.batches.lock();
        let Some(stored) = tables.scoped(scope, batch_id) else {
            return Ok(RetryOutcome::BatchNotFound);
        };
        let Some((batch, item)) = stored.item_mut(item_id) else {
            return Ok(RetryOutcome::NotFailed);
        };
        Ok(match machine::retry(batch, item, &now) {
            Ok(()) => RetryOutcome::Retried {
                batch: Box::new(batch.clone()),
                item: Box::new(item.clone()),
            },
            Err(machine::RetryRefusal::NotFailed) => RetryOutcome::NotFailed,
            Err(machine::RetryRefusal::BatchCancelled) => RetryOutcome::BatchCancelled,
        })
    }

    async fn claim_pass(&self, request: &ClaimRequest) -> Result<ClaimPass> {
        request.validate()?;
        let now = self.batch_now();
        let expires_at = now.millis.saturating_add(millis(request.lease));
        let mut pass = ClaimPass {
            lease_owner: request.mint_lease_owner(),
            ..ClaimPass::default()
        };
        let mut tables = self.batches.lock();
        let mut order: Vec<usize> = (0..tables.batches.len())
            .filter(|&i| tables.batches[i].batch.status.is_active())
            .collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (&tables.batches[a].batch, &tables.batches[b].batch);
            (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id))
        });
        let mut free = u64::from(request.free_slots);
        let mut admitted = request.admitted;
        for index in order {
            let Stored { batch, items, .. } = &mut tables.batches[index];
            for item in items.iter_mut() {
                if machine::expired(item, &now) {
                    machine::recover_expired(batch, item, &now);
                    pass.expired += 1;
                }
            }
            let mut quota = machine::promotion_quota(batch);
            for item in items.iter_mut() {
                if quota == 0 {
                    break;
                }
                if item.status == BatchItemStatus::Pending {
                    machine::promote(batch, item, &now);
                    pass.promoted += 1;
                    quota -= 1;
                }
            }
            let mut quota = machine::claim_quota(batch, free);
            let mut claimed = Vec::new();
            for item in items.iter_mut() {
                if quota == 0 {
                    break;
                }
                if machine::claimable(item) {
                    machine::claim(
                        batch,
                        item,
                        &pass.lease_owner,
                        expires_at,
                        &mut admitted,
                        &now,
                    );
                    claimed.push(item.clone());
                    quota -= 1;
                }
            }
            free -= claimed.len() as u64;
            pass.add_claims(batch, claimed);
        }
        Ok(pass)
    }

    async fn mark_running(&self, lease: &ItemLease) -> Result<bool> {
        Ok(self
            .worker_write(lease, |batch, item, now| {
                Some(machine::mark_running(batch, item, lease, now))
            })
            .unwrap_or(false))
    }

    async fn renew_lease(&self, lease: &ItemLease, ttl: Duration) -> Result<Renewal> {
        Ok(self
            .worker_write(lease, |_, item, now| {
                let expires_at = now.millis.saturating_add(millis(ttl));
                Some(machine::renew(item, lease, expires_at, now))
            })
            .unwrap_or(Renewal::Lost))
    }

    async fn finish_attempts(
        &self,
        outcomes: &[(ItemLease, AttemptOutcome)],
    ) -> Result<Vec<Option<BatchItemStatus>>> {
        Ok(outcomes
            .iter()
            .map(|(lease, outcome)| {
                self.worker_write(lease, |batch, item, now| match outcome {
                    AttemptOutcome::Succeeded(success) => {
                        machine::finish_success(batch, item, lease, success, now)
                    }
                    AttemptOutcome::Failed(failure) => {
                        machine::finish_failure(batch, item, lease, failure, now)
                    }
                })
            })
            .collect())
    }

    async fn release_claim(
        &self,
        lease: &ItemLease,
        reason: &ReleaseReason,
    ) -> Result<Option<BatchItemStatus>> {
        Ok(self.worker_write(lease, |batch, item, now| {
            machine::release(batch, item, lease, reason, now)
        }))
    }

    async fn heartbeat(&self, worker: &WorkerHeartbeat) -> Result<()> {
        let at = self.batch_now().millis;
        self.batches
            .lock()
            .workers
            .insert(worker.worker_id.clone(), (worker.clone(), at));
        Ok(())
    }

    async fn remove_worker(&self, worker_id: &str) -> Result<bool> {
        Ok(self.batches.lock().workers.remove(worker_id).is_some())
    }

    async fn live_workers(&self, max_age: Duration) -> Result<u64> {
        let cutoff = self.batch_now().millis.saturating_sub(millis(max_age));
        Ok(self
            .batches
            .lock()
            .workers
            .values()
            .filter(|(_, at)| *at > cutoff)
            .count() as u64)
    }

    async fn batch_totals(&self) -> Result<BatchTotals> {
        let tables = self.batches.lock();
        let mut items = BatchCounts::default();
        let mut batches: Vec<(BatchStatus, u64)> = Vec::new();
        for stored in &tables.batches {
            for (status, count) in stored.batch.counts.iter() {
                items.add(status, count);
            }
            batches.push((stored.batch.status, 1));
        }
        Ok(BatchTotals::new(batches, items))
    }

    async fn batch_activity(
        &self,
        scope: &BatchScope,
        query: &ActivityQuery,
    ) -> Result<Vec<BatchActivity>> {
        query.validate()?;
        let tables = self.batches.lock();
        let named = |id: &String| query.batch_ids.as_ref().is_none_or(|ids| ids.contains(id));
        let rows = tables
            .batches
            .iter()
            .filter(|stored| scope.sees(&stored.batch) && named(&stored.batch.id))
            .flat_map(|stored| stored.items.iter())
            .map(|item| {
                let recent = recently_completed(item, &query.completed_since);
                ActivityRow {
                    batch_id: item.batch_id.clone(),
                    model_name: item.model_name.clone(),
                    items_with_usage: u64::from(item.token_usage.is_some()),
                    usage: item.token_usage.unwrap_or_default(),
                    recent_completions: u64::from(recent),
                    recent_first_start: recent
                        .then(|| item.started_at.clone().or(item.completed_at.clone()))
                        .flatten(),
                }
            });
        Ok(fold_activity(rows))
    }
}

/// Whether `item` became `succeeded` or `failed` at or after `since` (RFC 3339 stamps of
/// one fixed width compare as text, as the SQL backends compare them).
fn recently_completed(item: &BatchItem, since: &str) -> bool {
    matches!(
        item.status,
        BatchItemStatus::Succeeded | BatchItemStatus::Failed
    ) && item.completed_at.as_deref().is_some_and(|at| at >= since)
}
