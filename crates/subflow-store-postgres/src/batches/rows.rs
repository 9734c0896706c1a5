//! The row access of PostgreSQL's batches ([`BatchRows`]): the columns and their decoding,
//! and each load, write and claim query inside the caller's transaction. A batch row is
//! locked `FOR UPDATE` (`SKIP LOCKED` in a claim pass) before its item rows, and the
//! lease clock is the database's `now()` in epoch milliseconds, read in the statement
//! that locks the batch row.

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Postgres};
use subflow_store::batches::machine::Now;
use subflow_store::batches::rows::BatchRows;
use subflow_store::batches::{BatchCounts, BatchItem, BatchRecord};
use subflow_store::{Error, Result, codec};

use crate::get;

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
         cancelled_count, user_id, run_id, tool_call_id, submission_key, pause_reason, \
         budget_level, execution_spec"
    };
}

/// The `SELECT` list of [`item_from_row`] with the result; `listed_item_columns!` reads
/// the same without it.
macro_rules! item_columns {
    () => {
        "id, batch_id, item_key, position, status, attempt, model_name, result_preview, \
         result_truncated, error, stop_reason, token_usage, acceptance_criteria, \
         acceptance_verdict, started_at, completed_at, created_at, updated_at, prompt, \
         lease_owner, lease_expires_at, cancel_requested_at, \
         COALESCE(result, result_preview) AS result, retries"
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

pub(super) fn db(error: sqlx::Error) -> Error {
    Error::backend(error)
}

pub(super) fn unsigned(row: &PgRow, column: &str) -> Result<u64> {
    Ok(get::<i64>(row, column)?.max(0) as u64)
}

fn small(row: &PgRow, column: &str) -> Result<u32> {
    let value: i64 = get(row, column)?;
    u32::try_from(value).map_err(|_| Error::Corrupt {
        what: "subagent batch column",
        detail: format!("{column} = {value} is out of range"),
    })
}

pub(super) fn batch_from_row(row: &PgRow) -> Result<BatchRecord> {
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
        pause_reason: get(row, "pause_reason")?,
        budget_level: small(row, "budget_level")?,
        execution_spec: codec::json(
            "subagent_batches.execution_spec",
            get(row, "execution_spec")?,
        )?,
    })
}

pub(super) fn item_from_row(row: &PgRow) -> Result<BatchItem> {
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

pub(super) async fn load_batch(
    conn: &mut PgConnection,
    batch_id: &str,
) -> Result<Option<BatchRecord>> {
    let query = sqlx::query(concat!(
        "SELECT ",
        batch_columns!(),
        " FROM subagent_batches WHERE id = $1"
    ))
    .bind(batch_id);
    fetch_optional(conn, query, batch_from_row).await
}

/// A bound query.
type Query<'q> = sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>;

pub(super) async fn fetch_items(
    conn: &mut PgConnection,
    query: Query<'_>,
) -> Result<Vec<BatchItem>> {
    let rows = query.fetch_all(&mut *conn).await.map_err(db)?;
    rows.iter().map(item_from_row).collect()
}

/// The row `query` finds, if any, decoded.
async fn fetch_optional<T>(
    conn: &mut PgConnection,
    query: Query<'_>,
    decode: impl Fn(&PgRow) -> Result<T>,
) -> Result<Option<T>> {
    let row = query.fetch_optional(&mut *conn).await.map_err(db)?;
    row.as_ref().map(decode).transpose()
}

/// [`BatchRows`] over one transaction's connection.
pub(super) struct PgRows<'a> {
    pub(super) conn: &'a mut PgConnection,
}

impl BatchRows for PgRows<'_> {
    async fn lock_batch(
        &mut self,
        batch_id: &str,
        _spec: bool,
    ) -> Result<Option<(BatchRecord, Now)>> {
        let query = sqlx::query(concat!(
            "SELECT ",
            batch_columns!(),
            ", ",
            db_now!(),
            " AS db_now FROM subagent_batches WHERE id = $1 FOR UPDATE"
        ))
        .bind(batch_id);
        fetch_optional(self.conn, query, |row| {
            Ok((batch_from_row(row)?, Now::at(get(row, "db_now")?)))
        })
        .await
    }

    async fn lock_active_batches(&mut self) -> Result<Option<(Vec<BatchRecord>, Now)>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            batch_columns!(),
            ", ",
            db_now!(),
            " AS db_now FROM subagent_batches WHERE status IN ('queued', 'running', 'paused') \
             ORDER BY created_at, id FOR UPDATE SKIP LOCKED"
        ))
        .fetch_all(&mut *self.conn)
        .await
        .map_err(db)?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let now = Now::at(get(first, "db_now")?);
        let batches = rows.iter().map(batch_from_row).collect::<Result<_>>()?;
        Ok(Some((batches, now)))
    }

    async fn lock_item(&mut self, batch_id: &str, item_id: &str) -> Result<Option<BatchItem>> {
        let query = sqlx::query(concat!(
            "SELECT ",
            item_columns!(),
            " FROM subagent_batch_items WHERE id = $1 AND batch_id = $2 FOR UPDATE"
        ))
        .bind(item_id)
        .bind(batch_id);
        fetch_optional(self.conn, query, item_from_row).await
    }

    async fn lock_expired_items(
        &mut self,
        batch_id: &str,
        now_millis: i64,
    ) -> Result<Vec<BatchItem>> {
        fetch_items(
            self.conn,
            sqlx::query(concat!(
                "SELECT ",
                item_columns!(),
                " FROM subagent_batch_items WHERE batch_id = $1 \
                 AND status IN ('leased', 'running') AND lease_expires_at <= $2 \
                 ORDER BY position FOR UPDATE"
            ))
            .bind(batch_id)
            .bind(now_millis),
        )
        .await
    }

    async fn lock_unfinished_items(&mut self, batch_id: &str) -> Result<Vec<BatchItem>> {
        fetch_items(
            self.conn,
            sqlx::query(concat!(
                "SELECT ",
                item_columns!(),
                " FROM subagent_batch_items WHERE batch_id = $1 \
                 AND status IN ('pending', 'queued', 'leased', 'running') \
                 ORDER BY position FOR UPDATE"
            ))
            .bind(batch_id),
        )
        .await
    }

    async fn lock_claimable_items(&mut self, batch_id: &str, limit: u64) -> Result<Vec<BatchItem>> {
        fetch_items(
            self.conn,
            sqlx::query(concat!(
                "SELECT ",
                item_columns!(),
                " FROM subagent_batch_items WHERE batch_id = $1 AND status = 'queued' \
                 AND cancel_requested_at IS NULL ORDER BY position LIMIT $2 \
                 FOR UPDATE SKIP LOCKED"
            ))
            .bind(batch_id)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX)),
        )
        .await
    }

    async fn promote_pending(&mut self, batch_id: &str, quota: u64, now: &Now) -> Result<u64> {
        let promoted = sqlx::query(
            "UPDATE subagent_batch_items SET status = 'queued', updated_at = $3 \
             WHERE id IN (SELECT id FROM subagent_batch_items WHERE batch_id = $1 \
             AND status = 'pending' ORDER BY position LIMIT $2 FOR UPDATE)",
        )
        .bind(batch_id)
        .bind(i64::try_from(quota).unwrap_or(i64::MAX))
        .bind(&now.stamp)
        .execute(&mut *self.conn)
        .await
        .map_err(db)?;
        Ok(promoted.rows_affected())
    }

    async fn write_batch(&mut self, batch: &BatchRecord) -> Result<()> {
        let c = &batch.counts;
        sqlx::query(
            "UPDATE subagent_batches SET status = $1, updated_at = $2, completed_at = $3, \
         pending_count = $4, queued_count = $5, leased_count = $6, running_count = $7, \
         succeeded_count = $8, failed_count = $9, cancelled_count = $10, pause_reason = $11, \
         budget_level = $12 WHERE id = $13",
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
        .bind(&batch.pause_reason)
        .bind(i64::from(batch.budget_level))
        .bind(&batch.id)
        .execute(&mut *self.conn)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn write_items(&mut self, items: &[BatchItem]) -> Result<()> {
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
        .bind(column(items, |i| i.stored_result().map(str::to_owned)))
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
        .execute(&mut *self.conn)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn insert_batch(&mut self, record: &BatchRecord, items: &[BatchItem]) -> Result<bool> {
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
        .execute(&mut *self.conn)
        .await
        .map_err(db)?;
        if inserted.rows_affected() == 0 {
            return Ok(false);
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
        .execute(&mut *self.conn)
        .await
        .map_err(db)?;
        Ok(true)
    }

    async fn submitted(&mut self, user_id: &str, key: &str) -> Result<Option<BatchRecord>> {
        let query = sqlx::query(concat!(
            "SELECT ",
            batch_columns!(),
            " FROM subagent_batches WHERE user_id = $1 AND submission_key = $2"
        ))
        .bind(user_id)
        .bind(key);
        fetch_optional(self.conn, query, batch_from_row).await
    }
}
