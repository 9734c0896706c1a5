//! Durable batches (docs/batches.md) on PostgreSQL, with the semantics of `MemoryStore`, for
//! any number of `serve` and `worker` processes. Every call is one transaction that
//! locks the batch row (`FOR UPDATE`; `FOR UPDATE SKIP LOCKED` in a claim pass) before
//! any item row, applies `subflow_store::batches::machine` to the loaded rows and writes
//! back what changed. Lease and heartbeat times are the database's `now()` in epoch
//! milliseconds, read in the same statement that locks the batch row.

mod activity;

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Postgres, Transaction};
use subflow_contracts::{BatchItemStatus, BatchStatus};
use subflow_store::batches::machine::{self, Now};
use subflow_store::batches::{
    ActivityQuery, AttemptOutcome, BatchActivity, BatchCounts, BatchItem, BatchQuery, BatchRecord,
    BatchScope, BatchStore, BatchTotals, ClaimPass, ClaimRequest, EXPORT_PAGE, ItemFailure,
    ItemLease, ItemQuery, ItemSuccess, NewBatch, ReleaseReason, Renewal, RetryOutcome, Submitted,
    WorkerHeartbeat,
};
use subflow_store::streams::millis;
use subflow_store::{Error, Result, codec};

use crate::{PostgresStore, get};

/// The database clock in epoch milliseconds, as a SQL literal for `concat!`.
macro_rules! db_now {
    () => {
        "(extract(epoch FROM now()) * 1000)::bigint"
    };
}

/// The `SELECT` list of [`batch_from_row`], as a literal for `concat!`.
macro_rules! batch_columns {
    () => {
        "id, thread_id, title, subagent_type, status, total_items, max_live_items, \
         max_running_items, max_attempts, created_at, updated_at, completed_at, pending_count, \
         queued_count, leased_count, running_count, succeeded_count, failed_count, \
         cancelled_count, user_id, run_id, tool_call_id, submission_key, execution_spec"
    };
}

/// The `SELECT` list of [`item_from_row`] with the result; `listed_item_columns!` reads
/// the same without it.
macro_rules! item_columns {
    () => {
        "id, batch_id, item_key, position, status, attempt, model_name, result_preview, \
         result_truncated, error, stop_reason, token_usage, acceptance_criteria, \
         acceptance_verdict, started_at, completed_at, created_at, updated_at, prompt, \
         lease_owner, lease_expires_at, cancel_requested_at, result, retries"
    };
}

macro_rules! listed_item_columns {
    () => {
        "id, batch_id, item_key, position, status, attempt, model_name, result_preview, \
         result_truncated, error, stop_reason, token_usage, acceptance_criteria, \
         acceptance_verdict, started_at, completed_at, created_at, updated_at, prompt, \
         lease_owner, lease_expires_at, cancel_requested_at, NULL::text AS result, retries"
    };
}

fn db(error: sqlx::Error) -> Error {
    Error::backend(error)
}

fn unsigned(row: &PgRow, column: &str) -> Result<u64> {
    Ok(get::<i64>(row, column)?.max(0) as u64)
}

fn small(row: &PgRow, column: &str) -> Result<u32> {
    let value: i64 = get(row, column)?;
    u32::try_from(value).map_err(|_| Error::Corrupt {
        what: "subagent batch column",
        detail: format!("{column} = {value} is out of range"),
    })
}

fn batch_from_row(row: &PgRow) -> Result<BatchRecord> {
    Ok(BatchRecord {
        id: get(row, "id")?,
        thread_id: get(row, "thread_id")?,
        title: get(row, "title")?,
        subagent_type: get(row, "subagent_type")?,
        status: codec::parse("subagent_batches.status", get(row, "status")?)?,
        total_items: unsigned(row, "total_items")?,
        max_live_items: small(row, "max_live_items")?,
        max_running_items: small(row, "max_running_items")?,
        max_attempts: small(row, "max_attempts")?,
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
        completed_at: get(row, "completed_at")?,
        counts: BatchCounts {
            pending: unsigned(row, "pending_count")?,
            queued: unsigned(row, "queued_count")?,
            leased: unsigned(row, "leased_count")?,
            running: unsigned(row, "running_count")?,
            succeeded: unsigned(row, "succeeded_count")?,
            failed: unsigned(row, "failed_count")?,
            cancelled: unsigned(row, "cancelled_count")?,
        },
        user_id: get(row, "user_id")?,
        run_id: get(row, "run_id")?,
        tool_call_id: get(row, "tool_call_id")?,
        submission_key: get(row, "submission_key")?,
        execution_spec: codec::json(
            "subagent_batches.execution_spec",
            get(row, "execution_spec")?,
        )?,
    })
}

fn item_from_row(row: &PgRow) -> Result<BatchItem> {
    let stop_reason: Option<&str> = get(row, "stop_reason")?;
    let token_usage: Option<&str> = get(row, "token_usage")?;
    Ok(BatchItem {
        id: get(row, "id")?,
        batch_id: get(row, "batch_id")?,
        item_key: get(row, "item_key")?,
        position: small(row, "position")?,
        status: codec::parse("subagent_batch_items.status", get(row, "status")?)?,
        attempt: small(row, "attempt")?,
        retries: small(row, "retries")?,
        model_name: get(row, "model_name")?,
        result_preview: get(row, "result_preview")?,
        result_truncated: get(row, "result_truncated")?,
        error: get(row, "error")?,
        stop_reason: stop_reason
            .map(|reason| codec::parse("subagent_batch_items.stop_reason", reason))
            .transpose()?,
        token_usage: token_usage
            .map(|usage| codec::decode("subagent_batch_items.token_usage", usage))
            .transpose()?,
        acceptance_criteria: codec::decode(
            "subagent_batch_items.acceptance_criteria",
            get(row, "acceptance_criteria")?,
        )?,
        acceptance_verdict: get(row, "acceptance_verdict")?,
        started_at: get(row, "started_at")?,
        completed_at: get(row, "completed_at")?,
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
        prompt: get(row, "prompt")?,
        lease_owner: get(row, "lease_owner")?,
        lease_expires_at: get(row, "lease_expires_at")?,
        cancel_requested_at: get(row, "cancel_requested_at")?,
        result: get(row, "result")?,
    })
}

/// Locks a batch row and reads the database clock; `None` when there is no such batch.
async fn lock_batch(conn: &mut PgConnection, batch_id: &str) -> Result<Option<(BatchRecord, Now)>> {
    let row = sqlx::query(concat!(
        "SELECT ",
        batch_columns!(),
        ", ",
        db_now!(),
        " AS db_now FROM subagent_batches WHERE id = $1 FOR UPDATE"
    ))
    .bind(batch_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(db)?;
    row.map(|row| Ok((batch_from_row(&row)?, Now::at(get(&row, "db_now")?))))
        .transpose()
}

async fn load_batch(conn: &mut PgConnection, batch_id: &str) -> Result<Option<BatchRecord>> {
    let row = sqlx::query(concat!(
        "SELECT ",
        batch_columns!(),
        " FROM subagent_batches WHERE id = $1"
    ))
    .bind(batch_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(db)?;
    row.as_ref().map(batch_from_row).transpose()
}

/// Locks an item row of a batch whose row the caller has locked.
async fn lock_item(
    conn: &mut PgConnection,
    batch_id: &str,
    item_id: &str,
) -> Result<Option<BatchItem>> {
    let row = sqlx::query(concat!(
        "SELECT ",
        item_columns!(),
        " FROM subagent_batch_items WHERE id = $1 AND batch_id = $2 FOR UPDATE"
    ))
    .bind(item_id)
    .bind(batch_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(db)?;
    row.as_ref().map(item_from_row).transpose()
}

async fn write_batch(conn: &mut PgConnection, batch: &BatchRecord) -> Result<()> {
    let c = &batch.counts;
    sqlx::query(
        "UPDATE subagent_batches SET status = $1, updated_at = $2, completed_at = $3, \
         pending_count = $4, queued_count = $5, leased_count = $6, running_count = $7, \
         succeeded_count = $8, failed_count = $9, cancelled_count = $10 WHERE id = $11",
    )
    .bind(batch.status.as_str())
    .bind(&batch.updated_at)
    .bind(&batch.completed_at)
    .bind(c.pending as i64)
    .bind(c.queued as i64)
    .bind(c.leased as i64)
    .bind(c.running as i64)
    .bind(c.succeeded as i64)
    .bind(c.failed as i64)
    .bind(c.cancelled as i64)
    .bind(&batch.id)
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    Ok(())
}

/// Writes the mutable columns of `items` back in one statement.
async fn write_items(conn: &mut PgConnection, items: &[BatchItem]) -> Result<()> {
    if items.is_empty() {
        return Ok(());
    }
    fn column<T>(items: &[BatchItem], f: impl Fn(&BatchItem) -> T) -> Vec<T> {
        items.iter().map(f).collect()
    }
    sqlx::query(
        "UPDATE subagent_batch_items AS i SET status = u.status, attempt = u.attempt, \
         model_name = u.model_name, result = u.result, result_preview = u.result_preview, \
         result_truncated = u.result_truncated, error = u.error, stop_reason = u.stop_reason, \
         token_usage = u.token_usage, acceptance_verdict = u.acceptance_verdict, \
         lease_owner = u.lease_owner, lease_expires_at = u.lease_expires_at, \
         cancel_requested_at = u.cancel_requested_at, started_at = u.started_at, \
         completed_at = u.completed_at, updated_at = u.updated_at, retries = u.retries \
         FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], \
         $6::text[], $7::bool[], $8::text[], $9::text[], $10::text[], $11::text[], \
         $12::text[], $13::bigint[], $14::text[], $15::text[], $16::text[], $17::text[], \
         $18::bigint[]) \
         AS u(id, status, attempt, model_name, result, result_preview, result_truncated, \
         error, stop_reason, token_usage, acceptance_verdict, lease_owner, lease_expires_at, \
         cancel_requested_at, started_at, completed_at, updated_at, retries) WHERE i.id = u.id",
    )
    .bind(column(items, |i| i.id.clone()))
    .bind(column(items, |i| i.status.as_str()))
    .bind(column(items, |i| i64::from(i.attempt)))
    .bind(column(items, |i| i.model_name.clone()))
    .bind(column(items, |i| i.result.clone()))
    .bind(column(items, |i| i.result_preview.clone()))
    .bind(column(items, |i| i.result_truncated))
    .bind(column(items, |i| i.error.clone()))
    .bind(column(items, |i| i.stop_reason.map(|r| r.as_str())))
    .bind(column(items, |i| i.token_usage.as_ref().map(codec::encode)))
    .bind(column(items, |i| i.acceptance_verdict.clone()))
    .bind(column(items, |i| i.lease_owner.clone()))
    .bind(column(items, |i| i.lease_expires_at))
    .bind(column(items, |i| i.cancel_requested_at.clone()))
    .bind(column(items, |i| i.started_at.clone()))
    .bind(column(items, |i| i.completed_at.clone()))
    .bind(column(items, |i| i.updated_at.clone()))
    .bind(column(items, |i| i64::from(i.retries)))
    .execute(&mut *conn)
    .await
    .map_err(db)?;
    Ok(())
}

async fn fetch_items(
    conn: &mut PgConnection,
    query: sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments>,
) -> Result<Vec<BatchItem>> {
    let rows = query.fetch_all(&mut *conn).await.map_err(db)?;
    rows.iter().map(item_from_row).collect()
}

/// One claim pass inside the caller's transaction.
async fn claim_pass(conn: &mut PgConnection, request: &ClaimRequest) -> Result<ClaimPass> {
    let mut pass = ClaimPass {
        lease_owner: request.mint_lease_owner(),
        ..ClaimPass::default()
    };
    let rows = sqlx::query(concat!(
        "SELECT ",
        batch_columns!(),
        ", ",
        db_now!(),
        " AS db_now FROM subagent_batches WHERE status IN ('queued', 'running', 'paused') \
         ORDER BY created_at, id FOR UPDATE SKIP LOCKED"
    ))
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    let Some(first) = rows.first() else {
        return Ok(pass);
    };
    let now = Now::at(get(first, "db_now")?);
    let expires_at = now.millis.saturating_add(millis(request.lease));
    let mut free = u64::from(request.free_slots);
    let mut admitted = request.admitted;
    for row in &rows {
        let mut batch = batch_from_row(row)?;
        let before = batch.clone();
        let mut changed = Vec::new();
        if batch.counts.leased_or_running() > 0 {
            let expired = fetch_items(
                conn,
                sqlx::query(concat!(
                    "SELECT ",
                    item_columns!(),
                    " FROM subagent_batch_items WHERE batch_id = $1 \
                     AND status IN ('leased', 'running') AND lease_expires_at <= $2 \
                     ORDER BY position FOR UPDATE"
                ))
                .bind(&batch.id)
                .bind(now.millis),
            )
            .await?;
            for mut item in expired {
                machine::recover_expired(&mut batch, &mut item, &now);
                pass.expired += 1;
                changed.push(item);
            }
        }
        let quota = machine::promotion_quota(&batch);
        if quota > 0 {
            let pending = fetch_items(
                conn,
                sqlx::query(concat!(
                    "SELECT ",
                    item_columns!(),
                    " FROM subagent_batch_items WHERE batch_id = $1 AND status = 'pending' \
                     ORDER BY position LIMIT $2 FOR UPDATE"
                ))
                .bind(&batch.id)
                .bind(quota as i64),
            )
            .await?;
            for mut item in pending {
                machine::promote(&mut batch, &mut item, &now);
                pass.promoted += 1;
                changed.push(item);
            }
        }
        // Recovered and promoted items are written before the claim reads the queue, so
        // it sees them queued, in position order with the rest, as the other backends do.
        write_items(conn, &changed).await?;
        changed.clear();
        let quota = machine::claim_quota(&batch, free);
        let mut claimed = Vec::new();
        if quota > 0 {
            let queued = fetch_items(
                conn,
                sqlx::query(concat!(
                    "SELECT ",
                    item_columns!(),
                    " FROM subagent_batch_items WHERE batch_id = $1 AND status = 'queued' \
                     AND cancel_requested_at IS NULL ORDER BY position LIMIT $2 \
                     FOR UPDATE SKIP LOCKED"
                ))
                .bind(&batch.id)
                .bind(quota as i64),
            )
            .await?;
            for mut item in queued {
                machine::claim(
                    &mut batch,
                    &mut item,
                    &pass.lease_owner,
                    expires_at,
                    &mut admitted,
                    &now,
                );
                claimed.push(item);
            }
        }
        write_items(conn, &claimed).await?;
        if batch != before {
            write_batch(conn, &batch).await?;
        }
        free -= claimed.len() as u64;
        pass.add_claims(&batch, claimed);
    }
    Ok(pass)
}

/// Ends a transaction that changed nothing. Dropping a sqlx transaction would leave
/// its row locks held until the pooled connection is next used.
async fn rollback<T>(tx: Transaction<'_, Postgres>, answer: T) -> Result<T> {
    tx.rollback().await.map_err(db)?;
    Ok(answer)
}

impl PostgresStore {
    async fn begin(&self) -> Result<Transaction<'static, Postgres>> {
        self.pool().begin().await.map_err(db)
    }

    /// Runs a worker write on the item `lease` names in one transaction (batch row,
    /// then item row, locked); committed only when `write` reports a change.
    async fn worker_write<T>(
        &self,
        lease: &ItemLease,
        missing: T,
        write: impl FnOnce(&mut BatchRecord, &mut BatchItem, &Now) -> (T, bool) + Send,
    ) -> Result<T>
    where
        T: Send,
    {
        let mut tx = self.begin().await?;
        let Some((mut batch, now)) = lock_batch(&mut tx, &lease.batch_id).await? else {
            return rollback(tx, missing).await;
        };
        let Some(mut item) = lock_item(&mut tx, &lease.batch_id, &lease.item_id).await? else {
            return rollback(tx, missing).await;
        };
        let (answer, changed) = write(&mut batch, &mut item, &now);
        if !changed {
            return rollback(tx, answer).await;
        }
        write_items(&mut tx, std::slice::from_ref(&item)).await?;
        write_batch(&mut tx, &batch).await?;
        tx.commit().await.map_err(db)?;
        Ok(answer)
    }

    /// Locks a scoped batch and applies a user control to it.
    async fn control(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        change: impl FnOnce(&mut BatchRecord, &Now) -> bool + Send,
    ) -> Result<Option<BatchRecord>> {
        let mut tx = self.begin().await?;
        let Some((mut batch, now)) = lock_batch(&mut tx, batch_id).await? else {
            return rollback(tx, None).await;
        };
        if !scope.sees(&batch) {
            return rollback(tx, None).await;
        }
        if !change(&mut batch, &now) {
            return rollback(tx, Some(batch)).await;
        }
        write_batch(&mut tx, &batch).await?;
        tx.commit().await.map_err(db)?;
        Ok(Some(batch))
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
        let mut tx = self.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO subagent_batches (id, thread_id, user_id, run_id, tool_call_id, \
             submission_key, title, subagent_type, status, total_items, max_live_items, \
             max_running_items, max_attempts, execution_spec, pending_count, created_at, \
             updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
             $15, $16, $17) ON CONFLICT (user_id, submission_key) DO NOTHING",
        )
        .bind(&record.id)
        .bind(&record.thread_id)
        .bind(&record.user_id)
        .bind(&record.run_id)
        .bind(&record.tool_call_id)
        .bind(&record.submission_key)
        .bind(&record.title)
        .bind(&record.subagent_type)
        .bind(record.status.as_str())
        .bind(record.total_items as i64)
        .bind(i64::from(record.max_live_items))
        .bind(i64::from(record.max_running_items))
        .bind(i64::from(record.max_attempts))
        .bind(codec::encode(&record.execution_spec))
        .bind(record.counts.pending as i64)
        .bind(&record.created_at)
        .bind(&record.updated_at)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        if inserted.rows_affected() == 0 {
            let row = sqlx::query(concat!(
                "SELECT ",
                batch_columns!(),
                " FROM subagent_batches WHERE user_id = $1 AND submission_key = $2"
            ))
            .bind(&record.user_id)
            .bind(&record.submission_key)
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?;
            let existing = batch_from_row(&row)?;
            return rollback(
                tx,
                Submitted {
                    batch: existing,
                    created: false,
                },
            )
            .await;
        }
        let column = |f: &dyn Fn(&BatchItem) -> String| items.iter().map(f).collect::<Vec<_>>();
        sqlx::query(
            "INSERT INTO subagent_batch_items (id, batch_id, item_key, position, status, \
             prompt, acceptance_criteria, created_at, updated_at) \
             SELECT id, $2, item_key, position, 'pending', prompt, acceptance_criteria, $6, $6 \
             FROM UNNEST($1::text[], $3::text[], $4::bigint[], $5::text[], $7::text[]) \
             AS u(id, item_key, position, prompt, acceptance_criteria)",
        )
        .bind(column(&|i| i.id.clone()))
        .bind(&record.id)
        .bind(column(&|i| i.item_key.clone()))
        .bind(
            items
                .iter()
                .map(|i| i64::from(i.position))
                .collect::<Vec<_>>(),
        )
        .bind(column(&|i| i.prompt.clone()))
        .bind(&record.created_at)
        .bind(column(&|i| codec::encode(&i.acceptance_criteria)))
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(Submitted {
            batch: record,
            created: true,
        })
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
        self.control(scope, batch_id, machine::pause).await
    }

    async fn resume_batch(
        &self,
        scope: &BatchScope,
        batch_id: &str,
    ) -> Result<Option<BatchRecord>> {
        self.control(scope, batch_id, machine::resume).await
    }

    async fn cancel_batch(
        &self,
        scope: &BatchScope,
        batch_id: &str,
    ) -> Result<Option<BatchRecord>> {
        let mut tx = self.begin().await?;
        let Some((mut batch, now)) = lock_batch(&mut tx, batch_id).await? else {
            return rollback(tx, None).await;
        };
        if !scope.sees(&batch) {
            return rollback(tx, None).await;
        }
        if !machine::cancel(&mut batch, &now) {
            return rollback(tx, Some(batch)).await;
        }
        let mut items = fetch_items(
            &mut tx,
            sqlx::query(concat!(
                "SELECT ",
                item_columns!(),
                " FROM subagent_batch_items WHERE batch_id = $1 \
                     AND status IN ('pending', 'queued', 'leased', 'running') \
                     ORDER BY position FOR UPDATE"
            ))
            .bind(batch_id),
        )
        .await?;
        for item in &mut items {
            machine::cancel_with_batch(&mut batch, item, &now);
        }
        write_items(&mut tx, &items).await?;
        write_batch(&mut tx, &batch).await?;
        tx.commit().await.map_err(db)?;
        Ok(Some(batch))
    }

    async fn retry_item(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        item_id: &str,
    ) -> Result<RetryOutcome> {
        let mut tx = self.begin().await?;
        let Some((mut batch, now)) = lock_batch(&mut tx, batch_id).await? else {
            return rollback(tx, RetryOutcome::BatchNotFound).await;
        };
        if !scope.sees(&batch) {
            return rollback(tx, RetryOutcome::BatchNotFound).await;
        }
        let Some(mut item) = lock_item(&mut tx, batch_id, item_id).await? else {
            return rollback(tx, RetryOutcome::NotFailed).await;
        };
        match machine::retry(&mut batch, &mut item, &now) {
            Ok(()) => {
                write_items(&mut tx, std::slice::from_ref(&item)).await?;
                write_batch(&mut tx, &batch).await?;
                tx.commit().await.map_err(db)?;
                Ok(RetryOutcome::Retried {
                    batch: Box::new(batch),
                    item: Box::new(item),
                })
            }
            Err(machine::RetryRefusal::NotFailed) => rollback(tx, RetryOutcome::NotFailed).await,
            Err(machine::RetryRefusal::BatchCancelled) => {
                rollback(tx, RetryOutcome::BatchCancelled).await
            }
        }
    }

    async fn claim_pass(&self, request: &ClaimRequest) -> Result<ClaimPass> {
        request.validate()?;
        let mut tx = self.begin().await?;
        let pass = claim_pass(&mut tx, request).await?;
        tx.commit().await.map_err(db)?;
        Ok(pass)
    }

    async fn mark_running(&self, lease: &ItemLease) -> Result<bool> {
        self.worker_write(lease, false, |batch, item, now| {
            let changed = machine::mark_running(batch, item, lease, now);
            (changed, changed)
        })
        .await
    }

    async fn renew_lease(&self, lease: &ItemLease, ttl: Duration) -> Result<Renewal> {
        self.worker_write(lease, Renewal::Lost, |_, item, now| {
            let expires_at = now.millis.saturating_add(millis(ttl));
            let renewal = machine::renew(item, lease, expires_at, now);
            (renewal, matches!(renewal, Renewal::Held { .. }))
        })
        .await
    }

    async fn finish_success(
        &self,
        lease: &ItemLease,
        outcome: &ItemSuccess,
    ) -> Result<Option<BatchItemStatus>> {
        self.worker_write(lease, None, |batch, item, now| {
            let status = machine::finish_success(batch, item, lease, outcome, now);
            (status, status.is_some())
        })
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
        let mut tx = self.begin().await?;
        let mut batch_ids: Vec<&str> = outcomes
            .iter()
            .map(|(lease, _)| lease.batch_id.as_str())
            .collect();
        batch_ids.sort_unstable();
        batch_ids.dedup();
        // Each batch as locked, and whether an outcome changed it.
        let mut batches = HashMap::new();
        for id in batch_ids {
            if let Some((batch, now)) = lock_batch(&mut tx, id).await? {
                batches.insert(id, (batch, now, false));
            }
        }
        // Each item as the outcomes so far left it (a repeat sees the first's write), and
        // whether one changed it.
        let mut items: HashMap<&str, (BatchItem, bool)> = HashMap::new();
        let mut statuses = Vec::with_capacity(outcomes.len());
        for (lease, outcome) in outcomes {
            let Some((batch, now, changed)) = batches.get_mut(lease.batch_id.as_str()) else {
                statuses.push(None);
                continue;
            };
            let (item, item_changed) = match items.get_mut(lease.item_id.as_str()) {
                Some(item) => item,
                None => match lock_item(&mut tx, &lease.batch_id, &lease.item_id).await? {
                    Some(item) => items.entry(lease.item_id.as_str()).or_insert((item, false)),
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
            *changed |= status.is_some();
            *item_changed |= status.is_some();
            statuses.push(status);
        }
        let written: Vec<BatchItem> = items
            .into_values()
            .filter_map(|(item, changed)| changed.then_some(item))
            .collect();
        if written.is_empty() {
            return rollback(tx, statuses).await;
        }
        write_items(&mut tx, &written).await?;
        for (batch, _, changed) in batches.values() {
            if *changed {
                write_batch(&mut tx, batch).await?;
            }
        }
        tx.commit().await.map_err(db)?;
        Ok(statuses)
    }

    async fn finish_failure(
        &self,
        lease: &ItemLease,
        outcome: &ItemFailure,
    ) -> Result<Option<BatchItemStatus>> {
        self.worker_write(lease, None, |batch, item, now| {
            let status = machine::finish_failure(batch, item, lease, outcome, now);
            (status, status.is_some())
        })
        .await
    }

    async fn release_claim(
        &self,
        lease: &ItemLease,
        reason: &ReleaseReason,
    ) -> Result<Option<BatchItemStatus>> {
        self.worker_write(lease, None, |batch, item, now| {
            let status = machine::release(batch, item, lease, reason, now);
            (status, status.is_some())
        })
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
