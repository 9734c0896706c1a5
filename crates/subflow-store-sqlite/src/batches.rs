//! Durable batches (docs/batches.md) on SQLite, with the semantics of `MemoryStore`. Every
//! write is one `BEGIN IMMEDIATE` transaction on the writer thread (the single writer
//! serialises claim passes and worker writes) running one of the shared
//! `subflow_store::batches::rows` functions over this backend's row access ([`rows`]).
//! One process uses the file, so lease and heartbeat times are this process's clock (the
//! store's [`Clock`]).
//!
//! [`Clock`]: subflow_store::batches::Clock

mod activity;
mod rows;

use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};
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

use self::rows::{
    BATCH_COLUMNS, ITEM_COLUMNS, LISTED_ITEM_COLUMNS, SqliteRows, count, decode_batch, decode_item,
    load_item, scoped_batch,
};
use crate::{Db, Route, SqliteStore, backend_message, query_all, text};

/// Runs a batch write whose row access never waits (SQLite's calls are synchronous) to
/// its end on the calling thread.
fn at_once<T>(work: impl Future<Output = Result<T>>) -> Result<T> {
    match pin!(work).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(answer) => answer,
        Poll::Pending => Err(backend_message(
            "a SQLite batch write waited for something".to_owned(),
        )),
    }
}

impl SqliteStore {
    /// Ends every batch item lease now: for a `serve` starting on this file. One process
    /// uses a SQLite file, so a lease still held names a process that is gone, and the
    /// next claim pass recovers its items (docs/batches.md#leases-and-fencing) instead of
    /// leaving them `running` for the rest of their lease. How many leases it ended.
    pub async fn expire_item_leases(&self) -> Result<u64> {
        let ended = self
            .write(|conn| {
                conn.prepare_cached(
                    "UPDATE subagent_batch_items SET lease_expires_at = 0 \
                     WHERE status IN ('leased', 'running') AND lease_expires_at > 0",
                )
                .db()?
                .execute([])
                .db()
            })
            .await?;
        Ok(ended as u64)
    }

    /// Runs `work` over this store's [`BatchRows`](shared::BatchRows) in one IMMEDIATE
    /// transaction on the writer thread ([`Route::Queued`]).
    async fn transact<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: AsyncFnOnce(&mut SqliteRows<'_>) -> Result<T> + Send + 'static,
    {
        self.transact_owned((), async move |rows, ()| work(rows).await)
            .await
    }

    /// [`transact`](Self::transact) over data the caller built, which `work` borrows
    /// and which is freed on this side ([`SqliteStore::write_owned`]).
    async fn transact_owned<O, T, F>(&self, owned: O, work: F) -> Result<T>
    where
        O: Send + 'static,
        T: Send + 'static,
        F: AsyncFnOnce(&mut SqliteRows<'_>, &O) -> Result<T> + Send + 'static,
    {
        let clock = self.inner.clock.clone();
        self.write_owned(Route::Queued, owned, move |conn, owned| {
            let mut rows = SqliteRows::new(conn, &clock);
            at_once(work(&mut rows, owned))
        })
        .await
    }
}

#[async_trait]
impl BatchStore for SqliteStore {
    async fn submit_batch(&self, batch: NewBatch) -> Result<Submitted> {
        batch.validate()?;
        let (record, items) = batch.into_records(&self.inner.clock.now().stamp);
        self.transact(async move |rows| shared::submit(rows, record, &items).await)
            .await
    }

    async fn get_batch(&self, scope: &BatchScope, batch_id: &str) -> Result<Option<BatchRecord>> {
        let (scope, batch_id) = (scope.clone(), batch_id.to_owned());
        self.read(move |conn| scoped_batch(conn, &scope, &batch_id))
            .await
    }

    async fn list_batches(
        &self,
        scope: &BatchScope,
        query: &BatchQuery,
    ) -> Result<Vec<BatchRecord>> {
        query.validate()?;
        let scope = scope.clone();
        let status = query.status.map(BatchStatus::as_str);
        let (limit, offset) = (i64::from(query.limit), i64::from(query.offset));
        self.read(move |conn| {
            let sql = format!(
                "SELECT {BATCH_COLUMNS} FROM subagent_batches WHERE user_id = ?1 \
                 AND (?2 IS NULL OR thread_id = ?2) AND (?3 IS NULL OR status = ?3) \
                 ORDER BY created_at DESC, id DESC LIMIT ?4 OFFSET ?5"
            );
            query_all(
                conn,
                &sql,
                params![scope.user_id, scope.thread_id, status, limit, offset],
                decode_batch,
            )
        })
        .await
    }

    async fn list_items(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        query: &ItemQuery,
    ) -> Result<Vec<BatchItem>> {
        query.validate()?;
        let (scope, batch_id, query) = (scope.clone(), batch_id.to_owned(), query.clone());
        self.read(move |conn| {
            if scoped_batch(conn, &scope, &batch_id)?.is_none() {
                return Ok(Vec::new());
            }
            let sql = format!(
                "SELECT {LISTED_ITEM_COLUMNS} FROM subagent_batch_items WHERE batch_id = ?1 \
                 AND (?2 IS NULL OR status = ?2) ORDER BY position LIMIT ?3 OFFSET ?4"
            );
            query_all(
                conn,
                &sql,
                params![
                    batch_id,
                    query.status.map(BatchItemStatus::as_str),
                    i64::from(query.limit),
                    i64::from(query.offset)
                ],
                decode_item,
            )
        })
        .await
    }

    async fn get_item(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        item_id: &str,
    ) -> Result<Option<BatchItem>> {
        let (scope, batch_id, item_id) = (scope.clone(), batch_id.to_owned(), item_id.to_owned());
        self.read(move |conn| {
            if scoped_batch(conn, &scope, &batch_id)?.is_none() {
                return Ok(None);
            }
            load_item(conn, &batch_id, &item_id)
        })
        .await
    }

    async fn export_items(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        after_position: Option<u32>,
    ) -> Result<Vec<BatchItem>> {
        let (scope, batch_id) = (scope.clone(), batch_id.to_owned());
        let after = after_position.map_or(-1, i64::from);
        self.read(move |conn| {
            if scoped_batch(conn, &scope, &batch_id)?.is_none() {
                return Ok(Vec::new());
            }
            let sql = format!(
                "SELECT {ITEM_COLUMNS} FROM subagent_batch_items WHERE batch_id = ? \
                 AND position > ? ORDER BY position LIMIT ?"
            );
            query_all(
                conn,
                &sql,
                params![batch_id, after, i64::from(EXPORT_PAGE)],
                decode_item,
            )
        })
        .await
    }

    async fn pause_batch(&self, scope: &BatchScope, batch_id: &str) -> Result<Option<BatchRecord>> {
        let (scope, batch_id) = (scope.clone(), batch_id.to_owned());
        self.transact(async move |rows| {
            shared::control(rows, &scope, &batch_id, machine::pause).await
        })
        .await
    }

    async fn mark_budget(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        level: u32,
        pause: bool,
    ) -> Result<Option<(BatchRecord, u32)>> {
        let (scope, batch_id) = (scope.clone(), batch_id.to_owned());
        self.transact(async move |rows| {
            shared::mark_budget(rows, &scope, &batch_id, level, pause).await
        })
        .await
    }

    async fn resume_batch(
        &self,
        scope: &BatchScope,
        batch_id: &str,
    ) -> Result<Option<BatchRecord>> {
        let (scope, batch_id) = (scope.clone(), batch_id.to_owned());
        self.transact(async move |rows| {
            shared::control(rows, &scope, &batch_id, machine::resume).await
        })
        .await
    }

    async fn cancel_batch(
        &self,
        scope: &BatchScope,
        batch_id: &str,
    ) -> Result<Option<BatchRecord>> {
        let (scope, batch_id) = (scope.clone(), batch_id.to_owned());
        self.transact(async move |rows| shared::cancel(rows, &scope, &batch_id).await)
            .await
    }

    async fn retry_item(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        item_id: &str,
    ) -> Result<RetryOutcome> {
        let (scope, batch_id, item_id) = (scope.clone(), batch_id.to_owned(), item_id.to_owned());
        self.transact(async move |rows| shared::retry(rows, &scope, &batch_id, &item_id).await)
            .await
    }

    async fn claim_pass(&self, request: &ClaimRequest) -> Result<ClaimPass> {
        request.validate()?;
        let request = request.clone();
        self.transact(async move |rows| shared::claim_pass(rows, &request).await)
            .await
    }

    async fn mark_running(&self, lease: &ItemLease) -> Result<bool> {
        let lease = lease.clone();
        self.transact(async move |rows| shared::mark_running(rows, &lease).await)
            .await
    }

    async fn renew_lease(&self, lease: &ItemLease, ttl: Duration) -> Result<Renewal> {
        let lease = lease.clone();
        self.transact(async move |rows| shared::renew_lease(rows, &lease, ttl).await)
            .await
    }

    /// One write job: each batch row is loaded and written once, each item once.
    async fn finish_attempts(
        &self,
        outcomes: &[(ItemLease, AttemptOutcome)],
    ) -> Result<Vec<Option<BatchItemStatus>>> {
        self.transact_owned(outcomes.to_vec(), async |rows, outcomes| {
            shared::finish_attempts(rows, outcomes).await
        })
        .await
    }

    async fn release_claim(
        &self,
        lease: &ItemLease,
        reason: &ReleaseReason,
    ) -> Result<Option<BatchItemStatus>> {
        let (lease, reason) = (lease.clone(), reason.clone());
        self.transact(async move |rows| shared::release_claim(rows, &lease, &reason).await)
            .await
    }

    async fn heartbeat(&self, worker: &WorkerHeartbeat) -> Result<()> {
        let worker = worker.clone();
        let at = self.inner.clock.now().millis;
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO subagent_batch_workers (worker_id, hostname, started_at, \
                 heartbeat_at) VALUES (?, ?, ?, ?) ON CONFLICT (worker_id) DO UPDATE SET \
                 hostname = excluded.hostname, heartbeat_at = excluded.heartbeat_at",
            )
            .db()?
            .execute(params![
                worker.worker_id,
                worker.hostname,
                worker.started_at,
                at
            ])
            .db()?;
            Ok(())
        })
        .await
    }

    async fn remove_worker(&self, worker_id: &str) -> Result<bool> {
        let worker_id = worker_id.to_owned();
        let removed = self
            .write(move |conn| {
                conn.prepare_cached("DELETE FROM subagent_batch_workers WHERE worker_id = ?")
                    .db()?
                    .execute([worker_id])
                    .db()
            })
            .await?;
        Ok(removed > 0)
    }

    async fn live_workers(&self, max_age: Duration) -> Result<u64> {
        let cutoff = self
            .inner
            .clock
            .now()
            .millis
            .saturating_sub(millis(max_age));
        let live: i64 = self
            .read(move |conn| {
                conn.prepare_cached(
                    "SELECT COUNT(*) FROM subagent_batch_workers WHERE heartbeat_at > ?",
                )
                .db()?
                .query_row([cutoff], |row| row.get(0))
                .db()
            })
            .await?;
        Ok(live.max(0) as u64)
    }

    async fn batch_totals(&self) -> Result<BatchTotals> {
        self.read(|conn| {
            let batches = query_all(
                conn,
                "SELECT status, COUNT(*) FROM subagent_batches GROUP BY status",
                [],
                |row| {
                    let status: BatchStatus =
                        codec::parse("subagent_batches.status", text(row, 0)?)?;
                    Ok((status, count(row, 1)?))
                },
            )?;
            let items = conn
                .prepare_cached(
                    "SELECT COALESCE(SUM(pending_count), 0), COALESCE(SUM(queued_count), 0), \
                     COALESCE(SUM(leased_count), 0), COALESCE(SUM(running_count), 0), \
                     COALESCE(SUM(succeeded_count), 0), COALESCE(SUM(failed_count), 0), \
                     COALESCE(SUM(cancelled_count), 0) FROM subagent_batches",
                )
                .db()?
                .query_row([], |row| {
                    let n = |i: usize| row.get::<_, i64>(i).map(|v| v.max(0) as u64);
                    Ok(BatchCounts {
                        pending: n(0)?,
                        queued: n(1)?,
                        leased: n(2)?,
                        running: n(3)?,
                        succeeded: n(4)?,
                        failed: n(5)?,
                        cancelled: n(6)?,
                    })
                })
                .optional()
                .db()?
                .unwrap_or_default();
            Ok(BatchTotals::new(batches, items))
        })
        .await
    }

    async fn batch_activity(
        &self,
        scope: &BatchScope,
        query: &ActivityQuery,
    ) -> Result<Vec<BatchActivity>> {
        activity::batch_activity(self, scope, query).await
    }
}
