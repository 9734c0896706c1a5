//! Run events (docs/events.md#envelope, docs/api.md#run-events) on SQLite: `seq` from the per-thread counter inside the
//! writer transaction, ids already stored skipped.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use async_trait::async_trait;
use rusqlite::types::Value as SqlValue;
use rusqlite::{CachedStatement, Connection, OptionalExtension, Row, params, params_from_iter};
use subflow_contracts::{EventType, NewEvent, RunEvent};
use subflow_store::{
    AppendOutcome, Error, EventQuery, EventStore, Result, TaskSummary, codec, validate_batch,
};
use uuid::Uuid;

use crate::{Db, Route, SqliteStore, query_all, text};

/// One event's column values but its thread's (shared by its batch), owned so that they
/// can move to the writer thread.
struct EventRow {
    run_id: String,
    event_id: Uuid,
    event_type: String,
    category: String,
    content: String,
    metadata: String,
    task_id: Option<String>,
    user_id: Option<String>,
    created_at: String,
}

impl EventRow {
    fn new(event: &NewEvent) -> Self {
        EventRow {
            run_id: event.run_id.clone(),
            event_id: event.event_id,
            event_type: event.event_type.clone(),
            category: event.category.clone(),
            content: event.content.get().to_owned(),
            metadata: event.metadata.get().to_owned(),
            task_id: event.task_id().map(str::to_owned),
            user_id: event.user_id.clone(),
            created_at: event.created_at.clone(),
        }
    }

    /// Runs `insert` (one of the `INSERT_EVENT*` statements) for the event of
    /// `thread_id`; returns rows written.
    fn insert(&self, insert: &mut CachedStatement<'_>, thread_id: &str, seq: i64) -> Result<usize> {
        insert
            .execute(params![
                thread_id,
                seq,
                self.run_id,
                self.event_id.as_bytes(),
                self.event_type,
                self.category,
                self.content,
                self.metadata,
                self.task_id,
                self.user_id,
                self.created_at,
            ])
            .db()
    }
}

/// One row into `run_events`, parameters in [`EventRow::insert`] order.
const INSERT_EVENT: &str = "INSERT INTO run_events (thread_id, seq, run_id, event_id, \
     event_type, category, content, metadata, task_id, user_id, created_at) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// [`INSERT_EVENT`] skipping an `event_id` that is already stored.
const INSERT_EVENT_IF_NEW: &str = "INSERT INTO run_events (thread_id, seq, run_id, event_id, \
     event_type, category, content, metadata, task_id, user_id, created_at) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING";

/// Whether a run's `run.end` is stored (through the partial index of the ends).
const RUN_ENDED: &str = "SELECT EXISTS (SELECT 1 FROM run_events WHERE thread_id = ? \
     AND run_id = ? AND event_type = 'run.end')";

const SELECT_EVENTS: &str = "SELECT thread_id, run_id, seq, event_type, category, content, \
     metadata, created_at, user_id, event_id FROM run_events WHERE ";

/// The statement and parameters of one page of a run's events.
fn events_page(query: &EventQuery) -> Result<(String, Vec<SqlValue>)> {
    query.validate()?;
    let mut sql = format!("{SELECT_EVENTS}thread_id = ? AND run_id = ?");
    let mut params = vec![
        SqlValue::Text(query.thread_id.clone()),
        SqlValue::Text(query.run_id.clone()),
    ];
    if let Some(task_id) = &query.task_id {
        sql.push_str(" AND task_id = ?");
        params.push(SqlValue::Text(task_id.clone()));
    }
    if let Some(after) = query.after_seq {
        sql.push_str(" AND seq > ?");
        params.push(SqlValue::Integer(after));
    }
    if let Some(types) = query.type_filter() {
        sql.push_str(" AND event_type IN (");
        for (index, event_type) in types.iter().enumerate() {
            sql.push_str(if index == 0 { "?" } else { ", ?" });
            params.push(SqlValue::Text(event_type.clone()));
        }
        sql.push(')');
    }
    sql.push_str(" ORDER BY seq LIMIT ?");
    params.push(SqlValue::Integer(i64::from(query.limit)));
    Ok((sql, params))
}

/// The columns of a [`SELECT_EVENTS`] row.
fn event_columns<'r>(row: &'r Row<'_>) -> Result<codec::EventColumns<'r>> {
    let event_id = row.get_ref(9).db()?.as_blob().map_err(Error::backend)?;
    Ok(codec::EventColumns {
        thread_id: text(row, 0)?,
        run_id: text(row, 1)?,
        seq: row.get(2).db()?,
        event_type: text(row, 3)?,
        category: text(row, 4)?,
        content: text(row, 5)?,
        metadata: text(row, 6)?,
        created_at: text(row, 7)?,
        user_id: row
            .get_ref(8)
            .db()?
            .as_str_or_null()
            .map_err(Error::backend)?,
        event_id: codec::uuid("run_events.event_id", event_id)?,
    })
}

/// Decodes a [`SELECT_EVENTS`] row.
fn decode_event(row: &Row<'_>) -> Result<RunEvent> {
    event_columns(row)?.decode()
}

/// A validated batch of run events of one thread, ready for the writer.
pub(crate) struct EventRows {
    thread_id: String,
    rows: Vec<EventRow>,
}

impl EventRows {
    /// The rows of `batch`, checked as [`EventStore::append`] checks them.
    pub(crate) fn new(batch: &[NewEvent]) -> Result<Self> {
        validate_batch(batch)?;
        Ok(EventRows {
            thread_id: batch
                .first()
                .map(|e| e.thread_id.clone())
                .unwrap_or_default(),
            rows: batch.iter().map(EventRow::new).collect(),
        })
    }

    /// Inserts the rows not yet stored in the writer's transaction, each with the
    /// thread's next `seq`; how many were written.
    pub(crate) fn insert(&self, tx: &Connection) -> Result<usize> {
        if self.rows.is_empty() {
            return Ok(0);
        }
        let last: i64 = tx
            .prepare_cached("SELECT last_seq FROM thread_seq WHERE thread_id = ?")
            .db()?
            .query_row([&self.thread_id], |row| row.get(0))
            .optional()
            .db()?
            .unwrap_or(0);
        let mut next = last + 1;
        {
            // Nothing follows a run's end, whoever still writes for it (a process that
            // lost the run's lease): each run is looked up once.
            let mut ended: HashMap<&str, bool> = HashMap::new();
            let mut run_ended = tx.prepare_cached(RUN_ENDED).db()?;
            let mut insert = tx.prepare_cached(INSERT_EVENT_IF_NEW).db()?;
            for row in &self.rows {
                let has_ended = match ended.entry(row.run_id.as_str()) {
                    Entry::Occupied(entry) => *entry.get(),
                    Entry::Vacant(entry) => *entry.insert(
                        run_ended
                            .query_row([&self.thread_id, &row.run_id], |r| r.get(0))
                            .db()?,
                    ),
                };
                if has_ended {
                    continue;
                }
                // A record stored by an earlier, ambiguous attempt (or twice in this
                // batch) is skipped and takes no seq, so seqs stay gap-free exactly as
                // in the other backends.
                if row.insert(&mut insert, &self.thread_id, next)? > 0 {
                    next += 1;
                    if row.event_type == EventType::RunEnd.as_str() {
                        ended.insert(row.run_id.as_str(), true);
                    }
                }
            }
        }
        if next > last + 1 {
            tx.prepare_cached(
                "INSERT INTO thread_seq (thread_id, last_seq) VALUES (?, ?) \
                 ON CONFLICT (thread_id) DO UPDATE SET last_seq = excluded.last_seq",
            )
            .db()?
            .execute(params![self.thread_id, next - 1])
            .db()?;
        }
        Ok((next - last - 1) as usize)
    }
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn append(&self, batch: &[NewEvent]) -> Result<AppendOutcome> {
        let rows = EventRows::new(batch)?;
        if batch.is_empty() {
            return Ok(AppendOutcome::default());
        }
        let written = self
            .write_owned(Route::in_place_for(batch.len()), rows, |conn, rows| {
                rows.insert(conn)
            })
            .await?;
        Ok(AppendOutcome {
            written,
            skipped: batch.len() - written,
        })
    }

    async fn list_events(&self, query: &EventQuery) -> Result<Vec<RunEvent>> {
        let (sql, params) = events_page(query)?;
        self.read(move |conn| query_all(conn, &sql, params_from_iter(params), decode_event))
            .await
    }

    async fn list_events_json(&self, query: &EventQuery) -> Result<Vec<u8>> {
        let (sql, params) = events_page(query)?;
        self.read(move |conn| {
            let mut statement = conn.prepare_cached(&sql).db()?;
            let mut rows = statement.query(params_from_iter(params)).db()?;
            let mut out = Vec::new();
            while let Some(row) = rows.next().db()? {
                event_columns(row)?.write_json(&mut out)?;
            }
            Ok(codec::finish_json_array(out))
        })
        .await
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
        let thread_id = thread_id.to_owned();
        let before = before_seq.unwrap_or(i64::MAX);
        let mut rows = self
            .read(move |conn| {
                let sql = format!(
                    "{SELECT_EVENTS}thread_id = ? AND category = 'message' AND seq < ? \
                     ORDER BY seq DESC LIMIT ?"
                );
                query_all(conn, &sql, params![thread_id, before, limit], decode_event)
            })
            .await?;
        rows.reverse();
        Ok(rows)
    }
}

impl SqliteStore {
    /// The driver's ceiling, for benchmarks: inserts `rows` with consecutive `seq`
    /// values from `first_seq` in one transaction through one cached prepared insert,
    /// with no validation, `seq` allocation or idempotency check.
    pub async fn insert_rows_unchecked(&self, rows: &[NewEvent], first_seq: i64) -> Result<()> {
        let thread_id = rows
            .first()
            .map(|e| e.thread_id.clone())
            .unwrap_or_default();
        let rows: Vec<EventRow> = rows.iter().map(EventRow::new).collect();
        self.write_owned(Route::InPlaceWhenIdle, rows, move |conn, rows| {
            let mut insert = conn.prepare_cached(INSERT_EVENT).db()?;
            for (seq, row) in (first_seq..).zip(rows) {
                row.insert(&mut insert, &thread_id, seq)?;
            }
            Ok(())
        })
        .await
    }
}
