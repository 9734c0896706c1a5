//! Run events (docs/events.md#envelope, docs/api.md#run-events): advisory-locked `seq` allocation and paged reads.

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{Postgres, QueryBuilder, Row};
use subflow_contracts::{EventCategory, NewEvent, RunEvent};
use subflow_store::{
    AppendOutcome, Error, EventQuery, EventStore, Result, TaskSummary, codec, validate_batch,
};
use uuid::Uuid;

use crate::PostgresStore;

/// Rows per `INSERT` statement: keeps each statement's arrays and WAL record bounded.
const INSERT_CHUNK: usize = 1000;

/// The `SELECT` of the envelope columns that [`event_columns`] reads by their places,
/// as a literal so statements built on it stay `&'static str`. `event_id` travels as
/// text so the crate does not need sqlx's `uuid` feature, which would rebuild sqlx for
/// the whole workspace.
macro_rules! select_events {
    () => {
        "SELECT event_id::text AS event_id, thread_id, run_id, seq, event_type, category, \
         content, metadata, created_at, user_id FROM run_events"
    };
}

const INSERT_EVENTS: &str = "INSERT INTO run_events \
     (event_id, thread_id, run_id, seq, event_type, category, content, metadata, task_id, user_id, created_at) \
     SELECT event_id, $1, run_id, seq, event_type, category, content, metadata, task_id, user_id, created_at \
     FROM UNNEST($2::text[], $3::text[]::uuid[], $4::text[], $5::bigint[], $6::text[], $7::text[], \
                 $8::text[], $9::text[], $10::text[], $11::text[]) \
          AS batch(created_at, event_id, run_id, seq, event_type, category, content, metadata, task_id, user_id) \
     ON CONFLICT (event_id) DO NOTHING";

#[async_trait]
impl EventStore for PostgresStore {
    async fn append(&self, batch: &[NewEvent]) -> Result<AppendOutcome> {
        validate_batch(batch)?;
        let Some(first) = batch.first() else {
            return Ok(AppendOutcome::default());
        };
        let thread_id = first.thread_id.as_str();
        let refs: Vec<&NewEvent> = batch.iter().collect();
        // `subflow_append_events` (migrations 0002, 0007) takes the thread's advisory lock,
        // allocates seqs and skips stored ids server-side: one round trip per chunk.
        let written = if refs.len() <= INSERT_CHUNK {
            let mut conn = self.pool().acquire().await.map_err(Error::backend)?;
            append_chunk(&mut conn, thread_id, &refs).await?
        } else {
            let mut tx = self.pool().begin().await.map_err(Error::backend)?;
            let mut written = 0;
            for chunk in refs.chunks(INSERT_CHUNK) {
                written += append_chunk(&mut tx, thread_id, chunk).await?;
            }
            tx.commit().await.map_err(Error::backend)?;
            written
        };
        Ok(AppendOutcome {
            written,
            skipped: batch.len() - written,
        })
    }

    async fn list_events(&self, query: &EventQuery) -> Result<Vec<RunEvent>> {
        let rows = self.events_page(query).await?;
        rows.iter().map(event_from_row).collect()
    }

    async fn list_events_json(&self, query: &EventQuery) -> Result<Vec<u8>> {
        let rows = self.events_page(query).await?;
        let mut out = Vec::new();
        for row in &rows {
            event_columns(row)?.write_json(&mut out)?;
        }
        Ok(codec::finish_json_array(out))
    }

    async fn task_summaries(&self, thread_id: &str, run_id: &str) -> Result<Vec<TaskSummary>> {
        self.read_task_summaries(thread_id, run_id).await
    }

    async fn list_messages(
        &self,
        thread_id: &str,
        before_seq: Option<i64>,
        limit: u32,
    ) -> Result<Vec<RunEvent>> {
        let rows = sqlx::query(concat!(
            select_events!(),
            " WHERE thread_id = $1 AND category = $2 AND seq < $3 ORDER BY seq DESC LIMIT $4"
        ))
        .bind(thread_id)
        .bind(EventCategory::Message.as_str())
        .bind(before_seq.unwrap_or(i64::MAX))
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await
        .map_err(Error::backend)?;
        rows.iter().rev().map(event_from_row).collect()
    }
}

impl PostgresStore {
    /// The driver's ceiling, for benchmarks: inserts `rows` with consecutive `seq` values
    /// from `first_seq` in one transaction, as large `UNNEST` statements, with no
    /// validation, lock, `seq` allocation or duplicate check.
    pub async fn insert_rows_unchecked(&self, rows: &[NewEvent], first_seq: i64) -> Result<()> {
        let Some(first) = rows.first() else {
            return Ok(());
        };
        let refs: Vec<&NewEvent> = rows.iter().collect();
        let mut tx = self.pool().begin().await.map_err(Error::backend)?;
        let mut next_seq = first_seq;
        for chunk in refs.chunks(INSERT_CHUNK) {
            let columns = EventColumns::new(chunk, next_seq);
            next_seq += chunk.len() as i64;
            insert_columns(&mut tx, &first.thread_id, columns).await?;
        }
        tx.commit().await.map_err(Error::backend)
    }
}

/// Runs [`INSERT_EVENTS`] for one chunk; returns the rows written.
async fn insert_columns(
    conn: &mut PgConnection,
    thread_id: &str,
    rows: EventColumns<'_>,
) -> Result<u64> {
    let result = sqlx::query(INSERT_EVENTS)
        .bind(thread_id)
        .bind(rows.created_at)
        .bind(rows.event_id)
        .bind(rows.run_id)
        .bind(rows.seq)
        .bind(rows.event_type)
        .bind(rows.category)
        .bind(rows.content)
        .bind(rows.metadata)
        .bind(rows.task_id)
        .bind(rows.user_id)
        .execute(conn)
        .await
        .map_err(Error::backend)?;
    Ok(result.rows_affected())
}

/// Appends one chunk through `subflow_append_events`; returns the rows written.
async fn append_chunk(
    conn: &mut PgConnection,
    thread_id: &str,
    events: &[&NewEvent],
) -> Result<usize> {
    let rows = EventColumns::new(events, 1);
    let written: i64 = sqlx::query_scalar(
        "SELECT subflow_append_events($1, $2, $3::text[]::uuid[], $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(thread_id)
    .bind(rows.created_at)
    .bind(rows.event_id)
    .bind(rows.run_id)
    .bind(rows.event_type)
    .bind(rows.category)
    .bind(rows.content)
    .bind(rows.metadata)
    .bind(rows.task_id)
    .bind(rows.user_id)
    .fetch_one(conn)
    .await
    .map_err(Error::backend)?;
    Ok(written as usize)
}

/// One chunk of rows as parallel arrays, the shape `UNNEST` takes.
struct EventColumns<'a> {
    created_at: Vec<&'a str>,
    event_id: Vec<String>,
    run_id: Vec<&'a str>,
    seq: Vec<i64>,
    event_type: Vec<&'a str>,
    category: Vec<&'a str>,
    content: Vec<&'a str>,
    metadata: Vec<&'a str>,
    task_id: Vec<Option<&'a str>>,
    user_id: Vec<Option<&'a str>>,
}

impl<'a> EventColumns<'a> {
    /// The columns of `events`, numbered from `first_seq` in batch order.
    fn new(events: &[&'a NewEvent], first_seq: i64) -> Self {
        EventColumns {
            created_at: events.iter().map(|e| e.created_at.as_str()).collect(),
            event_id: events.iter().map(|e| e.event_id.to_string()).collect(),
            run_id: events.iter().map(|e| e.run_id.as_str()).collect(),
            seq: (first_seq..).take(events.len()).collect(),
            event_type: events.iter().map(|e| e.event_type.as_str()).collect(),
            category: events.iter().map(|e| e.category.as_str()).collect(),
            content: events.iter().map(|e| e.content.get()).collect(),
            metadata: events.iter().map(|e| e.metadata.get()).collect(),
            task_id: events.iter().map(|e| e.task_id()).collect(),
            user_id: events.iter().map(|e| e.user_id.as_deref()).collect(),
        }
    }
}

impl PostgresStore {
    /// The rows of one page of a run's events.
    async fn events_page(&self, query: &EventQuery) -> Result<Vec<PgRow>> {
        query.validate()?;
        let mut sql = QueryBuilder::<Postgres>::new(select_events!());
        sql.push(" WHERE thread_id = ").push_bind(&query.thread_id);
        sql.push(" AND run_id = ").push_bind(&query.run_id);
        if let Some(after) = query.after_seq {
            sql.push(" AND seq > ").push_bind(after);
        }
        if let Some(types) = query.type_filter() {
            sql.push(" AND event_type = ANY(")
                .push_bind(types)
                .push(")");
        }
        // Filtering on the column inside the statement puts the task filter before LIMIT.
        if let Some(task_id) = &query.task_id {
            sql.push(" AND task_id = ").push_bind(task_id);
        }
        sql.push(" ORDER BY seq LIMIT ")
            .push_bind(i64::from(query.limit));
        sql.build()
            .fetch_all(self.pool())
            .await
            .map_err(Error::backend)
    }
}

/// The columns of a [`select_events!`] row, read by their place in it and decoded as
/// the types that statement gives them, without looking each value's column up by name
/// or checking its type again (`subflow bench store --backend postgres`).
fn event_columns(row: &PgRow) -> Result<codec::EventColumns<'_>> {
    let column = |index: usize| -> Result<&str> {
        row.try_get_unchecked::<&str, _>(index)
            .map_err(Error::backend)
    };
    Ok(codec::EventColumns {
        event_id: parse_event_id(column(0)?)?,
        thread_id: column(1)?,
        run_id: column(2)?,
        seq: row.try_get_unchecked(3).map_err(Error::backend)?,
        event_type: column(4)?,
        category: column(5)?,
        content: column(6)?,
        metadata: column(7)?,
        created_at: column(8)?,
        user_id: row
            .try_get_unchecked::<Option<&str>, _>(9)
            .map_err(Error::backend)?,
    })
}

fn event_from_row(row: &PgRow) -> Result<RunEvent> {
    event_columns(row)?.decode()
}

fn parse_event_id(text: &str) -> Result<Uuid> {
    Uuid::parse_str(text).map_err(|e| Error::Corrupt {
        what: "run_events.event_id",
        detail: e.to_string(),
    })
}
