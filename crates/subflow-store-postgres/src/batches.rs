//! Durable batches (docs/batches.md) on PostgreSQL, with the semantics of `MemoryStore`, for
//! any number of `serve` and `worker` processes. Every write is one transaction running
//! one of the shared `subflow_store::batches::rows` functions over this backend's row
//! access ([`rows`]): the batch row locked `FOR UPDATE` (`FOR UPDATE SKIP LOCKED` in a
//! claim pass) before any item row, lease and heartbeat times from the database's
//! `now()`. Reads take no lock.

mod activity;
#[macro_use]
mod rows;

use std::time::Duration;

use async_trait::async_trait;
use subflow_contracts::{BatchItemStatus, BatchStatus};
use subflow_store::batches::machine;
use subflow_store::batches::rows as shared;
use subflow_store::batches::{
    ActivityQuery, AttemptOutcome, BatchActivity, BatchCounts, BatchItem, BatchQuery, BatchRecord,
    BatchScope, BatchStore, BatchTotals, ClaimPass, ClaimRequest, EXPORT_PAGE, ItemLease,
    ItemQuery, NewBatch, ReleaseReason, Renewal, RetryOutcome, Submitted, WorkerHeartbeat,
};
use subflow_store::streams::millis;
use subflow_store::{Result, codec};

use self::rows::{PgRows, batch_from_row, db, item_from_row, load_batch, unsigned};
use crate::{PostgresStore, get};

impl PostgresStore {
    /// Runs `work` over this store's [`BatchRows`](shared::BatchRows) in one transaction,
    /// committed when it answers `Ok` and rolled back otherwise (a dropped sqlx
    /// transaction would keep its row locks until the pooled connection is next used).
    async fn transact<T>(&self, work: impl AsyncFnOnce(&mut PgRows<'_>) -> Result<T>) -> Result<T> {
        let mut tx = self.pool().begin().await.map_err(db)?;
        match work(&mut PgRows { conn: &mut tx }).await {
            Ok(answer) => {
                tx.commit().await.map_err(db)?;
                Ok(answer)
            }
            Err(error) => {
                // The write's own error is the answer; a failed rollback is only logged
                // (the pooled connection rolls back when next used).
                if let Err(rollback) = tx.rollback().await {
                    tracing::warn!(%rollback, "rolling back a failed batch write failed");
                }
                Err(error)
            }
        }
    }

    /// Whether a batch exists in the scope (reads, no lock).
    async fn visible(&self, scope: &BatchScope, batch_id: &str) -> Result<bool> {
        let mut conn = self.pool().acquire().await.map_err(db)?;
        Ok(load_batch(&mut conn, batch_id)
            .await?
            .is_some_and(|batch| scope.sees(&batch)))
    }
}

#[async_trait]
impl BatchStore for PostgresStore {
    async fn submit_batch(&self, batch: NewBatch) -> Result<Submitted> {
        batch.validate()?;
        let (record, items) = batch.into_records(&subflow_store::now_rfc3339());
        self.transact(async |rows| shared::submit(rows, record, &items).await)
            .await
    }

    async fn get_batch(&self, scope: &BatchScope, batch_id: &str) -> Result<Option<BatchRecord>> {
        let mut conn = self.pool().acquire().await.map_err(db)?;
        Ok(load_batch(&mut conn, batch_id)
            .await?
            .filter(|batch| scope.sees(batch)))
    }

    async fn list_batches(
        &self,
        scope: &BatchScope,
        query: &BatchQuery,
    ) -> Result<Vec<BatchRecord>> {
        query.validate()?;
        let rows = sqlx::query(concat!(
            "SELECT ",
            batch_columns!(),
            " FROM subagent_batches WHERE user_id = $1 AND ($2::text IS NULL OR thread_id = $2) \
             AND ($3::text IS NULL OR status = $3) ORDER BY created_at DESC, id DESC \
             LIMIT $4 OFFSET $5"
        ))
        .bind(&scope.user_id)
        .bind(&scope.thread_id)
        .bind(query.status.map(BatchStatus::as_str))
        .bind(i64::from(query.limit))
        .bind(i64::from(query.offset))
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        rows.iter().map(batch_from_row).collect()
    }

    async fn list_items(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        query: &ItemQuery,
    ) -> Result<Vec<BatchItem>> {
        query.validate()?;
        if !self.visible(scope, batch_id).await? {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(concat!(
            "SELECT ",
            listed_item_columns!(),
            " FROM subagent_batch_items WHERE batch_id = $1 \
             AND ($2::text IS NULL OR status = $2) ORDER BY position LIMIT $3 OFFSET $4"
        ))
        .bind(batch_id)
        .bind(query.status.map(BatchItemStatus::as_str))
        .bind(i64::from(query.limit))
        .bind(i64::from(query.offset))
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        rows.iter().map(item_from_row).collect()
    }

    async fn get_item(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        item_id: &str,
    ) -> Result<Option<BatchItem>> {
        if !self.visible(scope, batch_id).await? {
            return Ok(None);
        }
        let row = sqlx::query(concat!(
            "SELECT ",
            item_columns!(),
            " FROM subagent_batch_items WHERE id = $1 AND batch_id = $2"
        ))
        .bind(item_id)
        .bind(batch_id)
        .fetch_optional(self.pool())
        .await
        .map_err(db)?;
        row.as_ref().map(item_from_row).transpose()
    }

    async fn export_items(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        after_position: Option<u32>,
    ) -> Result<Vec<BatchItem>> {
        if !self.visible(scope, batch_id).await? {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(concat!(
            "SELECT ",
            item_columns!(),
            " FROM subagent_batch_items WHERE batch_id = $1 AND position > $2 \
             ORDER BY position LIMIT $3"
        ))
        .bind(batch_id)
        .bind(after_position.map_or(-1, i64::from))
        .bind(i64::from(EXPORT_PAGE))
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        rows.iter().map(item_from_row).collect()
    }

    async fn pause_batch(&self, scope: &BatchScope, batch_id: &str) -> Result<Option<BatchRecord>> {
        self.transact(async |rows| shared::control(rows, scope, batch_id, machine::pause).await)
            .await
    }

    async fn mark_budget(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        level: u32,
        pause: bool,
    ) -> Result<Option<(BatchRecord, u32)>> {
        self.transact(async |rows| shared::mark_budget(rows, scope, batch_id, level, pause).await)
            .await
    }

    async fn resume_batch(
        &self,
        scope: &BatchScope,
        batch_id: &str,
    ) -> Result<Option<BatchRecord>> {
        self.transact(async |rows| shared::control(rows, scope, batch_id, machine::resume).await)
            .await
    }

    async fn cancel_batch(
        &self,
        scope: &BatchScope,
        batch_id: &str,
    ) -> Result<Option<BatchRecord>> {
        self.transact(async |rows| shared::cancel(rows, scope, batch_id).await)
            .await
    }

    async fn retry_item(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        item_id: &str,
    ) -> Result<RetryOutcome> {
        self.transact(async |rows| shared::retry(rows, scope, batch_id, item_id).await)
            .await
    }

    async fn claim_pass(&self, request: &ClaimRequest) -> Result<ClaimPass> {
        request.validate()?;
        self.transact(async |rows| shared::claim_pass(rows, request).await)
            .await
    }

    async fn mark_running(&self, lease: &ItemLease) -> Result<bool> {
        self.transact(async |rows| shared::mark_running(rows, lease).await)
            .await
    }

    async fn renew_lease(&self, lease: &ItemLease, ttl: Duration) -> Result<Renewal> {
        self.transact(async |rows| shared::renew_lease(rows, lease, ttl).await)
            .await
    }

    /// One transaction: the outcomes' batch rows locked in id order, then their items.
    async fn finish_attempts(
        &self,
        outcomes: &[(ItemLease, AttemptOutcome)],
    ) -> Result<Vec<Option<BatchItemStatus>>> {
        if outcomes.is_empty() {
            return Ok(Vec::new());
        }
        self.transact(async |rows| shared::finish_attempts(rows, outcomes).await)
            .await
    }

    async fn release_claim(
        &self,
        lease: &ItemLease,
        reason: &ReleaseReason,
    ) -> Result<Option<BatchItemStatus>> {
        self.transact(async |rows| shared::release_claim(rows, lease, reason).await)
            .await
    }

    async fn heartbeat(&self, worker: &WorkerHeartbeat) -> Result<()> {
        sqlx::query(concat!(
            "INSERT INTO subagent_batch_workers (worker_id, hostname, started_at, heartbeat_at) \
             VALUES ($1, $2, $3, ",
            db_now!(),
            ") ON CONFLICT (worker_id) DO UPDATE SET \
             hostname = excluded.hostname, heartbeat_at = excluded.heartbeat_at"
        ))
        .bind(&worker.worker_id)
        .bind(&worker.hostname)
        .bind(&worker.started_at)
        .execute(self.pool())
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn remove_worker(&self, worker_id: &str) -> Result<bool> {
        let removed = sqlx::query("DELETE FROM subagent_batch_workers WHERE worker_id = $1")
            .bind(worker_id)
            .execute(self.pool())
            .await
            .map_err(db)?;
        Ok(removed.rows_affected() > 0)
    }

    async fn live_workers(&self, max_age: Duration) -> Result<u64> {
        let live: i64 = sqlx::query_scalar(concat!(
            "SELECT COUNT(*) FROM subagent_batch_workers WHERE heartbeat_at > ",
            db_now!(),
            " - $1"
        ))
        .bind(millis(max_age))
        .fetch_one(self.pool())
        .await
        .map_err(db)?;
        Ok(live.max(0) as u64)
    }

    async fn batch_totals(&self) -> Result<BatchTotals> {
        let rows =
            sqlx::query("SELECT status, COUNT(*) AS n FROM subagent_batches GROUP BY status")
                .fetch_all(self.pool())
                .await
                .map_err(db)?;
        let batches = rows
            .iter()
            .map(|row| {
                let status: BatchStatus =
                    codec::parse("subagent_batches.status", get(row, "status")?)?;
                Ok((status, unsigned(row, "n")?))
            })
            .collect::<Result<Vec<_>>>()?;
        let row = sqlx::query(
            "SELECT COALESCE(SUM(pending_count), 0)::bigint AS pending, \
             COALESCE(SUM(queued_count), 0)::bigint AS queued, \
             COALESCE(SUM(leased_count), 0)::bigint AS leased, \
             COALESCE(SUM(running_count), 0)::bigint AS running, \
             COALESCE(SUM(succeeded_count), 0)::bigint AS succeeded, \
             COALESCE(SUM(failed_count), 0)::bigint AS failed, \
             COALESCE(SUM(cancelled_count), 0)::bigint AS cancelled FROM subagent_batches",
        )
        .fetch_one(self.pool())
        .await
        .map_err(db)?;
        let items = BatchCounts {
            pending: unsigned(&row, "pending")?,
            queued: unsigned(&row, "queued")?,
            leased: unsigned(&row, "leased")?,
            running: unsigned(&row, "running")?,
            succeeded: unsigned(&row, "succeeded")?,
            failed: unsigned(&row, "failed")?,
            cancelled: unsigned(&row, "cancelled")?,
        };
        Ok(BatchTotals::new(batches, items))
    }

    async fn batch_activity(
        &self,
        scope: &BatchScope,
        query: &ActivityQuery,
    ) -> Result<Vec<BatchActivity>> {
        activity::batch_activity(self, scope, query).await
    }
}
