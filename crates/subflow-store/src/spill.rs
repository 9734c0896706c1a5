//! The spill file: run event records that could not be written, as JSON lines in the
//! data directory, re-applied at the next start before the gateway accepts requests.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use subflow_contracts::NewEvent;

use crate::EventStore;

/// The file name inside the data directory.
pub const SPILL_FILE_NAME: &str = "run-events.spill.jsonl";

/// Rows written per append while re-applying.
const REAPPLY_BATCH: usize = 500;

/// Why re-applying the spill file failed. The file is kept, so nothing is lost.
#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    /// Reading or removing the file failed.
    #[error("spill file {path}: {source}")]
    Io {
        /// The spill file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// A line is not a run event record.
    #[error("spill file {path}, line {line}: {detail}")]
    Parse {
        /// The spill file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// Why it does not parse.
        detail: String,
    },
    /// The store refused the records.
    #[error("re-applying spill file {path}: {source}")]
    Store {
        /// The spill file.
        path: PathBuf,
        /// The store error.
        source: crate::Error,
    },
}

/// An append-only JSON-lines file of unwritten records.
#[derive(Debug)]
pub struct SpillFile {
    path: PathBuf,
    write_lock: Mutex<()>,
}

impl SpillFile {
    /// The spill file of a data directory.
    pub fn in_dir(data_dir: &Path) -> Self {
        Self::at(data_dir.join(SPILL_FILE_NAME))
    }

    /// A spill file at an exact path.
    pub fn at(path: PathBuf) -> Self {
        SpillFile {
            path,
            write_lock: Mutex::new(()),
        }
    }

    /// Where the file lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends records, one JSON object a line, and syncs the file.
    pub fn append(&self, records: &[NewEvent]) -> std::io::Result<()> {
        let _guard = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(parent) = self.path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut text = String::new();
        for record in records {
            text.push_str(&serde_json::to_string(record).map_err(std::io::Error::other)?);
            text.push('\n');
        }
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        file.write_all(text.as_bytes())?;
        file.sync_data()
    }

    /// Writes every spilled record to `store` (records it already holds are skipped by
    /// `event_id`), then removes the file. Returns how many records the file held.
    /// On any error the file stays in place for the next attempt.
    pub async fn reapply(&self, store: &dyn EventStore) -> Result<usize, SpillError> {
        let records = {
            let _guard = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
            match self.read_all() {
                Ok(records) => records,
                Err(SpillError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    return Ok(0);
                }
                Err(error) => return Err(error),
            }
        };
        // Consecutive records of one thread form a batch: a batch never mixes threads.
        for group in records.chunk_by(|a, b| a.thread_id == b.thread_id) {
            for batch in group.chunks(REAPPLY_BATCH) {
                store
                    .append(batch)
                    .await
                    .map_err(|source| SpillError::Store {
                        path: self.path.clone(),
                        source,
                    })?;
            }
        }
        let _guard = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        // Records spilled while we were writing stay for the next start.
        let still_there = self.read_all()?;
        let remaining = &still_there[records.len().min(still_there.len())..];
        if remaining.is_empty() {
            std::fs::remove_file(&self.path).map_err(|source| self.io_error(source))?;
        } else {
            let rest = SpillFile::at(self.path.with_extension("tmp"));
            rest.append(remaining)
                .map_err(|source| self.io_error(source))?;
            std::fs::rename(rest.path(), &self.path).map_err(|source| self.io_error(source))?;
        }
        Ok(records.len())
    }

    fn read_all(&self) -> Result<Vec<NewEvent>, SpillError> {
        let file = std::fs::File::open(&self.path).map_err(|source| self.io_error(source))?;
        let mut records = Vec::new();
        for (index, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|source| self.io_error(source))?;
            if line.trim().is_empty() {
                continue;
            }
            let record = serde_json::from_str(&line).map_err(|error| SpillError::Parse {
                path: self.path.clone(),
                line: index + 1,
                detail: error.to_string(),
            })?;
            records.push(record);
        }
        Ok(records)
    }

    fn io_error(&self, source: std::io::Error) -> SpillError {
        SpillError::Io {
            path: self.path.clone(),
            source,
        }
    }
}
