//! The process-local hub of one executing run: the frames it produced, numbered here,
//! held until they are persisted and a little longer, so watchers in this process
//! follow the run without polling the store.
//!
//! Ids are assigned under the hub's lock, 1, 2, 3, … with no gaps. Watchers see a frame
//! only once it is persisted (commit before send), so an id a client holds names a
//! stored frame, and a process that recovers the run after a crash numbers its frames
//! after every one a client can have seen. Only persisted frames leave the window, so a
//! watcher that falls behind it finds every missing frame in the store.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use serde_json::Value;
use tokio::sync::watch;

use crate::sse;

/// Persisted frames kept for watchers beyond the unpersisted ones, by count …
const WINDOW_FRAMES: usize = 512;
/// … and by bytes: `values` frames carry the whole conversation.
const WINDOW_BYTES: usize = 8 * 1024 * 1024;

/// One numbered frame, kept as JSON text for the store and as SSE bytes for clients.
#[derive(Debug)]
pub struct Frame {
    /// The SSE id.
    pub id: u64,
    /// The SSE event name.
    pub event: String,
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
    pub fn new(id: u64, event: &str, data: String) -> Self {
        Frame {
            id,
            sse: sse::frame_text(event, &data, id),
            event: event.to_owned(),
            data,
            stored: None,
        }
    }

    /// The event and data the durable log stores for this frame.
    pub fn stored(&self) -> (&str, &str) {
        match &self.stored {
            Some((event, data)) => (event, data),
            None => (&self.event, &self.data),
        }
    }
}

/// What a watcher at a cursor finds in the hub.
#[derive(Debug)]
pub enum Read {
    /// The next frames after the cursor, in order.
    Frames(Vec<Arc<Frame>>),
    /// The frames after the cursor left the window; they are persisted up to `before`
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
    persisted: u64,
    /// The final frame was pushed.
    finished: bool,
    /// The store refused the frames for good (the run was deleted): watchers here are
    /// shown them unpersisted, since no store will ever hold them.
    unstorable: bool,
    /// Another process recovered the run: frames after `persisted` are never shown.
    lease_lost: bool,
}

impl State {
    /// The last id watchers may see.
    fn visible(&self) -> u64 {
        if self.unstorable {
            self.last_id
        } else {
            self.persisted.min(self.last_id)
        }
    }

    fn first_id(&self) -> u64 {
        self.window.front().map_or(self.last_id + 1, |f| f.id)
    }

    fn evict(&mut self) {
        while let Some(front) = self.window.front() {
            let over = self.window.len() > WINDOW_FRAMES || self.window_bytes > WINDOW_BYTES;
            if front.id > self.persisted || !over {
                break;
            }
            self.window_bytes -= front.sse.len();
            self.window.pop_front();
        }
    }
}

/// The hub of one run.
#[derive(Debug)]
pub struct Hub {
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

    /// Numbers a frame for the persister, which makes it visible to watchers once it is
    /// stored; `last` marks the final frame. Frames after the final one are dropped.
    pub fn push(&self, event: &str, data: &Value, last: bool) {
        self.push_stored(event, data, None, last);
    }

    /// [`Hub::push`] of a frame the durable log stores as `stored` (event, data).
    pub fn push_stored(
        &self,
        event: &str,
        data: &Value,
        stored: Option<(&'static str, String)>,
        last: bool,
    ) {
        let mut state = self.lock();
        if state.finished {
            return;
        }
        let mut frame = Frame::new(state.last_id + 1, event, data.to_string());
        frame.stored = stored;
        let frame = Arc::new(frame);
        state.last_id = frame.id;
        state.window_bytes += frame.sse.len();
        state.window.push_back(frame);
        state.finished = last;
        drop(state);
        self.changed.send_modify(|version| *version += 1);
    }

    /// A receiver that changes whenever a frame is pushed or frames become visible.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Up to `limit` visible (persisted) frames after `cursor`.
    pub fn read_after(&self, cursor: u64, limit: usize) -> Read {
        let state = self.lock();
        let visible = state.visible();
        if state.lease_lost && cursor >= visible {
            return Read::LeaseLost;
        }
        if cursor >= state.last_id && state.finished {
            return Read::Finished;
        }
        if cursor >= visible {
            return Read::Pending;
        }
        let first = state.first_id();
        if cursor + 1 < first {
            return Read::Behind { before: first };
        }
        let start = (cursor + 1 - first) as usize;
        let count = limit.min((visible - cursor) as usize);
        Read::Frames(state.window.range(start..).take(count).cloned().collect())
    }

    /// Up to `limit` frames not yet persisted, and whether they end the log.
    pub fn unpersisted(&self, limit: usize) -> (Vec<Arc<Frame>>, bool) {
        let state = self.lock();
        let first = state.first_id();
        let start = (state.persisted + 1).saturating_sub(first) as usize;
        let frames: Vec<Arc<Frame>> = state.window.range(start..).take(limit).cloned().collect();
        let ends = state.finished && frames.last().is_some_and(|f| f.id == state.last_id);
        (frames, ends)
    }

    /// Records that frames up to `id` are in the store, which shows them to watchers.
    pub fn persisted(&self, id: u64) {
        let mut state = self.lock();
        state.persisted = state.persisted.max(id);
        state.evict();
        drop(state);
        self.changed.send_modify(|version| *version += 1);
    }

    /// Shows every frame, now and later, to watchers unpersisted: the store refused them
    /// for good.
    pub fn unstorable(&self) {
        self.lock().unstorable = true;
        self.changed.send_modify(|version| *version += 1);
    }

    /// Another process recovered the run: nothing more is pushed, and watchers past the
    /// stored frames are told the lease was lost.
    pub fn lease_lost(&self) {
        let mut state = self.lock();
        state.lease_lost = true;
        state.finished = true;
        drop(state);
        self.changed.send_modify(|version| *version += 1);
    }

    /// The id of the latest frame pushed (0 before the first).
    pub fn last_id(&self) -> u64 {
        self.lock().last_id
    }

    /// Whether the final frame was pushed and everything is persisted.
    pub fn is_flushed(&self) -> bool {
        let state = self.lock();
        state.finished && state.persisted == state.last_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ids(read: Read) -> Vec<u64> {
        match read {
            Read::Frames(frames) => frames.iter().map(|f| f.id).collect(),
            other => panic!("expected frames, got {other:?}"),
        }
    }

    #[test]
    fn frames_are_numbered_contiguously_and_read_by_cursor() {
        let hub = Hub::new("r", "t");
        hub.unstorable();
        assert!(matches!(hub.read_after(0, 10), Read::Pending));
        for n in 0..5 {
            hub.push("values", &json!({"n": n}), false);
        }
        assert_eq!(ids(hub.read_after(0, 10)), [1, 2, 3, 4, 5]);
        assert_eq!(ids(hub.read_after(2, 2)), [3, 4]);
        assert!(matches!(hub.read_after(5, 10), Read::Pending));
        hub.push("end", &Value::Null, true);
        hub.push("values", &json!({}), false);
        assert_eq!(
            ids(hub.read_after(5, 10)),
            [6],
            "nothing after the final frame"
        );
        assert!(matches!(hub.read_after(6, 10), Read::Finished));
        let Read::Frames(frames) = hub.read_after(5, 1) else {
            panic!("frames")
        };
        assert_eq!(&frames[0].sse[..], b"event: end\ndata: null\nid: 6\n\n");
    }

    #[test]
    fn watchers_see_a_frame_only_once_it_is_persisted() {
        let hub = Hub::new("r", "t");
        let mut changes = hub.subscribe();
        for _ in 0..3 {
            hub.push("custom", &json!({}), false);
        }
        assert!(matches!(hub.read_after(0, 10), Read::Pending));
        changes.borrow_and_update();
        hub.persisted(2);
        assert!(changes.has_changed().unwrap(), "watchers are woken");
        assert_eq!(ids(hub.read_after(0, 10)), [1, 2]);
        assert!(matches!(hub.read_after(2, 10), Read::Pending));
        hub.push("end", &Value::Null, true);
        assert!(
            matches!(hub.read_after(2, 10), Read::Pending),
            "the final frame is not shown before it is stored"
        );
        hub.persisted(4);
        assert_eq!(ids(hub.read_after(2, 10)), [3, 4]);
        assert!(matches!(hub.read_after(4, 10), Read::Finished));
    }

    #[test]
    fn only_persisted_frames_leave_the_window() {
        let hub = Hub::new("r", "t");
        let total = WINDOW_FRAMES as u64 + 100;
        for _ in 0..total {
            hub.push("custom", &json!({}), false);
        }
        assert!(
            matches!(hub.read_after(0, 1), Read::Pending),
            "nothing persisted: nothing shown, nothing evicted"
        );
        assert_eq!(hub.unpersisted(1).0[0].id, 1);
        let (batch, ends) = hub.unpersisted(50);
        assert_eq!(batch.len(), 50);
        assert!(!ends);
        hub.persisted(150);
        assert!(matches!(hub.read_after(0, 1), Read::Behind { before: 101 }));
        assert_eq!(ids(hub.read_after(100, 1)), [101]);
        let (batch, _) = hub.unpersisted(1);
        assert_eq!(batch[0].id, 151);
        hub.push("end", &Value::Null, true);
        let (batch, ends) = hub.unpersisted(10_000);
        assert_eq!(batch.last().unwrap().id, total + 1);
        assert!(ends);
        assert!(!hub.is_flushed());
        hub.persisted(total + 1);
        assert!(hub.is_flushed());
        assert!(matches!(hub.read_after(0, 1), Read::Behind { .. }));
    }

    #[test]
    fn a_lost_lease_shows_the_stored_frames_then_says_so_and_takes_no_more() {
        let hub = Hub::new("r", "t");
        for n in 0..4 {
            hub.push("values", &json!({"n": n}), false);
        }
        hub.persisted(2);
        hub.lease_lost();
        hub.push("end", &Value::Null, true);
        assert_eq!(hub.last_id(), 4, "nothing is pushed after the loss");
        assert_eq!(ids(hub.read_after(0, 10)), [1, 2]);
        assert!(matches!(hub.read_after(2, 10), Read::LeaseLost));
        assert!(!hub.is_flushed());
    }
}
