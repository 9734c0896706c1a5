//! Durable batches (docs/batches.md) on SQLite, with the semantics of `MemoryStore`: every
//! call is one `BEGIN IMMEDIATE` transaction (the single writer serialises claim passes
//! and worker writes) that loads the batch row, then the item rows it needs, applies
//! `subflow_store::batches::machine` and writes back what changed. One process uses the
//! file, so lease and heartbeat times are this process's clock (the store's [`Clock`]).
//!
//! [`Clock`]: subflow_store::batches::Clock

mod activity;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};
use subflow_contracts::{BatchItemStatus, BatchStatus};
use subflow_store::batches::machine::{self, Now};
use subflow_store::batches::{
    ActivityQuery, AttemptOutcome, BatchActivity, BatchCounts, BatchItem, BatchQuery, BatchRecord,
    BatchScope, BatchStore, BatchTotals, ClaimPass, ClaimRequest, EXPORT_PAGE, ItemFailure,
    ItemLease, ItemQuery, ItemSuccess, NewBatch, ReleaseReason, Renewal, RetryOutcome, Submitted,
    WorkerHeartbeat,
};
use subflow_store::streams::millis;
use subflow_store::{Result, codec};

use crate::{Db, SqliteStore, query_all, query_first, text};

/// The columns [`decode_batch`] reads, the last one the `execution_spec` as `$spec`.
macro_rules! batch_columns {
    ($spec:literal) => {
        concat!(
            "id, thread_id, title, subagent_type, status, total_items, max_live_items, \
             max_running_items, max_attempts, created_at, updated_at, completed_at, \
             pending_count, queued_count, leased_count, running_count, succeeded_count, \
             failed_count, cancelled_count, user_id, run_id, tool_call_id, submission_key, ",
            $spec
        )
    };
}

const BATCH_COLUMNS: &str = batch_columns!(
    "(SELECT execution_spec FROM subagent_batch_specs WHERE batch_id = subagent_batches.id)"
);

/// [`BATCH_COLUMNS`] with `NULL` for the `execution_spec`: what a worker write reads,
/// since none of them looks at the spec.
const BATCH_STATE_COLUMNS: &str = batch_columns!("NULL");

fn count(row: &Row<'_>, index: usize) -> Result<u64> {
    let value: i64 = row.get(index).db()?;
    Ok(value.max(0) as u64)
}

fn decode_batch(row: &Row<'_>) -> Result<BatchRecord> {
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
        execution_spec: match row.get::<_, Option<String>>(23).db()? {
            Some(spec) => codec::json("subagent_batch_specs.execution_spec", &spec)?,
            // Every batch has its spec: only BATCH_STATE_COLUMNS reads none.
            None => serde_json::Value::Null,
        },
    })
}

/// Every item column; [`LISTED_ITEM_COLUMNS`] reads the same without the result.
const ITEM_COLUMNS: &str = "id, batch_id, item_key, position, status, attempt, model_name, \
     result_preview, result_truncated, error, stop_reason, token_usage, acceptance_criteria, \
     acceptance_verdict, started_at, completed_at, created_at, updated_at, prompt, lease_owner, \
     lease_expires_at, cancel_requested_at, result, retries";

const LISTED_ITEM_COLUMNS: &str = "id, batch_id, item_key, position, status, attempt, \
     model_name, result_preview, result_truncated, error, stop_reason, token_usage, \
     acceptance_criteria, acceptance_verdict, started_at, completed_at, created_at, \
     updated_at, prompt, lease_owner, lease_expires_at, cancel_requested_at, NULL, retries";

fn decode_item(row: &Row<'_>) -> Result<BatchItem> {
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

fn load_batch(conn: &Connection, batch_id: &str) -> Result<Option<BatchRecord>> {
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
fn scoped_batch(
    conn: &Connection,
    scope: &BatchScope,
    batch_id: &str,
) -> Result<Option<BatchRecord>> {
    Ok(load_batch(conn, batch_id)?.filter(|batch| scope.sees(batch)))
}

fn load_item(conn: &Connection, batch_id: &str, item_id: &str) -> Result<Option<BatchItem>> {
    let sql =
        format!("SELECT {ITEM_COLUMNS} FROM subagent_batch_items WHERE id = ? AND batch_id = ?");
    let mut statement = conn.prepare_cached(&sql).db()?;
    let mut rows = statement.query([item_id, batch_id]).db()?;
    rows.next().db()?.map(decode_item).transpose()
}

fn write_batch(conn: &Connection, batch: &BatchRecord) -> Result<()> {
    let c = &batch.counts;
    conn.prepare_cached(
        "UPDATE subagent_batches SET status = ?, updated_at = ?, completed_at = ?, \
         pending_count = ?, queued_count = ?, leased_count = ?, running_count = ?, \
         succeeded_count = ?, failed_count = ?, cancelled_count = ? WHERE id = ?",
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
        batch.id
    ])
    .db()?;
    Ok(())
}

fn write_item(conn: &Connection, item: &BatchItem) -> Result<()> {
    conn.prepare_cached(
        "UPDATE subagent_batch_items SET status = ?, attempt = ?, model_name = ?, \
         result = ?, result_preview = ?, result_truncated = ?, error = ?, stop_reason = ?, \
         token_usage = ?, acceptance_verdict = ?, lease_owner = ?, lease_expires_at = ?, \
         cancel_requested_at = ?, started_at = ?, completed_at = ?, updated_at = ?, \
         retries = ? WHERE id = ?",
    )
    .db()?
    .execute(params![
        item.status.as_str(),
        item.attempt,
        item.model_name,
        item.result,
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
        item.id
    ])
    .db()?;
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

/// The existing batch of a user's submission key.
fn submitted(conn: &Connection, user_id: &str, key: &str) -> Result<Option<BatchRecord>> {
    let sql = format!(
        "SELECT {BATCH_COLUMNS} FROM subagent_batches WHERE user_id = ? AND submission_key = ?"
    );
    let mut statement = conn.prepare_cached(&sql).db()?;
    let mut rows = statement.query([user_id, key]).db()?;
    rows.next().db()?.map(decode_batch).transpose()
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

/// One claim pass over the active batches, inside the caller's transaction.
fn claim_pass(conn: &Connection, request: &ClaimRequest, now: &Now) -> Result<ClaimPass> {
    let expires_at = now.millis.saturating_add(millis(request.lease));
    let mut pass = ClaimPass {
        lease_owner: request.mint_lease_owner(),
        ..ClaimPass::default()
    };
    let sql = format!(
        "SELECT {BATCH_COLUMNS} FROM subagent_batches \
         WHERE status IN ('queued', 'running', 'paused') ORDER BY created_at, id"
    );
    let batches = query_all(conn, &sql, [], decode_batch)?;
    let mut free = u64::from(request.free_slots);
    let mut admitted = request.admitted;
    for mut batch in batches {
        let before = batch.clone();
        if batch.counts.leased_or_running() > 0 {
            // One status at a time, so the partial status index is provably usable;
            // INDEXED BY keeps SQLite from reading the batch's every item in position
            // order instead.
            let mut expired = Vec::new();
            for status in ["leased", "running"] {
                let sql = format!(
                    "SELECT {ITEM_COLUMNS} FROM subagent_batch_items \
                     INDEXED BY subagent_batch_items_unfinished WHERE batch_id = ? \
                     AND status = '{status}' AND lease_expires_at <= ?"
                );
                expired.extend(query_all(
                    conn,
                    &sql,
                    params![batch.id, now.millis],
                    decode_item,
                )?);
            }
            expired.sort_by_key(|item| item.position);
            for mut item in expired {
                machine::recover_expired(&mut batch, &mut item, now);
                write_item(conn, &item)?;
                pass.expired += 1;
            }
        }
        let quota = machine::promotion_quota(&batch);
        if quota > 0 {
            let promoted = promote(conn, &batch.id, quota, now)?;
            machine::promoted(&mut batch, promoted, now);
            pass.promoted += promoted;
        }
        let quota = machine::claim_quota(&batch, free);
        let mut claimed = Vec::new();
        if quota > 0 {
            let sql = format!(
                "SELECT {ITEM_COLUMNS} FROM subagent_batch_items WHERE batch_id = ? \
                 AND status = 'queued' AND cancel_requested_at IS NULL ORDER BY position"
            );
            let queued = query_first(conn, &sql, [&batch.id], quota, decode_item)?;
            for mut item in queued {
                machine::claim(
                    &mut batch,
                    &mut item,
                    &pass.lease_owner,
                    expires_at,
                    &mut admitted,
                    now,
                );
                write_item(conn, &item)?;
                claimed.push(item);
            }
        }
        if batch != before {
            write_batch(conn, &batch)?;
        }
        free -= claimed.len() as u64;
        pass.add_claims(&batch, claimed);
    }
    Ok(pass)
}

impl SqliteStore {
    /// Runs a worker write on the item `lease` names in one IMMEDIATE transaction; the
    /// item and batch are written back when `write` reports a change. `missing` is the
    /// answer when the item does not exist.
    async fn worker_write<T, F>(&self, lease: &ItemLease, missing: T, write: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut BatchRecord, &mut BatchItem, &Now) -> (T, bool) + Send + 'static,
    {
        let lease = lease.clone();
        let clock = self.inner.clock.clone();
        self.write(move |conn| {
            let now = clock.now();
            let Some(mut batch) = load_batch_state(conn, &lease.batch_id)? else {
                return Ok(missing);
            };
            let Some(mut item) = load_item(conn, &lease.batch_id, &lease.item_id)? else {
                return Ok(missing);
            };
            let (answer, changed) = write(&mut batch, &mut item, &now);
            if changed {
                write_item(conn, &item)?;
                write_batch(conn, &batch)?;
            }
            Ok(answer)
        })
        .await
    }

    /// Loads a scoped batch, applies `change` to it in one IMMEDIATE transaction and
    /// writes it back with any items `change` returns.
    async fn batch_write<T, F>(&self, scope: &BatchScope, batch_id: &str, change: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Option<&mut BatchRecord>, &Now) -> Result<(T, Vec<BatchItem>)>
            + Send
            + 'static,
    {
        let (scope, batch_id) = (scope.clone(), batch_id.to_owned());
        let clock = self.inner.clock.clone();
        self.write(move |conn| {
            let now = clock.now();
            let mut batch = scoped_batch(conn, &scope, &batch_id)?;
            let before = batch.clone();
            let (answer, items) = change(conn, batch.as_mut(), &now)?;
            for item in &items {
                write_item(conn, item)?;
            }
            if let Some(batch) = &batch
                && before.as_ref() != Some(batch)
            {
                write_batch(conn, batch)?;
            }
            Ok(answer)
        })
        .await
    }
}

#[async_trait]
impl BatchStore for SqliteStore {
    async fn submit_batch(&self, batch: NewBatch) -> Result<Submitted> {
        batch.validate()?;
        let now = self.inner.clock.now();
        let (user_id, key) = (batch.user_id.clone(), batch.submission_key.clone());
        let (record, items) = batch.into_records(&now.stamp);
        self.write(move |conn| {
            if let Some(existing) = submitted(conn, &user_id, &key)? {
                return Ok(Submitted {
                    batch: existing,
                    created: false,
                });
            }
            insert_batch(conn, &record, &items)?;
            Ok(Submitted {
                batch: record,
                created: true,
            })
        })
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
        self.batch_write(scope, batch_id, |_, batch, now| {
            Ok((
                batch.map(|batch| {
                    machine::pause(batch, now);
                    batch.clone()
                }),
                Vec::new(),
            ))
        })
        .await
    }

    async fn resume_batch(
        &self,
        scope: &BatchScope,
        batch_id: &str,
    ) -> Result<Option<BatchRecord>> {
        self.batch_write(scope, batch_id, |_, batch, now| {
            Ok((
                batch.map(|batch| {
                    machine::resume(batch, now);
                    batch.clone()
                }),
                Vec::new(),
            ))
        })
        .await
    }

    async fn cancel_batch(
        &self,
        scope: &BatchScope,
        batch_id: &str,
    ) -> Result<Option<BatchRecord>> {
        self.batch_write(scope, batch_id, |conn, batch, now| {
            let Some(batch) = batch else {
                return Ok((None, Vec::new()));
            };
            let mut items = Vec::new();
            if machine::cancel(batch, now) {
                let sql = format!(
                    "SELECT {ITEM_COLUMNS} FROM subagent_batch_items WHERE batch_id = ? \
                     AND status IN ('pending', 'queued', 'leased', 'running') ORDER BY position"
                );
                items = query_all(conn, &sql, [&batch.id], decode_item)?;
                for item in &mut items {
                    machine::cancel_with_batch(batch, item, now);
                }
            }
            Ok((Some(batch.clone()), items))
        })
        .await
    }

    async fn retry_item(
        &self,
        scope: &BatchScope,
        batch_id: &str,
        item_id: &str,
    ) -> Result<RetryOutcome> {
        let item_id = item_id.to_owned();
        self.batch_write(scope, batch_id, move |conn, batch, now| {
            let Some(batch) = batch else {
                return Ok((RetryOutcome::BatchNotFound, Vec::new()));
            };
            let Some(mut item) = load_item(conn, &batch.id, &item_id)? else {
                return Ok((RetryOutcome::NotFailed, Vec::new()));
            };
            Ok(match machine::retry(batch, &mut item, now) {
                Ok(()) => (
                    RetryOutcome::Retried {
                        batch: Box::new(batch.clone()),
                        item: Box::new(item.clone()),
                    },
                    vec![item],
                ),
                Err(machine::RetryRefusal::NotFailed) => (RetryOutcome::NotFailed, Vec::new()),
                Err(machine::RetryRefusal::BatchCancelled) => {
                    (RetryOutcome::BatchCancelled, Vec::new())
                }
            })
        })
        .await
    }

    async fn claim_pass(&self, request: &ClaimRequest) -> Result<ClaimPass> {
        request.validate()?;
        let request = request.clone();
        let clock = self.inner.clock.clone();
        self.write(move |conn| claim_pass(conn, &request, &clock.now()))
            .await
    }

    async fn mark_running(&self, lease: &ItemLease) -> Result<bool> {
        let fence = lease.clone();
        self.worker_write(lease, false, move |batch, item, now| {
            let changed = machine::mark_running(batch, item, &fence, now);
            (changed, changed)
        })
        .await
    }

    async fn renew_lease(&self, lease: &ItemLease, ttl: Duration) -> Result<Renewal> {
        let fence = lease.clone();
        self.worker_write(lease, Renewal::Lost, move |_, item, now| {
            let expires_at = now.millis.saturating_add(millis(ttl));
            let renewal = machine::renew(item, &fence, expires_at, now);
            (renewal, matches!(renewal, Renewal::Held { .. }))
        })
        .await
    }

    async fn finish_success(
        &self,
        lease: &ItemLease,
        outcome: &ItemSuccess,
    ) -> Result<Option<BatchItemStatus>> {
        let (fence, outcome) = (lease.clone(), outcome.clone());
        self.worker_write(lease, None, move |batch, item, now| {
            let status = machine::finish_success(batch, item, &fence, &outcome, now);
            (status, status.is_some())
        })
        .await
    }

    async fn finish_failure(
        &self,
        lease: &ItemLease,
        outcome: &ItemFailure,
    ) -> Result<Option<BatchItemStatus>> {
        let (fence, outcome) = (lease.clone(), outcome.clone());
        self.worker_write(lease, None, move |batch, item, now| {
            let status = machine::finish_failure(batch, item, &fence, &outcome, now);
            (status, status.is_some())
        })
        .await
    }

    /// One write job: each batch row is loaded and written once, each item once.
    async fn finish_attempts(
        &self,
        outcomes: &[(ItemLease, AttemptOutcome)],
    ) -> Result<Vec<Option<BatchItemStatus>>> {
        let outcomes = outcomes.to_vec();
        let clock = self.inner.clock.clone();
        self.write(move |conn| {
            let now = clock.now();
            // Each batch as loaded, and whether an outcome changed it.
            let mut batches: HashMap<String, (Option<BatchRecord>, bool)> = HashMap::new();
            let mut statuses = Vec::with_capacity(outcomes.len());
            for (lease, outcome) in &outcomes {
                let (batch, changed) = match batches.entry(lease.batch_id.clone()) {
                    Entry::Occupied(entry) => entry.into_mut(),
                    Entry::Vacant(entry) => {
                        entry.insert((load_batch_state(conn, &lease.batch_id)?, false))
                    }
                };
                let (Some(batch), Some(mut item)) = (
                    batch.as_mut(),
                    load_item(conn, &lease.batch_id, &lease.item_id)?,
                ) else {
                    statuses.push(None);
                    continue;
                };
                let status = match outcome {
                    AttemptOutcome::Succeeded(success) => {
                        machine::finish_success(batch, &mut item, lease, success, &now)
                    }
                    AttemptOutcome::Failed(failure) => {
                        machine::finish_failure(batch, &mut item, lease, failure, &now)
                    }
                };
                if status.is_some() {
                    write_item(conn, &item)?;
                    *changed = true;
                }
                statuses.push(status);
            }
            for (batch, changed) in batches.values() {
                if let (Some(batch), true) = (batch, changed) {
                    write_batch(conn, batch)?;
                }
            }
            Ok(statuses)
        })
        .await
    }

    async fn release_claim(
        &self,
        lease: &ItemLease,
        reason: &ReleaseReason,
    ) -> Result<Option<BatchItemStatus>> {
        let (fence, reason) = (lease.clone(), reason.clone());
        self.worker_write(lease, None, move |batch, item, now| {
            let status = machine::release(batch, item, &fence, &reason, now);
            (status, status.is_some())
        })
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
