//! Thread and run records (docs/api.md#objects, docs/usage-and-cost.md#run-buckets) with the semantics of `MemoryStore`.

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::PgRow;
use subflow_contracts::{RunStatus, ThreadId, ThreadStatus};
use subflow_store::{
    Error, NewRun, NewThread, RecordStore, Result, RunRecord, RunScope, RunStatusUpdate, RunUsage,
    ThreadRecord, ThreadSearch, codec, now_rfc3339,
};

use crate::{PostgresStore, get, object_text, value_text};

/// The `SELECT` of every column [`run_from_row`] reads, as a literal for `concat!`.
macro_rules! select_runs {
    () => {
        "SELECT run_id, thread_id, owner, assistant_id, status, model_name, trace_id, \
         stop_reason, error, metadata, multitask_strategy, kwargs, total_input_tokens, \
         total_output_tokens, total_tokens, llm_call_count, lead_agent_tokens, \
         subagent_tokens, middleware_tokens, message_count, token_usage_by_model, \
         created_at, updated_at FROM runs"
    };
}

/// The `SELECT` of every column [`thread_from_row`] reads, as a literal for `concat!`.
macro_rules! select_threads {
    () => {
        "SELECT thread_id, owner, status, metadata, created_at, updated_at FROM threads"
    };
}

/// `$update` (an `UPDATE runs … WHERE run_id = $1 …`) fenced by the lease owner bound
/// at `$owner` (NULL: unfenced), as one statement: the lease row is read `FOR SHARE` and
/// the run row updated in the same statement, so no lock outlives it (a process frozen
/// between two statements of a transaction would hold them and stall the recovery that
/// waits for them). Answers `held` and `updated`.
macro_rules! fenced {
    ($update:literal, $owner:literal) => {
        concat!(
            "WITH lease AS (SELECT owner FROM run_leases WHERE run_id = $1 FOR SHARE), ",
            "fence AS (SELECT $",
            $owner,
            "::text IS NULL ",
            "OR EXISTS (SELECT 1 FROM lease WHERE owner = $",
            $owner,
            ") AS held), ",
            "updated AS (",
            $update,
            " AND (SELECT held FROM fence) RETURNING 1) ",
            "SELECT (SELECT held FROM fence) AS held, (SELECT count(*) FROM updated) AS updated"
        )
    };
}

#[async_trait]
impl RecordStore for PostgresStore {
    async fn create_thread(&self, thread: NewThread) -> Result<ThreadRecord> {
        ThreadId::parse(&thread.thread_id)?;
        let now = now_rfc3339();
        let record = ThreadRecord {
            thread_id: thread.thread_id,
            owner: thread.owner,
            status: ThreadStatus::Idle,
            metadata: thread.metadata,
            created_at: now.clone(),
            updated_at: now,
        };
        let inserted = sqlx::query(
            "INSERT INTO threads (thread_id, owner, status, metadata, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (thread_id) DO NOTHING",
        )
        .bind(&record.thread_id)
        .bind(&record.owner)
        .bind(record.status.as_str())
        .bind(object_text(&record.metadata))
        .bind(&record.created_at)
        .bind(&record.updated_at)
        .execute(self.pool())
        .await
        .map_err(Error::backend)?;
        if inserted.rows_affected() == 0 {
            return Err(Error::ThreadExists(record.thread_id));
        }
        Ok(record)
    }

    async fn get_thread(&self, thread_id: &str) -> Result<Option<ThreadRecord>> {
        let row = sqlx::query(concat!(select_threads!(), " WHERE thread_id = $1"))
            .bind(thread_id)
            .fetch_optional(self.pool())
            .await
            .map_err(Error::backend)?;
        row.as_ref().map(thread_from_row).transpose()
    }

    async fn search_threads(&self, search: &ThreadSearch) -> Result<Vec<ThreadRecord>> {
        // The metadata filter compares JSON values the way serde_json does, as every
        // backend must, so it runs in `page` after SQL has narrowed by owner and status.
        let rows = sqlx::query(concat!(
            select_threads!(),
            " WHERE owner = $1 AND ($2::text IS NULL OR status = $2)",
            " ORDER BY created_at DESC, id DESC"
        ))
        .bind(&search.owner)
        .bind(search.status.map(ThreadStatus::as_str))
        .fetch_all(self.pool())
        .await
        .map_err(Error::backend)?;
        let newest_first = rows.iter().map(thread_from_row).collect::<Result<_>>()?;
        Ok(search.page(newest_first))
    }

    async fn update_thread_metadata(
        &self,
        thread_id: &str,
        metadata: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Option<ThreadRecord>> {
        // Merged in Rust under the row lock, so the stored text keeps serde_json's form.
        let mut tx = self.pool().begin().await.map_err(Error::backend)?;
        let row = sqlx::query(concat!(
            select_threads!(),
            " WHERE thread_id = $1 FOR UPDATE"
        ))
        .bind(thread_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(Error::backend)?;
        let Some(mut thread) = row.as_ref().map(thread_from_row).transpose()? else {
            return Ok(None);
        };
        thread
            .metadata
            .extend(metadata.iter().map(|(k, v)| (k.clone(), v.clone())));
        thread.updated_at = now_rfc3339();
        sqlx::query("UPDATE threads SET metadata = $2, updated_at = $3 WHERE thread_id = $1")
            .bind(thread_id)
            .bind(object_text(&thread.metadata))
            .bind(&thread.updated_at)
            .execute(&mut *tx)
            .await
            .map_err(Error::backend)?;
        tx.commit().await.map_err(Error::backend)?;
        Ok(Some(thread))
    }

    async fn set_thread_status(&self, thread_id: &str, status: ThreadStatus) -> Result<bool> {
        let updated =
            sqlx::query("UPDATE threads SET status = $2, updated_at = $3 WHERE thread_id = $1")
                .bind(thread_id)
                .bind(status.as_str())
                .bind(now_rfc3339())
                .execute(self.pool())
                .await
                .map_err(Error::backend)?;
        Ok(updated.rows_affected() > 0)
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool> {
        let mut tx = self.pool().begin().await.map_err(Error::backend)?;
        for statement in [
            "DELETE FROM run_events WHERE thread_id = $1",
            "DELETE FROM runs WHERE thread_id = $1",
            "DELETE FROM checkpoints WHERE thread_id = $1",
            // Items go with their batch (ON DELETE CASCADE).
            "DELETE FROM subagent_batches WHERE thread_id = $1",
        ] {
            sqlx::query(statement)
                .bind(thread_id)
                .execute(&mut *tx)
                .await
                .map_err(Error::backend)?;
        }
        let deleted = sqlx::query("DELETE FROM threads WHERE thread_id = $1")
            .bind(thread_id)
            .execute(&mut *tx)
            .await
            .map_err(Error::backend)?;
        tx.commit().await.map_err(Error::backend)?;
        Ok(deleted.rows_affected() > 0)
    }

    async fn create_run(&self, run: NewRun) -> Result<RunRecord> {
        ThreadId::parse(&run.thread_id)?;
        let record = codec::new_run_record(run, now_rfc3339());
        let inserted = sqlx::query(
            "INSERT INTO runs (run_id, thread_id, owner, assistant_id, status, model_name, \
             trace_id, metadata, multitask_strategy, kwargs, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
             ON CONFLICT (run_id) DO NOTHING",
        )
        .bind(&record.run_id)
        .bind(&record.thread_id)
        .bind(&record.owner)
        .bind(&record.assistant_id)
        .bind(record.status.as_str())
        .bind(&record.model_name)
        .bind(&record.trace_id)
        .bind(object_text(&record.metadata))
        .bind(&record.multitask_strategy)
        .bind(value_text(&record.kwargs))
        .bind(&record.created_at)
        .bind(&record.updated_at)
        .execute(self.pool())
        .await
        .map_err(Error::backend)?;
        if inserted.rows_affected() == 0 {
            return Err(Error::RunExists(record.run_id));
        }
        Ok(record)
    }

    async fn get_run(&self, thread_id: &str, run_id: &str) -> Result<Option<RunRecord>> {
        let row = sqlx::query(concat!(
            select_runs!(),
            " WHERE run_id = $1 AND thread_id = $2"
        ))
        .bind(run_id)
        .bind(thread_id)
        .fetch_optional(self.pool())
        .await
        .map_err(Error::backend)?;
        row.as_ref().map(run_from_row).transpose()
    }

    async fn list_runs(
        &self,
        scope: RunScope<'_>,
        status: Option<RunStatus>,
        limit: u32,
        offset: u32,
    ) -> Result<Vec<RunRecord>> {
        macro_rules! runs_of {
            ($column:literal) => {
                concat!(
                    select_runs!(),
                    " WHERE ",
                    $column,
                    " = $1 AND ($2::text IS NULL OR status = $2)",
                    " ORDER BY created_at DESC, id DESC LIMIT $3 OFFSET $4"
                )
            };
        }
        let (sql, value) = match scope {
            RunScope::Thread(thread_id) => (runs_of!("thread_id"), thread_id),
            RunScope::Owner(owner) => (runs_of!("owner"), owner),
        };
        let rows = sqlx::query(sql)
            .bind(value)
            .bind(status.map(RunStatus::as_str))
            .bind(i64::from(limit))
            .bind(i64::from(offset))
            .fetch_all(self.pool())
            .await
            .map_err(Error::backend)?;
        rows.iter().map(run_from_row).collect()
    }

    async fn update_run_status(&self, run_id: &str, update: &RunStatusUpdate) -> Result<bool> {
        // The status guard makes the first terminal status win even between processes.
        let active: Vec<&str> = RunStatus::ALL
            .iter()
            .filter(|status| status.is_active())
            .map(|status| status.as_str())
            .collect();
        let row = sqlx::query(fenced!(
            "UPDATE runs SET status = $2, stop_reason = $3, error = $4, updated_at = $5 \
             WHERE run_id = $1 AND status = ANY($6)",
            "7"
        ))
        .bind(run_id)
        .bind(update.status.as_str())
        .bind(update.stop_reason.map(|reason| reason.as_str()))
        .bind(&update.error)
        .bind(now_rfc3339())
        .bind(active)
        .bind(&update.lease_owner)
        .fetch_one(self.pool())
        .await
        .map_err(Error::backend)?;
        fenced_outcome(&row, run_id)
    }

    async fn save_run_usage(
        &self,
        run_id: &str,
        usage: &RunUsage,
        lease_owner: Option<&str>,
    ) -> Result<bool> {
        let row = sqlx::query(fenced!(
            "UPDATE runs SET total_input_tokens = $2, total_output_tokens = $3, \
             total_tokens = $4, llm_call_count = $5, lead_agent_tokens = $6, \
             subagent_tokens = $7, middleware_tokens = $8, message_count = $9, \
             token_usage_by_model = $10, updated_at = $11 WHERE run_id = $1",
            "12"
        ))
        .bind(run_id)
        .bind(usage.total_input_tokens)
        .bind(usage.total_output_tokens)
        .bind(usage.total_tokens)
        .bind(usage.llm_call_count)
        .bind(usage.lead_agent_tokens)
        .bind(usage.subagent_tokens)
        .bind(usage.middleware_tokens)
        .bind(usage.message_count)
        .bind(codec::by_model_text(&usage.token_usage_by_model))
        .bind(now_rfc3339())
        .bind(lease_owner)
        .fetch_one(self.pool())
        .await
        .map_err(Error::backend)?;
        fenced_outcome(&row, run_id)
    }

    async fn delete_run(&self, thread_id: &str, run_id: &str) -> Result<bool> {
        let mut tx = self.pool().begin().await.map_err(Error::backend)?;
        sqlx::query("DELETE FROM run_events WHERE thread_id = $1 AND run_id = $2")
            .bind(thread_id)
            .bind(run_id)
            .execute(&mut *tx)
            .await
            .map_err(Error::backend)?;
        let deleted = sqlx::query("DELETE FROM runs WHERE thread_id = $1 AND run_id = $2")
            .bind(thread_id)
            .bind(run_id)
            .execute(&mut *tx)
            .await
            .map_err(Error::backend)?;
        tx.commit().await.map_err(Error::backend)?;
        Ok(deleted.rows_affected() > 0)
    }
}

fn thread_from_row(row: &PgRow) -> Result<ThreadRecord> {
    Ok(ThreadRecord {
        thread_id: get(row, "thread_id")?,
        owner: get(row, "owner")?,
        status: codec::parse("threads.status", &get::<String>(row, "status")?)?,
        metadata: codec::object("threads.metadata", &get::<String>(row, "metadata")?)?,
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
    })
}

fn run_from_row(row: &PgRow) -> Result<RunRecord> {
    let stop_reason = get::<Option<String>>(row, "stop_reason")?
        .map(|reason| codec::parse("runs.stop_reason", &reason))
        .transpose()?;
    let by_model = get::<String>(row, "token_usage_by_model")?;
    Ok(RunRecord {
        run_id: get(row, "run_id")?,
        thread_id: get(row, "thread_id")?,
        owner: get(row, "owner")?,
        assistant_id: get(row, "assistant_id")?,
        status: codec::parse("runs.status", &get::<String>(row, "status")?)?,
        model_name: get(row, "model_name")?,
        trace_id: get(row, "trace_id")?,
        stop_reason,
        error: get(row, "error")?,
        metadata: codec::object("runs.metadata", &get::<String>(row, "metadata")?)?,
        multitask_strategy: get(row, "multitask_strategy")?,
        kwargs: codec::json("runs.kwargs", &get::<String>(row, "kwargs")?)?,
        usage: RunUsage {
            total_input_tokens: get(row, "total_input_tokens")?,
            total_output_tokens: get(row, "total_output_tokens")?,
            total_tokens: get(row, "total_tokens")?,
            llm_call_count: get(row, "llm_call_count")?,
            lead_agent_tokens: get(row, "lead_agent_tokens")?,
            subagent_tokens: get(row, "subagent_tokens")?,
            middleware_tokens: get(row, "middleware_tokens")?,
            message_count: get(row, "message_count")?,
            token_usage_by_model: codec::by_model("runs.token_usage_by_model", &by_model)?,
        },
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
    })
}

/// What a `fenced!` update answered: [`Error::LeaseLost`] when the owner did not hold
/// the lease, else whether a row changed.
fn fenced_outcome(row: &PgRow, run_id: &str) -> Result<bool> {
    let held: bool = row.try_get("held").map_err(Error::backend)?;
    let updated: i64 = row.try_get("updated").map_err(Error::backend)?;
    if held {
        Ok(updated > 0)
    } else {
        Err(Error::LeaseLost(run_id.to_owned()))
    }
}
