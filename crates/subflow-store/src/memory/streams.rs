//! [`StreamStore`] for [`MemoryStore`]: the reference semantics the SQL backends match.
//!
//! The stream tables live under a lock of their own, always taken after the store's
//! record lock when both are needed, so a recovery changes the run and its log at once.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use subflow_contracts::RunStatus;

use crate::streams::{
    FrameBatch, LocalNotices, NewFrame, OrphanScope, OrphanedRun, RecoveredRun, StreamFrame,
    StreamLog, StreamNotice, StreamNotices, StreamStore, epoch_millis, millis, validate_frame_page,
};
use crate::{AppendOutcome, Error, MemoryStore, Result, RunStatusUpdate, now_rfc3339};

/// The stream tables of a [`MemoryStore`] and the notices of its appends.
#[derive(Debug, Default)]
pub(super) struct MemoryStreams {
    tables: Mutex<Tables>,
    notices: LocalNotices,
}

#[derive(Debug, Default)]
struct Tables {
    logs: HashMap<String, Log>,
    /// Run id → (owner, expiry in epoch ms).
    leases: HashMap<String, (String, i64)>,
    cancels: HashSet<String>,
    /// Run id → the tasks someone asked to cancel.
    task_cancels: HashMap<String, HashSet<String>>,
}

impl MemoryStreams {
    /// [`Error::LeaseLost`] unless `owner` (when given) holds `run_id`'s lease.
    /// Locked after the store's `inner`, as every caller holds it.
    pub(super) fn check_lease(&self, run_id: &str, owner: Option<&str>) -> Result<()> {
        self.lock().check_lease(run_id, owner)
    }
}

impl Tables {
    /// [`Error::LeaseLost`] unless `owner` (when given) holds `run_id`'s lease.
    fn check_lease(&self, run_id: &str, owner: Option<&str>) -> Result<()> {
        match (owner, self.leases.get(run_id)) {
            (None, _) => Ok(()),
            (Some(owner), Some((held, _))) if held == owner => Ok(()),
            _ => Err(Error::LeaseLost(run_id.to_owned())),
        }
    }

    /// Forgets a run's lease and cancel requests.
    fn forget_lease(&mut self, run_id: &str) {
        self.leases.remove(run_id);
        self.cancels.remove(run_id);
        self.task_cancels.remove(run_id);
    }
}

#[derive(Debug)]
struct Log {
    thread_id: String,
    frames: Vec<StreamFrame>,
    last_id: i64,
    /// Epoch ms.
    ended_at: Option<i64>,
    pruned: bool,
}

impl Log {
    fn new(thread_id: &str) -> Self {
        Log {
            thread_id: thread_id.to_owned(),
            frames: Vec::new(),
            last_id: 0,
            ended_at: None,
            pruned: false,
        }
    }
}

impl MemoryStreams {
    fn lock(&self) -> MutexGuard<'_, Tables> {
        // Every mutation below is checked first and applied without fallible steps.
        self.tables
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forgets everything of deleted runs.
    pub(super) fn forget(&self, run_ids: &[String]) {
        let mut tables = self.lock();
        for run_id in run_ids {
            tables.logs.remove(run_id);
            tables.forget_lease(run_id);
        }
    }
}

/// Whether `run_id` is orphaned in `scope`, given its status.
fn orphaned(tables: &Tables, run_id: &str, status: RunStatus, scope: OrphanScope) -> bool {
    let lease = tables.leases.get(run_id);
    match scope {
        OrphanScope::ExpiredLeases => lease.is_some_and(|(_, expires)| *expires <= epoch_millis()),
        OrphanScope::AllActive => lease.is_some() || status.is_active(),
    }
}

#[async_trait]
impl StreamStore for MemoryStore {
    async fn append_frames(&self, batch: &FrameBatch) -> Result<AppendOutcome> {
        batch.validate()?;
        let (written, last_id) = self.with_runs(|runs| {
            let exists = runs
                .iter()
                .any(|r| r.run_id == batch.run_id && r.thread_id == batch.thread_id);
            if !exists {
                return Err(Error::RunNotFound(batch.run_id.clone()));
            }
            let mut tables = self.streams.lock();
            tables.check_lease(&batch.run_id, batch.lease_owner.as_deref())?;
            let log = tables
                .logs
                .entry(batch.run_id.clone())
                .or_insert_with(|| Log::new(&batch.thread_id));
            if log.ended_at.is_some() {
                return Ok((0, None));
            }
            let fresh = batch.fresh_after(log.last_id)?;
            log.frames.extend_from_slice(fresh);
            log.last_id = log.last_id.max(fresh.last().map_or(0, |f| f.id));
            if batch.ends {
                log.ended_at = Some(epoch_millis());
            }
            let announce = !fresh.is_empty() || batch.ends;
            Ok((fresh.len(), announce.then_some(log.last_id)))
        })?;
        if let Some(last_id) = last_id {
            self.streams.notices.publish(StreamNotice::Appended {
                run_id: batch.run_id.clone(),
                last_id,
            });
        }
        Ok(AppendOutcome {
            written,
            skipped: batch.frames.len() - written,
        })
    }

    async fn read_frames(
        &self,
        run_id: &str,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<StreamFrame>> {
        validate_frame_page(after_id, limit)?;
        let tables = self.streams.lock();
        let Some(log) = tables.logs.get(run_id) else {
            return Ok(Vec::new());
        };
        let start = log.frames.partition_point(|f| f.id <= after_id);
        Ok(log.frames[start..]
            .iter()
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn stream_log(&self, run_id: &str) -> Result<Option<StreamLog>> {
        let tables = self.streams.lock();
        Ok(tables.logs.get(run_id).map(|log| StreamLog {
            thread_id: log.thread_id.clone(),
            last_id: log.last_id,
            earliest_id: log.frames.first().map(|f| f.id),
            latest_id: log.frames.last().map(|f| f.id),
            ended: log.ended_at.is_some(),
            pruned: log.pruned,
        }))
    }

    async fn prune_streams(&self, retention: Duration) -> Result<u64> {
        let cutoff = epoch_millis().saturating_sub(millis(retention));
        let mut tables = self.streams.lock();
        let mut pruned = 0;
        for log in tables.logs.values_mut() {
            if !log.pruned && log.ended_at.is_some_and(|ended| ended <= cutoff) {
                log.frames = Vec::new();
                log.pruned = true;
                pruned += 1;
            }
        }
        Ok(pruned)
    }

    async fn acquire_run_lease(&self, run_id: &str, owner: &str, ttl: Duration) -> Result<bool> {
        if !self.with_runs(|runs| runs.iter().any(|r| r.run_id == run_id)) {
            return Err(Error::RunNotFound(run_id.to_owned()));
        }
        let now = epoch_millis();
        let mut tables = self.streams.lock();
        let free = tables
            .leases
            .get(run_id)
            .is_none_or(|(holder, expires)| holder == owner || *expires <= now);
        if free {
            tables.leases.insert(
                run_id.to_owned(),
                (owner.to_owned(), now.saturating_add(millis(ttl))),
            );
        }
        Ok(free)
    }

    async fn renew_run_lease(&self, run_id: &str, owner: &str, ttl: Duration) -> Result<bool> {
        let mut tables = self.streams.lock();
        match tables.leases.get_mut(run_id) {
            Some((holder, expires)) if holder == owner => {
                *expires = epoch_millis().saturating_add(millis(ttl));
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release_run_lease(&self, run_id: &str, owner: &str) -> Result<bool> {
        let mut tables = self.streams.lock();
        if tables
            .leases
            .get(run_id)
            .is_none_or(|(holder, _)| holder != owner)
        {
            return Ok(false);
        }
        tables.forget_lease(run_id);
        Ok(true)
    }

    async fn find_orphaned_runs(&self, scope: OrphanScope, limit: u32) -> Result<Vec<OrphanedRun>> {
        let runs = self.with_runs(|runs| {
            runs.iter()
                .map(|r| (r.run_id.clone(), r.thread_id.clone(), r.status))
                .collect::<Vec<_>>()
        });
        let tables = self.streams.lock();
        Ok(runs
            .into_iter()
            .filter(|(run_id, _, status)| orphaned(&tables, run_id, *status, scope))
            .take(limit as usize)
            .map(|(run_id, thread_id, _)| OrphanedRun { run_id, thread_id })
            .collect())
    }

    async fn recover_orphan(
        &self,
        run_id: &str,
        scope: OrphanScope,
        update: &RunStatusUpdate,
        closing: &[NewFrame],
    ) -> Result<Option<RecoveredRun>> {
        let now = now_rfc3339();
        let recovered = self.with_runs(|runs| {
            let run = runs.iter_mut().find(|r| r.run_id == run_id)?;
            let mut tables = self.streams.lock();
            if !orphaned(&tables, run_id, run.status, scope) {
                return None;
            }
            let was_active = run.status.is_active();
            if was_active {
                run.status = update.status;
                run.stop_reason = update.stop_reason;
                run.error = update.error.clone();
                run.updated_at = now;
            }
            let log = tables
                .logs
                .entry(run_id.to_owned())
                .or_insert_with(|| Log::new(&run.thread_id));
            let mut frames_appended = 0;
            if log.ended_at.is_none() {
                for frame in closing {
                    log.last_id += 1;
                    log.frames.push(StreamFrame {
                        id: log.last_id,
                        event: frame.event.clone(),
                        data: frame.data.clone(),
                    });
                }
                frames_appended = closing.len();
                log.ended_at = Some(epoch_millis());
            }
            let last_id = log.last_id;
            tables.forget_lease(run_id);
            Some((
                RecoveredRun {
                    thread_id: run.thread_id.clone(),
                    was_active,
                    frames_appended,
                },
                last_id,
            ))
        });
        Ok(recovered.map(|(recovered, last_id)| {
            if recovered.frames_appended > 0 {
                self.streams.notices.publish(StreamNotice::Appended {
                    run_id: run_id.to_owned(),
                    last_id,
                });
            }
            recovered
        }))
    }

    async fn request_cancel(&self, run_id: &str) -> Result<bool> {
        let active = self.with_runs(|runs| {
            runs.iter()
                .any(|r| r.run_id == run_id && r.status.is_active())
        });
        if !active {
            return Ok(false);
        }
        self.streams.lock().cancels.insert(run_id.to_owned());
        self.streams.notices.publish(StreamNotice::CancelRequested {
            run_id: run_id.to_owned(),
        });
        Ok(true)
    }

    async fn take_cancel_requests(&self, run_ids: &[String]) -> Result<Vec<String>> {
        let mut tables = self.streams.lock();
        Ok(run_ids
            .iter()
            .filter(|run_id| tables.cancels.remove(run_id.as_str()))
            .cloned()
            .collect())
    }

    async fn request_task_cancel(&self, run_id: &str, task_id: &str) -> Result<bool> {
        let active = self.with_runs(|runs| {
            runs.iter()
                .any(|r| r.run_id == run_id && r.status.is_active())
        });
        if !active {
            return Ok(false);
        }
        self.streams
            .lock()
            .task_cancels
            .entry(run_id.to_owned())
            .or_default()
            .insert(task_id.to_owned());
        self.streams.notices.publish(StreamNotice::CancelRequested {
            run_id: run_id.to_owned(),
        });
        Ok(true)
    }

    async fn take_task_cancel_requests(&self, run_ids: &[String]) -> Result<Vec<(String, String)>> {
        let mut tables = self.streams.lock();
        let mut taken = Vec::new();
        for run_id in run_ids {
            if let Some(tasks) = tables.task_cancels.remove(run_id) {
                let mut tasks: Vec<String> = tasks.into_iter().collect();
                tasks.sort();
                taken.extend(tasks.into_iter().map(|task| (run_id.clone(), task)));
            }
        }
        Ok(taken)
    }

    async fn listen(&self) -> Result<StreamNotices> {
        Ok(self.streams.notices.subscribe())
    }

    fn is_shared(&self) -> bool {
        false
    }
}
