//! The in-memory store: the reference semantics of every trait, for tests and embedding.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use async_trait::async_trait;
use subflow_contracts::{EventCategory, NewEvent, RunEvent, RunStatus, ThreadId, ThreadStatus};
use uuid::Uuid;

use crate::checkpoints::{Checkpoint, CheckpointStore, NewCheckpoint};
use crate::events::{AppendOutcome, EventQuery, EventStore};
use crate::records::{
    NewRun, NewThread, RecordStore, RunRecord, RunStatusUpdate, RunUsage, ThreadRecord,
    ThreadSearch,
};
use crate::{Error, Result, codec, now_rfc3339, validate_batch};

/// A store that keeps everything in process memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    /// Users and tokens, under a lock of their own.
    pub(crate) auth: crate::auth::MemoryAuth,
    /// Stream logs, run leases and cancel requests, locked after `inner`.
    pub(crate) streams: crate::streams::MemoryStreams,
}

#[derive(Debug, Default)]
struct Inner {
    /// Per thread, in `seq` order.
    events: HashMap<String, Vec<RunEvent>>,
    event_ids: HashSet<Uuid>,
    /// In creation order.
    threads: Vec<ThreadRecord>,
    /// In creation order.
    runs: Vec<RunRecord>,
    /// In creation order.
    checkpoints: Vec<Checkpoint>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied batch: every
        // mutation below is prepared first and applied without fallible steps.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `work` on the run records under the store's lock.
    pub(crate) fn with_runs<T>(&self, work: impl FnOnce(&mut Vec<RunRecord>) -> T) -> T {
        work(&mut self.lock().runs)
    }
}

#[async_trait]
impl EventStore for MemoryStore {
    async fn append(&self, batch: &[NewEvent]) -> Result<AppendOutcome> {
        validate_batch(batch)?;
        let Some(first) = batch.first() else {
            return Ok(AppendOutcome::default());
        };
        let mut inner = self.lock();
        let inner = &mut *inner;
        let rows = inner.events.entry(first.thread_id.clone()).or_default();
        let mut next_seq = rows.last().map_or(0, |row| row.seq) + 1;
        let created_at = now_rfc3339();
        let mut outcome = AppendOutcome::default();
        for event in batch {
            if !inner.event_ids.insert(event.event_id) {
                outcome.skipped += 1;
                continue;
            }
            rows.push(RunEvent {
                thread_id: event.thread_id.clone(),
                run_id: event.run_id.clone(),
                seq: next_seq,
                event_type: event.event_type.clone(),
                category: event.category.clone(),
                content: event.content_value(),
                metadata: event.metadata_map(),
                created_at: created_at.clone(),
                user_id: event.user_id.clone(),
                event_id: event.event_id,
            });
            next_seq += 1;
            outcome.written += 1;
        }
        Ok(outcome)
    }

    async fn list_events(&self, query: &EventQuery) -> Result<Vec<RunEvent>> {
        query.validate()?;
        let inner = self.lock();
        let rows = inner
            .events
            .get(&query.thread_id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let start = query
            .after_seq
            .map_or(0, |after| rows.partition_point(|row| row.seq <= after));
        Ok(rows[start..]
            .iter()
            .filter(|row| query.matches(row))
            .take(query.limit as usize)
            .cloned()
            .collect())
    }

    async fn list_messages(&self, thread_id: &str) -> Result<Vec<RunEvent>> {
        let inner = self.lock();
        let message = EventCategory::Message.as_str();
        Ok(inner
            .events
            .get(thread_id)
            .map(|rows| {
                rows.iter()
                    .filter(|row| row.category == message)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }
}

#[async_trait]
impl RecordStore for MemoryStore {
    async fn create_thread(&self, thread: NewThread) -> Result<ThreadRecord> {
        ThreadId::parse(&thread.thread_id)?;
        let mut inner = self.lock();
        if inner
            .threads
            .iter()
            .any(|t| t.thread_id == thread.thread_id)
        {
            return Err(Error::ThreadExists(thread.thread_id));
        }
        let now = now_rfc3339();
        let record = ThreadRecord {
            thread_id: thread.thread_id,
            owner: thread.owner,
            status: ThreadStatus::Idle,
            metadata: thread.metadata,
            created_at: now.clone(),
            updated_at: now,
        };
        inner.threads.push(record.clone());
        Ok(record)
    }

    async fn get_thread(&self, thread_id: &str) -> Result<Option<ThreadRecord>> {
        Ok(self
            .lock()
            .threads
            .iter()
            .find(|t| t.thread_id == thread_id)
            .cloned())
    }

    async fn search_threads(&self, search: &ThreadSearch) -> Result<Vec<ThreadRecord>> {
        let inner = self.lock();
        let newest_first = inner
            .threads
            .iter()
            .rev()
            .filter(|t| t.owner == search.owner && search.status.is_none_or(|s| t.status == s))
            .cloned()
            .collect();
        Ok(search.page(newest_first))
    }

    async fn set_thread_status(&self, thread_id: &str, status: ThreadStatus) -> Result<bool> {
        let mut inner = self.lock();
        let Some(thread) = inner.threads.iter_mut().find(|t| t.thread_id == thread_id) else {
            return Ok(false);
        };
        thread.status = status;
        thread.updated_at = now_rfc3339();
        Ok(true)
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let before = inner.threads.len();
        inner.threads.retain(|t| t.thread_id != thread_id);
        let deleted_runs: Vec<String> = inner
            .runs
            .iter()
            .filter(|r| r.thread_id == thread_id)
            .map(|r| r.run_id.clone())
            .collect();
        self.streams.forget(&deleted_runs);
        inner.runs.retain(|r| r.thread_id != thread_id);
        inner.checkpoints.retain(|c| c.thread_id != thread_id);
        if let Some(rows) = inner.events.remove(thread_id) {
            for row in rows {
                inner.event_ids.remove(&row.event_id);
            }
        }
        Ok(inner.threads.len() != before)
    }

    async fn create_run(&self, run: NewRun) -> Result<RunRecord> {
        ThreadId::parse(&run.thread_id)?;
        let mut inner = self.lock();
        if inner.runs.iter().any(|r| r.run_id == run.run_id) {
            return Err(Error::RunExists(run.run_id));
        }
        let record = codec::new_run_record(run, now_rfc3339());
        inner.runs.push(record.clone());
        Ok(record)
    }

    async fn get_run(&self, thread_id: &str, run_id: &str) -> Result<Option<RunRecord>> {
        Ok(self
            .lock()
            .runs
            .iter()
            .find(|r| r.run_id == run_id && r.thread_id == thread_id)
            .cloned())
    }

    async fn list_runs(
        &self,
        thread_id: &str,
        status: Option<RunStatus>,
        limit: u32,
        offset: u32,
    ) -> Result<Vec<RunRecord>> {
        Ok(self
            .lock()
            .runs
            .iter()
            .rev()
            .filter(|r| r.thread_id == thread_id && status.is_none_or(|s| r.status == s))
            .skip(offset as usize)
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn update_run_status(&self, run_id: &str, update: &RunStatusUpdate) -> Result<bool> {
        let mut inner = self.lock();
        let Some(run) = inner
            .runs
            .iter_mut()
            .find(|r| r.run_id == run_id && r.status.is_active())
        else {
            return Ok(false);
        };
        run.status = update.status;
        run.stop_reason = update.stop_reason;
        run.error = update.error.clone();
        run.updated_at = now_rfc3339();
        Ok(true)
    }

    async fn save_run_usage(&self, run_id: &str, usage: &RunUsage) -> Result<bool> {
        let mut inner = self.lock();
        let Some(run) = inner.runs.iter_mut().find(|r| r.run_id == run_id) else {
            return Ok(false);
        };
        run.usage = usage.clone();
        run.updated_at = now_rfc3339();
        Ok(true)
    }

    async fn delete_run(&self, thread_id: &str, run_id: &str) -> Result<bool> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let before = inner.runs.len();
        inner
            .runs
            .retain(|r| !(r.run_id == run_id && r.thread_id == thread_id));
        if inner.runs.len() != before {
            self.streams.forget(&[run_id.to_owned()]);
        }
        if let Some(rows) = inner.events.get_mut(thread_id) {
            rows.retain(|row| {
                let keep = row.run_id != run_id;
                if !keep {
                    inner.event_ids.remove(&row.event_id);
                }
                keep
            });
        }
        Ok(inner.runs.len() != before)
    }
}

#[async_trait]
impl CheckpointStore for MemoryStore {
    async fn put_checkpoint(&self, checkpoint: NewCheckpoint) -> Result<Checkpoint> {
        let stored = checkpoint.into_stored()?;
        self.lock().checkpoints.push(stored.clone());
        Ok(stored)
    }

    async fn latest_checkpoint(&self, thread_id: &str) -> Result<Option<Checkpoint>> {
        Ok(self
            .lock()
            .checkpoints
            .iter()
            .rev()
            .find(|c| c.thread_id == thread_id)
            .cloned())
    }

    async fn list_checkpoints(
        &self,
        thread_id: &str,
        limit: u32,
        before: Option<&str>,
    ) -> Result<Vec<Checkpoint>> {
        let inner = self.lock();
        let newest_first = inner
            .checkpoints
            .iter()
            .rev()
            .filter(|c| c.thread_id == thread_id);
        let older = newest_first
            .skip_while(|c| before.is_some_and(|id| c.checkpoint_id != id))
            .skip(usize::from(before.is_some()));
        Ok(older.take(limit as usize).cloned().collect())
    }

    async fn delete_run_checkpoints(&self, thread_id: &str, run_id: &str) -> Result<u64> {
        let mut inner = self.lock();
        let before = inner.checkpoints.len();
        inner
            .checkpoints
            .retain(|c| !(c.thread_id == thread_id && c.run_id.as_deref() == Some(run_id)));
        Ok((before - inner.checkpoints.len()) as u64)
    }
}
