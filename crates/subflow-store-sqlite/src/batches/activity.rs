//! `batch_activity` on SQLite: one grouped read over the scope's items, summing the
//! `token_usage` JSON per batch and model; `subflow_store::batches::fold_activity` merges
//! the groups as on every backend.

use rusqlite::params;
use subflow_store::batches::{
    ActivityQuery, ActivityRow, BatchActivity, BatchScope, ItemUsage, fold_activity,
};
use subflow_store::{Result, codec};

use crate::{Db, SqliteStore, query_all};

/// Items that finished at or after `?4` count as recent completions. Only items with
/// usage or a recent completion are read, so a batch of waiting items costs an index
/// scan of its rows and no JSON parsing.
const ACTIVITY: &str = "SELECT i.batch_id, i.model_name, COUNT(i.token_usage), \
     COALESCE(SUM(json_extract(i.token_usage, '$.input_tokens')), 0), \
     COALESCE(SUM(json_extract(i.token_usage, '$.output_tokens')), 0), \
     COALESCE(SUM(json_extract(i.token_usage, '$.total_tokens')), 0), \
     COALESCE(SUM(json_extract(i.token_usage, '$.cache_read_tokens')), 0), \
     COALESCE(SUM(json_extract(i.token_usage, '$.cache_write_tokens')), 0), \
     COALESCE(SUM(i.status IN ('succeeded', 'failed') AND i.completed_at >= ?4), 0), \
     MIN(CASE WHEN i.status IN ('succeeded', 'failed') AND i.completed_at >= ?4 \
         THEN COALESCE(i.started_at, i.completed_at) END) \
     FROM subagent_batches b JOIN subagent_batch_items i ON i.batch_id = b.id \
     WHERE b.user_id = ?1 AND (?2 IS NULL OR b.thread_id = ?2) \
     AND (?3 IS NULL OR b.id IN (SELECT value FROM json_each(?3))) \
     AND (i.token_usage IS NOT NULL \
          OR (i.status IN ('succeeded', 'failed') AND i.completed_at >= ?4)) \
     GROUP BY i.batch_id, i.model_name";

fn unsigned(value: i64) -> u64 {
    value.max(0) as u64
}

pub(super) async fn batch_activity(
    store: &SqliteStore,
    scope: &BatchScope,
    query: &ActivityQuery,
) -> Result<Vec<BatchActivity>> {
    query.validate()?;
    let scope = scope.clone();
    let ids = query.batch_ids.as_ref().map(codec::encode);
    let since = query.completed_since.clone();
    let rows = store
        .read(move |conn| {
            query_all(
                conn,
                ACTIVITY,
                params![scope.user_id, scope.thread_id, ids, since],
                |row| {
                    Ok(ActivityRow {
                        batch_id: row.get(0).db()?,
                        model_name: row.get(1).db()?,
                        items_with_usage: unsigned(row.get(2).db()?),
                        usage: ItemUsage {
                            input_tokens: row.get(3).db()?,
                            output_tokens: row.get(4).db()?,
                            total_tokens: row.get(5).db()?,
                            cache_read_tokens: row.get(6).db()?,
                            cache_write_tokens: row.get(7).db()?,
                        },
                        recent_completions: unsigned(row.get(8).db()?),
                        recent_first_start: row.get(9).db()?,
                    })
                },
            )
        })
        .await?;
    Ok(fold_activity(rows))
}
