//! Keeps the write-ahead log within what its volume can hold, and its checkpoints off
//! the writer thread. A checkpoint copies the WAL into the database file and fsyncs it;
//! run by the writer it stalls every write queued behind it (tens of milliseconds on a
//! slow disk). So the writer connection never checkpoints by itself (its WAL hook,
//! which replaces SQLite's auto-checkpoint, only notes how many pages the log holds),
//! and a checkpointer thread with a connection of its own runs a passive checkpoint once
//! the log reaches the bound; the writer keeps committing meanwhile, and restarts the
//! log at its first write after a checkpoint that copied everything.
//!
//! The bound is a quarter of the free space (within [`MIN_PAGES`]..=[`MAX_PAGES`]): a
//! fixed 8,192 pages (32 MiB) would let the WAL fill a small volume, after which every
//! write fails, even once space is freed. The writer checks the free space every
//! [`CHECK_EVERY`] groups and after a failed one (when it also checkpoints at once),
//! keeps the file no larger than the bound after a restart (`journal_size_limit`), and
//! checkpoints itself when the log reaches twice the bound, which the checkpointer
//! cannot keep below under a writer that never pauses. The log is truncated to nothing
//! when the store closes.

use std::cell::Cell;
use std::os::raw::c_int;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rusqlite::Connection;
use rusqlite::hooks::Wal;

use super::lock;

/// The bound on a roomy volume: each checkpoint fsyncs the database file, and with
/// `synchronous = NORMAL` those fsyncs are the only ones a write pays.
pub(crate) const MAX_PAGES: u64 = 8192;
/// The smallest bound, so a nearly full volume still groups its checkpoints.
pub(crate) const MIN_PAGES: u64 = 64;
/// Group commits between two looks at the free space.
const CHECK_EVERY: u32 = 256;

/// The checkpointer's page cache in KiB: a checkpoint copies frames without it.
const CHECKPOINTER_CACHE_KIB: i64 = 256;

/// The WAL bound, in pages, for `available` free bytes.
pub(crate) fn bound_pages(available: u64, page_size: u64) -> u64 {
    (available / 4 / page_size.max(1)).clamp(MIN_PAGES, MAX_PAGES)
}

thread_local! {
    /// The pages the WAL held after the last commit on this thread, until the group's
    /// [`WalBound::after_group`] on the same thread takes it. A writer connection
    /// commits on the writer thread or in place on a caller's, one group at a time, and
    /// each group's `after_group` follows its commit on the thread that committed it.
    static LOG_PAGES: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The writer connection's WAL hook: notes the log's size, checkpoints nothing.
fn note_log_pages(_: &Wal, pages: c_int) -> rusqlite::Result<()> {
    LOG_PAGES.set(Some(u64::try_from(pages).unwrap_or(0)));
    Ok(())
}

/// Runs a passive checkpoint on `conn`; `what` names the moment in the log.
fn checkpoint(conn: &Connection, what: &str) {
    if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::debug!(%error, "checkpointing {what} failed");
    }
}

/// The thread that checkpoints the WAL beside the writer.
struct Checkpointer {
    /// Asks for a checkpoint; one asked while another runs is kept for after it.
    wake: SyncSender<()>,
    /// Held while a checkpoint runs, so the writer's own waits for it.
    running: Arc<Mutex<()>>,
    thread: JoinHandle<()>,
}

impl Checkpointer {
    /// Opens a connection of its own on the database at `path` and starts the thread.
    fn start(path: &Path) -> Result<Self, Box<dyn std::error::Error>> {
        let flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags)?;
        super::configure(&conn)?;
        conn.pragma_update(None, "cache_size", -CHECKPOINTER_CACHE_KIB)?;
        let (wake, asked) = mpsc::sync_channel::<()>(1);
        let running = Arc::new(Mutex::new(()));
        let held = running.clone();
        let thread = std::thread::Builder::new()
            .name("sqlite-checkpointer".to_owned())
            .spawn(move || {
                while asked.recv().is_ok() {
                    let _running = lock(&held);
                    checkpoint(&conn, "beside the writer");
                }
            })?;
        Ok(Checkpointer {
            wake,
            running,
            thread,
        })
    }

    fn ask(&self) {
        if let Err(TrySendError::Disconnected(())) = self.wake.try_send(()) {
            tracing::debug!("the SQLite checkpointer is gone");
        }
    }

    /// Stops the thread once its checkpoint (if any) is done.
    fn stop(self) {
        drop(self.wake);
        if self.thread.join().is_err() {
            tracing::warn!("the SQLite checkpointer thread panicked");
        }
    }
}

/// The writer's view of its WAL; `None` directory for an in-memory database.
pub(crate) struct WalBound {
    dir: Option<PathBuf>,
    page_size: u64,
    groups: u32,
    /// The bound, in pages.
    pages: u64,
    /// The pages the log held after its last commit that wrote any.
    log_pages: u64,
    /// `None` for an in-memory database, or when its connection could not be opened
    /// (the writer then checkpoints at the bound itself).
    checkpointer: Option<Checkpointer>,
}

impl WalBound {
    /// Takes over checkpoints of the writer connection `conn` to the database file at
    /// `path` (its commits' hook notes the log's size) and sets the first bound.
    pub(crate) fn new(conn: &Connection, path: Option<PathBuf>) -> Self {
        let page_size = conn
            .pragma_query_value(None, "page_size", |row| row.get::<_, i64>(0))
            .map_or(4096, |size| size.max(512) as u64);
        let checkpointer = path.as_deref().and_then(|path| {
            conn.wal_hook(Some(note_log_pages));
            Checkpointer::start(path)
                .inspect_err(|error| {
                    tracing::warn!(%error, "starting the SQLite checkpointer failed; the writer checkpoints");
                })
                .ok()
        });
        let dir = path.map(|path| match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        });
        let mut bound = WalBound {
            dir,
            page_size,
            groups: 0,
            pages: MAX_PAGES,
            log_pages: 0,
            checkpointer,
        };
        bound.adjust(conn);
        bound
    }

    /// Whether the log reached its bound at the last commit: the next commit may copy it
    /// into the database itself.
    pub(crate) fn at_bound(&self) -> bool {
        self.dir.is_some() && self.log_pages >= self.pages
    }

    /// After a group commit: whether it committed.
    pub(crate) fn after_group(&mut self, conn: &Connection, committed: bool) {
        if self.dir.is_none() {
            return;
        }
        self.groups += 1;
        if !committed {
            // A full disk shows as a failed write: copy what the WAL holds into the
            // database now, so the next write after space is freed restarts the WAL.
            self.checkpoint_here(conn, "after a failed write");
        }
        if !committed || self.groups >= CHECK_EVERY {
            self.groups = 0;
            self.adjust(conn);
        }
        if let Some(pages) = LOG_PAGES.take() {
            self.log_pages = pages;
        }
        let pages = self.log_pages;
        match &self.checkpointer {
            _ if pages < self.pages => {}
            Some(checkpointer) if pages < 2 * self.pages => checkpointer.ask(),
            _ => self.checkpoint_here(conn, "at the bound"),
        }
    }

    /// Checkpoints on the writer connection, once a checkpoint beside it is done: the
    /// writer writes nothing meanwhile, so the whole log is copied.
    fn checkpoint_here(&self, conn: &Connection, what: &str) {
        let _running = self.checkpointer.as_ref().map(|c| lock(&c.running));
        checkpoint(conn, what);
    }

    /// Checkpoints everything and truncates the WAL file: the store is closing.
    pub(crate) fn truncate(self, conn: &Connection) {
        if self.dir.is_none() {
            return;
        }
        if let Some(checkpointer) = self.checkpointer {
            checkpointer.stop();
        }
        if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
            tracing::warn!(%error, "truncating the SQLite WAL at close failed");
        }
    }

    fn adjust(&mut self, conn: &Connection) {
        let Some(dir) = &self.dir else { return };
        self.pages = available(dir).map_or(MAX_PAGES, |free| bound_pages(free, self.page_size));
        let limit = format!(
            "PRAGMA journal_size_limit = {}",
            self.pages * self.page_size
        );
        if let Err(error) = conn.query_row(&limit, [], |_| Ok(())) {
            tracing::debug!(%error, "bounding the SQLite WAL failed");
        }
    }
}

/// Free bytes on the volume holding `dir`, for an unprivileged writer.
#[cfg(unix)]
fn available(dir: &std::path::Path) -> Option<u64> {
    let stat = rustix::fs::statvfs(dir).ok()?;
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

#[cfg(not(unix))]
fn available(_dir: &std::path::Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_bound_is_a_quarter_of_the_free_space_within_its_limits() {
        assert_eq!(bound_pages(8 << 20, 4096), 512);
        assert_eq!(bound_pages(10 << 30, 4096), MAX_PAGES);
        assert_eq!(bound_pages(0, 4096), MIN_PAGES);
    }

    /// A writer connection on a fresh WAL database, its bound set to `pages`.
    fn writer(dir: &Path, pages: Option<u64>) -> (Connection, WalBound) {
        let path = dir.join("bound.sqlite");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x BLOB)")
            .unwrap();
        let mut bound = WalBound::new(&conn, Some(path));
        if let Some(pages) = pages {
            bound.pages = pages;
        }
        (conn, bound)
    }

    /// Commits one row of `bytes`, as a group of the writer's; the log's pages after it.
    fn commit(conn: &Connection, bound: &mut WalBound, bytes: i64) -> u64 {
        conn.execute("INSERT INTO t VALUES (zeroblob(?1))", [bytes])
            .unwrap();
        bound.after_group(conn, true);
        bound.log_pages
    }

    #[test]
    fn a_file_database_gets_a_bound_that_fits_its_volume() {
        let dir = tempfile::tempdir().unwrap();
        let (conn, bound) = writer(dir.path(), None);
        let free = available(dir.path()).unwrap();
        assert_eq!(bound.pages, bound_pages(free, 4096));
        let limit: i64 = conn
            .pragma_query_value(None, "journal_size_limit", |row| row.get(0))
            .unwrap();
        assert_eq!(limit as u64, bound.pages * 4096);
    }

    #[test]
    fn the_checkpointer_copies_the_log_while_the_writer_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let (conn, mut bound) = writer(dir.path(), Some(MIN_PAGES));
        while commit(&conn, &mut bound, 3000) < MIN_PAGES {}
        // Small commits (a page each) leave the checkpointer dozens of them to copy the
        // log before it reaches twice the bound, where the writer would checkpoint it
        // itself; the writer restarts the log at its first commit after that copy.
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let pages = commit(&conn, &mut bound, 10);
            if pages < MIN_PAGES {
                break;
            }
            assert!(
                pages < 2 * MIN_PAGES,
                "the log reached twice the bound without a checkpoint beside the writer"
            );
        }
        bound.truncate(&conn);
        let wal = dir.path().join("bound.sqlite-wal");
        assert_eq!(std::fs::metadata(wal).map_or(0, |m| m.len()), 0);
    }

    #[test]
    fn a_writer_that_never_pauses_keeps_the_log_within_twice_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let (conn, mut bound) = writer(dir.path(), Some(MIN_PAGES));
        let mut restarts = 0;
        let mut last = 0;
        // Fewer commits than a look at the free space, which would reset the bound.
        for _ in 1..CHECK_EVERY {
            let pages = commit(&conn, &mut bound, 3000);
            // One commit past twice the bound at most: the next one restarts the log.
            assert!(pages <= 2 * MIN_PAGES + 4, "the log held {pages} pages");
            restarts += usize::from(pages < last);
            last = pages;
        }
        assert!(restarts >= 4, "the log restarted {restarts} times");
    }
}
