//! The SQLite backend of the subflow store: one database file in WAL mode, written
//! through a single writer connection whose transactions begin with `BEGIN IMMEDIATE`,
//! read through a pool, with migrations embedded in the binary.
//!
//! One `serve` process per file. This crate holds SQL for SQLite only and no
//! behaviour of its own beyond the `subflow-store` traits.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row, Sqlite};
use subflow_contracts::{NewEvent, RunEvent, RunStatus, ThreadId, ThreadStatus};
use subflow_store::{
    AppendOutcome, Error, EventQuery, EventStore, NewRun, NewThread, RecordStore, Result,
    RunRecord, RunStatusUpdate, RunUsage, ThreadRecord, ThreadSearch, codec, now_rfc3339,
    validate_batch,
};

/// Rows per INSERT statement; SQLite caps bound parameters per statement.
const INSERT_CHUNK: usize = 500;

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://path` or
    /// `sqlite::memory:`) and applies the embedded migrations.
    pub async fn open(url: &str, max_connections: u32) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(Error::backend)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        // One writer connection serialises writers inside the process, so writes never
        // wait on SQLITE_BUSY; WAL lets the readers run beside it.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .map_err(Error::backend)?;
        sqlx::migrate!("./migrations")
            .run(&writer)
            .await
            .map_err(Error::backend)?;
        let reader = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .connect_with(options.read_only(true))
            .await
            .map_err(Error::backend)?;
        Ok(SqliteStore { writer, reader })
    }

    /// The writer pool, for benchmarks that measure the driver's ceiling.
    pub fn writer_pool(&self) -> &SqlitePool {
        &self.writer
    }

    /// Closes both pools, checkpointing the WAL.
    pub async fn close(&self) {
        self.reader.close().await;
        self.writer.close().await;
    }
}

/// Appends a multi-row insert of `rows` into `run_events` to `builder`, seqs from `first_seq`.
pub fn push_event_rows<'a>(
    builder: &mut QueryBuilder<Sqlite>,
    rows: impl IntoIterator<Item = &'a NewEvent>,
    first_seq: i64,
    created_at: &str,
) {
    let mut seq = first_seq;
    builder.push_values(rows, |mut row, event| {
        row.push_bind(event.thread_id.clone())
            .push_bind(seq)
            .push_bind(event.run_id.clone())
            .push_bind(event.event_id.as_bytes().to_vec())
            .push_bind(event.event_type.clone())
            .push_bind(event.category.clone())
            .push_bind(event.content.to_string())
            .push_bind(Value::Object(event.metadata.clone()).to_string())
            .push_bind(event.task_id().map(str::to_owned))
            .push_bind(event.user_id.clone())
            .push_bind(created_at.to_owned());
        seq += 1;
    });
}

/// The column list matching [`push_event_rows`].
pub const INSERT_EVENTS: &str = "INSERT INTO run_events (thread_id, seq, run_id, event_id, \
     event_type, category, content, metadata, task_id, user_id, created_at) ";

const SELECT_EVENTS: &str = "SELECT thread_id, run_id, seq, event_type, category, content, \
     metadata, created_at, user_id, event_id FROM run_events WHERE ";

fn decode_event(row: &SqliteRow) -> Result<RunEvent> {
    let get = |column: &str| row.try_get::<String, _>(column).map_err(Error::backend);
    let event_id: Vec<u8> = row.try_get("event_id").map_err(Error::backend)?;
    Ok(RunEvent {
        thread_id: get("thread_id")?,
        run_id: get("run_id")?,
        seq: row.try_get("seq").map_err(Error::backend)?,
        event_type: get("event_type")?,
        category: get("category")?,
        content: codec::json("run_events.content", &get("content")?)?,
        metadata: codec::object("run_events.metadata", &get("metadata")?)?,
        created_at: get("created_at")?,
        user_id: row.try_get("user_id").map_err(Error::backend)?,
        event_id: codec::uuid("run_events.event_id", &event_id)?,
    })
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn append(&self, batch: &[NewEvent]) -> Result<AppendOutcome> {
        validate_batch(batch)?;
        let Some(first) = batch.first() else {
            return Ok(AppendOutcome::default());
        };
        let mut tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(Error::backend)?;
        let last: i64 =
            sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM run_events WHERE thread_id = ?")
                .bind(&first.thread_id)
                .fetch_one(&mut *tx)
                .await
                .map_err(Error::backend)?;
        let created_at = now_rfc3339();
        let mut written = 0;
        for (index, chunk) in batch.chunks(INSERT_CHUNK).enumerate() {
            let mut builder = QueryBuilder::new(INSERT_EVENTS);
            let first_seq = last + 1 + (index * INSERT_CHUNK) as i64;
            push_event_rows(&mut builder, chunk, first_seq, &created_at);
            builder.push(" ON CONFLICT (event_id) DO NOTHING");
            let result = builder
                .build()
                .execute(&mut *tx)
                .await
                .map_err(Error::backend)?;
            written += result.rows_affected() as usize;
        }
        tx.commit().await.map_err(Error::backend)?;
        Ok(AppendOutcome {
            written,
            skipped: batch.len() - written,
        })
    }

    async fn list_events(&self, query: &EventQuery) -> Result<Vec<RunEvent>> {
        query.validate()?;
        let mut builder = QueryBuilder::<Sqlite>::new(SELECT_EVENTS);
        builder
            .push("thread_id = ")
            .push_bind(query.thread_id.clone());
        builder
            .push(" AND run_id = ")
            .push_bind(query.run_id.clone());
        if let Some(task_id) = &query.task_id {
            builder.push(" AND task_id = ").push_bind(task_id.clone());
        }
        if let Some(after) = query.after_seq {
            builder.push(" AND seq > ").push_bind(after);
        }
        if let Some(types) = query.type_filter() {
            builder.push(" AND event_type IN (");
            let mut separated = builder.separated(", ");
            for event_type in types {
                separated.push_bind(event_type.clone());
            }
            builder.push(")");
        }
        builder
            .push(" ORDER BY seq LIMIT ")
            .push_bind(i64::from(query.limit));
        let rows = builder
            .build()
            .fetch_all(&self.reader)
            .await
            .map_err(Error::backend)?;
        rows.iter().map(decode_event).collect()
    }

    async fn list_messages(&self, thread_id: &str) -> Result<Vec<RunEvent>> {
        let sql = "SELECT thread_id, run_id, seq, event_type, category, content, metadata, \
                   created_at, user_id, event_id FROM run_events \
                   WHERE thread_id = ? AND category = 'message' ORDER BY seq";
        let rows = sqlx::query(sql)
            .bind(thread_id)
            .fetch_all(&self.reader)
            .await
            .map_err(Error::backend)?;
        rows.iter().map(decode_event).collect()
    }
}

const THREAD_COLUMNS: &str = "thread_id, owner, status, metadata, created_at, updated_at";

fn decode_thread(row: &SqliteRow) -> Result<ThreadRecord> {
    let get = |column: &str| row.try_get::<String, _>(column).map_err(Error::backend);
    Ok(ThreadRecord {
        thread_id: get("thread_id")?,
        owner: get("owner")?,
        status: codec::parse("threads.status", &get("status")?)?,
        metadata: codec::object("threads.metadata", &get("metadata")?)?,
        created_at: get("created_at")?,
        updated_at: get("updated_at")?,
    })
}

const RUN_COLUMNS: &str = "run_id, thread_id, owner, assistant_id, status, model_name, trace_id, \
     stop_reason, error, metadata, multitask_strategy, kwargs, total_input_tokens, \
     total_output_tokens, total_tokens, llm_call_count, lead_agent_tokens, subagent_tokens, \
     middleware_tokens, message_count, token_usage_by_model, created_at, updated_at";

fn decode_run(row: &SqliteRow) -> Result<RunRecord> {
    let get = |column: &str| row.try_get::<String, _>(column).map_err(Error::backend);
    let opt = |column: &str| {
        row.try_get::<Option<String>, _>(column)
            .map_err(Error::backend)
    };
    let int = |column: &str| row.try_get::<i64, _>(column).map_err(Error::backend);
    Ok(RunRecord {
        run_id: get("run_id")?,
        thread_id: get("thread_id")?,
        owner: get("owner")?,
        assistant_id: get("assistant_id")?,
        status: codec::parse("runs.status", &get("status")?)?,
        model_name: opt("model_name")?,
        trace_id: opt("trace_id")?,
        stop_reason: opt("stop_reason")?
            .map(|reason| codec::parse("runs.stop_reason", &reason))
            .transpose()?,
        error: opt("error")?,
        metadata: codec::object("runs.metadata", &get("metadata")?)?,
        multitask_strategy: get("multitask_strategy")?,
        kwargs: codec::json("runs.kwargs", &get("kwargs")?)?,
        usage: RunUsage {
            total_input_tokens: int("total_input_tokens")?,
            total_output_tokens: int("total_output_tokens")?,
            total_tokens: int("total_tokens")?,
            llm_call_count: int("llm_call_count")?,
            lead_agent_tokens: int("lead_agent_tokens")?,
            subagent_tokens: int("subagent_tokens")?,
            middleware_tokens: int("middleware_tokens")?,
            message_count: int("message_count")?,
            token_usage_by_model: codec::by_model(
                "runs.token_usage_by_model",
                &get("token_usage_by_model")?,
            )?,
        },
        created_at: get("created_at")?,
        updated_at: get("updated_at")?,
    })
}

#[async_trait]
impl RecordStore for SqliteStore {
    async fn create_thread(&self, thread: NewThread) -> Result<ThreadRecord> {
        ThreadId::parse(&thread.thread_id)?;
        let now = now_rfc3339();
        let inserted = sqlx::query(
            "INSERT INTO threads (thread_id, owner, status, metadata, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id) DO NOTHING",
        )
        .bind(&thread.thread_id)
        .bind(&thread.owner)
        .bind(ThreadStatus::Idle.as_str())
        .bind(Value::Object(thread.metadata.clone()).to_string())
        .bind(&now)
        .bind(&now)
        .execute(&self.writer)
        .await
        .map_err(Error::backend)?;
        if inserted.rows_affected() == 0 {
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
        let sql = format!("SELECT {THREAD_COLUMNS} FROM threads WHERE thread_id = ?");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(thread_id)
            .fetch_optional(&self.reader)
            .await
            .map_err(Error::backend)?;
        row.as_ref().map(decode_thread).transpose()
    }

    async fn search_threads(&self, search: &ThreadSearch) -> Result<Vec<ThreadRecord>> {
        let mut builder = QueryBuilder::<Sqlite>::new(format!(
            "SELECT {THREAD_COLUMNS} FROM threads WHERE owner = "
        ));
        builder.push_bind(search.owner.clone());
        if let Some(status) = search.status {
            builder.push(" AND status = ").push_bind(status.as_str());
        }
        builder.push(" ORDER BY created_at DESC, rowid DESC");
        let rows = builder
            .build()
            .fetch_all(&self.reader)
            .await
            .map_err(Error::backend)?;
        let threads = rows.iter().map(decode_thread).collect::<Result<Vec<_>>>()?;
        Ok(search.page(threads))
    }

    async fn set_thread_status(&self, thread_id: &str, status: ThreadStatus) -> Result<bool> {
        let result =
            sqlx::query("UPDATE threads SET status = ?, updated_at = ? WHERE thread_id = ?")
                .bind(status.as_str())
                .bind(now_rfc3339())
                .bind(thread_id)
                .execute(&self.writer)
                .await
                .map_err(Error::backend)?;
        Ok(result.rows_affected() > 0)
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool> {
        let mut tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(Error::backend)?;
        for sql in [
            "DELETE FROM run_events WHERE thread_id = ?",
            "DELETE FROM runs WHERE thread_id = ?",
        ] {
            sqlx::query(sql)
                .bind(thread_id)
                .execute(&mut *tx)
                .await
                .map_err(Error::backend)?;
        }
        let deleted = sqlx::query("DELETE FROM threads WHERE thread_id = ?")
            .bind(thread_id)
            .execute(&mut *tx)
            .await
            .map_err(Error::backend)?;
        tx.commit().await.map_err(Error::backend)?;
        Ok(deleted.rows_affected() > 0)
    }

    async fn create_run(&self, run: NewRun) -> Result<RunRecord> {
        ThreadId::parse(&run.thread_id)?;
        let now = now_rfc3339();
        let inserted = sqlx::query(
            "INSERT INTO runs (run_id, thread_id, owner, assistant_id, status, model_name, \
             trace_id, metadata, multitask_strategy, kwargs, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
        )
        .bind(&run.run_id)
        .bind(&run.thread_id)
        .bind(&run.owner)
        .bind(&run.assistant_id)
        .bind(RunStatus::Pending.as_str())
        .bind(&run.model_name)
        .bind(&run.trace_id)
        .bind(Value::Object(run.metadata.clone()).to_string())
        .bind(&run.multitask_strategy)
        .bind(run.kwargs.to_string())
        .bind(&now)
        .bind(&now)
        .execute(&self.writer)
        .await
        .map_err(Error::backend)?;
        if inserted.rows_affected() == 0 {
            return Err(Error::RunExists(run.run_id));
        }
        Ok(codec::new_run_record(run, now))
    }

    async fn get_run(&self, thread_id: &str, run_id: &str) -> Result<Option<RunRecord>> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ? AND thread_id = ?");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(run_id)
            .bind(thread_id)
            .fetch_optional(&self.reader)
            .await
            .map_err(Error::backend)?;
        row.as_ref().map(decode_run).transpose()
    }

    async fn list_runs(
        &self,
        thread_id: &str,
        status: Option<RunStatus>,
        limit: u32,
        offset: u32,
    ) -> Result<Vec<RunRecord>> {
        let mut builder = QueryBuilder::<Sqlite>::new(format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE thread_id = "
        ));
        builder.push_bind(thread_id.to_owned());
        if let Some(status) = status {
            builder.push(" AND status = ").push_bind(status.as_str());
        }
        builder
            .push(" ORDER BY created_at DESC, rowid DESC LIMIT ")
            .push_bind(i64::from(limit))
            .push(" OFFSET ")
            .push_bind(i64::from(offset));
        let rows = builder
            .build()
            .fetch_all(&self.reader)
            .await
            .map_err(Error::backend)?;
        rows.iter().map(decode_run).collect()
    }

    async fn update_run_status(&self, run_id: &str, update: &RunStatusUpdate) -> Result<bool> {
        let result = sqlx::query(
            "UPDATE runs SET status = ?, stop_reason = ?, error = ?, updated_at = ? \
             WHERE run_id = ? AND status IN ('pending', 'running')",
        )
        .bind(update.status.as_str())
        .bind(update.stop_reason.map(|reason| reason.as_str()))
        .bind(&update.error)
        .bind(now_rfc3339())
        .bind(run_id)
        .execute(&self.writer)
        .await
        .map_err(Error::backend)?;
        Ok(result.rows_affected() > 0)
    }

    async fn save_run_usage(&self, run_id: &str, usage: &RunUsage) -> Result<bool> {
        let result = sqlx::query(
            "UPDATE runs SET total_input_tokens = ?, total_output_tokens = ?, total_tokens = ?, \
             llm_call_count = ?, lead_agent_tokens = ?, subagent_tokens = ?, \
             middleware_tokens = ?, message_count = ?, token_usage_by_model = ?, updated_at = ? \
             WHERE run_id = ?",
        )
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
        .bind(run_id)
        .execute(&self.writer)
        .await
        .map_err(Error::backend)?;
        Ok(result.rows_affected() > 0)
    }

    async fn delete_run(&self, thread_id: &str, run_id: &str) -> Result<bool> {
        let mut tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(Error::backend)?;
        sqlx::query("DELETE FROM run_events WHERE thread_id = ? AND run_id = ?")
            .bind(thread_id)
            .bind(run_id)
            .execute(&mut *tx)
            .await
            .map_err(Error::backend)?;
        let deleted = sqlx::query("DELETE FROM runs WHERE thread_id = ? AND run_id = ?")
            .bind(thread_id)
            .bind(run_id)
            .execute(&mut *tx)
            .await
            .map_err(Error::backend)?;
        tx.commit().await.map_err(Error::backend)?;
        Ok(deleted.rows_affected() > 0)
    }
}
