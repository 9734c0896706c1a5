//! A batch store that delegates to a real one, with faults a test switches on: claim
//! passes held at a gate after they ran, claims left `leased` by the pass, and outcome,
//! start and release writes that fail.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use subflow_contracts::BatchItemStatus;
use subflow_store::{
    AttemptOutcome, BatchItem, BatchQuery, BatchRecord, BatchScope, BatchStore, BatchTotals,
    ClaimPass, ClaimRequest, Error, ItemLease, ItemQuery, NewBatch, ReleaseReason, Renewal, Result,
    RetryOutcome, Submitted, WorkerHeartbeat,
};
use tokio::sync::{Notify, Semaphore};

#[derive(Debug)]
pub struct Faults {
    inner: Arc<dyn BatchStore>,
    /// When set, a claim pass that ran waits for a permit before it returns, after
    /// telling `claim_ran`.
    pub claim_gate: Option<Arc<Semaphore>>,
    pub claim_ran: Arc<Notify>,
    /// How many `finish_success` calls fail before reaching the store.
    pub failing_finishes: AtomicU32,
    /// `finish_success` calls seen.
    pub finish_calls: AtomicU32,
    /// When set, claim passes start nothing `running`: every claim is admitted and
    /// marked running by its attempt.
    pub leave_leased: AtomicBool,
    /// How many `mark_running` calls fail before reaching the store.
    pub failing_starts: AtomicU32,
    /// How many `release_claim` calls fail before reaching the store.
    pub failing_releases: AtomicU32,
    /// `release_claim` calls seen.
    pub release_calls: AtomicU32,
}

impl Faults {
    pub fn new(inner: Arc<dyn BatchStore>) -> Self {
        Faults {
            inner,
            claim_gate: None,
            claim_ran: Arc::new(Notify::new()),
            failing_finishes: AtomicU32::new(0),
            finish_calls: AtomicU32::new(0),
            leave_leased: AtomicBool::new(false),
            failing_starts: AtomicU32::new(0),
            failing_releases: AtomicU32::new(0),
            release_calls: AtomicU32::new(0),
        }
    }
}

fn injected() -> Error {
    Error::backend(std::io::Error::other("injected write failure"))
}

/// Takes one from `count` if it is not zero: whether this call fails.
fn fails(count: &AtomicU32) -> bool {
    count
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[async_trait]
impl BatchStore for Faults {
    async fn submit_batch(&self, batch: NewBatch) -> Result<Submitted> {
        self.inner.submit_batch(batch).await
    }
    async fn get_batch(&self, scope: &BatchScope, batch_id: &str) -> Result<Option<BatchRecord>> {
        self.inner.get_batch(scope, batch_id).await
    }
    async fn list_batches(
        &self,
        scope: &BatchScope,
        query: &BatchQuery,
    ) -> Result<Vec<BatchRecord>> {
        self.inner.list_batches(scope, query).await
    }
    async fn list_items(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        query: &ItemQuery,
    ) -> Result<Vec<BatchItem>> {
        self.inner.list_items(scope, batch_id, query).await
    }
    async fn get_item(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        item_id: &str,
    ) -> Result<Option<BatchItem>> {
        self.inner.get_item(scope, batch_id, item_id).await
    }
    async fn export_items(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        after_position: Option<u32>,
    ) -> Result<Vec<BatchItem>> {
        self.inner
            .export_items(scope, batch_id, after_position)
            .await
    }
    async fn pause_batch(&self, scope: &BatchScope, batch_id: &str) -> Result<Option<BatchRecord>> {
        self.inner.pause_batch(scope, batch_id).await
    }
    async fn mark_budget(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        level: u32,
        pause: bool,
    ) -> Result<Option<(BatchRecord, u32)>> {
        self.inner.mark_budget(scope, batch_id, level, pause).await
    }
    async fn resume_batch(
        &self,
        scope: &BatchScope,
        batch_id: &str,
    ) -> Result<Option<BatchRecord>> {
        self.inner.resume_batch(scope, batch_id).await
    }
    async fn cancel_batch(
        &self,
        scope: &BatchScope,
        batch_id: &str,
    ) -> Result<Option<BatchRecord>> {
        self.inner.cancel_batch(scope, batch_id).await
    }
    async fn retry_item(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        item_id: &str,
    ) -> Result<RetryOutcome> {
        self.inner.retry_item(scope, batch_id, item_id).await
    }
    async fn claim_pass(&self, request: &ClaimRequest) -> Result<ClaimPass> {
        let pass = if self.leave_leased.load(Ordering::SeqCst) {
            let leased = ClaimRequest {
                admitted: 0,
                ..request.clone()
            };
            self.inner.claim_pass(&leased).await
        } else {
            self.inner.claim_pass(request).await
        };
        if let Some(gate) = &self.claim_gate {
            self.claim_ran.notify_one();
            gate.acquire().await.unwrap().forget();
        }
        pass
    }
    async fn mark_running(&self, lease: &ItemLease) -> Result<bool> {
        if fails(&self.failing_starts) {
            return Err(injected());
        }
        self.inner.mark_running(lease).await
    }
    async fn renew_lease(&self, lease: &ItemLease, ttl: Duration) -> Result<Renewal> {
        self.inner.renew_lease(lease, ttl).await
    }
    /// Each success is one finish call, counted; an injected failure stops the list
    /// there.
    async fn finish_attempts(
        &self,
        outcomes: &[(ItemLease, AttemptOutcome)],
    ) -> Result<Vec<Option<BatchItemStatus>>> {
        let mut statuses = Vec::with_capacity(outcomes.len());
        for outcome in outcomes {
            if !matches!(outcome.1, AttemptOutcome::Succeeded(_)) {
                statuses.extend(
                    self.inner
                        .finish_attempts(std::slice::from_ref(outcome))
                        .await?,
                );
                continue;
            }
            self.finish_calls.fetch_add(1, Ordering::SeqCst);
            if fails(&self.failing_finishes) {
                return Err(injected());
            }
            statuses.extend(
                self.inner
                    .finish_attempts(std::slice::from_ref(outcome))
                    .await?,
            );
        }
        Ok(statuses)
    }
    async fn release_claim(
        &self,
        lease: &ItemLease,
        reason: &ReleaseReason,
    ) -> Result<Option<BatchItemStatus>> {
        self.release_calls.fetch_add(1, Ordering::SeqCst);
        if fails(&self.failing_releases) {
            return Err(injected());
        }
        self.inner.release_claim(lease, reason).await
    }
    async fn heartbeat(&self, worker: &WorkerHeartbeat) -> Result<()> {
        self.inner.heartbeat(worker).await
    }
    async fn remove_worker(&self, worker_id: &str) -> Result<bool> {
        self.inner.remove_worker(worker_id).await
    }
    async fn live_workers(&self, max_age: Duration) -> Result<u64> {
        self.inner.live_workers(max_age).await
    }
    async fn batch_totals(&self) -> Result<BatchTotals> {
        self.inner.batch_totals().await
    }
    async fn batch_activity(
        &self,
        scope: &BatchScope,
        query: &subflow_store::ActivityQuery,
    ) -> Result<Vec<subflow_store::BatchActivity>> {
        self.inner.batch_activity(scope, query).await
    }
}
