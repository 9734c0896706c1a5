//! The row access of SQLite's batches ([`BatchRows`]): the columns and their decoding,
//! and each load, write and claim query, run on the writer thread's connection inside
//! its transaction. SQLite has one writer, so "locking" a row is reading it there.
//!
//! An item read in a transaction notes its row's `rowid`, and writing it back finds the
//! row by that `rowid`: one b-tree search instead of two (the `id` key's index, then the
//! table). Each claim and each outcome writes an item, on a writer the batch worker keeps
//! busy (`subflow bench batches`).

use std::collections::HashMap;

use rusqlite::{Connection, Row, params};
use subflow_store::batches::machine::Now;
use subflow_store::batches::rows::BatchRows;
use subflow_store::batches::{BatchCounts, BatchItem, BatchRecord, BatchScope, SharedClock};
use subflow_store::{Result, codec};

use crate::{Db, backend_message, query_all, query_first, text};

/// The columns [`decode_batch`] reads, the last one the `execution_spec` as `$spec`.
macro_rules! batch_columns {
    ($spec:literal) => {
        concat!(
            "id, thread_id, title, subagent_type, status, total_items, max_live_items, \
             max_running_items, max_attempts, created_at, updated_at, completed_at, \
             pending_count, queued_count, leased_count, running_count, succeeded_count, \
             failed_count, cancelled_count, user_id, run_id, tool_call_id, submission_key, \
             pause_reason, budget_level, ",
            $spec
        )
    };
}

pub(super) const BATCH_COLUMNS: &str = batch_columns!(
    "(SELECT execution_spec FROM subagent_batch_specs WHERE batch_id = subagent_batches.id)"
);

/// [`BATCH_COLUMNS`] with `NULL` for the `execution_spec`: what a worker write reads,
/// since none of them looks at the spec.
const BATCH_STATE_COLUMNS: &str = batch_columns!("NULL");

pub(super) fn count(row: &Row<'_>, index: usize) -> Result<u64> {
    let value: i64 = row.get(index).db()?;
    Ok(value.max(0) as u64)
}

pub(super) fn decode_batch(row: &Row<'_>) -> Result<BatchRecord> {
    Ok(BatchRecord {
        id: row.get(0).db()?,
        thread_id: row.get(1).db()?,
        title: row.get(2).db()?,
        subagent_type: row.get(3).db()?,
        status: codec::parse("subagent_batches.status", text(row, 4)?)?,
        total_items: count(row, 5)?,
        max_live_items: row.get(6).db()?,
        max_running_items: row.get(7).db()?,
        max_attempts: row.get(8).db()?,
        created_at: row.get(9).db()?,
        updated_at: row.get(10).db()?,
        completed_at: row.get(11).db()?,
        counts: BatchCounts {
            pending: count(row, 12)?,
            queued: count(row, 13)?,
            leased: count(row, 14)?,
            running: count(row, 15)?,
            succeeded: count(row, 16)?,
            failed: count(row, 17)?,
            cancelled: count(row, 18)?,
        },
        user_id: row.get(19).db()?,
        run_id: row.get(20).db()?,
        tool_call_id: row.get(21).db()?,
        submission_key: row.get(22).db()?,
        pause_reason: row.get(23).db()?,
        budget_level: row.get(24).db()?,
        execution_spec: match row.get::<_, Option<String>>(25).db()? {
            Some(spec) => codec::json("subagent_batch_specs.execution_spec", &spec)?,
            // Every batch has its spec: only BATCH_STATE_COLUMNS reads none.
            None => serde_json::Value::Null,
        },
    })
}

/// Every item column, as a literal for `concat!`.
macro_rules! item_columns {
    () => {
        "id, batch_id, item_key, position, status, attempt, model_name, result_preview, \
         result_truncated, error, stop_reason, token_usage, acceptance_criteria, \
         acceptance_verdict, started_at, completed_at, created_at, updated_at, prompt, \
         lease_owner, lease_expires_at, cancel_requested_at, COALESCE(result, result_preview), \
         retries"
    };
}

/// Every item column; [`LISTED_ITEM_COLUMNS`] reads the same without the result.
pub(super) const ITEM_COLUMNS: &str = item_columns!();

/// Every item column and the row's `rowid` (read by [`decode_locked`]): what a write
/// transaction reads.
const LOCKED_ITEM_COLUMNS: &str = concat!(item_columns!(), ", rowid");

/// One item by id, with its `rowid`: read for each outcome of a group, so its text is
/// built once.
const LOAD_ITEM: &str = concat!(
    "SELECT ",
    item_columns!(),
    ", rowid FROM subagent_batch_items WHERE id = ? AND batch_id = ?"
);

pub(super) const LISTED_ITEM_COLUMNS: &str = "id, batch_id, item_key, position, status, attempt, \
     model_name, result_preview, result_truncated, error, stop_reason, token_usage, \
     acceptance_criteria, acceptance_verdict, started_at, completed_at, created_at, \
     updated_at, prompt, lease_owner, lease_expires_at, cancel_requested_at, NULL, retries";

pub(super) fn decode_item(row: &Row<'_>) -> Result<BatchItem> {
    let stop_reason: Option<String> = row.get(10).db()?;
    let token_usage: Option<String> = row.get(11).db()?;
    Ok(BatchItem {
        id: row.get(0).db()?,
        batch_id: row.get(1).db()?,
        item_key: row.get(2).db()?,
        position: row.get(3).db()?,
        status: codec::parse("subagent_batch_items.status", text(row, 4)?)?,
        attempt: row.get(5).db()?,
        model_name: row.get(6).db()?,
        result_preview: row.get(7).db()?,
        result_truncated: row.get(8).db()?,
        error: row.get(9).db()?,
        stop_reason: stop_reason
            .map(|reason| codec::parse("subagent_batch_items.stop_reason", &reason))
            .transpose()?,
        token_usage: token_usage
            .map(|usage| codec::decode("subagent_batch_items.token_usage", &usage))
            .transpose()?,
        acceptance_criteria: codec::decode(
            "subagent_batch_items.acceptance_criteria",
            text(row, 12)?,
        )?,
        acceptance_verdict: row.get(13).db()?,
        started_at: row.get(14).db()?,
        completed_at: row.get(15).db()?,
        created_at: row.get(16).db()?,
        updated_at: row.get(17).db()?,
        prompt: row.get(18).db()?,
        lease_owner: row.get(19).db()?,
        lease_expires_at: row.get(20).db()?,
        cancel_requested_at: row.get(21).db()?,
        result: row.get(22).db()?,
        retries: row.get(23).db()?,
    })
}

/// Decodes a [`LOCKED_ITEM_COLUMNS`] row: the item and its `rowid`.
fn decode_locked(row: &Row<'_>) -> Result<(BatchItem, i64)> {
    Ok((decode_item(row)?, row.get(24).db()?))
}

pub(super) fn load_batch(conn: &Connection, batch_id: &str) -> Result<Option<BatchRecord>> {
    let sql = format!("SELECT {BATCH_COLUMNS} FROM subagent_batches WHERE id = ?");
    let mut statement = conn.prepare_cached(&sql).db()?;
    let mut rows = statement.query([batch_id]).db()?;
    rows.next().db()?.map(decode_batch).transpose()
}

/// The batch without its `execution_spec` (left `null`).
fn load_batch_state(conn: &Connection, batch_id: &str) -> Result<Option<BatchRecord>> {
    let sql = format!("SELECT {BATCH_STATE_COLUMNS} FROM subagent_batches WHERE id = ?");
    let mut statement = conn.prepare_cached(&sql).db()?;
    let mut rows = statement.query([batch_id]).db()?;
    rows.next().db()?.map(decode_batch).transpose()
}

/// The batch when it exists and is visible in `scope`.
pub(super) fn scoped_batch(
    conn: &Connection,
    scope: &BatchScope,
    batch_id: &str,
) -> Result<Option<BatchRecord>> {
    Ok(load_batch(conn, batch_id)?.filter(|batch| scope.sees(batch)))
}

pub(super) fn load_item(
    conn: &Connection,
    batch_id: &str,
    item_id: &str,
) -> Result<Option<BatchItem>> {
    Ok(load_locked(conn, batch_id, item_id)?.map(|(item, _)| item))
}

/// [`load_item`] with the row's `rowid`.
fn load_locked(
    conn: &Connection,
    batch_id: &str,
    item_id: &str,
) -> Result<Option<(BatchItem, i64)>> {
    let mut statement = conn.prepare_cached(LOAD_ITEM).db()?;
    let mut rows = statement.query([item_id, batch_id]).db()?;
    rows.next().db()?.map(decode_locked).transpose()
}

fn write_batch(conn: &Connection, batch: &BatchRecord) -> Result<()> {
    let c = &batch.counts;
    conn.prepare_cached(
        "UPDATE subagent_batches SET status = ?, updated_at = ?, completed_at = ?, \
         pending_count = ?, queued_count = ?, leased_count = ?, running_count = ?, \
         succeeded_count = ?, failed_count = ?, cancelled_count = ?, pause_reason = ?, \
         budget_level = ? WHERE id = ?",
    )
    .db()?
    .execute(params![
        batch.status.as_str(),
        batch.updated_at,
        batch.completed_at,
        c.pending as i64,
        c.queued as i64,
        c.leased as i64,
        c.running as i64,
        c.succeeded as i64,
        c.failed as i64,
        c.cancelled as i64,
        batch.pause_reason,
        batch.budget_level,
        batch.id
    ])
    .db()?;
    Ok(())
}

/// Writes `items` back with one prepared statement: a claim pass or a group of outcomes
/// writes dozens, and looking the statement up in the cache for each cost the writer
/// a hash of its text and a move in the cache every time. Each row is found by the
/// `rowid` its item was read with in this transaction (`rowids`).
fn write_items(
    conn: &Connection,
    rowids: &HashMap<String, i64>,
    items: &[BatchItem],
) -> Result<()> {
    let mut update = conn
        .prepare_cached(
            "UPDATE subagent_batch_items SET status = ?, attempt = ?, model_name = ?, \
             result = ?, result_preview = ?, result_truncated = ?, error = ?, stop_reason = ?, \
             token_usage = ?, acceptance_verdict = ?, lease_owner = ?, lease_expires_at = ?, \
             cancel_requested_at = ?, started_at = ?, completed_at = ?, updated_at = ?, \
             retries = ? WHERE rowid = ?",
        )
        .db()?;
    for item in items {
        let rowid = rowids.get(&item.id).ok_or_else(|| {
            backend_message(format!(
                "batch item {} was written without being read in its transaction",
                item.id
            ))
        })?;
        update
            .execute(params![
                item.status.as_str(),
                item.attempt,
                item.model_name,
                item.stored_result(),
                item.result_preview,
                item.result_truncated,
                item.error,
                item.stop_reason.map(|reason| reason.as_str()),
                item.token_usage.as_ref().map(codec::encode),
                item.acceptance_verdict,
                item.lease_owner,
                item.lease_expires_at,
                item.cancel_requested_at,
                item.started_at,
                item.completed_at,
                item.updated_at,
                item.retries,
                rowid
            ])
            .db()?;
    }
    Ok(())
}

fn insert_batch(conn: &Connection, batch: &BatchRecord, items: &[BatchItem]) -> Result<bool> {
    let inserted = conn
        .prepare_cached(
            "INSERT INTO subagent_batches (id, thread_id, user_id, run_id, tool_call_id, \
             submission_key, title, subagent_type, status, total_items, max_live_items, \
             max_running_items, max_attempts, pending_count, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (user_id, submission_key) DO NOTHING",
        )
        .db()?
        .execute(params![
            batch.id,
            batch.thread_id,
            batch.user_id,
            batch.run_id,
            batch.tool_call_id,
            batch.submission_key,
            batch.title,
            batch.subagent_type,
            batch.status.as_str(),
            batch.total_items as i64,
            batch.max_live_items,
            batch.max_running_items,
            batch.max_attempts,
            batch.counts.pending as i64,
            batch.created_at,
            batch.updated_at
        ])
        .db()?;
    if inserted == 0 {
        return Ok(false);
    }
    conn.prepare_cached(
        "INSERT INTO subagent_batch_specs (batch_id, execution_spec) VALUES (?, ?)",
    )
    .db()?
    .execute(params![batch.id, codec::encode(&batch.execution_spec)])
    .db()?;
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO subagent_batch_items (id, batch_id, item_key, position, status, \
             prompt, acceptance_criteria, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .db()?;
    for item in items {
        insert
            .execute(params![
                item.id,
                item.batch_id,
                item.item_key,
                item.position,
                item.status.as_str(),
                item.prompt,
                codec::encode(&item.acceptance_criteria),
                item.created_at,
                item.updated_at
            ])
            .db()?;
    }
    Ok(true)
}

/// Promotes a batch's first `quota` pending items (`queued`, `updated_at` now) with one
/// statement, rather than reading and writing each: returns how many it promoted.
fn promote(conn: &Connection, batch_id: &str, quota: u64, now: &Now) -> Result<u64> {
    let mut positions = conn
        .prepare_cached(
            "SELECT position FROM subagent_batch_items WHERE batch_id = ? \
             AND status = 'pending' ORDER BY position",
        )
        .db()?;
    let mut rows = positions.query([batch_id]).db()?;
    let mut last = None;
    for _ in 0..quota {
        let Some(row) = rows.next().db()? else { break };
        last = Some(row.get::<_, i64>(0).db()?);
    }
    let Some(last) = last else {
        return Ok(0);
    };
    let promoted = conn
        .prepare_cached(
            "UPDATE subagent_batch_items SET status = 'queued', updated_at = ? \
             WHERE batch_id = ? AND status = 'pending' AND position <= ?",
        )
        .db()?
        .execute(params![now.stamp, batch_id, last])
        .db()?;
    Ok(promoted as u64)
}

/// [`BatchRows`] over the writer's connection; the store's clock is the database clock.
pub(super) struct SqliteRows<'a> {
    conn: &'a Connection,
    clock: &'a SharedClock,
    /// The `rowid` of each item read in this transaction, by item id.
    rowids: HashMap<String, i64>,
}

impl<'a> SqliteRows<'a> {
    pub(super) fn new(conn: &'a Connection, clock: &'a SharedClock) -> Self {
        SqliteRows {
            conn,
            clock,
            rowids: HashMap::new(),
        }
    }

    /// The item of a locked row, its `rowid` noted for [`write_items`].
    fn note(&mut self, (item, rowid): (BatchItem, i64)) -> BatchItem {
        self.rowids.insert(item.id.clone(), rowid);
        item
    }

    /// The items of locked rows, each noted ([`note`](Self::note)).
    fn note_all(&mut self, locked: Vec<(BatchItem, i64)>) -> Vec<BatchItem> {
        locked.into_iter().map(|row| self.note(row)).collect()
    }
}

impl BatchRows for SqliteRows<'_> {
    async fn lock_batch(
        &mut self,
        batch_id: &str,
        spec: bool,
    ) -> Result<Option<(BatchRecord, Now)>> {
        let batch = if spec {
            load_batch(self.conn, batch_id)?
        } else {
            load_batch_state(self.conn, batch_id)?
        };
        Ok(batch.map(|batch| (batch, self.clock.now())))
    }

    async fn lock_active_batches(&mut self) -> Result<Option<(Vec<BatchRecord>, Now)>> {
        let now = self.clock.now();
        let sql = format!(
            "SELECT {BATCH_COLUMNS} FROM subagent_batches \
             WHERE status IN ('queued', 'running', 'paused') ORDER BY created_at, id"
        );
        let batches = query_all(self.conn, &sql, [], decode_batch)?;
        Ok((!batches.is_empty()).then_some((batches, now)))
    }

    async fn lock_item(&mut self, batch_id: &str, item_id: &str) -> Result<Option<BatchItem>> {
        let locked = load_locked(self.conn, batch_id, item_id)?;
        Ok(locked.map(|row| self.note(row)))
    }

    async fn lock_expired_items(
        &mut self,
        batch_id: &str,
        now_millis: i64,
    ) -> Result<Vec<BatchItem>> {
        // One status at a time, so the partial status index is provably usable; INDEXED
        // BY keeps SQLite from reading the batch's every item in position order instead.
        let mut expired = Vec::new();
        for status in ["leased", "running"] {
            let sql = format!(
                "SELECT {LOCKED_ITEM_COLUMNS} FROM subagent_batch_items \
                 INDEXED BY subagent_batch_items_unfinished WHERE batch_id = ? \
                 AND status = '{status}' AND lease_expires_at <= ?"
            );
            expired.extend(query_all(
                self.conn,
                &sql,
                params![batch_id, now_millis],
                decode_locked,
            )?);
        }
        expired.sort_by_key(|(item, _)| item.position);
        Ok(self.note_all(expired))
    }

    async fn lock_unfinished_items(&mut self, batch_id: &str) -> Result<Vec<BatchItem>> {
        let sql = format!(
            "SELECT {LOCKED_ITEM_COLUMNS} FROM subagent_batch_items WHERE batch_id = ? \
             AND status IN ('pending', 'queued', 'leased', 'running') ORDER BY position"
        );
        let locked = query_all(self.conn, &sql, [batch_id], decode_locked)?;
        Ok(self.note_all(locked))
    }

    async fn lock_claimable_items(&mut self, batch_id: &str, limit: u64) -> Result<Vec<BatchItem>> {
        let sql = format!(
            "SELECT {LOCKED_ITEM_COLUMNS} FROM subagent_batch_items WHERE batch_id = ? \
             AND status = 'queued' AND cancel_requested_at IS NULL ORDER BY position"
        );
        let locked = query_first(self.conn, &sql, [batch_id], limit, decode_locked)?;
        Ok(self.note_all(locked))
    }

    async fn promote_pending(&mut self, batch_id: &str, quota: u64, now: &Now) -> Result<u64> {
        promote(self.conn, batch_id, quota, now)
    }

    async fn write_batch(&mut self, batch: &BatchRecord) -> Result<()> {
        write_batch(self.conn, batch)
    }

    async fn write_items(&mut self, items: &[BatchItem]) -> Result<()> {
        write_items(self.conn, &self.rowids, items)
    }

    async fn insert_batch(&mut self, batch: &BatchRecord, items: &[BatchItem]) -> Result<bool> {
        insert_batch(self.conn, batch, items)
    }

    async fn submitted(&mut self, user_id: &str, key: &str) -> Result<Option<BatchRecord>> {
        let sql = format!(
            "SELECT {BATCH_COLUMNS} FROM subagent_batches WHERE user_id = ? \
             AND submission_key = ?"
        );
        Ok(query_all(self.conn, &sql, [user_id, key], decode_batch)?.pop())
    }
}

#[cfg(test)]
mod tests {
    use subflow_contracts::BatchItemStatus;
    use subflow_store::batches::{NewBatch, NewItem};

    use super::*;
    use crate::batches::at_once;
    use crate::{Target, open_writer};

    /// A writer connection holding one batch of two items; the items as submitted.
    fn submitted() -> (Connection, Vec<BatchItem>) {
        let conn = open_writer(&Target::Memory).unwrap();
        let batch = NewBatch {
            thread_id: "t".into(),
            user_id: "u".into(),
            run_id: None,
            tool_call_id: None,
            submission_key: "k".into(),
            title: "Rows".into(),
            subagent_type: "general-purpose".into(),
            max_live_items: 10,
            max_running_items: 10,
            max_attempts: 3,
            execution_spec: serde_json::json!({}),
            items: ["a", "b"]
                .map(|key| NewItem {
                    item_key: key.into(),
                    prompt: format!("prompt {key}"),
                    acceptance_criteria: Vec::new(),
                })
                .into(),
        };
        let (record, items) = batch.into_records("2026-01-01T00:00:00Z");
        assert!(insert_batch(&conn, &record, &items).unwrap());
        (conn, items)
    }

    fn status(conn: &Connection, item_id: &str) -> String {
        conn.query_row(
            "SELECT status FROM subagent_batch_items WHERE id = ?",
            [item_id],
            |row| row.get(0),
        )
        .unwrap()
    }

    #[test]
    fn an_item_is_written_back_to_the_row_it_was_read_from() {
        let (conn, items) = submitted();
        let clock = SharedClock::default();
        let mut rows = SqliteRows::new(&conn, &clock);
        let (batch_id, second) = (&items[1].batch_id, &items[1].id);
        let mut item = at_once(rows.lock_item(batch_id, second)).unwrap().unwrap();
        item.status = BatchItemStatus::Queued;
        at_once(rows.write_items(std::slice::from_ref(&item))).unwrap();
        assert_eq!(status(&conn, second), "queued");
        assert_eq!(status(&conn, &items[0].id), "pending");
    }

    #[test]
    fn an_item_not_read_in_the_transaction_is_not_written() {
        let (conn, items) = submitted();
        let clock = SharedClock::default();
        let mut rows = SqliteRows::new(&conn, &clock);
        let mut item = items[0].clone();
        item.status = BatchItemStatus::Queued;
        let error = at_once(rows.write_items(std::slice::from_ref(&item))).unwrap_err();
        assert!(error.to_string().contains("without being read"), "{error}");
        assert_eq!(status(&conn, &item.id), "pending");
    }
}
