//! Following a run's stream from a cursor (docs/api.md#resume-and-rejoin): the frames after it, once each and
//! in order, then live frames until `end`. A run executing here is read from its hub
//! (and from the store for whatever already left the hub's window); any other run from
//! the store, woken by the store's notices and re-read every second regardless.
//!
//! A cursor whose following frames were pruned gets one `gap` frame and the stream
//! closes; a rejoin without a cursor on a terminal run whose log was pruned gets a lone
//! `end`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use subflow_contracts::api::StreamMode;
use subflow_store::{Store, StreamNotice};
use tokio::sync::{broadcast, watch};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::hub::{FrameEvent, Hub, Read};
use super::{POLL, Streams, stored};
use crate::sse;
use crate::{ActiveRuns, ApiError};

/// Frames read per step.
const PAGE: u32 = 256;

/// How long a watcher waits before re-reading after a failed store read.
const READ_RETRY: Duration = Duration::from_secs(1);

/// What a watcher of this process gets once the process lost the run's lease: `error`
/// (`lease_lost`) and `end`, without ids, since the store holds other frames under the
/// ids this process would have used; a rejoin reads what the log holds.
const LEASE_LOST: &[u8] = b"event: error\ndata: {\"error\":\"lease_lost\",\"name\":\"LeaseLost\",\"message\":\"Another process recovered this run; rejoin to read its stored end\"}\n\nevent: end\ndata: null\n\n";

/// One frame of a run stream as an SSE client reads it (docs/api.md#sse-frames): the schema of each
/// `text/event-stream` event in the OpenAPI document. The hub writes frames as text
/// (`sse::frame_text`); this type only describes them.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)]
pub(crate) struct RunFrame {
    /// What the frame carries.
    event: FrameEvent,
    /// JSON text: `{run_id, thread_id}` for metadata, the mode's payload (a
    /// `[message, metadata]` pair for messages), `{message, name}` for error, `{code,
    /// message}` for gap, `null` for end.
    #[schema(content_media_type = "application/json")]
    data: String,
    /// The frame id, 1, 2, 3, … in the run's log; `gap` and a lone `end` of a pruned log
    /// have none.
    #[schema(pattern = "^[0-9]+$")]
    id: Option<String>,
}

/// Frames every watcher gets whatever modes it asked for.
const ALWAYS: [&str; 3] = ["metadata", "error", "end"];

/// The query of `GET …/runs/{run_id}/stream`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct RejoinParams {
    /// The frames (by event name) the watcher wants; `None` for all of them.
    pub events: Option<Vec<&'static str>>,
    /// Whether losing this watcher cancels the run.
    pub cancel_on_disconnect: bool,
}

impl RejoinParams {
    /// Reads `stream_mode` (repeated, or comma-separated) and `cancel_on_disconnect`
    /// (`true`/`false`/`1`/`0`); unknown or empty modes and non-boolean flags are 422. Other keys
    /// the SDKs send on a rejoin (`namespace`, `checkpoint_id`) are ignored, as LangGraph
    /// servers ignore them for a run without subgraphs.
    pub fn parse(query: Option<&str>) -> Result<Self, ApiError> {
        let mut params = RejoinParams::default();
        let mut modes: Vec<&str> = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "stream_mode" | "stream_mode[]" => {
                    modes.extend(value.split(','));
                }
                "cancel_on_disconnect" => {
                    params.cancel_on_disconnect =
                        crate::extract::parse_value("cancel_on_disconnect", value)?;
                }
                _ => {}
            }
        }
        if modes.is_empty() {
            return Ok(params);
        }
        let modes = super::parse_stream_modes(modes)?;
        params.events = Some(
            StreamMode::ALL
                .iter()
                .filter(|mode| modes.contains(mode))
                .map(|mode| mode.event())
                .collect(),
        );
        Ok(params)
    }
}

/// The `Last-Event-ID` header as a cursor: absent, or `-1` (what the LangGraph SDKs send
/// to replay a run from its start, docs/api.md#resume-and-rejoin), is `None`; anything but a decimal id is 422.
pub(crate) fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("").trim();
    if text == "-1" {
        return Ok(None);
    }
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // An id too large for u64 is well formed and past the end of every stream.
        return Ok(Some(text.parse::<u64>().unwrap_or(u64::MAX)));
    }
    Err(ApiError::Unprocessable(format!(
        "Invalid Last-Event-ID header: expected a non-negative integer event id or -1, got '{}'",
        String::from_utf8_lossy(value.as_bytes())
    )))
}

/// Refuses a cursor past the end of a run's stream (409, a conflict with the stream's
/// state rather than a malformed header): one no frame of the run ever had. Every id a
/// client received names a stored frame (commit before send), so the hub of a run
/// executing here, else the log, holds it at once.
pub(crate) async fn check_cursor(
    streams: &Streams,
    store: &dyn Store,
    run_id: &str,
    cursor: u64,
) -> Result<(), ApiError> {
    let last_id = match streams.hub(run_id) {
        Some(hub) => hub.last_id(),
        None => match store.stream_log(run_id).await? {
            Some(log) => u64::try_from(log.last_id).unwrap_or(0),
            // A run that ended before logs existed: the follower decides.
            None => return Ok(()),
        },
    };
    if cursor <= last_id {
        Ok(())
    } else {
        Err(ApiError::Conflict(format!(
            "Invalid Last-Event-ID header: event id {cursor} is past the end of the run's stream (its last event id is {last_id})"
        )))
    }
}

/// Waits for a notice about `run_id` (or one asking everyone to re-read), at most `limit`.
pub(crate) async fn wait_for_notice(
    notices: &mut broadcast::Receiver<StreamNotice>,
    run_id: &str,
    limit: Duration,
) {
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => return,
            notice = notices.recv() => match notice {
                Ok(StreamNotice::Appended { run_id: id, .. }) if id == run_id => return,
                Ok(StreamNotice::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Closed) => {
                    deadline.as_mut().await;
                    return;
                }
            },
        }
    }
}

enum Source {
    Hub(Arc<Hub>, watch::Receiver<u64>),
    Store,
}

/// What a follower does next.
#[derive(Debug)]
pub(crate) enum Step {
    /// Send these bytes.
    Send(Bytes),
    /// The stream is over.
    Close,
}

/// One watcher of one run, at a cursor.
pub(crate) struct Follow {
    streams: Streams,
    store: Arc<dyn Store>,
    thread_id: String,
    run_id: String,
    source: Source,
    notices: broadcast::Receiver<StreamNotice>,
    cursor: u64,
    /// The cursor the client gave.
    requested: Option<u64>,
    sent_any: bool,
    events: Option<Vec<&'static str>>,
    finished: bool,
}

impl std::fmt::Debug for Follow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follow")
            .field("run_id", &self.run_id)
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

impl Follow {
    /// A watcher of `run_id` (of `thread_id`) after `cursor`, wanting `events` (all when
    /// `None`).
    pub fn new(
        streams: &Streams,
        store: Arc<dyn Store>,
        thread_id: &str,
        run_id: &str,
        cursor: Option<u64>,
        events: Option<Vec<&'static str>>,
    ) -> Self {
        // Subscribe before the first read, so no notice falls between the two.
        let notices = streams.notices();
        let source = match streams.hub(run_id) {
            Some(hub) => {
                let changes = hub.subscribe();
                Source::Hub(hub, changes)
            }
            None => Source::Store,
        };
        Follow {
            streams: streams.clone(),
            store,
            thread_id: thread_id.to_owned(),
            run_id: run_id.to_owned(),
            source,
            notices,
            cursor: cursor.unwrap_or(0),
            requested: cursor,
            sent_any: false,
            events,
            finished: false,
        }
    }

    /// Whether the stream has delivered its `end` (or closed).
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The next bytes to send, or the end of the stream. Cancel-safe: the cursor only
    /// moves when bytes are returned.
    pub async fn next(&mut self) -> Step {
        if self.finished {
            return Step::Close;
        }
        loop {
            let result = match self.source {
                Source::Hub(..) => self.read_hub().await,
                Source::Store => self.read_store().await,
            };
            match result {
                Ok(Some(step)) => return step,
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, run_id = %self.run_id, "reading the run's stream failed; retrying");
                    tokio::time::sleep(READ_RETRY).await;
                }
            }
        }
    }

    fn wants(&self, event: &str) -> bool {
        self.events
            .as_ref()
            .is_none_or(|events| ALWAYS.contains(&event) || events.contains(&event))
    }

    /// Moves the cursor over `frames` (id, whether it is the `end`, the bytes to send if
    /// wanted) and returns the bytes; `None` when none was sent and the stream goes on.
    /// A lone frame goes out as the bytes every watcher shares; several are joined.
    fn deliver(&mut self, frames: Vec<(u64, bool, Option<Bytes>)>) -> Option<Step> {
        let mut out: Vec<Bytes> = Vec::new();
        for (id, end, bytes) in frames {
            self.cursor = id;
            out.extend(bytes);
            if end {
                self.finished = true;
                break;
            }
        }
        let bytes = match out.len() {
            0 => return self.finished.then_some(Step::Close),
            1 => out.pop().unwrap_or_default(),
            _ => Bytes::from(out.concat()),
        };
        self.sent_any = true;
        Some(Step::Send(bytes))
    }

    /// Up to `limit` stored frames after the cursor, as they were sent live.
    async fn read_stored(&self, limit: u32) -> Result<Vec<stored::Resolved>, subflow_store::Error> {
        let frames = self
            .store
            .read_frames(&self.run_id, self.cursor as i64, limit)
            .await?;
        stored::resolve(&*self.store, &self.thread_id, frames, |event| {
            self.wants(event)
        })
        .await
    }

    fn deliver_stored(&mut self, frames: Vec<stored::Resolved>) -> Option<Step> {
        let frames = frames
            .into_iter()
            .map(|f| (f.id, f.event == "end", f.sse))
            .collect();
        self.deliver(frames)
    }

    fn close_with(&mut self, bytes: Bytes) -> Option<Step> {
        self.finished = true;
        self.sent_any = true;
        Some(Step::Send(bytes))
    }

    async fn read_hub(&mut self) -> Result<Option<Step>, subflow_store::Error> {
        let read = {
            let Source::Hub(hub, changes) = &mut self.source else {
                return Ok(None);
            };
            changes.borrow_and_update();
            hub.read_after(self.cursor, PAGE as usize)
        };
        match read {
            Read::Frames(frames) => {
                let frames = frames
                    .iter()
                    .map(|f| {
                        let bytes = self.wants(f.event.as_str()).then(|| f.sse.clone());
                        (f.id, f.event == FrameEvent::End, bytes)
                    })
                    .collect();
                Ok(self.deliver(frames))
            }
            Read::Behind { before } => {
                let wanted = u32::try_from(before - 1 - self.cursor).unwrap_or(PAGE);
                let frames = self.read_stored(wanted.clamp(1, PAGE)).await?;
                if frames.is_empty() {
                    // The log went away under the hub (the run was deleted).
                    self.source = Source::Store;
                    return Ok(None);
                }
                Ok(self.deliver_stored(frames))
            }
            Read::Finished => {
                self.finished = true;
                Ok(Some(Step::Close))
            }
            Read::LeaseLost => Ok(self.close_with(Bytes::from_static(LEASE_LOST))),
            Read::Pending => {
                let Source::Hub(_, changes) = &mut self.source else {
                    return Ok(None);
                };
                if changes.changed().await.is_err() {
                    self.source = Source::Store;
                }
                Ok(None)
            }
        }
    }

    async fn read_store(&mut self) -> Result<Option<Step>, subflow_store::Error> {
        if let Some(hub) = self.streams.hub(&self.run_id) {
            let changes = hub.subscribe();
            self.source = Source::Hub(hub, changes);
            return Ok(None);
        }
        let frames = self.read_stored(PAGE).await?;
        if !frames.is_empty() {
            return Ok(self.deliver_stored(frames));
        }
        let log = self.store.stream_log(&self.run_id).await?;
        if log.as_ref().is_some_and(|log| log.ended) {
            // The last frames may have been committed between the two reads; once the log
            // has ended, a read finds all of them.
            let frames = self.read_stored(PAGE).await?;
            if !frames.is_empty() {
                return Ok(self.deliver_stored(frames));
            }
        }
        if let Some(log) = &log {
            let last_id = u64::try_from(log.last_id).unwrap_or(0);
            if log.pruned && self.cursor < last_id {
                if self.requested.is_none() && !self.sent_any {
                    return Ok(self.close_with(sse::frame_text("end", "null", last_id)));
                }
                let gap = json!({
                    "code": "stream_replay_gap",
                    "run_id": self.run_id,
                    "requested_event_id": self.cursor,
                    "earliest_available_event_id": log.earliest_id,
                    "latest_available_event_id": log.latest_id,
                    "recovery": "reload_durable_state",
                });
                return Ok(self.close_with(sse::frame_without_id(FrameEvent::Gap.as_str(), &gap)));
            }
            if log.ended {
                self.finished = true;
                return Ok(Some(Step::Close));
            }
        }
        let run = self.store.get_run(&self.thread_id, &self.run_id).await?;
        match run {
            None => {
                self.finished = true;
                return Ok(Some(Step::Close));
            }
            Some(run) if log.is_none() && !run.status.is_active() => {
                // A run that never logged a frame (`launch` stores `metadata` before the
                // run starts): it ended before stream logs existed.
                if self.requested.is_none() && !self.sent_any {
                    return Ok(self.close_with(sse::frame_without_id(
                        FrameEvent::End.as_str(),
                        &Value::Null,
                    )));
                }
                self.finished = true;
                return Ok(Some(Step::Close));
            }
            Some(_) => {}
        }
        wait_for_notice(&mut self.notices, &self.run_id, POLL).await;
        Ok(None)
    }
}

/// What losing a watcher does to its run.
#[derive(Debug)]
pub(crate) enum OnDisconnect {
    /// Nothing.
    Continue,
    /// Cancel through the run's own token (the creating request).
    Token(CancellationToken),
    /// Cancel wherever the run executes (a rejoin with `cancel_on_disconnect=true`).
    Run {
        /// Runs executing here.
        active: ActiveRuns,
        /// For a remote cancel request.
        store: Arc<dyn Store>,
        /// The run.
        run_id: String,
    },
}

/// Fires [`OnDisconnect`] when the response body is dropped before the stream ended.
#[derive(Debug)]
struct DisconnectGuard(Option<OnDisconnect>);

impl DisconnectGuard {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for DisconnectGuard {
    fn drop(&mut self) {
        match self.0.take() {
            None | Some(OnDisconnect::Continue) => {}
            Some(OnDisconnect::Token(token)) => token.cancel(),
            Some(OnDisconnect::Run {
                active,
                store,
                run_id,
            }) => {
                if let Some(run) = active.get(&run_id) {
                    run.cancel.cancel();
                } else if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        if let Err(error) = store.request_cancel(&run_id).await {
                            tracing::error!(%error, run_id, "storing the cancel request failed");
                        }
                    });
                }
            }
        }
    }
}

struct BodyState<K> {
    follow: Follow,
    heartbeat: tokio::time::Interval,
    guard: DisconnectGuard,
    _keep: K,
}

/// The SSE response of a follower: its frames, `: heartbeat` every `heartbeat` while it
/// waits, and `on_disconnect` applied if the client goes before the stream ends. `keep`
/// lives as long as the body (e.g. an open-stream gauge).
pub(crate) fn sse_response(
    follow: Follow,
    heartbeat: Duration,
    on_disconnect: OnDisconnect,
    keep: impl Send + 'static,
) -> Response {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let state = BodyState {
        follow,
        heartbeat: ticks,
        guard: DisconnectGuard(Some(on_disconnect)),
        _keep: keep,
    };
    let frames = futures::stream::unfold(state, |mut state| async move {
        let bytes = tokio::select! {
            step = state.follow.next() => match step {
                Step::Send(bytes) => bytes,
                Step::Close => {
                    state.guard.disarm();
                    return None;
                }
            },
            _ = state.heartbeat.tick() => Bytes::from_static(sse::HEARTBEAT),
        };
        if state.follow.is_finished() {
            state.guard.disarm();
        }
        Some((Ok::<_, Infallible>(bytes), state))
    });
    (
        // `no-transform` and `X-Accel-Buffering: no` keep a compressing or buffering proxy
        // (Next.js rewrites, nginx) from holding frames back until the run ends.
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache, no-transform"),
            (HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        Body::from_stream(frames),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejoin_queries_name_modes_repeated_or_comma_separated() {
        assert_eq!(RejoinParams::parse(None).unwrap(), RejoinParams::default());
        let params =
            RejoinParams::parse(Some("stream_mode=custom&stream_mode=values,messages-tuple"))
                .unwrap();
        assert_eq!(params.events, Some(vec!["values", "messages", "custom"]));
        assert!(!params.cancel_on_disconnect);
        let params = RejoinParams::parse(Some("cancel_on_disconnect=true&x=1")).unwrap();
        assert!(params.cancel_on_disconnect);
        assert_eq!(params.events, None);
        // What `joinStream` of the JS SDK sends.
        let params = RejoinParams::parse(Some(
            "cancel_on_disconnect=0&stream_mode=messages-tuple&stream_mode=updates&stream_mode=custom&namespace=tools&checkpoint_id=1f0a-2b",
        ))
        .unwrap();
        assert!(!params.cancel_on_disconnect);
        assert_eq!(params.events, Some(vec!["messages", "updates", "custom"]));
        assert!(
            RejoinParams::parse(Some("cancel_on_disconnect=1"))
                .unwrap()
                .cancel_on_disconnect
        );
        let Err(ApiError::Unprocessable(detail)) = RejoinParams::parse(Some("stream_mode=debug"))
        else {
            panic!("422")
        };
        assert_eq!(detail, "Unsupported stream mode(s): debug");
        for query in ["stream_mode=", "stream_mode=values,"] {
            let Err(ApiError::Unprocessable(detail)) = RejoinParams::parse(Some(query)) else {
                panic!("an empty mode in {query} is 422")
            };
            assert_eq!(detail, "Unsupported stream mode(s): ''");
        }
        assert!(RejoinParams::parse(Some("cancel_on_disconnect=maybe")).is_err());
        assert!(
            RejoinParams::parse(Some("cancel_on_disconnect=")).is_err(),
            "an empty flag is no boolean"
        );
    }

    #[test]
    fn last_event_ids_are_decimal_or_a_422() {
        let mut headers = HeaderMap::new();
        assert_eq!(last_event_id(&headers).unwrap(), None);
        headers.insert("last-event-id", " 42 ".parse().unwrap());
        assert_eq!(last_event_id(&headers).unwrap(), Some(42));
        headers.insert("last-event-id", "-1".parse().unwrap());
        assert_eq!(
            last_event_id(&headers).unwrap(),
            None,
            "-1 is from the start"
        );
        headers.insert("last-event-id", "99999999999999999999999".parse().unwrap());
        assert_eq!(last_event_id(&headers).unwrap(), Some(u64::MAX));
        for bad in ["abc", "-2", "- 1", "4.2", ""] {
            headers.insert("last-event-id", bad.parse().unwrap());
            assert!(
                matches!(last_event_id(&headers), Err(ApiError::Unprocessable(_))),
                "{bad:?}"
            );
        }
    }
}
