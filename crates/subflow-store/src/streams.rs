//! The durable per-run stream log, run leases and remote cancel requests (docs/api.md#resume-and-rejoin, docs/api.md#cancel), and the trait that stores them.
//!
//! A run's log holds its SSE frames (`id`, `event`, `data`) exactly as the gateway sent
//! them, ids contiguous from 1: the store refuses a batch that would leave a hole and
//! skips frames it already holds, so a retried batch never duplicates. A log that has
//! ended never grows again, which is what fences a slow owner out once its run was
//! recovered. The store knows nothing of SSE beyond that: which frames exist, their
//! order, and when the log ended.
//!
//! Backends announce appends and cancel requests as [`StreamNotice`]s. PostgreSQL does it
//! with `NOTIFY` on [`STREAM_CHANNEL`] and [`CANCEL_CHANNEL`], so every process sees them;
//! the single-process backends announce them to listeners of the same store value.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use subflow_contracts::{NewEvent, ThreadId};
use tokio::sync::{broadcast, mpsc};

use crate::{AppendOutcome, Error, EventStore, MAX_PAGE_LIMIT, Result, RunStatusUpdate};

/// The PostgreSQL channel announcing appends: payload `{"run_id", "last_id"}`.
pub const STREAM_CHANNEL: &str = "subflow_stream";

/// The PostgreSQL channel announcing cancel requests: payload `{"run_id"}`.
pub const CANCEL_CHANNEL: &str = "subflow_cancel";

/// Longest frame event name.
pub const FRAME_EVENT_MAX_CHARS: usize = 32;

/// One frame of a run's stream log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamFrame {
    /// The SSE id: 1, 2, 3, … per run.
    pub id: i64,
    /// The SSE event name, e.g. `metadata`, `values`, `end`.
    pub event: String,
    /// The frame's data: JSON text, kept byte for byte.
    pub data: String,
}

/// A frame whose id the store assigns (the closing frames of a recovered run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFrame {
    /// The SSE event name.
    pub event: String,
    /// JSON text.
    pub data: String,
}

/// Frames to append to one run's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameBatch {
    /// The run; its record must exist.
    pub run_id: String,
    /// The run's thread.
    pub thread_id: String,
    /// Consecutive ids, continuing the stored log (frames already stored are skipped).
    pub frames: Vec<StreamFrame>,
    /// Whether this batch ends the log: nothing is appended after it.
    pub ends: bool,
    /// The run lease owner writing the batch: the append is accepted only while this
    /// owner holds the run's lease, checked in the append's own transaction
    /// ([`Error::LeaseLost`] otherwise, nothing written). `None` writes unfenced.
    pub lease_owner: Option<String>,
}

impl FrameBatch {
    /// Checks what can be checked without the stored log: a valid thread id, a run id,
    /// event names of 1–32 characters and ids ≥ 1, each one more than the previous.
    pub fn validate(&self) -> Result<()> {
        ThreadId::parse(&self.thread_id)?;
        if self.run_id.is_empty() {
            return Err(Error::InvalidRunId);
        }
        let mut previous: Option<i64> = None;
        for frame in &self.frames {
            let chars = frame.event.chars().count();
            if !(1..=FRAME_EVENT_MAX_CHARS).contains(&chars) {
                return Err(Error::InvalidFrame(format!(
                    "event '{}' must have 1-{FRAME_EVENT_MAX_CHARS} characters",
                    frame.event
                )));
            }
            match previous {
                None if frame.id < 1 => {
                    return Err(Error::InvalidFrame(format!(
                        "frame ids start at 1, got {}",
                        frame.id
                    )));
                }
                Some(previous) if frame.id != previous + 1 => {
                    return Err(Error::InvalidFrame(format!(
                        "frame ids must be consecutive: {} follows {previous}",
                        frame.id
                    )));
                }
                _ => {}
            }
            previous = Some(frame.id);
        }
        Ok(())
    }

    /// The frames with an id above `last_id` (the stored log's end), checked to continue
    /// it; an error when they would leave a hole.
    pub fn fresh_after(&self, last_id: i64) -> Result<&[StreamFrame]> {
        let start = self.frames.partition_point(|f| f.id <= last_id);
        let fresh = &self.frames[start..];
        match fresh.first() {
            Some(first) if first.id != last_id + 1 => Err(Error::InvalidFrame(format!(
                "frame {} does not continue the log of run {}, which ends at {last_id}",
                first.id, self.run_id
            ))),
            _ => Ok(fresh),
        }
    }
}

/// What a run's stream log holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamLog {
    /// The run's thread.
    pub thread_id: String,
    /// The highest id ever appended (0 before the first frame), kept after pruning.
    pub last_id: i64,
    /// The earliest id still retained; `None` when no frame is.
    pub earliest_id: Option<i64>,
    /// The latest id still retained; `None` when no frame is.
    pub latest_id: Option<i64>,
    /// Whether the log has ended (nothing will be appended).
    pub ended: bool,
    /// Whether the frames were pruned after the retention period.
    pub pruned: bool,
}

/// Which runs [`StreamStore::find_orphaned_runs`] and [`StreamStore::recover_orphan`]
/// treat as orphaned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphanScope {
    /// Runs whose lease has expired: their owner stopped renewing it.
    ExpiredLeases,
    /// Every run that is active (pending or running) or holds a lease, whoever holds it:
    /// for a backend used by one process at a time, at that process's start.
    AllActive,
}

/// A run found orphaned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanedRun {
    /// The run.
    pub run_id: String,
    /// Its thread.
    pub thread_id: String,
}

/// What [`StreamStore::recover_orphan`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredRun {
    /// The run's thread.
    pub thread_id: String,
    /// Whether the run was still active and took the recovery status.
    pub was_active: bool,
    /// How many closing frames were appended (none when the log had already ended).
    pub frames_appended: usize,
}

/// A change another party may be waiting for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StreamNotice {
    /// Frames up to `last_id` of `run_id` are stored (or its log ended).
    Appended {
        /// The run.
        run_id: String,
        /// The log's latest id.
        last_id: i64,
    },
    /// Someone asked the owner of `run_id` to cancel it.
    CancelRequested {
        /// The run.
        run_id: String,
    },
    /// Notices may have been missed (a lagging listener, a lost connection): re-read
    /// whatever is being waited for.
    Resync,
}

/// The capacity of an in-process notice channel; a slower listener gets a
/// [`StreamNotice::Resync`].
const NOTICE_CAPACITY: usize = 1024;

/// The notices of one store value, for the backends that run in one process.
#[derive(Debug, Clone)]
pub struct LocalNotices {
    sender: broadcast::Sender<StreamNotice>,
}

impl Default for LocalNotices {
    fn default() -> Self {
        LocalNotices {
            sender: broadcast::channel(NOTICE_CAPACITY).0,
        }
    }
}

impl LocalNotices {
    /// Announces a notice to every current listener.
    pub fn publish(&self, notice: StreamNotice) {
        // No listener is not an error: nobody is waiting.
        let _ = self.sender.send(notice);
    }

    /// A new listener.
    pub fn subscribe(&self) -> StreamNotices {
        StreamNotices {
            inner: NoticeSource::Local(self.sender.subscribe()),
        }
    }
}

/// A listener's side of the notices.
#[derive(Debug)]
pub struct StreamNotices {
    inner: NoticeSource,
}

#[derive(Debug)]
enum NoticeSource {
    Local(broadcast::Receiver<StreamNotice>),
    Remote(mpsc::Receiver<StreamNotice>),
}

impl StreamNotices {
    /// Notices forwarded by a backend's own listener task; the task should stop once
    /// `sender.closed()` completes.
    pub fn remote(receiver: mpsc::Receiver<StreamNotice>) -> Self {
        StreamNotices {
            inner: NoticeSource::Remote(receiver),
        }
    }

    /// The next notice; `None` once the source has gone.
    pub async fn recv(&mut self) -> Option<StreamNotice> {
        match &mut self.inner {
            NoticeSource::Local(receiver) => match receiver.recv().await {
                Ok(notice) => Some(notice),
                Err(broadcast::error::RecvError::Lagged(_)) => Some(StreamNotice::Resync),
                Err(broadcast::error::RecvError::Closed) => None,
            },
            NoticeSource::Remote(receiver) => receiver.recv().await,
        }
    }
}

/// Checks the bounds of a frame page: `after_id` ≥ 0 and `limit` 1–2000.
pub fn validate_frame_page(after_id: i64, limit: u32) -> Result<()> {
    if after_id < 0 {
        return Err(Error::InvalidQuery(format!(
            "after_id must be at least 0, got {after_id}"
        )));
    }
    if !(1..=MAX_PAGE_LIMIT).contains(&limit) {
        return Err(Error::InvalidQuery(format!(
            "limit must be between 1 and {MAX_PAGE_LIMIT}, got {limit}"
        )));
    }
    Ok(())
}

/// Milliseconds since the Unix epoch, the clock of the single-process backends' leases.
pub fn epoch_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A duration in whole milliseconds, saturating.
pub fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Storage of run stream logs, run leases and cancel requests.
#[async_trait]
pub trait StreamStore: EventStore + Send + Sync + std::fmt::Debug {
    /// Appends frames to a run's log atomically and announces it. Frames already stored
    /// are skipped; the rest must continue the log (else [`Error::InvalidFrame`], nothing
    /// written); a log that has ended takes nothing (all skipped). `ends` marks the log
    /// ended. [`Error::RunNotFound`] when no such run exists in that thread;
    /// [`Error::LeaseLost`] when the batch names a `lease_owner` that does not hold the
    /// run's lease.
    async fn append_frames(&self, batch: &FrameBatch) -> Result<AppendOutcome>;

    /// Stores `events` as [`EventStore::append`] does, then `batch` as
    /// [`StreamStore::append_frames`] does, so the frames are never stored without the
    /// run events before them; the outcome is the frames'. An error may leave the events
    /// stored (appending them again skips them); a backend that makes it one transaction
    /// stores neither.
    async fn append_events_and_frames(
        &self,
        events: &[NewEvent],
        batch: &FrameBatch,
    ) -> Result<AppendOutcome> {
        if !events.is_empty() {
            self.append(events).await?;
        }
        self.append_frames(batch).await
    }

    /// Up to `limit` (1–2000) frames of a run with an id above `after_id`, ascending.
    async fn read_frames(
        &self,
        run_id: &str,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<StreamFrame>>;

    /// The state of a run's log; `None` when nothing was ever appended.
    async fn stream_log(&self, run_id: &str) -> Result<Option<StreamLog>>;

    /// Deletes the frames of logs that ended at least `retention` ago, keeping their
    /// bounds; returns how many logs were pruned.
    async fn prune_streams(&self, retention: Duration) -> Result<u64>;

    /// Takes the run's lease for `ttl` when it is free, expired or already `owner`'s;
    /// false when another owner holds a live lease. [`Error::RunNotFound`] without a run.
    async fn acquire_run_lease(&self, run_id: &str, owner: &str, ttl: Duration) -> Result<bool>;

    /// Extends `owner`'s lease to `ttl` from now; false when `owner` no longer holds it.
    async fn renew_run_lease(&self, run_id: &str, owner: &str, ttl: Duration) -> Result<bool>;

    /// Gives `owner`'s lease up and forgets the run's cancel requests; false when
    /// `owner` did not hold it.
    async fn release_run_lease(&self, run_id: &str, owner: &str) -> Result<bool>;

    /// Up to `limit` runs orphaned in `scope`.
    async fn find_orphaned_runs(&self, scope: OrphanScope, limit: u32) -> Result<Vec<OrphanedRun>>;

    /// Finishes an orphaned run in one transaction: if it is still orphaned in `scope`,
    /// an active run takes `update`, a log that has not ended gets `closing` appended
    /// with the next ids and ends, and the lease and cancel requests go. `None` when the
    /// run is not (or no longer) orphaned, e.g. because its owner renewed the lease.
    async fn recover_orphan(
        &self,
        run_id: &str,
        scope: OrphanScope,
        update: &RunStatusUpdate,
        closing: &[NewFrame],
    ) -> Result<Option<RecoveredRun>>;

    /// Stores a request to cancel an active run and announces it to its owner; false
    /// when the run does not exist or has already ended.
    async fn request_cancel(&self, run_id: &str) -> Result<bool>;

    /// Removes and returns the cancel requests stored for any of `run_ids`.
    async fn take_cancel_requests(&self, run_ids: &[String]) -> Result<Vec<String>>;

    /// Stores a request to cancel one task of an active run and announces it to the
    /// run's owner like a run's cancel request; false when the run does not exist or has
    /// already ended.
    async fn request_task_cancel(&self, run_id: &str, task_id: &str) -> Result<bool>;

    /// Removes and returns the task cancel requests stored for any of `run_ids`, as
    /// `(run_id, task_id)` pairs.
    async fn take_task_cancel_requests(&self, run_ids: &[String]) -> Result<Vec<(String, String)>>;

    /// A listener for appends and cancel requests.
    async fn listen(&self) -> Result<StreamNotices>;

    /// Whether other processes may execute runs in this store (PostgreSQL). When false,
    /// one process uses the store at a time, so every run it finds active at its start
    /// was left behind by a process that stopped.
    fn is_shared(&self) -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(id: i64) -> StreamFrame {
        StreamFrame {
            id,
            event: "values".into(),
            data: "{}".into(),
        }
    }

    fn batch(ids: &[i64]) -> FrameBatch {
        FrameBatch {
            run_id: "r1".into(),
            thread_id: "t1".into(),
            frames: ids.iter().copied().map(frame).collect(),
            ends: false,
            lease_owner: None,
        }
    }

    #[test]
    fn batches_must_hold_consecutive_ids_from_one() {
        assert!(batch(&[1, 2, 3]).validate().is_ok());
        assert!(batch(&[]).validate().is_ok());
        assert!(matches!(
            batch(&[0, 1]).validate(),
            Err(Error::InvalidFrame(_))
        ));
        assert!(matches!(
            batch(&[1, 3]).validate(),
            Err(Error::InvalidFrame(_))
        ));
        assert!(matches!(
            batch(&[2, 1]).validate(),
            Err(Error::InvalidFrame(_))
        ));
        let mut long = batch(&[1]);
        long.frames[0].event = "e".repeat(33);
        assert!(matches!(long.validate(), Err(Error::InvalidFrame(_))));
        let mut bad_thread = batch(&[1]);
        bad_thread.thread_id = "no spaces".into();
        assert!(bad_thread.validate().is_err());
    }

    #[test]
    fn fresh_frames_continue_the_stored_log_or_fail() {
        let b = batch(&[4, 5, 6]);
        assert_eq!(b.fresh_after(3).unwrap().len(), 3);
        assert_eq!(b.fresh_after(5).unwrap()[0].id, 6);
        assert!(b.fresh_after(6).unwrap().is_empty());
        assert!(b.fresh_after(9).unwrap().is_empty());
        assert!(matches!(b.fresh_after(2), Err(Error::InvalidFrame(_))));
    }

    #[test]
    fn notices_parse_from_the_notify_payloads() {
        let appended: StreamNotice =
            serde_json::from_str(r#"{"run_id" : "r1", "last_id" : 7}"#).unwrap();
        assert_eq!(
            appended,
            StreamNotice::Appended {
                run_id: "r1".into(),
                last_id: 7
            }
        );
        let cancel: StreamNotice = serde_json::from_str(r#"{"run_id": "r2"}"#).unwrap();
        assert_eq!(
            cancel,
            StreamNotice::CancelRequested {
                run_id: "r2".into()
            }
        );
    }

    #[tokio::test]
    async fn a_lagging_local_listener_is_told_to_resync() {
        let notices = LocalNotices::default();
        let mut listener = notices.subscribe();
        for n in 0..(NOTICE_CAPACITY as i64 + 5) {
            notices.publish(StreamNotice::Appended {
                run_id: "r".into(),
                last_id: n,
            });
        }
        assert_eq!(listener.recv().await, Some(StreamNotice::Resync));
    }
}
