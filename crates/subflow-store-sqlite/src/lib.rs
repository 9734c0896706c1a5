//! The SQLite backend of the subflow store: one database file in WAL mode, written
//! through a single rusqlite writer connection whose transactions begin with
//! `BEGIN IMMEDIATE`, read through a small pool of read-only connections, with the
//! migrations embedded in the binary and tracked by `PRAGMA user_version`.
//!
//! Every call runs its SQL off the async scheduler in one hop (`block_in_place` on a
//! multi-threaded runtime, the blocking pool otherwise), not one per statement or row.
//! One file per store trait (`events`, `records`, `checkpoints`, `auth`, `streams`,
//! `batches`);
//! this file holds the connections, migrations and the helpers they share.
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

use rusqlite::{Connection, OpenFlags, Row, TransactionBehavior};
use subflow_store::batches::{Clock, SharedClock};
use subflow_store::{Error, Result};
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::Semaphore;
use tokio::task::{block_in_place, spawn_blocking};

mod auth;
mod batches;
mod checkpoints;
mod events;
mod records;
mod streams;
mod tasks;

/// The embedded migrations, in order. `PRAGMA user_version` holds how many are applied.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_checkpoints.sql"),
    include_str!("../migrations/0003_auth.sql"),
    include_str!("../migrations/0004_streams.sql"),
    include_str!("../migrations/0005_batches.sql"),
    include_str!("../migrations/0006_checkpoint_deltas.sql"),
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
    let mut statement = conn.prepare_cached(sql).db()?;
    let mut rows = statement.query(params).db()?;
    let mut decoded = Vec::new();
    while let Some(row) = rows.next().db()? {
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
