//! The SQLite backend of the subflow store: one database file in WAL mode, written
//! through a single rusqlite writer connection served by a writer thread, read through a
//! small pool of read-only connections, with the migrations embedded in the binary and
//! tracked by `PRAGMA user_version`.
//!
//! Writes are group-committed: the writer thread takes every write waiting for it (up to
//! [`MAX_GROUP`]) into one `BEGIN IMMEDIATE` transaction, each write in a savepoint of its
//! own, so a write that fails rolls back alone and many concurrent runs cost one commit
//! instead of one each. A caller hears of its write only once the group committed.
//! A write that finds the writer idle, with nothing queued for it, is committed in place
//! on the calling thread, sparing the two thread wake-ups of a trip to the writer thread;
//! one that finds it busy queues behind the writes already waiting, so none is overtaken.
//! A small write in place (up to 64 rows: a buffer flush, a frame, a status) keeps its
//! worker thread for the commit; a larger one first hands the worker's tasks to another
//! thread (`block_in_place`), which costs a wake-up and a context switch. Batch writes always queue (`Route::Queued`): they group better.
//! The hot writes (event batches, stream frames, batch outcomes) go through
//! `write_owned`, which hands their rows back with the answer, so their memory is freed
//! on the thread that allocated it and the writer pays no cross-thread frees.
//! Reads run their SQL off the async scheduler in one hop (`block_in_place` on a
//! multi-threaded runtime, the blocking pool otherwise), not one per statement or row.
//! One file per store trait (`events`, `records`, `checkpoints`, `auth`, `streams`,
//! `batches`);
//! this file holds the connections, migrations and the helpers they share.
//!
//! One `serve` process per file. This crate holds SQL for SQLite only and no
//! behaviour of its own beyond the `subflow-store` traits: it must not validate,
//! buffer, retry or decode differently from the other backends (it uses
//! `subflow_store::{validate_batch, codec}` for that), and it must not block an
//! async worker thread on SQLite beyond a small write's commit.
//!
//! # Map
//!
//! The embedded default, on rusqlite (SQLite compiled in): one file in WAL mode; one
//! writer connection (behind a mutex, used in place when idle) and a writer thread that
//! group-commits: every write waiting for
//! it (up to 64) goes into one `BEGIN IMMEDIATE` transaction, each in a savepoint of its
//! own when there are several (a lone write needs none, and a savepoint's journal copies
//! every page it touches; that journal stays in memory, `temp_store = MEMORY`), so a
//! failing or panicking write rolls back alone, a transaction SQLite itself rolls back (a
//! full disk) fails the whole group, and callers are answered after the commit; the
//! transaction statements come from the statement cache, and hot queries take their limit
//! by stepping (`query_first`) because SQLite re-prepares a statement whose bound `LIMIT`
//! changes; a pool of read-only readers; migrations in `migrations/` embedded and tracked
//! by `PRAGMA user_version`. `seq` comes from a per-thread counter table inside the
//! writer transaction, and `run_events` is clustered by `(thread_id, run_id, seq)`, so a
//! step row touches three b-trees. Reads run in place (`block_in_place`) on a
//! multi-threaded runtime and on the blocking pool otherwise; opening and closing always
//! use the blocking pool (`spawn_blocking`), and so does waiting for a write on a
//! single-threaded runtime (paused test time must not jump). The writer never
//! checkpoints the WAL by itself: `wal.rs` notes the log's size through a WAL hook and a
//! checkpointer thread with its own connection copies the log at the bound. `events.rs`, `records.rs`,
//! `checkpoints.rs`, `auth.rs`; `streams.rs`: stream logs, leases (this process's clock,
//! epoch milliseconds) and cancel requests; every row cascades from its run.
//! `batches.rs`: every write one job of the writer's (the single writer serialises claim
//! passes) running a shared `subflow_store::batches::rows` function over
//! `batches/rows.rs`, this backend's row access, to its end on the writer thread (its
//! futures never wait); leases on the store's `Clock`. Every item transition rewrites its batch row,
//! so the row is kept small (the `execution_spec` lives in `subagent_batch_specs`,
//! written once) and worker writes read it without the spec; the status index holds
//! unfinished items only, and the pass promotes pending items with one statement.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, Row, TransactionBehavior};
use std::sync::mpsc;
use subflow_store::batches::{Clock, SharedClock};
use subflow_store::{Error, Result};
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::Semaphore;
use tokio::sync::oneshot;
use tokio::task::{block_in_place, spawn_blocking};

mod auth;
mod batches;
mod checkpoints;
mod events;
mod records;
mod streams;
mod tasks;
mod wal;

/// The embedded migrations, in order. `PRAGMA user_version` holds how many are applied.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_checkpoints.sql"),
    include_str!("../migrations/0003_auth.sql"),
    include_str!("../migrations/0004_streams.sql"),
    include_str!("../migrations/0005_batches.sql"),
    include_str!("../migrations/0006_checkpoint_deltas.sql"),
    include_str!("../migrations/0007_batch_writes.sql"),
    include_str!("../migrations/0008_task_cancels_and_runs_by_owner.sql"),
    include_str!("../migrations/0009_item_retries.sql"),
    include_str!("../migrations/0010_run_ends.sql"),
    include_str!("../migrations/0011_batch_budgets.sql"),
];

/// How long a connection waits for a lock held by another process.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The writer's page cache in KiB. Event ingest gains nothing past SQLite's default
/// (2 MiB); the batch worker's claims and outcome writes gain a little from 4 MiB and
/// nothing measurable past it (`subflow bench batches` ran at the same 36-44k items/s
/// with 2, 4 and 16 MiB). The cache fills with the pages used: after 100,000 events
/// (`subflow bench store`) 16 MiB held the process at 65 MB, 4 MiB at 40-44 MB.
const WRITER_CACHE_KIB: i64 = 4 * 1024;

/// Prepared statements kept per connection.
const STATEMENT_CACHE: usize = 64;

/// The most writes one transaction of the writer thread commits together.
const MAX_GROUP: usize = 64;

/// Most rows a write commits on its caller's worker thread without handing the
/// worker's tasks to another thread ([`Route::InlineWhenIdle`]): a buffer flush of 25
/// run events, a stream frame with its events, a status update.
const INLINE_ROWS: usize = 64;

/// The SQLite store. Clones share the connections.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The writer thread's queue; `None` once closed.
    writer: Mutex<Option<mpsc::Sender<Box<dyn WriteJob>>>>,
    /// The writer connection, shared by the writer thread and callers that find it idle.
    connection: Arc<WriterConnection>,
    /// The writer thread, joined when the store closes.
    writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Read-only connections; `None` for an in-memory database, read through the writer.
    readers: Option<Arc<Readers>>,
    /// Announces stream appends and cancel requests to listeners in this process.
    notices: subflow_store::streams::LocalNotices,
    /// The clock of batch leases and heartbeats.
    clock: SharedClock,
    /// Encodes checkpoints as deltas; remembers each thread's latest message hashes.
    deltas: Arc<subflow_store::delta::DeltaCodec>,
}

/// Locks `mutex`, recovering it from poisoning: a panic in an earlier call has
/// already rolled back its transaction while unwinding, so the data is sound.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A write waiting for the writer thread.
trait WriteJob: Send {
    /// Runs the write on the writer connection inside the group's transaction: whether
    /// it succeeded, and how to answer its caller once the group's fate is known (none
    /// when it panicked: its caller hears that the writer dropped it).
    fn run(self: Box<Self>, conn: &mut Connection) -> (bool, Option<Reply>);
    /// Answers the caller with an error without running the write.
    fn refuse(self: Box<Self>, message: String);
}

/// Answers a write's caller: `Ok` when its group committed, else why it did not.
type Reply = Box<dyn FnOnce(std::result::Result<(), String>) + Send>;

/// A write and the channel its result goes back on.
struct Pending<T, F> {
    work: F,
    reply: oneshot::Sender<Result<T>>,
}

impl<T, F> WriteJob for Pending<T, F>
where
    T: Send + 'static,
    F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
{
    fn run(self: Box<Self>, conn: &mut Connection) -> (bool, Option<Reply>) {
        let Pending { work, reply } = *self;
        let result = work(conn);
        let succeeded = result.is_ok();
        let answer: Reply = Box::new(move |committed| {
            let answer = match committed {
                Ok(()) => result,
                Err(message) => result.and(Err(backend_message(message))),
            };
            let _ = reply.send(answer);
        });
        (succeeded, Some(answer))
    }

    fn refuse(self: Box<Self>, message: String) {
        let _ = self.reply.send(Err(backend_message(message)));
    }
}

/// Where a write may be committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// A small write (up to [`INLINE_ROWS`] rows): on the calling worker thread itself
    /// when the writer is idle and nothing is queued for it, else on the writer thread.
    /// The worker keeps its tasks for the commit's few hundred µs: handing them to
    /// another thread first (`block_in_place`) costs a thread wake-up and a context
    /// switch, more than such a commit blocks them.
    InlineWhenIdle,
    /// On the calling thread when the writer is idle and nothing is queued for it, its
    /// worker's tasks handed to another thread meanwhile (`block_in_place`), else on the
    /// writer thread.
    InPlaceWhenIdle,
    /// Always on the writer thread, grouped with the writes queued beside it. Batch
    /// writes go this way: the worker's claims and outcomes arrive in bursts that group
    /// well, and committed one by one in place they ran a fifth slower
    /// (`subflow bench batches`).
    Queued,
}

impl Route {
    /// The in-place route of a write of `rows` rows (or a checkpoint of `rows` messages).
    fn in_place_for(rows: usize) -> Route {
        if rows <= INLINE_ROWS {
            Route::InlineWhenIdle
        } else {
            Route::InPlaceWhenIdle
        }
    }
}

/// The writer connection and its WAL bound: one group of writes at a time, committed by
/// the writer thread or, when nothing is queued for it, in place by the caller.
struct Writer {
    conn: Connection,
    wal: wal::WalBound,
}

impl Writer {
    /// Commits `group` in one transaction, then keeps the WAL within its bound.
    fn commit(&mut self, group: Vec<Box<dyn WriteJob>>) {
        let committed = write_group(&mut self.conn, group);
        self.wal.after_group(&self.conn, committed);
    }

    /// Checkpoints and truncates the WAL, then closes the connection.
    fn close(self) {
        let Writer { conn, wal } = self;
        wal.truncate(&conn);
        if let Err((_, error)) = conn.close() {
            tracing::warn!(%error, "closing the SQLite writer failed");
        }
    }
}

/// The writer connection (`None` once the store closed) and how many writes wait for
/// the writer thread.
struct WriterConnection {
    writer: Mutex<Option<Writer>>,
    /// Writes sent to the writer thread whose group has not yet committed.
    queued: AtomicUsize,
}

impl std::fmt::Debug for WriterConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterConnection")
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl WriterConnection {
    /// Commits `job` alone on the calling thread when the writer is idle and nothing is
    /// queued for it, sparing the two thread wake-ups of a trip to the writer thread;
    /// otherwise hands `job` back for the queue, behind the writes already there. With
    /// `hand_off`, or while the WAL is at its bound (the commit may checkpoint), the
    /// worker's tasks go to another thread meanwhile (`block_in_place`). Only on a
    /// multi-threaded runtime.
    fn try_in_place(
        &self,
        job: Box<dyn WriteJob>,
        hand_off: bool,
    ) -> std::result::Result<(), Box<dyn WriteJob>> {
        let mut writer = match self.writer.try_lock() {
            Ok(writer) => writer,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(job),
        };
        // The writer thread lowers the count only after it committed, under the lock:
        // zero here means no earlier write is waiting to be overtaken.
        if self.queued.load(Ordering::Acquire) != 0 {
            return Err(job);
        }
        let Some(writer) = writer.as_mut() else {
            return Err(job);
        };
        if hand_off || writer.wal.at_bound() {
            block_in_place(|| writer.commit(vec![job]));
        } else {
            writer.commit(vec![job]);
        }
        Ok(())
    }
}

/// The writer thread: takes every write waiting (up to [`MAX_GROUP`]) and commits them
/// together, until the store closes; then closes the connection.
fn run_writer(connection: Arc<WriterConnection>, jobs: mpsc::Receiver<Box<dyn WriteJob>>) {
    while let Ok(first) = jobs.recv() {
        let mut writer = lock(&connection.writer);
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        let taken = group.len();
        match writer.as_mut() {
            Some(writer) => writer.commit(group),
            None => group
                .into_iter()
                .for_each(|job| job.refuse(closed().to_string())),
        }
        connection.queued.fetch_sub(taken, Ordering::Release);
    }
    let writer = lock(&connection.writer).take();
    if let Some(writer) = writer {
        writer.close();
    }
}

/// One transaction over `group`, each write in its own savepoint (a lone write in none):
/// a write that fails (or panics) is rolled back alone. If SQLite rolls the whole
/// transaction back (a full disk, an I/O error) or the commit fails, every write of the
/// group is answered with that error, and none of them is in the database. Whether it
/// committed.
fn write_group(conn: &mut Connection, group: Vec<Box<dyn WriteJob>>) -> bool {
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    if let Err(error) = run_cached(conn, "BEGIN IMMEDIATE") {
        let message = format!("beginning a write failed: {error}");
        group
            .into_iter()
            .for_each(|job| job.refuse(message.clone()));
        return false;
    }
    // A lone write needs no savepoint (whose journal copies every page it touches): if
    // it fails, the whole transaction is rolled back.
    let alone = group.len() == 1;
    let mut replies = Vec::with_capacity(group.len());
    let mut jobs = group.into_iter();
    let mut aborted = None;
    for job in jobs.by_ref() {
        if !alone && let Err(error) = run_cached(conn, "SAVEPOINT write_job") {
            job.refuse(format!("a write could not start: {error}"));
            aborted = Some(format!("the write transaction failed: {error}"));
            break;
        }
        let (succeeded, reply) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run(conn)))
                .unwrap_or((false, None));
        if conn.is_autocommit() {
            aborted = Some("SQLite rolled the write transaction back".to_owned());
            replies.extend(reply);
            break;
        }
        if alone {
            if !succeeded {
                aborted = Some("the write failed".to_owned());
            }
            replies.extend(reply);
            break;
        }
        let end = if succeeded {
            Ok(())
        } else {
            run_cached(conn, "ROLLBACK TO write_job")
        };
        if let Err(error) = end.and_then(|()| run_cached(conn, "RELEASE write_job")) {
            aborted = Some(format!("the write transaction failed: {error}"));
            replies.extend(reply);
            break;
        }
        replies.extend(reply);
    }
    let committed = match aborted {
        Some(message) => Err(message),
        None => {
            run_cached(conn, "COMMIT").map_err(|error| format!("committing writes failed: {error}"))
        }
    };
    if let Err(message) = &committed {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        jobs.for_each(|job| job.refuse(message.clone()));
    }
    for reply in replies {
        reply(committed.clone());
    }
    committed.is_ok()
}

/// Runs one statement of the group's transaction from the statement cache, sparing the
/// parse `execute_batch` pays on every call.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
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
    // The savepoint journals of grouped writes stay in memory instead of spilling to a
    // temporary file past 64 KiB.
    conn.pragma_update(None, "temp_store", "MEMORY").db()?;
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
        Self::open_with_clock(
            url,
            max_connections,
            Arc::new(subflow_store::batches::SystemClock),
        )
        .await
    }

    /// [`SqliteStore::open`] with the clock batch leases and heartbeats read, so tests
    /// can let leases expire without waiting.
    pub async fn open_with_clock(
        url: &str,
        max_connections: u32,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        let clock = SharedClock::new(clock);
        let target = parse_url(url)?;
        let readers = max_connections.max(1) as usize;
        spawn_blocking(move || {
            let writer = open_writer(&target)?;
            let wal_path = match &target {
                Target::Memory => None,
                Target::File(path) => Some(path.clone()),
            };
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
            let wal = wal::WalBound::new(&writer, wal_path);
            let connection = Arc::new(WriterConnection {
                writer: Mutex::new(Some(Writer { conn: writer, wal })),
                queued: AtomicUsize::new(0),
            });
            let (jobs, queue) = mpsc::channel();
            let thread_connection = connection.clone();
            let thread = std::thread::Builder::new()
                .name("sqlite-writer".to_owned())
                .spawn(move || run_writer(thread_connection, queue))
                .map_err(Error::backend)?;
            Ok(SqliteStore {
                inner: Arc::new(Inner {
                    writer: Mutex::new(Some(jobs)),
                    connection,
                    writer_thread: Mutex::new(Some(thread)),
                    readers,
                    notices: Default::default(),
                    clock,
                    deltas: Default::default(),
                }),
            })
        })
        .await
        .map_err(Error::backend)?
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
            // The writer thread finishes the writes already queued, then closes.
            drop(lock(&inner.writer).take());
            let thread = lock(&inner.writer_thread).take();
            if let Some(thread) = thread
                && thread.join().is_err()
            {
                tracing::warn!("the SQLite writer thread panicked");
            }
        });
        if let Err(error) = closing.await {
            tracing::warn!(%error, "closing the SQLite store failed");
        }
    }

    /// Runs `work` on the writer connection, inside a transaction it may share with other
    /// writes, and answers once that transaction committed: in place when the writer is
    /// idle ([`Route::InPlaceWhenIdle`]), else on the writer thread. A write of one or a
    /// few rows goes by [`write_small`](Self::write_small). `work` is atomic as
    /// it is: an `Err` undoes exactly its changes (its savepoint in a group, or the whole
    /// transaction of a lone write), so it opens no savepoint of its own, which would copy
    /// every page it touches into an in-memory journal (deleting a 100,000-event thread
    /// took 90 MB that way).
    async fn write<T, F>(&self, work: F) -> Result<T>
    where
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.write_by(Route::InPlaceWhenIdle, work).await
    }

    /// [`write`](Self::write) of a few rows (at most [`INLINE_ROWS`]):
    /// [`Route::InlineWhenIdle`].
    async fn write_small<T, F>(&self, work: F) -> Result<T>
    where
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.write_by(Route::InlineWhenIdle, work).await
    }

    /// [`write`](Self::write) by `route`.
    async fn write_by<T, F>(&self, route: Route, work: F) -> Result<T>
    where
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let queue = lock(&self.inner.writer).clone().ok_or_else(closed)?;
        let mut job: Box<dyn WriteJob> = Box::new(Pending { work, reply });
        let dropped = || Err(backend_message("a SQLite call panicked".to_owned()));
        let threaded = Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread;
        if threaded && route != Route::Queued {
            let hand_off = route == Route::InPlaceWhenIdle;
            match self.inner.connection.try_in_place(job, hand_off) {
                Ok(()) => return answer.await.unwrap_or_else(|_| dropped()),
                Err(queued) => job = queued,
            }
        }
        let connection = &self.inner.connection;
        connection.queued.fetch_add(1, Ordering::AcqRel);
        if queue.send(job).is_err() {
            connection.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(closed());
        }
        if threaded {
            return answer.await.unwrap_or_else(|_| dropped());
        }
        // A single-threaded runtime may run on paused time (tests), which jumps ahead
        // whenever it waits on nothing but another thread: waiting in the blocking pool
        // keeps it where it is while SQLite works, as any blocking call does.
        spawn_blocking(move || answer.blocking_recv())
            .await
            .map_err(Error::backend)?
            .unwrap_or_else(|_| dropped())
    }

    /// [`write_by`](Self::write_by) over rows the caller built: `work` borrows them on
    /// the writer connection, and once it succeeded they come back to be freed on this
    /// side, on the thread that allocated them (a free across threads costs the writer
    /// thread a flush into the allocating thread's arena, under its lock).
    async fn write_owned<O, T, F>(&self, route: Route, owned: O, work: F) -> Result<T>
    where
        O: Send + 'static,
        F: FnOnce(&mut Connection, &O) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (answer, _owned) = self
            .write_by(route, move |conn| {
                work(conn, &owned).map(|answer| (answer, owned))
            })
            .await?;
        Ok(answer)
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

/// A text column, borrowed from the row.
fn text<'r>(row: &'r Row<'_>, index: usize) -> Result<&'r str> {
    row.get_ref(index).db()?.as_str().map_err(Error::backend)
}

/// Runs a cached query and decodes every row.
fn query_all<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    decode: impl Fn(&Row<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    query_first(conn, sql, params, u64::MAX, decode)
}

/// The first `limit` rows of `sql`, decoded. Hot statements take their limit here
/// rather than as a bound `LIMIT ?`: SQLite plans with a bound limit's value, so every
/// new value re-prepares the statement.
fn query_first<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    limit: u64,
    decode: impl Fn(&Row<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let mut statement = conn.prepare_cached(sql).db()?;
    let mut rows = statement.query(params).db()?;
    let mut decoded = Vec::new();
    while (decoded.len() as u64) < limit {
        let Some(row) = rows.next().db()? else { break };
        decoded.push(decode(row)?);
    }
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use subflow_contracts::NewEvent;
    use subflow_store::{EventQuery, EventStore};

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
    async fn a_batch_submitted_before_its_spec_moved_keeps_its_spec() {
        use subflow_store::{BatchScope, BatchStore};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("subflow.db");
        let mut conn = Connection::open(&path).unwrap();
        for sql in &MIGRATIONS[..6] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 6).unwrap();
        conn.execute(
            "INSERT INTO subagent_batches (id, thread_id, user_id, submission_key, title, \
             subagent_type, status, total_items, max_live_items, max_running_items, \
             max_attempts, execution_spec, created_at, updated_at) VALUES ('b1', 't1', 'u1', \
             'k1', 'Old', 'general-purpose', 'queued', 0, 3, 3, 3, '{\"model\":\"m\"}', \
             '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')",
            [],
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        drop(conn);
        let store = SqliteStore::open(&format!("sqlite://{}", path.display()), 2)
            .await
            .unwrap();
        let batch = store
            .get_batch(&BatchScope::user("u1"), "b1")
            .await
            .unwrap()
            .expect("the batch survives the migration");
        assert_eq!(batch.execution_spec, serde_json::json!({"model": "m"}));
        assert_eq!(batch.title, "Old");
        store.close().await;
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
        assert!(store.list_messages("t1", None, 10).await.is_err());
    }

    #[tokio::test]
    async fn a_panic_in_a_call_is_a_backend_error_and_the_writer_survives() {
        let store = SqliteStore::open("sqlite::memory:", 1).await.unwrap();
        let result: Result<()> = store
            .write(|conn| {
                conn.execute_batch(
                    "CREATE TABLE half_done (x INTEGER); INSERT INTO half_done VALUES (1)",
                )
                .db()?;
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
        let half_done: Result<i64> = store
            .read(|conn| {
                conn.query_row("SELECT COUNT(*) FROM half_done", [], |row| row.get(0))
                    .db()
            })
            .await;
        assert!(half_done.is_err(), "the panicked write was rolled back");
    }

    /// A store on a file in `dir` with one table of the writer tests, made by `schema`.
    async fn store_with_table(dir: &tempfile::TempDir, schema: &'static str) -> SqliteStore {
        let url = format!("sqlite://{}", dir.path().join("w.db").display());
        let store = SqliteStore::open(&url, 2).await.unwrap();
        store
            .write(move |conn| conn.execute_batch(schema).db())
            .await
            .unwrap();
        store
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_commit_together_and_a_failing_one_rolls_back_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_table(&dir, "CREATE TABLE w (x INTEGER)").await;
        let writes: Vec<_> = (0..40_i64)
            .map(|x| {
                let store = store.clone();
                tokio::spawn(async move {
                    store
                        .write(move |conn| {
                            let tx = conn.savepoint().db()?;
                            tx.execute("INSERT INTO w VALUES (?)", [x]).db()?;
                            match x {
                                7 => return Err(backend_message("refused".to_owned())),
                                13 => panic!("boom"),
                                _ => {}
                            }
                            tx.commit().db()
                        })
                        .await
                })
            })
            .collect();
        let mut results = Vec::new();
        for write in writes {
            results.push(write.await.unwrap());
        }
        for (x, result) in results.iter().enumerate() {
            assert_eq!(result.is_ok(), x != 7 && x != 13, "write {x}: {result:?}");
        }
        let stored: Vec<i64> = store
            .read(|conn| {
                query_all(conn, "SELECT x FROM w ORDER BY x", [], |row| {
                    row.get(0).db()
                })
            })
            .await
            .unwrap();
        let expected: Vec<i64> = (0..40).filter(|x| *x != 7 && *x != 13).collect();
        assert_eq!(stored, expected);
        store.close().await;
        assert!(store.write(|_| Ok(())).await.is_err(), "closed");
    }

    /// Whether a task spawned beside an in-place write of `route` ran while the write
    /// held the runtime's only worker thread.
    async fn ran_beside(store: &SqliteStore, route: Route) -> bool {
        let ran = Arc::new(AtomicBool::new(false));
        let beside = tokio::spawn({
            let ran = ran.clone();
            async move { ran.store(true, Ordering::Release) }
        });
        let seen = store
            .write_by(route, move |conn| {
                // Waits for the task for as long as it may take another thread to run it.
                let deadline = std::time::Instant::now() + Duration::from_secs(2);
                while !ran.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                conn.execute("INSERT INTO log VALUES (1)", []).db()?;
                Ok(ran.load(Ordering::Acquire))
            })
            .await
            .unwrap();
        beside.await.unwrap();
        seen
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_small_write_keeps_its_worker_and_a_larger_one_hands_its_tasks_over() {
        assert_eq!(Route::in_place_for(INLINE_ROWS), Route::InlineWhenIdle);
        assert_eq!(Route::in_place_for(INLINE_ROWS + 1), Route::InPlaceWhenIdle);
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(store_with_table(&dir, "CREATE TABLE log (n INTEGER)").await);
        // On the worker thread (the test's own body runs beside the runtime's workers).
        let seen = tokio::spawn({
            let store = store.clone();
            async move {
                let inline = ran_beside(&store, Route::InlineWhenIdle).await;
                let handed_off = ran_beside(&store, Route::InPlaceWhenIdle).await;
                (inline, handed_off)
            }
        })
        .await
        .unwrap();
        assert_eq!(
            seen,
            (false, true),
            "a small write holds its worker; a larger one lets the worker's tasks run meanwhile"
        );
        store.close().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_writer_commits_in_place_and_a_busy_or_queued_one_takes_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_table(&dir, "CREATE TABLE log (n INTEGER, thread TEXT)").await;
        let log = |n: i64| {
            move |conn: &mut Connection| {
                let thread = std::thread::current().name().map(str::to_owned);
                conn.execute(
                    "INSERT INTO log VALUES (?, ?)",
                    rusqlite::params![n, thread],
                )
                .db()
            }
        };
        // A holds the idle writer in place until told to finish.
        let (entered, inside) = std::sync::mpsc::channel();
        let (finish, finished) = std::sync::mpsc::channel::<()>();
        let a = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .write(move |conn| {
                        entered.send(()).unwrap();
                        finished.recv().unwrap();
                        log(1)(conn)
                    })
                    .await
            }
        });
        tokio::task::spawn_blocking(move || inside.recv().unwrap())
            .await
            .unwrap();
        // B finds it busy and waits in the writer thread's queue.
        let b = tokio::spawn({
            let store = store.clone();
            async move { store.write(log(2)).await }
        });
        while store.inner.connection.queued.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        finish.send(()).unwrap();
        a.await.unwrap().unwrap();
        b.await.unwrap().unwrap();
        // With a write counted as queued (one the writer thread has not yet taken), an
        // idle writer is not used in place: C goes behind it.
        let queued = &store.inner.connection.queued;
        queued.fetch_add(1, Ordering::AcqRel);
        store.write(log(3)).await.unwrap();
        queued.fetch_sub(1, Ordering::AcqRel);
        let rows: Vec<(i64, Option<String>)> = store
            .read(|conn| {
                query_all(
                    conn,
                    "SELECT n, thread FROM log ORDER BY rowid",
                    [],
                    |row| Ok((row.get(0).db()?, row.get(1).db()?)),
                )
            })
            .await
            .unwrap();
        let order: Vec<i64> = rows.iter().map(|(n, _)| *n).collect();
        assert_eq!(order, [1, 2, 3]);
        let writer = Some("sqlite-writer");
        let threads: Vec<bool> = rows.iter().map(|(_, t)| t.as_deref() == writer).collect();
        assert_eq!(
            threads,
            [false, true, true],
            "A in place, B (the writer busy) and C (a write queued) on the writer thread"
        );
        store.close().await;
    }
}
