//! `batch_activity` on PostgreSQL: one grouped read over the scope's items, summing the
//! `token_usage` JSON (stored as text) per batch and model; no lock is taken, a read
//! sees one committed snapshot. `subflow_store::batches::fold_activity` merges the
//! groups as on every backend.

use subflow_store::batches::{
    ActivityQuery, ActivityRow, BatchActivity, BatchScope, ItemUsage, fold_activity,
};
use subflow_store::{Error, Result};

use crate::{PostgresStore, get};

/// Items that finished at or after `$4` count as recent completions; only items with
/// usage or a recent completion are read.
const ACTIVITY: &str = "SELECT i.batch_id, i.model_name, COUNT(i.token_usage) AS items, \
     COALESCE(SUM((i.token_usage::jsonb ->> 'input_tokens')::bigint), 0)::bigint AS input, \
     COALESCE(SUM((i.token_usage::jsonb ->> 'output_tokens')::bigint), 0)::bigint AS output, \
     COALESCE(SUM((i.token_usage::jsonb ->> 'total_tokens')::bigint), 0)::bigint AS total, \
     COALESCE(SUM((i.token_usage::jsonb ->> 'cache_read_tokens')::bigint), 0)::bigint \
         AS cache_read, \
     COALESCE(SUM((i.token_usage::jsonb ->> 'cache_write_tokens')::bigint), 0)::bigint \
         AS cache_write, \
     COUNT(*) FILTER (WHERE i.status IN ('succeeded', 'failed') AND i.completed_at >= $4) \
         AS recent, \
     MIN(COALESCE(i.started_at, i.completed_at)) \
         FILTER (WHERE i.status IN ('succeeded', 'failed') AND i.completed_at >= $4) \
         AS recent_first_start \
     FROM subagent_batches b JOIN subagent_batch_items i ON i.batch_id = b.id \
     WHERE b.user_id = $1 AND ($2::text IS NULL OR b.thread_id = $2) \
     AND ($3::text[] IS NULL OR b.id = ANY($3)) \
     AND (i.token_usage IS NOT NULL \
          OR (i.status IN ('succeeded', 'failed') AND i.completed_at >= $4)) \
     GROUP BY i.batch_id, i.model_name";

fn unsigned(value: i64) -> u64 {
    value.max(0) as u64
}

pub(super) async fn batch_activity(
    store: &PostgresStore,
    scope: &BatchScope,
    query: &ActivityQuery,
) -> Result<Vec<BatchActivity>> {
    query.validate()?;
    let rows = sqlx::query(ACTIVITY)
        .bind(&scope.user_id)
        .bind(&scope.thread_id)
        .bind(&query.batch_ids)
        .bind(&query.completed_since)
        .fetch_all(store.pool())
        .await
        .map_err(Error::backend)?;
    let rows = rows
        .iter()
        .map(|row| {
            Ok(ActivityRow {
                batch_id: get(row, "batch_id")?,
                model_name: get(row, "model_name")?,
                items_with_usage: unsigned(get(row, "items")?),
                usage: ItemUsage {
                    input_tokens: get(row, "input")?,
                    output_tokens: get(row, "output")?,
                    total_tokens: get(row, "total")?,
                    cache_read_tokens: get(row, "cache_read")?,
                    cache_write_tokens: get(row, "cache_write")?,
                },
                recent_completions: unsigned(get(row, "recent")?),
                recent_first_start: get(row, "recent_first_start")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(fold_activity(rows))
}
