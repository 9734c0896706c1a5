//! Task summaries (docs/api.md#task-summaries) on SQLite: one statement reads a run's `subagent.*` rows
//! once and returns at most five rows per task (its first `seq`, start, end, the last two
//! listable steps and the latest usage); `subflow_store::tasks` folds them.

use std::sync::OnceLock;

use rusqlite::Row;
use subflow_store::Result;
use subflow_store::tasks::{self, TaskQueryRow, TaskSummary};

use crate::{Db, SqliteStore, query_all};

/// `?1` thread, `?2` run, `?3` the characters JavaScript's `trim` removes. A step is
/// listable when it is a tool step or its text is a string that is not blank; of the
/// records of one `message_index` (a whole, non-negative number) the latest `seq` wins.
const TASK_SUMMARY_QUERY: &str = "
WITH task_rows AS (
    SELECT seq, event_type, task_id, created_at, content FROM run_events
    WHERE thread_id = ?1 AND run_id = ?2 AND category = 'subagent' AND task_id IS NOT NULL
),
indexed AS (
    SELECT seq, task_id, content, json_extract(content, '$.message_index') AS message_index
    FROM task_rows
    WHERE event_type = 'subagent.step'
      AND json_type(content, '$.message_index') IN ('integer', 'real')
),
steps AS (
    SELECT task_id, content, message_index FROM (
        SELECT *, ROW_NUMBER() OVER (PARTITION BY task_id, message_index ORDER BY seq DESC) AS copy
        FROM indexed
        WHERE message_index >= 0 AND message_index = CAST(message_index AS INTEGER)
    ) WHERE copy = 1
),
listable AS (
    SELECT task_id, content,
           ROW_NUMBER() OVER (PARTITION BY task_id ORDER BY message_index DESC) AS from_last,
           COUNT(*) OVER (PARTITION BY task_id) AS listable
    FROM steps
    WHERE json_extract(content, '$.kind') = 'tool'
       OR (json_type(content, '$.text') = 'text'
           AND trim(json_extract(content, '$.text'), ?3) <> '')
),
latest AS (
    SELECT task_id, content -> '$.usage' AS usage,
           ROW_NUMBER() OVER (PARTITION BY task_id ORDER BY message_index DESC) AS from_last
    FROM steps
)
SELECT 'first', task_id, MIN(seq), NULL, NULL, NULL FROM task_rows GROUP BY task_id
UNION ALL
SELECT event_type, task_id, seq, created_at, content, NULL FROM task_rows
WHERE event_type IN ('subagent.start', 'subagent.end')
UNION ALL
SELECT 'listable', task_id, from_last, NULL, content, listable FROM listable WHERE from_last <= 2
UNION ALL
SELECT 'usage', task_id, NULL, NULL, usage, NULL FROM latest WHERE from_last = 1 AND usage IS NOT NULL";

fn decode(row: &Row<'_>) -> Result<TaskQueryRow> {
    Ok(TaskQueryRow {
        part: row.get(0).db()?,
        task_id: row.get(1).db()?,
        seq: row.get(2).db()?,
        created_at: row.get(3).db()?,
        content: row.get(4).db()?,
        count: row.get(5).db()?,
    })
}

fn js_whitespace() -> &'static str {
    static SET: OnceLock<String> = OnceLock::new();
    SET.get_or_init(tasks::js_whitespace)
}

impl SqliteStore {
    /// [`EventStore::task_summaries`](subflow_store::EventStore::task_summaries).
    pub(crate) async fn read_task_summaries(
        &self,
        thread_id: &str,
        run_id: &str,
    ) -> Result<Vec<TaskSummary>> {
        let params = (thread_id.to_owned(), run_id.to_owned(), js_whitespace());
        let rows = self
            .read(move |conn| query_all(conn, TASK_SUMMARY_QUERY, params, decode))
            .await?;
        Ok(tasks::summarize_all(tasks::rows_from_query(rows)?))
    }
}
