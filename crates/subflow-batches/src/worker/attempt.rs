//! One claimed attempt of an item, from its claim to its outcome write (docs/batches.md#item-states, docs/batches.md#leases-and-fencing, docs/batches.md#running-an-item): admission through the controller `task` shares, `leased` → `running`,
//! the subagent rebuilt from the batch's `execution_spec` and run after the
//! at-least-once preamble, the lease renewed all along, and the outcome written once
//! the execution ends (retried once, then handed back with backoff while the store takes
//! no writes), with nothing written when the worker stopped it.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use subflow_contracts::SubagentStatus;
use subflow_runtime::budget::BudgetScope;
use subflow_runtime::subagent::{ExecutionReport, ExecutionSpec};
use subflow_store::batches::{ActivityQuery, BatchActivity, BatchScope};
use subflow_store::{
    AttemptOutcome, ClaimedItem, ItemFailure, ItemLease, ItemSuccess, ReleaseReason, Renewal,
};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::finisher::{Written, twice};
use super::{Counted, Shared};
use crate::item::{StoredResult, capped_error, item_prompt, item_usage};
use crate::metrics::AttemptEnd;

/// Why the worker stopped a local execution; the first cause wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopCause {
    /// The worker is shutting down.
    Shutdown,
    /// The item was claimed again while this execution still ran.
    Drained,
    /// A renewal found the lease held by someone else.
    LeaseLost,
    /// A renewal found a cancel request (the batch was cancelled).
    CancelRequested,
}

/// How a local execution can be stopped from outside.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stopper {
    cancel: CancellationToken,
    cause: Arc<OnceLock<StopCause>>,
}

impl Stopper {
    /// Stops the execution at its next await point; the first cause is kept.
    pub fn stop(&self, cause: StopCause) {
        let _ = self.cause.set(cause);
        self.cancel.cancel();
    }

    fn cause(&self) -> Option<StopCause> {
        self.cause.get().copied()
    }
}

/// Where the work of an attempt got to.
enum Outcome {
    /// The batch's `execution_spec` cannot be used.
    Unusable(String),
    /// Stopped while waiting for admission.
    NotAdmitted,
    /// The admission controller refused it or timed out.
    Rejected(String),
    /// `leased` → `running` was refused: the lease is gone or a cancel was requested.
    NotStarted,
    /// `leased` → `running` could not be written.
    StartUnstored,
    /// The execution ran to its end.
    Ran(ExecutionReport),
}

/// One claimed attempt.
pub(crate) struct Attempt {
    pub shared: Arc<Shared>,
    pub claimed: ClaimedItem,
    pub stopper: Stopper,
    pub claimed_at: Instant,
}

impl Attempt {
    /// Runs the attempt to its end and counts how it ended. `admitted` is the admission
    /// slot the claim pass started the item `running` on, if it did; `counted` is let go
    /// once the execution is over, before the outcome is written.
    pub async fn run(self, admitted: Option<OwnedSemaphorePermit>, mut counted: Counted) {
        let lease = self.claimed.lease();
        // Boxed: the execution's future is most of an attempt's size, and a spawned
        // attempt is copied into its task whole (7.9 KB inline, 2.9 KB boxed).
        let mut work = Box::pin(self.work(&lease, admitted));
        let outcome = tokio::select! {
            outcome = &mut work => outcome,
            // Renewals end only by stopping the execution, which then ends promptly.
            () = self.renew(&lease) => work.await,
        };
        counted.execution_ended();
        if let Outcome::Ran(ExecutionReport {
            model_name,
            usage: Some(usage),
            ..
        }) = &outcome
        {
            self.shared.metrics.execution_usage(model_name, usage);
        }
        let end = self.settle(&lease, outcome).await;
        if matches!(end, AttemptEnd::Finished(_)) {
            self.check_budget().await;
        }
        let item = &self.claimed.item;
        tracing::info!(
            batch_id = %item.batch_id,
            item_key = %item.item_key,
            attempt = item.attempt,
            "batch item attempt ended: {end:?}"
        );
        self.shared.metrics.attempt_finished(
            &self.claimed.batch.subagent_type,
            end,
            self.claimed_at.elapsed(),
        );
    }

    async fn work(&self, lease: &ItemLease, admitted: Option<OwnedSemaphorePermit>) -> Outcome {
        let spec = match ExecutionSpec::from_value(&self.claimed.batch.execution_spec) {
            Ok(spec) => spec,
            Err(error) => return Outcome::Unusable(error.to_string()),
        };
        let _slot = match admitted {
            // The claim pass already started the item running on this slot.
            Some(slot) => slot,
            None => match self.admit_and_start(lease).await {
                Ok(slot) => slot,
                Err(outcome) => return outcome,
            },
        };
        let (batch, item) = (&self.claimed.batch, &self.claimed.item);
        let mut execution = spec.execution(
            item_prompt(&item.item_key, &item.prompt),
            format!("{}:{}", item.id, item.attempt),
            format!("batch item {}", item.item_key),
            vec![
                ("batch_id".to_owned(), batch.id.clone()),
                ("item_key".to_owned(), item.item_key.clone()),
            ],
        );
        execution.batch_spent = self.batch_spent().await;
        let report = self
            .shared
            .runtime
            .execute_detached(execution, self.stopper.cancel.clone())
            .await;
        Outcome::Ran(report)
    }

    /// What the batch's items have spent, when `budgets.batch_max_cost` is set; `None`
    /// without one, or when the store cannot say (logged).
    async fn batch_spent(&self) -> Option<f64> {
        let budgets = self.shared.runtime.budgets()?;
        budgets.config.limit(BudgetScope::Batch)?;
        let batch = &self.claimed.batch;
        let scope = BatchScope::thread(&batch.user_id, &batch.thread_id);
        let query = ActivityQuery {
            batch_ids: Some(vec![batch.id.clone()]),
            completed_since: subflow_store::now_rfc3339(),
        };
        match self.shared.store.batch_activity(&scope, &query).await {
            Ok(found) => Some(BatchActivity::find(&found, &batch.id).spent(&budgets.models)),
            Err(error) => {
                tracing::warn!(%error, batch_id = %batch.id, "reading the batch's spend failed");
                None
            }
        }
    }

    /// After an outcome is stored: records how far the batch's spend went against its
    /// budget, pausing it at the limit, and reports each crossing once.
    async fn check_budget(&self) {
        let Some(spent) = self.batch_spent().await else {
            return;
        };
        let Some(budgets) = self.shared.runtime.budgets().cloned() else {
            return;
        };
        let batch = &self.claimed.batch;
        let level = budgets.config.level(BudgetScope::Batch, spent);
        let reached = budgets
            .config
            .limit(BudgetScope::Batch)
            .is_some_and(|limit| spent >= limit);
        let scope = BatchScope::thread(&batch.user_id, &batch.thread_id);
        let previous = match self
            .shared
            .store
            .mark_budget(&scope, &batch.id, level, reached)
            .await
        {
            Ok(Some((_, previous))) => previous,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(%error, batch_id = %batch.id, "recording the batch's budget failed");
                return;
            }
        };
        let events = budgets
            .config
            .crossings(BudgetScope::Batch, spent, previous, level);
        if reached && previous < level {
            tracing::warn!(batch_id = %batch.id, spent, "batch paused: its budget is spent");
        }
        self.shared
            .runtime
            .report_batch_budget((&batch.user_id, &batch.thread_id, &batch.id), spent, events)
            .await;
    }

    /// Waits for an admission slot, then moves the item `leased` → `running`.
    async fn admit_and_start(&self, lease: &ItemLease) -> Result<OwnedSemaphorePermit, Outcome> {
        let admission = self.shared.runtime.admission();
        let admitted = tokio::select! {
            biased;
            () = self.stopper.cancel.cancelled() => return Err(Outcome::NotAdmitted),
            admitted = admission.admit() => admitted,
        };
        let slot = admitted.map_err(|error| Outcome::Rejected(error.to_string()))?;
        match self.shared.store.mark_running(lease).await {
            Ok(true) => Ok(slot),
            Ok(false) => Err(Outcome::NotStarted),
            Err(error) => {
                tracing::warn!(%error, item_id = %lease.item_id, "marking a batch item running failed; handing it back");
                Err(Outcome::StartUnstored)
            }
        }
    }

    /// Renews the lease every `renew_every` until a renewal says to stop, then stops
    /// the execution. A failed renewal is retried at the next tick.
    async fn renew(&self, lease: &ItemLease) {
        let every = self.shared.renew_every;
        let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match self
                .shared
                .store
                .renew_lease(lease, self.shared.lease)
                .await
            {
                Ok(Renewal::Held { .. }) => {}
                Ok(Renewal::CancelRequested) => {
                    return self.stopper.stop(StopCause::CancelRequested);
                }
                Ok(Renewal::Lost) => return self.stopper.stop(StopCause::LeaseLost),
                Err(error) => {
                    tracing::warn!(%error, item_id = %lease.item_id, "renewing a batch item lease failed")
                }
            }
        }
    }

    /// Writes what the attempt came to, unless the worker stopped it.
    async fn settle(&self, lease: &ItemLease, outcome: Outcome) -> AttemptEnd {
        if let Some(cause) = self.stopper.cause() {
            // Finalise nothing: the lease went elsewhere, the batch was cancelled (the
            // item already is), or the worker stops and lease expiry hands the item on.
            // A claim not yet admitted at shutdown is handed back at once.
            return match (cause, outcome) {
                (StopCause::Shutdown, Outcome::NotAdmitted) => {
                    self.release(lease, ReleaseReason::ShutdownBeforeAdmission)
                        .await
                }
                _ => AttemptEnd::Stopped,
            };
        }
        match outcome {
            Outcome::Unusable(error) => self.fail(lease, error, None).await,
            Outcome::NotAdmitted | Outcome::NotStarted => AttemptEnd::Stopped,
            Outcome::StartUnstored => {
                self.until_stored(|| self.release(lease, ReleaseReason::StartUnstored))
                    .await
            }
            Outcome::Rejected(reason) => {
                self.release(lease, ReleaseReason::AdmissionRejected(reason))
                    .await
            }
            Outcome::Ran(report) if report.status == SubagentStatus::Completed => {
                let stored = StoredResult::cap(
                    report.result.as_deref().unwrap_or_default(),
                    self.shared.max_result_chars,
                    self.shared.result_preview_max_chars,
                );
                let success = ItemSuccess {
                    result: stored.result,
                    result_preview: stored.preview,
                    result_truncated: stored.truncated,
                    model_name: Some(report.model_name),
                    stop_reason: report.stop_reason,
                    token_usage: item_usage(report.usage),
                };
                let outcome = AttemptOutcome::Succeeded(success);
                self.finish(lease, outcome).await
            }
            Outcome::Ran(report) => {
                let error = report
                    .error
                    .clone()
                    .unwrap_or_else(|| format!("Task {}", report.status));
                self.fail(lease, error, Some(report)).await
            }
        }
    }

    async fn fail(
        &self,
        lease: &ItemLease,
        error: String,
        report: Option<ExecutionReport>,
    ) -> AttemptEnd {
        let failure = ItemFailure {
            error: capped_error(&error),
            model_name: report.as_ref().map(|r| r.model_name.clone()),
            stop_reason: report.as_ref().and_then(|r| r.stop_reason),
            token_usage: report.and_then(|r| item_usage(r.usage)),
        };
        let outcome = AttemptOutcome::Failed(failure);
        self.finish(lease, outcome).await
    }

    /// Writes the attempt's outcome; when that failed twice, hands the claim back at once
    /// so the item runs again now instead of after its lease.
    async fn finish(&self, lease: &ItemLease, outcome: AttemptOutcome) -> AttemptEnd {
        self.until_stored(|| async {
            match finished(self.shared.finisher.finish(lease, outcome.clone()).await) {
                AttemptEnd::WriteFailed => {
                    self.release(lease, ReleaseReason::OutcomeUnstored).await
                }
                end => end,
            }
        })
        .await
    }

    /// Runs `write` until it lands: when the store takes no writes (a full disk, an
    /// outage), it is tried again with backoff until a lease has passed, so the item moves
    /// on as soon as the store is back instead of waiting out its lease.
    async fn until_stored<F, W>(&self, write: W) -> AttemptEnd
    where
        W: Fn() -> F,
        F: Future<Output = AttemptEnd>,
    {
        let give_up = Instant::now() + self.shared.lease;
        let mut backoff = FINISH_RETRY_MIN;
        loop {
            match write().await {
                AttemptEnd::WriteFailed if Instant::now() < give_up => {}
                end => return end,
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(FINISH_RETRY_MAX);
        }
    }

    async fn release(&self, lease: &ItemLease, reason: ReleaseReason) -> AttemptEnd {
        match twice(|| self.shared.store.release_claim(lease, &reason)).await {
            Ok(Some(_)) => AttemptEnd::Released,
            Ok(None) => AttemptEnd::Fenced,
            Err(_) => AttemptEnd::WriteFailed,
        }
    }
}

/// The first and the longest pause before an unstored outcome or release is tried again.
const FINISH_RETRY_MIN: Duration = Duration::from_millis(250);
const FINISH_RETRY_MAX: Duration = Duration::from_secs(5);

/// How an outcome write ended.
fn finished(written: Written) -> AttemptEnd {
    match written {
        Ok(Some(status)) => AttemptEnd::Finished(status),
        Ok(None) => AttemptEnd::Fenced,
        Err(_) => AttemptEnd::WriteFailed,
    }
}
