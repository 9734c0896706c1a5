//! Thread and run records (docs/api.md#objects, docs/usage-and-cost.md#run-buckets) on SQLite, with the semantics of `MemoryStore`.

use async_trait::async_trait;
use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, Row, params, params_from_iter};
use subflow_contracts::{RunStatus, ThreadId, ThreadStatus};
use subflow_store::{
    Error, NewRun, NewThread, RecordStore, Result, RunRecord, RunScope, RunStatusUpdate, RunUsage,
    ThreadRecord, ThreadSearch, codec, now_rfc3339,
};

use crate::{Db, SqliteStore, query_all, text};

const THREAD_COLUMNS: &str = "thread_id, owner, status, metadata, created_at, updated_at";

fn decode_thread(row: &Row<'_>) -> Result<ThreadRecord> {
    Ok(ThreadRecord {
        thread_id: row.get(0).db()?,
        owner: row.get(1).db()?,
        status: codec::parse("threads.status", text(row, 2)?)?,
        metadata: codec::object("threads.metadata", text(row, 3)?)?,
        created_at: row.get(4).db()?,
        updated_at: row.get(5).db()?,
    })
}

const RUN_COLUMNS: &str = "run_id, thread_id, owner, assistant_id, status, model_name, trace_id, \
     stop_reason, error, metadata, multitask_strategy, kwargs, total_input_tokens, \
     total_output_tokens, total_tokens, llm_call_count, lead_agent_tokens, subagent_tokens, \
     middleware_tokens, message_count, token_usage_by_model, created_at, updated_at";

fn decode_run(row: &Row<'_>) -> Result<RunRecord> {
    let stop_reason: Option<String> = row.get(7).db()?;
    Ok(RunRecord {
        run_id: row.get(0).db()?,
        thread_id: row.get(1).db()?,
        owner: row.get(2).db()?,
        assistant_id: row.get(3).db()?,
        status: codec::parse("runs.status", text(row, 4)?)?,
        model_name: row.get(5).db()?,
        trace_id: row.get(6).db()?,
        stop_reason: stop_reason
            .map(|reason| codec::parse("runs.stop_reason", &reason))
            .transpose()?,
        error: row.get(8).db()?,
        metadata: codec::object("runs.metadata", text(row, 9)?)?,
        multitask_strategy: row.get(10).db()?,
        kwargs: codec::json("runs.kwargs", text(row, 11)?)?,
        usage: RunUsage {
            total_input_tokens: row.get(12).db()?,
            total_output_tokens: row.get(13).db()?,
            total_tokens: row.get(14).db()?,
            llm_call_count: row.get(15).db()?,
            lead_agent_tokens: row.get(16).db()?,
            subagent_tokens: row.get(17).db()?,
            middleware_tokens: row.get(18).db()?,
            message_count: row.get(19).db()?,
            token_usage_by_model: codec::by_model("runs.token_usage_by_model", text(row, 20)?)?,
        },
        created_at: row.get(21).db()?,
        updated_at: row.get(22).db()?,
    })
}

#[async_trait]
impl RecordStore for SqliteStore {
    async fn create_thread(&self, thread: NewThread) -> Result<ThreadRecord> {
        ThreadId::parse(&thread.thread_id)?;
        let now = now_rfc3339();
        let metadata =
            serde_json::to_string(&thread.metadata).expect("a JSON map always serialises");
        let (thread_id, owner, created_at) =
            (thread.thread_id.clone(), thread.owner.clone(), now.clone());
        let inserted = self
            .write_small(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO threads (thread_id, owner, status, metadata, created_at, \
                     updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id) DO NOTHING",
                )
                .db()?
                .execute(params![
                    thread_id,
                    owner,
                    ThreadStatus::Idle.as_str(),
                    metadata,
                    created_at,
                    created_at
                ])
                .db()
            })
            .await?;
        if inserted == 0 {
            return Err(Error::ThreadExists(thread.thread_id));
        }
        Ok(ThreadRecord {
            thread_id: thread.thread_id,
            owner: thread.owner,
            status: ThreadStatus::Idle,
            metadata: thread.metadata,
            created_at: now.clone(),
            updated_at: now,
        })
    }

    async fn get_thread(&self, thread_id: &str) -> Result<Option<ThreadRecord>> {
        let thread_id = thread_id.to_owned();
        self.read(move |conn| {
            let sql = format!("SELECT {THREAD_COLUMNS} FROM threads WHERE thread_id = ?");
            let mut statement = conn.prepare_cached(&sql).db()?;
            let mut rows = statement.query([thread_id]).db()?;
            rows.next().db()?.map(decode_thread).transpose()
        })
        .await
    }

    async fn search_threads(&self, search: &ThreadSearch) -> Result<Vec<ThreadRecord>> {
        let mut sql = format!("SELECT {THREAD_COLUMNS} FROM threads WHERE owner = ?");
        let mut params = vec![SqlValue::Text(search.owner.clone())];
        if let Some(status) = search.status {
            sql.push_str(" AND status = ?");
            params.push(SqlValue::Text(status.as_str().to_owned()));
        }
        sql.push_str(" ORDER BY created_at DESC, rowid DESC");
        let threads = self
            .read(move |conn| query_all(conn, &sql, params_from_iter(params), decode_thread))
            .await?;
        Ok(search.page(threads))
    }

    async fn update_thread_metadata(
        &self,
        thread_id: &str,
        metadata: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Option<ThreadRecord>> {
        let thread_id = thread_id.to_owned();
        let patch = metadata.clone();
        let now = now_rfc3339();
        self.write(move |conn| {
            let sql = format!("SELECT {THREAD_COLUMNS} FROM threads WHERE thread_id = ?");
            let found = {
                let mut statement = conn.prepare_cached(&sql).db()?;
                let mut rows = statement.query([&thread_id]).db()?;
                rows.next().db()?.map(decode_thread).transpose()?
            };
            let Some(mut thread) = found else {
                return Ok(None);
            };
            thread.metadata.extend(patch);
            thread.updated_at = now;
            let text =
                serde_json::to_string(&thread.metadata).expect("a JSON map always serialises");
            conn.prepare_cached(
                "UPDATE threads SET metadata = ?, updated_at = ? WHERE thread_id = ?",
            )
            .db()?
            .execute(params![text, thread.updated_at, thread_id])
            .db()?;
            Ok(Some(thread))
        })
        .await
    }

    async fn set_thread_status(&self, thread_id: &str, status: ThreadStatus) -> Result<bool> {
        let thread_id = thread_id.to_owned();
        let now = now_rfc3339();
        let updated = self
            .write_small(move |conn| {
                conn.prepare_cached(
                    "UPDATE threads SET status = ?, updated_at = ? WHERE thread_id = ?",
                )
                .db()?
                .execute(params![status.as_str(), now, thread_id])
                .db()
            })
            .await?;
        Ok(updated > 0)
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool> {
        let thread_id = thread_id.to_owned();
        let deltas = self.inner.deltas.clone();
        self.write(move |conn| {
            let tx: &Connection = conn;
            for sql in [
                "DELETE FROM run_events WHERE thread_id = ?",
                "DELETE FROM thread_seq WHERE thread_id = ?",
                "DELETE FROM checkpoints WHERE thread_id = ?",
                // Items go with their batch (ON DELETE CASCADE).
                "DELETE FROM subagent_batches WHERE thread_id = ?",
            ] {
                tx.execute(sql, [&thread_id]).db()?;
            }
            tx.execute("DELETE FROM runs WHERE thread_id = ?", [&thread_id])
                .db()?;
            let deleted = tx
                .execute("DELETE FROM threads WHERE thread_id = ?", [&thread_id])
                .db()?;
            // Row ids may be reused once deleted: forget the thread's latest checkpoint.
            deltas.forget(&thread_id);
            Ok(deleted > 0)
        })
        .await
    }

    async fn create_run(&self, run: NewRun) -> Result<RunRecord> {
        ThreadId::parse(&run.thread_id)?;
        let now = now_rfc3339();
        let values = (
            run.run_id.clone(),
            run.thread_id.clone(),
            run.owner.clone(),
            run.assistant_id.clone(),
            run.model_name.clone(),
            run.trace_id.clone(),
            serde_json::to_string(&run.metadata).expect("a JSON map always serialises"),
            run.multitask_strategy.clone(),
            run.kwargs.to_string(),
            now.clone(),
        );
        let inserted = self
            .write_small(move |conn| {
                let (
                    run_id,
                    thread_id,
                    owner,
                    assistant,
                    model,
                    trace,
                    metadata,
                    strategy,
                    kwargs,
                    now,
                ) = values;
                conn.prepare_cached(
                    "INSERT INTO runs (run_id, thread_id, owner, assistant_id, status, \
                     model_name, trace_id, metadata, multitask_strategy, kwargs, created_at, \
                     updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                     ON CONFLICT (run_id) DO NOTHING",
                )
                .db()?
                .execute(params![
                    run_id,
                    thread_id,
                    owner,
                    assistant,
                    RunStatus::Pending.as_str(),
                    model,
                    trace,
                    metadata,
                    strategy,
                    kwargs,
                    now,
                    now
                ])
                .db()
            })
            .await?;
        if inserted == 0 {
            return Err(Error::RunExists(run.run_id));
        }
        Ok(codec::new_run_record(run, now))
    }

    async fn get_run(&self, thread_id: &str, run_id: &str) -> Result<Option<RunRecord>> {
        let (thread_id, run_id) = (thread_id.to_owned(), run_id.to_owned());
        self.read(move |conn| {
            let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ? AND thread_id = ?");
            let mut statement = conn.prepare_cached(&sql).db()?;
            let mut rows = statement.query([run_id, thread_id]).db()?;
            rows.next().db()?.map(decode_run).transpose()
        })
        .await
    }

    async fn list_runs(
        &self,
        scope: RunScope<'_>,
        status: Option<RunStatus>,
        limit: u32,
        offset: u32,
    ) -> Result<Vec<RunRecord>> {
        let (column, value) = scope.column();
        let mut sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE {column} = ?");
        let mut params = vec![SqlValue::Text(value.to_owned())];
        if let Some(status) = status {
            sql.push_str(" AND status = ?");
            params.push(SqlValue::Text(status.as_str().to_owned()));
        }
        sql.push_str(" ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?");
        params.push(SqlValue::Integer(i64::from(limit)));
        params.push(SqlValue::Integer(i64::from(offset)));
        self.read(move |conn| query_all(conn, &sql, params_from_iter(params), decode_run))
            .await
    }

    async fn update_run_status(&self, run_id: &str, update: &RunStatusUpdate) -> Result<bool> {
        let run_id = run_id.to_owned();
        let status = update.status.as_str();
        let stop_reason = update.stop_reason.map(|reason| reason.as_str());
        let error = update.error.clone();
        let owner = update.lease_owner.clone();
        let now = now_rfc3339();
        let updated = self
            .write_small(move |conn| {
                crate::streams::check_lease(conn, &run_id, owner.as_deref())?;
                // The first terminal status wins: only an active run changes.
                conn.prepare_cached(
                    "UPDATE runs SET status = ?, stop_reason = ?, error = ?, updated_at = ? \
                     WHERE run_id = ? AND status IN ('pending', 'running')",
                )
                .db()?
                .execute(params![status, stop_reason, error, now, run_id])
                .db()
            })
            .await?;
        Ok(updated > 0)
    }

    async fn save_run_usage(
        &self,
        run_id: &str,
        usage: &RunUsage,
        lease_owner: Option<&str>,
    ) -> Result<bool> {
        let run_id = run_id.to_owned();
        let usage = usage.clone();
        let owner = lease_owner.map(str::to_owned);
        let by_model = codec::by_model_text(&usage.token_usage_by_model);
        let now = now_rfc3339();
        let updated = self
            .write_small(move |conn| {
                crate::streams::check_lease(conn, &run_id, owner.as_deref())?;
                conn.prepare_cached(
                    "UPDATE runs SET total_input_tokens = ?, total_output_tokens = ?, \
                     total_tokens = ?, llm_call_count = ?, lead_agent_tokens = ?, \
                     subagent_tokens = ?, middleware_tokens = ?, message_count = ?, \
                     token_usage_by_model = ?, updated_at = ? WHERE run_id = ?",
                )
                .db()?
                .execute(params![
                    usage.total_input_tokens,
                    usage.total_output_tokens,
                    usage.total_tokens,
                    usage.llm_call_count,
                    usage.lead_agent_tokens,
                    usage.subagent_tokens,
                    usage.middleware_tokens,
                    usage.message_count,
                    by_model,
                    now,
                    run_id
                ])
                .db()
            })
            .await?;
        Ok(updated > 0)
    }

    async fn delete_run(&self, thread_id: &str, run_id: &str) -> Result<bool> {
        let (thread_id, run_id) = (thread_id.to_owned(), run_id.to_owned());
        self.write(move |conn| {
            let tx: &Connection = conn;
            tx.execute(
                "DELETE FROM run_events WHERE thread_id = ? AND run_id = ?",
                [&thread_id, &run_id],
            )
            .db()?;
            let deleted = tx
                .execute(
                    "DELETE FROM runs WHERE thread_id = ? AND run_id = ?",
                    [&thread_id, &run_id],
                )
                .db()?;
            Ok(deleted > 0)
        })
        .await
    }
}
