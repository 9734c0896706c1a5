//! The durable stream log over HTTP (docs/api.md#resume-and-rejoin, docs/api.md#cancel): resume with `Last-Event-ID`,
//! rejoin, `gap` and the lone `end` after pruning, orphan recovery, and two gateways on
//! one PostgreSQL database streaming and cancelling each other's runs.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use subflow_contracts::{RunStatus, RunStopReason};
use subflow_gateway::stream::StreamConfig;
use subflow_store::{FrameBatch, NewRun, NewThread, RunStatusUpdate, Store, StreamFrame};
use subflow_store_postgres::PostgresStore;
use subflow_store_postgres::testing::TestDb;
use subflow_store_sqlite::SqliteStore;

use crate::{Frame, TestApp, parse_frames};

/// Bounds every wait of these tests, so a broken stream fails instead of hanging.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// A prompt that runs the demo plan: three tasks with two tool steps each.
pub(crate) const DEMO: &str = "Compare three storage engines";

/// A gateway on `store`, its scripted model pacing text by `delay_ms`, with run leases
/// of `lease`. Its spill file and workspaces go in a directory of its own.
pub(crate) async fn gateway_on(store: Arc<dyn Store>, delay_ms: u64, lease: Duration) -> TestApp {
    crate::spawn_app_with(crate::Options {
        delay_ms,
        store: Some(store),
        configure: Box::new(move |app| {
            app.streams = StreamConfig {
                retention: Duration::from_secs(3600),
                lease,
            }
        }),
        ..crate::Options::default()
    })
    .await
}

async fn sqlite_store(dir: &Path) -> SqliteStore {
    let url = format!("sqlite://{}", dir.join("subflow.db").display());
    SqliteStore::open(&url, 4).await.unwrap()
}

pub(crate) async fn sqlite_gateway(delay_ms: u64) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(sqlite_store(dir.path()).await);
    let app = gateway_on(store, delay_ms, Duration::from_secs(30)).await;
    (app, dir)
}

/// A gateway process of its own on a PostgreSQL database: its own pool and runtime.
pub(crate) async fn postgres_gateway(url: &str, delay_ms: u64, lease: Duration) -> TestApp {
    let store: Arc<dyn Store> = Arc::new(PostgresStore::connect(url, 4).await.unwrap());
    gateway_on(store, delay_ms, lease).await
}

/// An SSE response read frame by frame, heartbeats skipped.
pub(crate) struct Sse {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Sse {
    fn new(response: reqwest::Response) -> Self {
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "an event stream"
        );
        Sse {
            response,
            buffer: Vec::new(),
        }
    }

    pub(crate) async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let text = String::from_utf8(block).expect("frames are UTF-8");
                if let Some(frame) = parse_frames(&text).into_iter().next() {
                    return Some(frame);
                }
                continue;
            }
            let chunk = tokio::time::timeout(PATIENCE, self.response.chunk())
                .await
                .expect("the stream goes on or ends")
                .expect("the stream reads");
            match chunk {
                Some(chunk) => self.buffer.extend_from_slice(&chunk),
                None => {
                    assert!(self.buffer.is_empty(), "the stream ended mid-frame");
                    return None;
                }
            }
        }
    }

    async fn take(&mut self, count: usize) -> Vec<Frame> {
        let mut frames = Vec::new();
        while frames.len() < count {
            frames.push(self.next().await.expect("more frames"));
        }
        frames
    }

    pub(crate) async fn rest(mut self) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next().await {
            frames.push(frame);
        }
        frames
    }
}

impl TestApp {
    /// Posts a streamed run and returns its id and the open stream, past `metadata`.
    pub(crate) async fn start_run(&self, thread: &str, body: Value) -> (String, Frame, Sse) {
        let response = self
            .client
            .post(self.url(&format!("/api/threads/{thread}/runs/stream")))
            .json(&body)
            .send()
            .await
            .unwrap();
        let mut sse = Sse::new(response);
        let metadata = sse.next().await.expect("metadata");
        assert_eq!(metadata.event, "metadata");
        let run_id = metadata.data["run_id"].as_str().unwrap().to_owned();
        (run_id, metadata, sse)
    }

    /// `GET …/runs/{run_id}/stream` with an optional `Last-Event-ID` and query.
    async fn rejoin_response(
        &self,
        thread: &str,
        run: &str,
        cursor: Option<&str>,
        query: &str,
    ) -> reqwest::Response {
        let mut request = self
            .client
            .get(self.url(&format!("/api/threads/{thread}/runs/{run}/stream{query}")));
        if let Some(cursor) = cursor {
            request = request.header("Last-Event-ID", cursor);
        }
        request.send().await.unwrap()
    }

    async fn rejoin(&self, thread: &str, run: &str, cursor: Option<&str>) -> Vec<Frame> {
        Sse::new(self.rejoin_response(thread, run, cursor, "").await)
            .rest()
            .await
    }

    pub(crate) async fn run_record(&self, thread: &str, run: &str) -> Value {
        let (status, _, body) = self
            .get_json(&format!("/api/threads/{thread}/runs/{run}"))
            .await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// The run's record once it is no longer active.
    pub(crate) async fn finished_run(&self, thread: &str, run: &str) -> Value {
        let (status, _, _) = tokio::time::timeout(
            PATIENCE,
            self.get_json(&format!("/api/threads/{thread}/runs/{run}/join")),
        )
        .await
        .expect("the run ends");
        assert_eq!(status, 200);
        self.run_record(thread, run).await
    }
}

pub(crate) fn demo_request(modes: &[&str], on_disconnect: &str) -> Value {
    json!({
        "input": {"messages": [{"role": "user", "content": DEMO}]},
        "stream_mode": modes,
        "on_disconnect": on_disconnect,
    })
}

fn ids(frames: &[Frame]) -> Vec<u64> {
    frames
        .iter()
        .map(|f| f.id.as_deref().expect("an id").parse().unwrap())
        .collect()
}

/// Ids `from..` with no gap and no repeat, the last frame `end`.
fn assert_contiguous_to_end(frames: &[Frame], from: u64) {
    let expected: Vec<u64> = (from..from + frames.len() as u64).collect();
    assert_eq!(ids(frames), expected, "contiguous ids, each once");
    assert_eq!(frames.last().map(|f| f.event.as_str()), Some("end"));
    assert_eq!(
        frames.iter().filter(|f| f.event == "end").count(),
        1,
        "one end, last"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_resumes_with_exactly_the_missing_frames_then_live_ones_then_end() {
    let (app, _dir) = sqlite_gateway(40).await;
    let (run_id, metadata, mut sse) = app
        .start_run("t-resume", demo_request(&["custom", "values"], "continue"))
        .await;
    let mut seen = vec![metadata];
    seen.extend(sse.take(4).await);
    drop(sse);
    let cursor = seen.last().unwrap().id.clone().unwrap();
    assert_eq!(cursor, "5");

    let resumed = app.rejoin("t-resume", &run_id, Some(&cursor)).await;
    assert_contiguous_to_end(&resumed, 6);
    let run = app.finished_run("t-resume", &run_id).await;
    assert_eq!(
        run["status"], "success",
        "the creator's drop did not cancel"
    );

    let everything = app.rejoin("t-resume", &run_id, None).await;
    assert_contiguous_to_end(&everything, 1);
    assert_eq!(everything[..5], seen[..], "the same frames the creator saw");
    assert_eq!(
        everything[5..],
        resumed[..],
        "the missing frames, once each"
    );
    assert!(
        resumed.iter().any(|f| f.event == "custom"),
        "task events were still to come"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoin_without_a_cursor_replays_the_log_and_stream_mode_filters_it() {
    let (app, _dir) = sqlite_gateway(0).await;
    let streamed = app
        .stream_run("t-replay", demo_request(&["values", "custom"], "cancel"))
        .await;
    assert_eq!(streamed.status, 200);
    assert_contiguous_to_end(&streamed.frames, 1);
    let run_id = streamed.frames[0].data["run_id"].as_str().unwrap();

    let replayed = app.rejoin("t-replay", run_id, None).await;
    assert_eq!(replayed, streamed.frames, "the same frames, ids and data");

    let response = app
        .rejoin_response("t-replay", run_id, None, "?stream_mode=values")
        .await;
    let values_only = Sse::new(response).rest().await;
    let expected: Vec<Frame> = streamed
        .frames
        .iter()
        .filter(|f| f.event != "custom")
        .cloned()
        .collect();
    assert!(expected.iter().any(|f| f.event == "values"));
    assert_eq!(values_only, expected);

    let past_the_end = app
        .rejoin(
            "t-replay",
            run_id,
            streamed.frames.last().unwrap().id.as_deref(),
        )
        .await;
    assert!(past_the_end.is_empty(), "nothing follows end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pruned_log_gives_a_gap_to_an_old_cursor_and_a_lone_end_without_one() {
    let (app, _dir) = sqlite_gateway(0).await;
    let streamed = app
        .stream_run("t-prune", demo_request(&["values"], "cancel"))
        .await;
    let run_id = streamed.frames[0].data["run_id"].as_str().unwrap();
    let last = streamed.frames.last().unwrap().clone();
    assert_eq!(last.event, "end");
    // The creator reads `end` once it is stored; the run counts as finished once its
    // lease is released too.
    app.finished_run("t-prune", run_id).await;
    assert_eq!(app.store.prune_streams(Duration::ZERO).await.unwrap(), 1);

    let response = app.rejoin_response("t-prune", run_id, Some("2"), "").await;
    let text = response.text().await.unwrap();
    let frames = parse_frames(&text);
    assert_eq!(frames.len(), 1, "{text}");
    assert_eq!(
        frames[0],
        Frame {
            event: "gap".into(),
            id: None,
            data: json!({
                "code": "stream_replay_gap",
                "run_id": run_id,
                "requested_event_id": 2,
                "earliest_available_event_id": null,
                "latest_available_event_id": null,
                "recovery": "reload_durable_state",
            }),
        }
    );
    assert!(!text.contains("event: end"), "a gap closes without end");

    let lone = app.rejoin("t-prune", run_id, None).await;
    assert_eq!(lone, [last], "a lone end, with the log's last id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cursors_and_modes_are_422_cursors_past_the_end_409_and_unknown_runs_404() {
    let (app, _dir) = sqlite_gateway(0).await;
    let streamed = app
        .stream_run("t-bad", demo_request(&["values"], "cancel"))
        .await;
    let run_id = streamed.frames[0].data["run_id"].as_str().unwrap();
    let last = streamed.frames.last().unwrap().id.clone().unwrap();
    let past_the_end = (last.parse::<u64>().unwrap() + 1).to_string();
    for (cursor, status) in [
        ("abc", 422),
        ("-2", 422),
        ("1.5", 422),
        (&past_the_end, 409),
    ] {
        let response = app.rejoin_response("t-bad", run_id, Some(cursor), "").await;
        assert_eq!(response.status(), status, "{cursor}");
        let body: Value = response.json().await.unwrap();
        assert!(
            body["detail"]
                .as_str()
                .is_some_and(|d| d.contains("Last-Event-ID")),
            "{body}"
        );
    }
    let response = app
        .rejoin_response("t-bad", run_id, None, "?stream_mode=debug")
        .await;
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["detail"], "Unsupported stream mode(s): debug");
    let response = app.rejoin_response("t-bad", "nope", None, "").await;
    assert_eq!(response.status(), 404);
    let response = app.rejoin_response("t bad", run_id, None, "").await;
    assert_eq!(response.status(), 422);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoin_cancels_the_run_on_disconnect_only_when_it_asks_to() {
    let (app, _dir) = sqlite_gateway(60).await;
    let (kept, _, creator) = app
        .start_run("t-keep", demo_request(&["custom"], "continue"))
        .await;
    drop(creator);
    let mut watcher = Sse::new(app.rejoin_response("t-keep", &kept, None, "").await);
    watcher.next().await.expect("metadata");
    drop(watcher);
    assert_eq!(app.finished_run("t-keep", &kept).await["status"], "success");

    let (cancelled, _, creator) = app
        .start_run("t-drop", demo_request(&["custom"], "continue"))
        .await;
    drop(creator);
    let mut watcher = Sse::new(
        app.rejoin_response("t-drop", &cancelled, None, "?cancel_on_disconnect=true")
            .await,
    );
    watcher.next().await.expect("metadata");
    drop(watcher);
    assert_eq!(
        app.finished_run("t-drop", &cancelled).await["status"],
        "interrupted"
    );
    let log = app.rejoin("t-drop", &cancelled, None).await;
    assert_contiguous_to_end(&log, 1);
}

/// A thread with a run left `running` (and leased) by a process that stopped, and two
/// frames of its log.
async fn seed_orphan(store: &dyn Store, thread: &str, run: &str, lease: Duration) {
    store
        .create_thread(NewThread {
            thread_id: thread.into(),
            owner: "default".into(),
            metadata: Map::new(),
        })
        .await
        .unwrap();
    store
        .create_run(NewRun {
            run_id: run.into(),
            thread_id: thread.into(),
            owner: "default".into(),
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
    assert!(store.update_run_status(run, &running).await.unwrap());
    assert!(
        store
            .acquire_run_lease(run, "a-stopped-process", lease)
            .await
            .unwrap()
    );
    let frame = |id: i64, event: &str, data: Value| StreamFrame {
        id,
        event: event.into(),
        data: data.to_string(),
    };
    store
        .append_frames(&FrameBatch {
            run_id: run.into(),
            thread_id: thread.into(),
            frames: vec![
                frame(1, "metadata", json!({"run_id": run, "thread_id": thread})),
                frame(2, "values", json!({"messages": []})),
            ],
            ends: false,
            lease_owner: None,
        })
        .await
        .unwrap();
}

/// The log of a recovered orphan: its frames, then `error` and `end`.
fn assert_recovered_log(frames: &[Frame]) {
    assert_contiguous_to_end(frames, 1);
    let events: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(events, ["metadata", "values", "error", "end"]);
    assert_eq!(frames[2].data["name"], "OrphanRecovered");
}

async fn assert_recovered_run(app: &TestApp, thread: &str, run: &str) {
    let record = app.run_record(thread, run).await;
    assert_eq!(record["status"], RunStatus::Error.as_str());
    assert_eq!(
        record["stop_reason"],
        RunStopReason::OrphanRecovered.as_str()
    );
    // The failure is recorded as `run.error` right after the log is closed.
    let recorded = async {
        loop {
            let (_, _, events) = app
                .get_json(&format!("/api/threads/{thread}/runs/{run}/events"))
                .await;
            if let Some(error) = events
                .as_array()
                .and_then(|e| e.iter().find(|e| e["event_type"] == "run.error"))
            {
                return error.clone();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let error = tokio::time::timeout(PATIENCE, recorded)
        .await
        .expect("run.error is recorded");
    assert_eq!(error["metadata"]["error_type"], "OrphanRecovered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_left_running_in_a_sqlite_file_is_recovered_when_the_gateway_starts() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(dir.path()).await;
    // A lease still valid: on SQLite the process that held it is gone whatever it says.
    seed_orphan(&store, "t-orphan", "r-orphan", Duration::from_secs(600)).await;
    store.close().await;
    let app = gateway_on(
        Arc::new(sqlite_store(dir.path()).await),
        0,
        Duration::from_secs(30),
    )
    .await;
    assert_recovered_log(&app.rejoin("t-orphan", "r-orphan", None).await);
    assert_recovered_run(&app, "t-orphan", "r-orphan").await;
    let (_, _, thread) = app.get_json("/api/threads/t-orphan").await;
    assert_eq!(thread["status"], "error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_postgres_stream_each_others_runs_with_every_frame_once() {
    let db = TestDb::new().await;
    let a = postgres_gateway(&db.url, 30, Duration::from_secs(30)).await;
    let b = postgres_gateway(&db.url, 30, Duration::from_secs(30)).await;
    let (run_id, metadata, creator) = a
        .start_run("t-pg", demo_request(&["custom", "values"], "continue"))
        .await;
    let through_b = Sse::new(b.rejoin_response("t-pg", &run_id, None, "").await);
    let (from_b, rest_of_a) = tokio::join!(through_b.rest(), creator.rest());
    let mut from_a = vec![metadata];
    from_a.extend(rest_of_a);
    assert_contiguous_to_end(&from_a, 1);
    let summary = |frames: &[Frame]| {
        frames
            .iter()
            .map(|f| format!("{}:{}", f.id.as_deref().unwrap_or("-"), f.event))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        summary(&from_b),
        summary(&from_a),
        "the same frames in order"
    );
    for (b, a) in from_b.iter().zip(&from_a) {
        assert_eq!(
            b, a,
            "B streams frame {:?} of the run in A identically",
            a.id
        );
    }

    let resumed = b.rejoin("t-pg", &run_id, Some("3")).await;
    assert_eq!(resumed[..], from_a[3..]);
    let (status, _, joined) = b
        .get_json(&format!("/api/threads/t-pg/runs/{run_id}/join"))
        .await;
    assert_eq!(status, 200);
    assert!(!joined["messages"].as_array().unwrap().is_empty());
    assert_eq!(b.run_record("t-pg", &run_id).await["status"], "success");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_received_by_another_gateway_stops_the_run_where_it_executes() {
    let db = TestDb::new().await;
    let a = postgres_gateway(&db.url, 100, Duration::from_secs(30)).await;
    let b = postgres_gateway(&db.url, 0, Duration::from_secs(30)).await;
    let (run_id, _, creator) = a
        .start_run("t-pg-cancel", demo_request(&["custom"], "continue"))
        .await;
    let cancelled = b
        .client
        .post(b.url(&format!(
            "/api/threads/t-pg-cancel/runs/{run_id}/cancel?wait=true"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 202);
    assert_eq!(
        b.run_record("t-pg-cancel", &run_id).await["status"],
        "interrupted",
        "wait=true returns once the owner stopped it"
    );
    let frames = creator.rest().await;
    assert_eq!(frames.last().map(|f| f.event.as_str()), Some("end"));

    let (rolled, _, creator) = a
        .start_run("t-pg-rollback", demo_request(&["custom"], "continue"))
        .await;
    let response = b
        .client
        .post(b.url(&format!(
            "/api/threads/t-pg-rollback/runs/{rolled}/cancel?action=rollback&wait=true"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let frames = creator.rest().await;
    assert_eq!(frames.last().map(|f| f.event.as_str()), Some("end"));
    for gateway in [&a, &b] {
        let (status, _, _) = gateway
            .get_json(&format!("/api/threads/t-pg-rollback/runs/{rolled}"))
            .await;
        assert_eq!(status, 404, "rolled back everywhere");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_gateway_on_postgres_recovers_a_run_whose_lease_expired() {
    let db = TestDb::new().await;
    seed_orphan(&db.store, "t-pg-orphan", "r-pg-orphan", Duration::ZERO).await;
    let b = postgres_gateway(&db.url, 0, Duration::from_secs(3)).await;
    // The watcher waits for the recovery's `end`, however long the sweep takes.
    assert_recovered_log(&b.rejoin("t-pg-orphan", "r-pg-orphan", None).await);
    assert_recovered_run(&b, "t-pg-orphan", "r-pg-orphan").await;
}
