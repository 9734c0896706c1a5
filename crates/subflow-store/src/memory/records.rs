//! [`RecordStore`] for [`MemoryStore`]: threads and runs.

use async_trait::async_trait;
use subflow_contracts::{RunStatus, ThreadId, ThreadStatus};

use crate::records::{
    NewRun, NewThread, RecordStore, RunRecord, RunScope, RunStatusUpdate, RunUsage, ThreadRecord,
    ThreadSearch,
};
use crate::{Error, MemoryStore, Result, codec, now_rfc3339};

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

    async fn update_thread_metadata(
        &self,
        thread_id: &str,
        metadata: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Option<ThreadRecord>> {
        let mut inner = self.lock();
        let Some(thread) = inner.threads.iter_mut().find(|t| t.thread_id == thread_id) else {
            return Ok(None);
        };
        thread
            .metadata
            .extend(metadata.iter().map(|(k, v)| (k.clone(), v.clone())));
        thread.updated_at = now_rfc3339();
        Ok(Some(thread.clone()))
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
        self.batches.forget_thread(thread_id);
        inner.runs.retain(|r| r.thread_id != thread_id);
        inner.checkpoints.retain(|c| c.thread_id != thread_id);
        if let Some(rows) = inner.events.remove(thread_id) {
            for row in rows {
                inner.event_ids.remove(&row.event_id);
                inner.ended_runs.remove(&row.run_id);
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
        scope: RunScope<'_>,
        status: Option<RunStatus>,
        limit: u32,
        offset: u32,
    ) -> Result<Vec<RunRecord>> {
        Ok(self
            .lock()
            .runs
            .iter()
            .rev()
            .filter(|r| scope.holds(r) && status.is_none_or(|s| r.status == s))
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
        self.streams
            .check_lease(run_id, update.lease_owner.as_deref())?;
        run.status = update.status;
        run.stop_reason = update.stop_reason;
        run.error = update.error.clone();
        run.updated_at = now_rfc3339();
        Ok(true)
    }

    async fn save_run_usage(
        &self,
        run_id: &str,
        usage: &RunUsage,
        lease_owner: Option<&str>,
    ) -> Result<bool> {
        let mut inner = self.lock();
        let Some(run) = inner.runs.iter_mut().find(|r| r.run_id == run_id) else {
            return Ok(false);
        };
        self.streams.check_lease(run_id, lease_owner)?;
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
        inner.ended_runs.remove(run_id);
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
