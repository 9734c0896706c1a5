//! The process-local hub of one executing run: the frames its persister stored, held a
//! little longer so watchers in this process follow the run without polling the store.
//!
//! The hub holds only stored frames (commit before send): the persister
//! ([`super::persister`]) numbers a run's frames, stores them under the run's lease and
//! then publishes them here, in id order, once each. An id a client holds therefore
//! names a frame the log holds, and a watcher that falls behind the window finds every
//! missing frame in the store.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use tokio::sync::watch;

use crate::sse;

/// Frames kept for watchers, by count …
const WINDOW_FRAMES: usize = 512;
/// … and by bytes: `values` frames carry the whole conversation.
const WINDOW_BYTES: usize = 8 * 1024 * 1024;

/// The `event` of a run stream frame (docs/api.md#sse-frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq, utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
pub(crate) enum FrameEvent {
    /// The first frame: `{run_id, thread_id}`.
    Metadata,
    /// The thread's state after a step (`values` mode).
    Values,
    /// A `[message, metadata]` pair (`messages-tuple` mode).
    Messages,
    /// A node's update (`updates` mode).
    Updates,
    /// A custom payload, task events among them (`custom` mode).
    Custom,
    /// The run failed: `{message, name}`.
    Error,
    /// The last frame.
    End,
    /// Frames a pruned log no longer holds (sent without an id).
    Gap,
}

impl FrameEvent {
    /// The SSE event name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FrameEvent::Metadata => "metadata",
            FrameEvent::Values => "values",
            FrameEvent::Messages => "messages",
            FrameEvent::Updates => "updates",
            FrameEvent::Custom => "custom",
            FrameEvent::Error => "error",
            FrameEvent::End => "end",
            FrameEvent::Gap => "gap",
        }
    }
}

/// One numbered frame, kept as JSON text for the store and as SSE bytes for clients.
#[derive(Debug)]
pub(crate) struct Frame {
    /// The SSE id.
    pub id: u64,
    /// The SSE event.
    pub event: FrameEvent,
    /// JSON text.
    pub data: String,
    /// The encoded frame.
    pub sse: Bytes,
    /// What the durable log stores instead of `event` and `data`, when not the frame
    /// itself (a `values` frame kept as a checkpoint reference, `stored`).
    pub stored: Option<(&'static str, String)>,
}

impl Frame {
    /// A frame as stored and as sent.
    pub fn new(id: u64, event: FrameEvent, data: String) -> Self {
        Frame {
            id,
            sse: sse::frame_text(event.as_str(), &data, id),
            event,
            data,
            stored: None,
        }
    }

    /// The event and data the durable log stores for this frame.
    pub fn stored(&self) -> (&str, &str) {
        match &self.stored {
            Some((event, data)) => (event, data),
            None => (self.event.as_str(), &self.data),
        }
    }
}

/// What a watcher at a cursor finds in the hub.
#[derive(Debug)]
pub(crate) enum Read {
    /// The next frames after the cursor, in order.
    Frames(Vec<Arc<Frame>>),
    /// The frames after the cursor left the window; they are stored up to `before`
    /// (exclusive), so read them from the store.
    Behind {
        /// The first id still in the window.
        before: u64,
    },
    /// Nothing after the cursor and nothing more will come.
    Finished,
    /// Every stored frame after the cursor was read, and this process lost the run's
    /// lease: the rest of its frames will never be stored.
    LeaseLost,
    /// Nothing after the cursor yet.
    Pending,
}

#[derive(Debug, Default)]
struct State {
    window: VecDeque<Arc<Frame>>,
    window_bytes: usize,
    last_id: u64,
    /// The final frame was published.
    finished: bool,
    /// Another process recovered the run: nothing more is published.
    lease_lost: bool,
}

impl State {
    fn first_id(&self) -> u64 {
        self.window.front().map_or(self.last_id + 1, |f| f.id)
    }

    fn evict(&mut self) {
        while self.window.len() > WINDOW_FRAMES || self.window_bytes > WINDOW_BYTES {
            let Some(front) = self.window.pop_front() else {
                break;
            };
            self.window_bytes -= front.sse.len();
        }
    }
}

/// The hub of one run.
#[derive(Debug)]
pub(crate) struct Hub {
    /// The run.
    pub run_id: String,
    /// Its thread.
    pub thread_id: String,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

impl Hub {
    /// An empty hub.
    pub fn new(run_id: &str, thread_id: &str) -> Arc<Self> {
        Arc::new(Hub {
            run_id: run_id.to_owned(),
            thread_id: thread_id.to_owned(),
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation is a push, a counter or a pop: nothing is left half-done.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shows `frames` (the next ones in id order, stored) to watchers and wakes them;
    /// `last` says they end the run's log. Nothing is published after the last frame
    /// or a lost lease.
    pub fn publish(&self, frames: &[Arc<Frame>], last: bool) {
        let mut state = self.lock();
        if state.finished {
            return;
        }
        for frame in frames {
            debug_assert_eq!(frame.id, state.last_id + 1, "frames are published in order");
            state.last_id = frame.id;
            state.window_bytes += frame.sse.len();
            state.window.push_back(frame.clone());
        }
        state.finished = last;
        state.evict();
        drop(state);
        self.changed.send_modify(|version| *version += 1);
    }

    /// A receiver that changes whenever frames are published or the lease is lost.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Up to `limit` published frames after `cursor`.
    pub fn read_after(&self, cursor: u64, limit: usize) -> Read {
        let state = self.lock();
        if cursor >= state.last_id {
            return if state.lease_lost {
                Read::LeaseLost
            } else if state.finished {
                Read::Finished
            } else {
                Read::Pending
            };
        }
        let first = state.first_id();
        if cursor + 1 < first {
            return Read::Behind { before: first };
        }
        let start = (cursor + 1 - first) as usize;
        Read::Frames(state.window.range(start..).take(limit).cloned().collect())
    }

    /// Another process recovered the run: nothing more is published, and watchers past
    /// the stored frames are told the lease was lost.
    pub fn lease_lost(&self) {
        let mut state = self.lock();
        state.lease_lost = true;
        state.finished = true;
        drop(state);
        self.changed.send_modify(|version| *version += 1);
    }

    /// The id of the latest frame published (0 before the first).
    pub fn last_id(&self) -> u64 {
        self.lock().last_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(read: Read) -> Vec<u64> {
        match read {
            Read::Frames(frames) => frames.iter().map(|f| f.id).collect(),
            other => panic!("expected frames, got {other:?}"),
        }
    }

    fn frames(ids: std::ops::RangeInclusive<u64>, event: FrameEvent) -> Vec<Arc<Frame>> {
        ids.map(|id| Arc::new(Frame::new(id, event, "null".to_owned())))
            .collect()
    }

    #[test]
    fn published_frames_are_read_by_cursor_until_the_last() {
        let hub = Hub::new("r", "t");
        let mut changes = hub.subscribe();
        assert!(matches!(hub.read_after(0, 10), Read::Pending));
        changes.borrow_and_update();
        hub.publish(&frames(1..=5, FrameEvent::Values), false);
        assert!(changes.has_changed().unwrap(), "watchers are woken");
        assert_eq!(ids(hub.read_after(0, 10)), [1, 2, 3, 4, 5]);
        assert_eq!(ids(hub.read_after(2, 2)), [3, 4]);
        assert!(matches!(hub.read_after(5, 10), Read::Pending));
        hub.publish(&frames(6..=6, FrameEvent::End), true);
        hub.publish(&frames(7..=7, FrameEvent::Values), false);
        assert_eq!(
            ids(hub.read_after(5, 10)),
            [6],
            "nothing after the last frame"
        );
        assert!(matches!(hub.read_after(6, 10), Read::Finished));
        let Read::Frames(end) = hub.read_after(5, 1) else {
            panic!("frames")
        };
        assert_eq!(&end[0].sse[..], b"event: end\ndata: null\nid: 6\n\n");
    }

    #[test]
    fn a_watcher_behind_the_window_is_sent_to_the_store() {
        let hub = Hub::new("r", "t");
        let total = WINDOW_FRAMES as u64 + 100;
        hub.publish(&frames(1..=total, FrameEvent::Custom), false);
        assert!(matches!(hub.read_after(0, 1), Read::Behind { before: 101 }));
        assert_eq!(ids(hub.read_after(100, 1)), [101]);
        assert_eq!(hub.last_id(), total);
    }

    #[test]
    fn a_lost_lease_shows_the_published_frames_then_says_so_and_takes_no_more() {
        let hub = Hub::new("r", "t");
        hub.publish(&frames(1..=2, FrameEvent::Values), false);
        hub.lease_lost();
        hub.publish(&frames(3..=3, FrameEvent::End), true);
        assert_eq!(hub.last_id(), 2, "nothing is published after the loss");
        assert_eq!(ids(hub.read_after(0, 10)), [1, 2]);
        assert!(matches!(hub.read_after(2, 10), Read::LeaseLost));
    }
}
