//! Keeps the write-ahead log within what its volume can hold. SQLite checkpoints the WAL
//! once it holds `wal_autocheckpoint` pages; a fixed 8,192 (32 MiB) never fires on a
//! small volume, where the WAL fills the disk instead and every write fails from then on,
//! even after space is freed. The writer thread sets the bound to a quarter of the free
//! space (within [`MIN_PAGES`]..=[`MAX_PAGES`]), checks it every [`CHECK_EVERY`] groups
//! and after a failed one (when it also checkpoints at once), keeps the file no larger
//! than the bound after a checkpoint (`journal_size_limit`), and truncates the WAL to
//! nothing when the store closes.

use std::path::PathBuf;

use rusqlite::Connection;

/// The bound on a roomy volume: each checkpoint fsyncs the database file, and with
/// `synchronous = NORMAL` those fsyncs are the only ones a write pays.
pub(crate) const MAX_PAGES: u64 = 8192;
/// The smallest bound, so a nearly full volume still groups its checkpoints.
pub(crate) const MIN_PAGES: u64 = 64;
/// Group commits between two looks at the free space.
const CHECK_EVERY: u32 = 256;

/// The WAL bound, in pages, for `available` free bytes.
pub(crate) fn bound_pages(available: u64, page_size: u64) -> u64 {
    (available / 4 / page_size.max(1)).clamp(MIN_PAGES, MAX_PAGES)
}

/// The writer's view of its WAL; `None` directory for an in-memory database.
pub(crate) struct WalBound {
    dir: Option<PathBuf>,
    page_size: u64,
    groups: u32,
}

impl WalBound {
    /// Sets the first bound for the database file at `path`.
    pub(crate) fn new(conn: &Connection, path: Option<PathBuf>) -> Self {
        let page_size = conn
            .pragma_query_value(None, "page_size", |row| row.get::<_, i64>(0))
            .map_or(4096, |size| size.max(512) as u64);
        let dir = path.map(|path| match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        });
        let bound = WalBound {
            dir,
            page_size,
            groups: 0,
        };
        bound.adjust(conn);
        bound
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
            if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                tracing::debug!(%error, "checkpointing after a failed write failed");
            }
        }
        if !committed || self.groups >= CHECK_EVERY {
            self.groups = 0;
            self.adjust(conn);
        }
    }

    /// Checkpoints everything and truncates the WAL file: the store is closing.
    pub(crate) fn truncate(&self, conn: &Connection) {
        if self.dir.is_none() {
            return;
        }
        if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
            tracing::warn!(%error, "truncating the SQLite WAL at close failed");
        }
    }

    fn adjust(&self, conn: &Connection) {
        let Some(dir) = &self.dir else { return };
        let pages = available(dir).map_or(MAX_PAGES, |free| bound_pages(free, self.page_size));
        let set = conn
            .pragma_update(None, "wal_autocheckpoint", pages as i64)
            .and_then(|()| {
                conn.query_row(
                    &format!("PRAGMA journal_size_limit = {}", pages * self.page_size),
                    [],
                    |_| Ok(()),
                )
            });
        if let Err(error) = set {
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

    #[test]
    fn the_bound_is_a_quarter_of_the_free_space_within_its_limits() {
        assert_eq!(bound_pages(8 << 20, 4096), 512);
        assert_eq!(bound_pages(10 << 30, 4096), MAX_PAGES);
        assert_eq!(bound_pages(0, 4096), MIN_PAGES);
    }

    #[test]
    fn a_file_database_gets_a_bound_that_fits_its_volume() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bound.sqlite");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
        WalBound::new(&conn, Some(path));
        let pages: i64 = conn
            .pragma_query_value(None, "wal_autocheckpoint", |row| row.get(0))
            .unwrap();
        let free = available(dir.path()).unwrap();
        assert_eq!(pages as u64, bound_pages(free, 4096));
        let limit: i64 = conn
            .pragma_query_value(None, "journal_size_limit", |row| row.get(0))
            .unwrap();
        assert_eq!(limit as u64, pages as u64 * 4096);
    }
}
