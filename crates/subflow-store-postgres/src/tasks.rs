//! Task summaries (docs/api.md#task-summaries) on PostgreSQL: one statement reads a run's `subagent.*`
//! rows once and returns at most five rows per task (its first `seq`, start, end, the last
//! two listable steps and the latest usage); `subflow_store::tasks` folds them.

use std::sync::OnceLock;

use sqlx::postgres::PgRow;
use subflow_store::tasks::{self, TaskQueryRow, TaskSummary};
use subflow_store::{Error, Result};

use crate::{PostgresStore, get};

/// `$1` thread, `$2` run, `$3` the characters JavaScript's `trim` removes. A step is
/// listable when it is a tool step or its text is a string that is not blank; of the
/// records of one `message_index` (a whole, non-negative number) the latest `seq` wins.
/// PostgreSQL refuses every JSON operation on a document holding an escaped NUL, so the
/// query reads `\u0000` as `\u0001`: same length, still valid JSON, and as non-blank
/// (rows handed back keep their stored content).
const TASK_SUMMARY_QUERY: &str = "
WITH task_rows AS (
    SELECT seq, event_type, task_id, created_at, content FROM run_events
    WHERE thread_id = $1 AND run_id = $2 AND category = 'subagent' AND task_id IS NOT NULL
),
parsed AS (
    SELECT seq, task_id, content, doc,
           CASE WHEN jsonb_typeof(doc -> 'message_index') = 'number'
                THEN (doc ->> 'message_index')::numeric END AS message_index
    FROM (SELECT seq, task_id, content,
                 replace(content, chr(92) || 'u0000', chr(92) || 'u0001')::jsonb AS doc
          FROM task_rows WHERE event_type = 'subagent.step') AS records
),
steps AS (
    SELECT task_id, content, doc, message_index FROM (
        SELECT *, ROW_NUMBER() OVER (PARTITION BY task_id, message_index ORDER BY seq DESC) AS copy
        FROM parsed
        WHERE message_index >= 0 AND message_index = trunc(message_index)
    ) AS numbered WHERE copy = 1
),
listable AS (
    SELECT task_id, content,
           ROW_NUMBER() OVER (PARTITION BY task_id ORDER BY message_index DESC) AS from_last,
           COUNT(*) OVER (PARTITION BY task_id) AS listable
    FROM steps
    WHERE (jsonb_typeof(doc -> 'kind') = 'string' AND doc ->> 'kind' = 'tool')
       OR (jsonb_typeof(doc -> 'text') = 'string' AND btrim(doc ->> 'text', $3) <> '')
),
latest AS (
    SELECT task_id, (doc -> 'usage')::text AS usage,
           ROW_NUMBER() OVER (PARTITION BY task_id ORDER BY message_index DESC) AS from_last
    FROM steps
)
SELECT 'first' AS part, task_id, MIN(seq) AS seq, NULL AS created_at, NULL AS content,
       NULL::bigint AS count
FROM task_rows GROUP BY task_id
UNION ALL
SELECT event_type, task_id, seq, created_at, content, NULL FROM task_rows
WHERE event_type IN ('subagent.start', 'subagent.end')
UNION ALL
SELECT 'listable', task_id, from_last, NULL, content, listable FROM listable WHERE from_last <= 2
UNION ALL
SELECT 'usage', task_id, NULL, NULL, usage, NULL FROM latest WHERE from_last = 1 AND usage IS NOT NULL";

fn decode(row: &PgRow) -> Result<TaskQueryRow> {
    Ok(TaskQueryRow {
        part: get(row, "part")?,
        task_id: get(row, "task_id")?,
        seq: get(row, "seq")?,
        created_at: get(row, "created_at")?,
        content: get(row, "content")?,
        count: get(row, "count")?,
    })
}

fn js_whitespace() -> &'static str {
    static SET: OnceLock<String> = OnceLock::new();
    SET.get_or_init(tasks::js_whitespace)
}

impl PostgresStore {
    /// [`EventStore::task_summaries`](subflow_store::EventStore::task_summaries).
    pub(crate) async fn read_task_summaries(
        &self,
        thread_id: &str,
        run_id: &str,
    ) -> Result<Vec<TaskSummary>> {
        let rows = sqlx::query(TASK_SUMMARY_QUERY)
            .bind(thread_id)
            .bind(run_id)
            .bind(js_whitespace())
            .fetch_all(self.pool())
            .await
            .map_err(Error::backend)?;
        let rows = rows.iter().map(decode).collect::<Result<Vec<_>>>()?;
        Ok(tasks::summarize_all(tasks::rows_from_query(rows)?))
    }
}
