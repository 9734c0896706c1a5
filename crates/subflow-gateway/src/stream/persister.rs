//! The life of an executing run's frames in this process: numbered here, 1, 2, 3, …
//! with no gaps; stored in id order under the run's lease (each write takes what the
//! run's event buffers hold and stores it first, in one transaction where the store
//! can, so the records a frame shows are stored before it); then
//! published to the run's [`Hub`] once, which shows them to watchers (commit before
//! send). The final `end` goes in the write that ends the log.
//!
//! A failed write is retried with backoff for as long as the process lives: the frames
//! wait here meanwhile, so none is lost and none is written twice (the store skips
//! stored ids). A write the store refuses because another process holds the lease
//! stops the run here: nothing more is stored or published, and the hub tells its
//! watchers `lease_lost` once they have read what was stored. A write refused for good
//! (the run was deleted) leaves the log where it is, and the frames go to this
//! process's watchers unstored, since no store will hold them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use subflow_runtime::output::EventBarrier;
use subflow_store::{FrameBatch, Store, StreamFrame};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::hub::{Frame, FrameEvent, Hub};

/// Frames per store write; more pending frames go in the next write.
const PERSIST_BATCH: usize = 256;

/// The first and the longest wait before a failed write is retried.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// What fences a run's frame writes: the lease owner they are written under, and the
/// run's cancel, pulled when the store says another process recovered the run.
pub(crate) struct Fence {
    /// The lease owner (this process).
    pub owner: String,
    /// The run's cancel.
    pub cancel: CancellationToken,
}

/// The frames numbered and not yet stored.
#[derive(Debug, Default)]
struct Pending {
    frames: VecDeque<Arc<Frame>>,
    last_id: u64,
    /// The final frame was pushed.
    finished: bool,
}

#[derive(Debug, Default)]
struct Queue {
    pending: Mutex<Pending>,
    /// Wakes the writer; a wake-up while it writes is kept for its next wait.
    wake: Notify,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // Every mutation is a push or a pop: nothing is left half-done.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Up to `limit` pending frames from the oldest, whether they end the log, and
    /// whether nothing is pending because the log is complete.
    fn next(&self, limit: usize) -> (Vec<Arc<Frame>>, bool, bool) {
        let pending = self.lock();
        let frames: Vec<Arc<Frame>> = pending.frames.iter().take(limit).cloned().collect();
        let ends = pending.finished && frames.len() == pending.frames.len();
        (frames, ends, pending.finished && pending.frames.is_empty())
    }

    /// Drops the pending frames up to `id`, stored (or published unstored).
    fn done_with(&self, id: u64) {
        let mut pending = self.lock();
        while pending.frames.front().is_some_and(|f| f.id <= id) {
            pending.frames.pop_front();
        }
    }

    /// Takes nothing more: the lease was lost.
    fn close(&self) {
        let mut pending = self.lock();
        pending.finished = true;
        pending.frames.clear();
    }
}

/// The producing side of one run's frames; dropping it leaves the writer to finish.
pub(crate) struct Persister {
    queue: Arc<Queue>,
}

impl Persister {
    /// Starts a run's frames: numbers its `metadata` frame and stores it at once (so a
    /// run without a log is one that ended before logs existed, never one whose first
    /// write is still pending; a failure is left to the writer), then spawns the writer,
    /// which publishes to `hub`. The handle resolves once the writer is done: the log is
    /// stored to its end, refused for good, or the lease was lost.
    pub async fn start(
        hub: Arc<Hub>,
        store: Arc<dyn Store>,
        barrier: EventBarrier,
        fence: Fence,
        span: tracing::Span,
    ) -> (Persister, JoinHandle<()>) {
        let persister = Persister {
            queue: Arc::new(Queue::default()),
        };
        let metadata = json!({"run_id": hub.run_id, "thread_id": hub.thread_id});
        persister.push(FrameEvent::Metadata, &metadata);
        let mut writer = Writer {
            queue: persister.queue.clone(),
            hub,
            store,
            barrier,
            fence,
            unstorable: false,
        };
        let running = writer.write_once().await;
        let task = tokio::spawn(
            async move {
                if running {
                    writer.run().await;
                }
            }
            .instrument(span),
        );
        (persister, task)
    }

    /// Numbers a frame for the writer; `data` is serialised once, here.
    pub fn push(&self, event: FrameEvent, data: &(impl Serialize + ?Sized)) {
        self.push_frame(event, json_text(data), None, false);
    }

    /// [`Persister::push`] of a frame the durable log stores as `stored` (event, data).
    pub fn push_stored(&self, event: FrameEvent, data: &Value, stored: (&'static str, String)) {
        self.push_frame(event, data.to_string(), Some(stored), false);
    }

    /// Numbers the run's last frames: `error` with `error` when it failed, then `end`.
    pub fn end(&self, error: Option<&str>) {
        if let Some(message) = error {
            let error = json!({"message": message, "name": "RunError"});
            self.push_frame(FrameEvent::Error, error.to_string(), None, false);
        }
        self.push_frame(FrameEvent::End, Value::Null.to_string(), None, true);
    }

    fn push_frame(
        &self,
        event: FrameEvent,
        data: String,
        stored: Option<(&'static str, String)>,
        last: bool,
    ) {
        let mut pending = self.queue.lock();
        if pending.finished {
            return;
        }
        let mut frame = Frame::new(pending.last_id + 1, event, data);
        frame.stored = stored;
        pending.last_id = frame.id;
        pending.frames.push_back(Arc::new(frame));
        pending.finished = last;
        drop(pending);
        self.queue.wake.notify_one();
    }
}

/// The JSON text of a frame's data: frames carry JSON values and typed events, whose
/// serialisation cannot fail.
fn json_text(data: &(impl Serialize + ?Sized)) -> String {
    serde_json::to_string(data).expect("frame data always serialises")
}

/// What a write came to.
enum Written {
    /// The frames are stored (or published unstored).
    Done,
    /// The store failed; the frames wait for the next attempt.
    Failed,
    /// The writer is done for good: the log ended or the lease was lost.
    Over,
}

/// The task that stores and publishes one run's frames.
struct Writer {
    queue: Arc<Queue>,
    hub: Arc<Hub>,
    store: Arc<dyn Store>,
    barrier: EventBarrier,
    fence: Fence,
    /// The store refused the frames for good.
    unstorable: bool,
}

impl Writer {
    /// Writes what is pending now once; false when the writer is done.
    async fn write_once(&mut self) -> bool {
        !matches!(self.write().await, Written::Over)
    }

    /// Writes until the final frame is stored. Frames that arrive while a write is under
    /// way go in the next one.
    async fn run(mut self) {
        let mut backoff = RETRY_MIN;
        loop {
            match self.write().await {
                Written::Over => return,
                Written::Done => backoff = RETRY_MIN,
                Written::Failed => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Waits for pending frames, then stores the next batch and publishes it.
    async fn write(&mut self) -> Written {
        let (frames, ends) = loop {
            let (frames, ends, complete) = self.queue.next(PERSIST_BATCH);
            if complete {
                return Written::Over;
            }
            if !frames.is_empty() {
                break (frames, ends);
            }
            self.queue.wake.notified().await;
            // Let the frames a step pushes at once go in one write.
            tokio::task::yield_now().await;
        };
        let last = frames.last().map_or(0, |f| f.id);
        if !self.unstorable {
            let loan = self.barrier.lend().await;
            if !loan.complete() {
                tracing::warn!("storing the run's events failed; its frames wait");
                return Written::Failed;
            }
            let written = self
                .store
                .append_events_and_frames(loan.records(), &self.batch(&frames, ends))
                .await;
            loan.settle(written.is_ok());
            match written {
                Ok(_) => {}
                Err(subflow_store::Error::LeaseLost(_)) => {
                    tracing::warn!(run_id = %self.hub.run_id, "another process recovered the run; it stops here");
                    self.queue.close();
                    self.hub.lease_lost();
                    self.fence.cancel.cancel();
                    return Written::Over;
                }
                Err(error) if error.is_invalid_input() => {
                    // The run was deleted, or a bug made the frames unacceptable: retrying
                    // cannot help, and watchers here still get them.
                    tracing::error!(%error, "the run's stream frames cannot be stored; its log stops here");
                    self.unstorable = true;
                }
                Err(error) => {
                    tracing::warn!(%error, "storing stream frames failed");
                    return Written::Failed;
                }
            }
        }
        self.queue.done_with(last);
        self.hub.publish(&frames, ends);
        if ends { Written::Over } else { Written::Done }
    }

    /// The store batch of `frames`, written under the fence's lease.
    fn batch(&self, frames: &[Arc<Frame>], ends: bool) -> FrameBatch {
        FrameBatch {
            run_id: self.hub.run_id.clone(),
            thread_id: self.hub.thread_id.clone(),
            frames: frames
                .iter()
                .map(|f| {
                    let (event, data) = f.stored();
                    StreamFrame {
                        id: f.id as i64,
                        event: event.to_owned(),
                        data: data.to_owned(),
                    }
                })
                .collect(),
            ends,
            lease_owner: Some(self.fence.owner.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::hub::Read;
    use serde_json::Map;
    use subflow_contracts::RunStatus;
    use subflow_contracts::messages::Message;
    use subflow_contracts::task_events::TaskEvent;
    use subflow_store::{MemoryStore, NewRun, NewThread, RunStatusUpdate};

    async fn running_run(store: &dyn Store, owner: &str) {
        store
            .create_thread(NewThread {
                thread_id: "t".into(),
                owner: "u".into(),
                metadata: Map::new(),
            })
            .await
            .unwrap();
        store
            .create_run(NewRun {
                run_id: "r".into(),
                thread_id: "t".into(),
                owner: "u".into(),
                assistant_id: "lead_agent".into(),
                model_name: None,
                trace_id: None,
                metadata: Map::new(),
                multitask_strategy: "reject".into(),
                kwargs: json!({}),
            })
            .await
            .unwrap();
        let running = RunStatusUpdate {
            lease_owner: None,
            status: RunStatus::Running,
            stop_reason: None,
            error: None,
        };
        assert!(store.update_run_status("r", &running).await.unwrap());
        let lease = Duration::from_secs(60);
        assert!(store.acquire_run_lease("r", owner, lease).await.unwrap());
    }

    async fn start(store: Arc<dyn Store>) -> (Persister, JoinHandle<()>, Arc<Hub>, Fence) {
        let hub = Hub::new("r", "t");
        let cancel = CancellationToken::new();
        let fence = |cancel: &CancellationToken| Fence {
            owner: "a".into(),
            cancel: cancel.clone(),
        };
        let (persister, writer) = Persister::start(
            hub.clone(),
            store,
            EventBarrier::default(),
            fence(&cancel),
            tracing::Span::none(),
        )
        .await;
        (persister, writer, hub, fence(&cancel))
    }

    fn published(hub: &Hub) -> Vec<(u64, FrameEvent)> {
        match hub.read_after(0, 100) {
            Read::Frames(frames) => frames.iter().map(|f| (f.id, f.event)).collect(),
            other => panic!("expected frames, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_hub_shows_exactly_the_stored_frames_in_order() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        running_run(&*store, "a").await;
        let (persister, writer, hub, _) = start(store.clone()).await;
        assert_eq!(
            published(&hub),
            [(1, FrameEvent::Metadata)],
            "metadata is stored before the run starts"
        );
        persister.push(FrameEvent::Values, &json!({"n": 1}));
        persister.push_stored(
            FrameEvent::Values,
            &json!({"n": 2}),
            ("values:checkpoint", "{}".into()),
        );
        persister.end(Some("boom"));
        writer.await.unwrap();
        persister.push(FrameEvent::Custom, &json!({}));
        let stored: Vec<(u64, String)> = store
            .read_frames("r", 0, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|f| (f.id as u64, f.event))
            .collect();
        let names = ["metadata", "values", "values:checkpoint", "error", "end"];
        let expected: Vec<(u64, String)> = (1..).zip(names.map(String::from)).collect();
        assert_eq!(stored, expected, "nothing after end");
        use FrameEvent::*;
        assert_eq!(
            published(&hub),
            [
                (1, Metadata),
                (2, Values),
                (3, Values),
                (4, Error),
                (5, End)
            ]
        );
        assert!(matches!(hub.read_after(5, 10), Read::Finished));
    }

    #[tokio::test]
    async fn a_task_event_is_framed_as_its_json_value() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        running_run(&*store, "a").await;
        let (persister, writer, _, _) = start(store.clone()).await;
        let event = TaskEvent::Running {
            task_id: "call_1".into(),
            message: Box::new(Message::human("step one")),
            message_index: 1,
            total_messages: 1,
            usage: None,
            model_name: "scripted-1".into(),
        };
        persister.push(FrameEvent::Custom, &event);
        persister.end(None);
        writer.await.unwrap();
        let frames = store.read_frames("r", 0, 100).await.unwrap();
        assert_eq!(frames[1].event, "custom");
        assert_eq!(frames[1].data, event.to_value().to_string());
        assert!(
            frames[1]
                .data
                .starts_with(r#"{"type":"task_running","task_id":"call_1","message":{"#),
            "fields in the documented order: {}",
            frames[1].data
        );
    }

    #[tokio::test]
    async fn a_lost_lease_stops_the_run_and_publishes_nothing_more() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        running_run(&*store, "a").await;
        let (persister, writer, hub, fence) = start(store.clone()).await;
        assert!(store.release_run_lease("r", "a").await.unwrap());
        let lease = Duration::from_secs(60);
        assert!(store.acquire_run_lease("r", "b", lease).await.unwrap());
        persister.push(FrameEvent::Values, &json!({}));
        writer.await.unwrap();
        assert!(fence.cancel.is_cancelled(), "the run is cancelled here");
        assert_eq!(published(&hub), [(1, FrameEvent::Metadata)]);
        assert!(matches!(hub.read_after(1, 10), Read::LeaseLost));
        persister.end(None);
        assert_eq!(store.read_frames("r", 0, 100).await.unwrap().len(), 1);
    }
}
