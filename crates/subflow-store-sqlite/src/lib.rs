//! The SQLite backend of the subflow store: one database file in WAL mode, written
//! through a single rusqlite writer connection whose transactions begin with
//! `BEGIN IMMEDIATE`, read through a small pool of read-only connections, with the
//! migrations embedded in the binary and tracked by `PRAGMA user_version`.
//!
//! Every call runs its SQL on the blocking thread pool (`spawn_blocking`), one hop
//! per call rather than per statement or row.
//!
//! One `serve` process per file. This crate holds SQL for SQLite only and no
//! behaviour of its own beyond the `subflow-store` traits: it must not validate,
//! buffer, retry or decode differently from the other backends (it uses
//! `subflow_store::{validate_batch, codec}` for that), and it must not block an
//! async worker thread on SQLite.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::types::Value as SqlValue;
use rusqlite::{
    CachedStatement, Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior, params,
    params_from_iter,
};
use subflow_contracts::{NewEvent, RunEvent, RunStatus, ThreadId, ThreadStatus};
use subflow_store::{
    AppendOutcome, Checkpoint, CheckpointStore, Error, EventQuery, EventStore, NewCheckpoint,
    NewRun, NewThread, RecordStore, Result, RunRecord, RunStatusUpdate, RunUsage, ThreadRecord,
    ThreadSearch, codec, now_rfc3339, validate_batch,
};
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::Semaphore;
use tokio::task::{block_in_place, spawn_blocking};
use uuid::Uuid;

mod auth;
mod streams;

/// The embedded migrations, in order. `PRAGMA user_version` holds how many are applied.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_checkpoints.sql"),
    include_str!("../migrations/0003_auth.sql"),
    include_str!("../migrations/0004_streams.sql"),
];

/// How long a connection waits for a lock held by another process.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The writer's page cache in KiB. SQLite's default (2 MiB) on purpose: 8 MiB bought
/// no ingest speed in `subflow bench store` and cost ~10 MB of peak RSS.
const WRITER_CACHE_KIB: i64 = 2 * 1024;

/// Prepared statements kept per connection.
const STATEMENT_CACHE: usize = 64;

/// The SQLite store. Clones share the connections.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The one writer; `None` once closed.
    writer: Mutex<Option<Connection>>,
    /// Read-only connections; `None` for an in-memory database, read through the writer.
    readers: Option<Arc<Readers>>,
    /// Announces stream appends and cancel requests to listeners in this process.
    notices: subflow_store::streams::LocalNotices,
}

/// Locks `mutex`, recovering it from poisoning: a panic in an earlier call has
/// already rolled back its transaction while unwinding, so the data is sound.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A small pool of read-only connections, opened on demand up to `max_connections`.
#[derive(Debug)]
struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    permits: Semaphore,
    closed: AtomicBool,
}

impl Readers {
    fn open(&self) -> Result<Connection> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&self.path, flags).db()?;
        configure(&conn).db()?;
        Ok(conn)
    }

    fn take(&self) -> Result<Connection> {
        let idle = lock(&self.idle).pop();
        match idle {
            Some(conn) => Ok(conn),
            None => self.open(),
        }
    }

    fn give_back(&self, conn: Connection) {
        if !self.closed.load(Ordering::Acquire) {
            lock(&self.idle).push(conn);
        }
    }
}

/// Where a `sqlite:` URL points.
enum Target {
    Memory,
    File(PathBuf),
}

/// Reads `sqlite://PATH`, `sqlite:PATH` (any `?query` ignored) or `sqlite::memory:`.
fn parse_url(url: &str) -> Result<Target> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| backend_message(format!("'{url}' is not a sqlite: URL")))?;
    let path = rest.split('?').next().unwrap_or(rest);
    match path {
        "" => Err(backend_message(format!("'{url}' names no database file"))),
        ":memory:" => Ok(Target::Memory),
        path => Ok(Target::File(PathBuf::from(path))),
    }
}

fn backend_message(message: String) -> Error {
    Error::backend(std::io::Error::other(message))
}

fn closed() -> Error {
    backend_message("the SQLite store is closed".to_owned())
}

/// Maps rusqlite results into the store's error type.
trait Db<T> {
    fn db(self) -> Result<T>;
}

impl<T> Db<T> for rusqlite::Result<T> {
    fn db(self) -> Result<T> {
        self.map_err(Error::backend)
    }
}

/// The pragmas every connection gets.
fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;",
    )?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

fn open_writer(target: &Target) -> Result<Connection> {
    let mut conn = match target {
        Target::Memory => Connection::open_in_memory().db()?,
        Target::File(path) => {
            let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            Connection::open_with_flags(path, flags).db()?
        }
    };
    configure(&conn).db()?;
    conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)
        .db()?;
    // Checkpoint every 8,192 WAL pages (32 MiB) rather than 1,000: each checkpoint
    // fsyncs the database file, and with synchronous=NORMAL those fsyncs are the only
    // ones a write pays.
    conn.pragma_update(None, "wal_autocheckpoint", 8192).db()?;
    migrate(&mut conn)?;
    Ok(conn)
}

/// Applies the embedded migrations not yet applied, each in its own IMMEDIATE
/// transaction that also bumps `user_version`, so concurrent openers apply each once.
fn migrate(conn: &mut Connection) -> Result<()> {
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .db()?;
        let applied: i64 = tx
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .db()?;
        let Some(sql) = usize::try_from(applied)
            .ok()
            .and_then(|applied| MIGRATIONS.get(applied))
        else {
            if applied > MIGRATIONS.len() as i64 {
                return Err(backend_message(format!(
                    "the database schema is at version {applied}, newer than this binary's {}",
                    MIGRATIONS.len()
                )));
            }
            return tx.commit().db();
        };
        tx.execute_batch(sql).db()?;
        tx.pragma_update(None, "user_version", applied + 1).db()?;
        tx.commit().db()?;
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://PATH`, `sqlite:PATH`
    /// or `sqlite::memory:`; a `?query` suffix is ignored) and applies the embedded
    /// migrations. Reads use up to `max_connections` read-only connections.
    pub async fn open(url: &str, max_connections: u32) -> Result<Self> {
        let target = parse_url(url)?;
        let readers = max_connections.max(1) as usize;
        spawn_blocking(move || {
            let writer = open_writer(&target)?;
            let readers = match target {
                Target::Memory => None,
                Target::File(path) => {
                    let readers = Readers {
                        path,
                        idle: Mutex::new(Vec::with_capacity(readers)),
                        permits: Semaphore::new(readers),
                        closed: AtomicBool::new(false),
                    };
                    // Fail at open, not at the first read, when the file is unreadable.
                    let first = readers.open()?;
                    readers.give_back(first);
                    Some(Arc::new(readers))
                }
            };
            Ok(SqliteStore {
                inner: Arc::new(Inner {
                    writer: Mutex::new(Some(writer)),
                    readers,
                    notices: Default::default(),
                }),
            })
        })
        .await
        .map_err(Error::backend)?
    }

    /// The driver's ceiling, for benchmarks: inserts `rows` with consecutive `seq`
    /// values from `first_seq` in one transaction through one cached prepared insert,
    /// with no validation, `seq` allocation or idempotency check.
    pub async fn insert_rows_unchecked(&self, rows: &[NewEvent], first_seq: i64) -> Result<()> {
        let rows: Vec<EventRow> = rows.iter().map(EventRow::new).collect();
        self.write(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .db()?;
            let created_at = now_rfc3339();
            {
                let mut insert = tx.prepare_cached(INSERT_EVENT).db()?;
                for (seq, row) in (first_seq..).zip(&rows) {
                    row.insert(&mut insert, seq, &created_at)?;
                }
            }
            tx.commit().db()
        })
        .await
    }

    /// Closes the connections; the writer goes last, which checkpoints and removes the WAL.
    /// Calls on any clone afterwards fail with a backend error.
    pub async fn close(&self) {
        let inner = self.inner.clone();
        let closing = spawn_blocking(move || {
            if let Some(readers) = &inner.readers {
                readers.closed.store(true, Ordering::Release);
                readers.permits.close();
                lock(&readers.idle).clear();
            }
            let writer = lock(&inner.writer).take();
            if let Some(writer) = writer
                && let Err((_, error)) = writer.close()
            {
                tracing::warn!(%error, "closing the SQLite writer failed");
            }
        });
        if let Err(error) = closing.await {
            tracing::warn!(%error, "closing the SQLite store failed");
        }
    }

    /// Runs `work` on the writer connection, on the blocking pool.
    async fn write<T, F>(&self, work: F) -> Result<T>
    where
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let inner = self.inner.clone();
        let run = move || {
            // A panic in an earlier call poisons the lock; its transaction was rolled
            // back when the panic unwound, so the connection is still sound.
            let mut writer = lock(&inner.writer);
            let conn = writer.as_mut().ok_or_else(closed)?;
            if !conn.is_autocommit() {
                conn.execute_batch("ROLLBACK").db()?;
            }
            work(conn)
        };
        blocking(run).await
    }

    /// Runs `work` on a read-only connection (the writer for an in-memory database).
    async fn read<T, F>(&self, work: F) -> Result<T>
    where
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let Some(readers) = self.inner.readers.clone() else {
            return self.write(move |conn| work(conn)).await;
        };
        let _permit = readers.permits.acquire().await.map_err(|_| closed())?;
        let readers = readers.clone();
        blocking(move || {
            let conn = readers.take()?;
            let result = work(&conn);
            readers.give_back(conn);
            result
        })
        .await
    }
}

/// Runs SQLite work off the async scheduler. On a multi-threaded runtime it runs in
/// place (`block_in_place`): calls are short and frequent (a batch of 25 takes a few
/// hundred µs), and staying on the calling thread saves two thread wake-ups per call and
/// keeps the rows' memory on the thread that allocated them. Elsewhere (single-threaded
/// test runtimes) it uses the blocking pool. A panic becomes a backend error.
async fn blocking<T, F>(work: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    if Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread {
        return std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| block_in_place(work)))
            .unwrap_or_else(|_| Err(backend_message("a SQLite call panicked".to_owned())));
    }
    spawn_blocking(work).await.map_err(Error::backend)?
}

/// One event's column values, owned so that they can move to the blocking pool.
struct EventRow {
    thread_id: String,
    run_id: String,
    event_id: Uuid,
    event_type: String,
    category: String,
    content: String,
    metadata: String,
    task_id: Option<String>,
    user_id: Option<String>,
}

impl EventRow {
    fn new(event: &NewEvent) -> Self {
        EventRow {
            thread_id: event.thread_id.clone(),
            run_id: event.run_id.clone(),
            event_id: event.event_id,
            event_type: event.event_type.clone(),
            category: event.category.clone(),
            content: event.content.get().to_owned(),
            metadata: event.metadata.get().to_owned(),
            task_id: event.task_id().map(str::to_owned),
            user_id: event.user_id.clone(),
        }
    }

    /// Runs `insert` (one of the `INSERT_EVENT*` statements); returns rows written.
    fn insert(
        &self,
        insert: &mut CachedStatement<'_>,
        seq: i64,
        created_at: &str,
    ) -> Result<usize> {
        insert
            .execute(params![
                self.thread_id,
                seq,
                self.run_id,
                self.event_id.as_bytes(),
                self.event_type,
                self.category,
                self.content,
                self.metadata,
                self.task_id,
                self.user_id,
                created_at,
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

const SELECT_EVENTS: &str = "SELECT thread_id, run_id, seq, event_type, category, content, \
     metadata, created_at, user_id, event_id FROM run_events WHERE ";

/// A text column, borrowed from the row.
fn text<'r>(row: &'r Row<'_>, index: usize) -> Result<&'r str> {
    row.get_ref(index).db()?.as_str().map_err(Error::backend)
}

/// Decodes a [`SELECT_EVENTS`] row.
fn decode_event(row: &Row<'_>) -> Result<RunEvent> {
    let event_id = row.get_ref(9).db()?.as_blob().map_err(Error::backend)?;
    Ok(RunEvent {
        thread_id: row.get(0).db()?,
        run_id: row.get(1).db()?,
        seq: row.get(2).db()?,
        event_type: row.get(3).db()?,
        category: row.get(4).db()?,
        content: codec::json("run_events.content", text(row, 5)?)?,
        metadata: codec::object("run_events.metadata", text(row, 6)?)?,
        created_at: row.get(7).db()?,
        user_id: row.get(8).db()?,
        event_id: codec::uuid("run_events.event_id", event_id)?,
    })
}

/// Runs a cached query and decodes every row.
fn query_all<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    decode: impl Fn(&Row<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let mut statement = conn.prepare_cached(sql).db()?;
    let mut rows = statement.query(params).db()?;
    let mut decoded = Vec::new();
    while let Some(row) = rows.next().db()? {
        decoded.push(decode(row)?);
    }
    Ok(decoded)
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn append(&self, batch: &[NewEvent]) -> Result<AppendOutcome> {
        validate_batch(batch)?;
        let Some(first) = batch.first() else {
            return Ok(AppendOutcome::default());
        };
        let thread_id = first.thread_id.clone();
        let rows: Vec<EventRow> = batch.iter().map(EventRow::new).collect();
        let written = self
            .write(move |conn| {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .db()?;
                let last: i64 = tx
                    .prepare_cached("SELECT last_seq FROM thread_seq WHERE thread_id = ?")
                    .db()?
                    .query_row([&thread_id], |row| row.get(0))
                    .optional()
                    .db()?
                    .unwrap_or(0);
                let created_at = now_rfc3339();
                let mut next = last + 1;
                {
                    let mut insert = tx.prepare_cached(INSERT_EVENT_IF_NEW).db()?;
                    for row in &rows {
                        // A record stored by an earlier, ambiguous attempt (or twice in
                        // this batch) is skipped and takes no seq, so seqs stay gap-free
                        // exactly as in the other backends.
                        if row.insert(&mut insert, next, &created_at)? > 0 {
                            next += 1;
                        }
                    }
                }
                if next > last + 1 {
                    tx.prepare_cached(
                        "INSERT INTO thread_seq (thread_id, last_seq) VALUES (?, ?) \
                         ON CONFLICT (thread_id) DO UPDATE SET last_seq = excluded.last_seq",
                    )
                    .db()?
                    .execute(params![thread_id, next - 1])
                    .db()?;
                }
                tx.commit().db()?;
                Ok((next - last - 1) as usize)
            })
            .await?;
        Ok(AppendOutcome {
            written,
            skipped: batch.len() - written,
        })
    }

    async fn list_events(&self, query: &EventQuery) -> Result<Vec<RunEvent>> {
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
        self.read(move |conn| query_all(conn, &sql, params_from_iter(params), decode_event))
            .await
    }

    async fn list_messages(&self, thread_id: &str) -> Result<Vec<RunEvent>> {
        let thread_id = thread_id.to_owned();
        self.read(move |conn| {
            let sql = format!("{SELECT_EVENTS}thread_id = ? AND category = 'message' ORDER BY seq");
            query_all(conn, &sql, [thread_id], decode_event)
        })
        .await
    }
}

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
            .write(move |conn| {
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

    async fn set_thread_status(&self, thread_id: &str, status: ThreadStatus) -> Result<bool> {
        let thread_id = thread_id.to_owned();
        let now = now_rfc3339();
        let updated = self
            .write(move |conn| {
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
        self.write(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .db()?;
            for sql in [
                "DELETE FROM run_events WHERE thread_id = ?",
                "DELETE FROM thread_seq WHERE thread_id = ?",
                "DELETE FROM checkpoints WHERE thread_id = ?",
            ] {
                tx.execute(sql, [&thread_id]).db()?;
            }
            tx.execute("DELETE FROM runs WHERE thread_id = ?", [&thread_id])
                .db()?;
            let deleted = tx
                .execute("DELETE FROM threads WHERE thread_id = ?", [&thread_id])
                .db()?;
            tx.commit().db()?;
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
            .write(move |conn| {
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
        thread_id: &str,
        status: Option<RunStatus>,
        limit: u32,
        offset: u32,
    ) -> Result<Vec<RunRecord>> {
        let mut sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE thread_id = ?");
        let mut params = vec![SqlValue::Text(thread_id.to_owned())];
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
        let now = now_rfc3339();
        let updated = self
            .write(move |conn| {
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

    async fn save_run_usage(&self, run_id: &str, usage: &RunUsage) -> Result<bool> {
        let run_id = run_id.to_owned();
        let usage = usage.clone();
        let by_model = codec::by_model_text(&usage.token_usage_by_model);
        let now = now_rfc3339();
        let updated = self
            .write(move |conn| {
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
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .db()?;
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
            tx.commit().db()?;
            Ok(deleted > 0)
        })
        .await
    }
}

const CHECKPOINT_COLUMNS: &str = "thread_id, checkpoint_id, parent_checkpoint_id, run_id, \
     state_values, metadata, created_at";

fn decode_checkpoint(row: &Row<'_>) -> Result<Checkpoint> {
    Ok(Checkpoint {
        thread_id: row.get(0).db()?,
        checkpoint_id: row.get(1).db()?,
        parent_checkpoint_id: row.get(2).db()?,
        run_id: row.get(3).db()?,
        values: codec::json("checkpoints.state_values", text(row, 4)?)?,
        metadata: codec::object("checkpoints.metadata", text(row, 5)?)?,
        created_at: row.get(6).db()?,
    })
}

#[async_trait]
impl CheckpointStore for SqliteStore {
    async fn put_checkpoint(&self, checkpoint: NewCheckpoint) -> Result<Checkpoint> {
        let stored = checkpoint.into_stored()?;
        let row = (
            stored.thread_id.clone(),
            stored.checkpoint_id.clone(),
            stored.parent_checkpoint_id.clone(),
            stored.run_id.clone(),
            serde_json::to_string(&stored.values).expect("a JSON value always serialises"),
            serde_json::to_string(&stored.metadata).expect("a JSON map always serialises"),
            stored.created_at.clone(),
        );
        self.write(move |conn| {
            let (thread_id, checkpoint_id, parent, run_id, values, metadata, created_at) = row;
            conn.prepare_cached(
                "INSERT INTO checkpoints (thread_id, checkpoint_id, parent_checkpoint_id, \
                 run_id, state_values, metadata, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .db()?
            .execute(params![
                thread_id,
                checkpoint_id,
                parent,
                run_id,
                values,
                metadata,
                created_at
            ])
            .db()
        })
        .await?;
        Ok(stored)
    }

    async fn latest_checkpoint(&self, thread_id: &str) -> Result<Option<Checkpoint>> {
        let thread_id = thread_id.to_owned();
        self.read(move |conn| {
            let sql = format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE thread_id = ? \
                 ORDER BY id DESC LIMIT 1"
            );
            let mut statement = conn.prepare_cached(&sql).db()?;
            let mut rows = statement.query([thread_id]).db()?;
            rows.next().db()?.map(decode_checkpoint).transpose()
        })
        .await
    }

    async fn list_checkpoints(
        &self,
        thread_id: &str,
        limit: u32,
        before: Option<&str>,
    ) -> Result<Vec<Checkpoint>> {
        let mut sql = format!("SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE thread_id = ?1");
        let mut params = vec![SqlValue::Text(thread_id.to_owned())];
        if let Some(before) = before {
            // An id unknown in this thread makes the subquery NULL, so nothing matches.
            sql.push_str(
                " AND id < (SELECT id FROM checkpoints WHERE thread_id = ?1 \
                 AND checkpoint_id = ?2)",
            );
            params.push(SqlValue::Text(before.to_owned()));
        }
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", params.len() + 1));
        params.push(SqlValue::Integer(i64::from(limit)));
        self.read(move |conn| query_all(conn, &sql, params_from_iter(params), decode_checkpoint))
            .await
    }

    async fn delete_run_checkpoints(&self, thread_id: &str, run_id: &str) -> Result<u64> {
        let (thread_id, run_id) = (thread_id.to_owned(), run_id.to_owned());
        let deleted = self
            .write(move |conn| {
                conn.prepare_cached("DELETE FROM checkpoints WHERE thread_id = ? AND run_id = ?")
                    .db()?
                    .execute([thread_id, run_id])
                    .db()
            })
            .await?;
        Ok(deleted as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_file_or_memory() {
        assert!(matches!(parse_url("sqlite::memory:"), Ok(Target::Memory)));
        assert!(matches!(
            parse_url("sqlite://:memory:?cache=shared"),
            Ok(Target::Memory)
        ));
        let Ok(Target::File(path)) = parse_url("sqlite:///var/lib/s.db?mode=rwc") else {
            panic!("an absolute path");
        };
        assert_eq!(path, PathBuf::from("/var/lib/s.db"));
        let Ok(Target::File(path)) = parse_url("sqlite:subflow.db") else {
            panic!("a relative path");
        };
        assert_eq!(path, PathBuf::from("subflow.db"));
        assert!(parse_url("postgres://u@h/db").is_err());
        assert!(parse_url("sqlite://").is_err());
    }

    #[test]
    fn a_database_at_version_one_migrates_to_checkpoints() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        migrate(&mut conn).unwrap();
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
        let count: i64 = conn
            .query_row("SELECT COUNT(*) FROM checkpoints", [], |row| row.get(0))
            .unwrap();
        assert_eq!(count, 0);
    }

    #[tokio::test]
    async fn an_in_memory_store_reads_its_own_writes() {
        let store = SqliteStore::open("sqlite::memory:", 4).await.unwrap();
        let event = NewEvent::new(
            "t1",
            "r1",
            "run.start",
            "trace",
            serde_json::json!({"a": 1}),
            Default::default(),
        );
        let outcome = store.append(&[event]).await.unwrap();
        assert_eq!(outcome.written, 1);
        let rows = store
            .list_events(&EventQuery::run("t1", "r1"))
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        store.close().await;
        assert!(store.list_messages("t1").await.is_err());
    }

    #[tokio::test]
    async fn a_panic_in_a_call_is_a_backend_error_and_the_writer_survives() {
        let store = SqliteStore::open("sqlite::memory:", 1).await.unwrap();
        let result: Result<()> = store
            .write(|conn| {
                conn.execute_batch("BEGIN IMMEDIATE").db()?;
                panic!("boom")
            })
            .await;
        assert!(matches!(result, Err(Error::Backend(_))));
        let event = NewEvent::new(
            "t1",
            "r1",
            "run.start",
            "trace",
            serde_json::json!(null),
            Default::default(),
        );
        assert_eq!(store.append(&[event]).await.unwrap().written, 1);
    }
}
