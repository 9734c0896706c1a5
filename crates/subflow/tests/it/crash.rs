//! The crash harness (docs/api.md#resume-and-rejoin, docs/api.md#cancel, docs/events.md#run-events): `subflow serve` is killed with `kill -9` at
//! random moments of a streaming demo run, each time right after the client received a
//! frame, then restarted (SQLite) or taken over by a second gateway (PostgreSQL). For
//! every kill:
//! * every task event the client received is in `/events` exactly once;
//! * every frame id the client received names the same frame in the replayed log;
//! * resuming with the client's last id, and with a lower one, gets what it missed and
//!   then `error` + `end`: never an empty stream, never a bare `end`.
//!
//! And a gateway paused (`SIGSTOP`) past its lease while another recovers its run, then
//! resumed: every frame its client received is the log's frame with that id, the client
//! is told `lease_lost`, and no run event follows `run.end`.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use subflow_contracts::RunEvent;
use subflow_contracts::task_events::map_task_event;
use subflow_store_postgres::testing::TestDb;

use crate::recovery::{Serve, client, events, get, post_demo_run, write_config};

/// Kills on SQLite, each followed by a restart.
const SQLITE_KILLS: usize = 20;
/// Kills on PostgreSQL, each followed by the other gateway's takeover.
const POSTGRES_KILLS: usize = 10;
/// Pauses of the lease holder on PostgreSQL, each past its lease.
const PAUSES: usize = 5;
/// Bounds every wait, so a broken recovery fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(60);
/// The stream modes of the run and of every resume.
const MODES: &str = "stream_mode=messages-tuple&stream_mode=updates&stream_mode=custom";

/// One SSE frame as the client received it.
#[derive(Debug, Clone, PartialEq)]
struct Frame {
    id: u64,
    event: String,
    data: String,
}

/// Frames complete in `buffer`, which keeps the incomplete rest.
fn take_frames(buffer: &mut String) -> Vec<Frame> {
    let mut frames = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let block: String = buffer.drain(..end + 2).collect();
        let (mut id, mut event, mut data) = (None, String::new(), String::new());
        for line in block.lines() {
            if let Some(rest) = line.strip_prefix("id: ") {
                id = rest.parse().ok();
            } else if let Some(rest) = line.strip_prefix("event: ") {
                event = rest.to_owned();
            } else if let Some(rest) = line.strip_prefix("data: ") {
                data = rest.to_owned();
            }
        }
        if let Some(id) = id {
            frames.push(Frame { id, event, data });
        }
    }
    frames
}

/// A small deterministic generator, seeded from the clock and printed, so a failing
/// schedule can be read back from the output.
struct Dice(u64);

impl Dice {
    fn seeded() -> Self {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        eprintln!("crash harness seed {seed}");
        Dice(seed)
    }

    /// A number in `low..=high`.
    fn roll(&mut self, low: u64, high: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        low + self.0 % (high - low + 1)
    }
}

/// A demo run streamed through a gateway, as its client reads it.
struct Client {
    response: reqwest::Response,
    /// An incomplete frame, kept until its end arrives.
    buffer: String,
    /// Everything received.
    text: String,
    /// The frames received that have an id.
    frames: Vec<Frame>,
}

impl Client {
    async fn start(api: &str, thread: &str) -> Self {
        let response = post_demo_run(api, thread, "runs/stream").await;
        assert_eq!(response.status(), 200);
        Client {
            response,
            buffer: String::new(),
            text: String::new(),
            frames: Vec::new(),
        }
    }

    /// Reads until the client holds `count` frames, the stream closes, or nothing comes
    /// for [`PATIENCE`].
    async fn read_until(&mut self, count: u64) {
        while (self.frames.len() as u64) < count {
            let Ok(Ok(Some(chunk))) = tokio::time::timeout(PATIENCE, self.response.chunk()).await
            else {
                return;
            };
            let chunk = std::str::from_utf8(&chunk).unwrap();
            self.text.push_str(chunk);
            self.buffer.push_str(chunk);
            self.frames.extend(take_frames(&mut self.buffer));
        }
    }

    fn run_id(&self) -> String {
        let metadata: Value = serde_json::from_str(&self.frames[0].data).unwrap();
        metadata["run_id"].as_str().unwrap().to_owned()
    }
}

/// Streams a new demo run through `api` and kills `process` the moment the client holds
/// `kill_after` frames (or the run ended first). Returns the run id and the frames.
async fn stream_and_kill(
    api: &str,
    thread: &str,
    kill_after: u64,
    process: Serve,
) -> (String, Vec<Frame>) {
    let mut client = Client::start(api, thread).await;
    client.read_until(kill_after).await;
    process.kill();
    (client.run_id(), client.frames)
}

/// Waits until the run is no longer active and its `run.end` is stored.
async fn wait_ended(api: &str, thread: &str, run: &str) -> (Value, Vec<RunEvent>) {
    let ended = async {
        loop {
            let record = get(api, &format!("/threads/{thread}/runs/{run}")).await;
            let records = events(api, thread, run).await;
            if !matches!(record["status"].as_str(), Some("running" | "pending"))
                && records.iter().any(|e| e.event_type == "run.end")
            {
                return (record, records);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(PATIENCE, ended)
        .await
        .expect("the run is recovered")
}

/// The stored log after `cursor` (`-1`: from the start), as a resuming client reads it.
async fn resume(api: &str, thread: &str, run: &str, cursor: i64) -> Vec<Frame> {
    let mut text = client()
        .get(format!("{api}/threads/{thread}/runs/{run}/stream?{MODES}"))
        .header("Last-Event-ID", cursor.to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    take_frames(&mut text)
}

/// What one kill showed.
#[derive(Debug, Default)]
struct Tally {
    kills: usize,
    frames: usize,
    task_events: usize,
    recovered: usize,
    resumes: usize,
}

/// Checks one killed run after its recovery and adds it to `tally`.
async fn check_kill(
    api: &str,
    thread: &str,
    run: &str,
    received: &[Frame],
    dice: &mut Dice,
    tally: &mut Tally,
) {
    let (record, records) = wait_ended(api, thread, run).await;
    if record["stop_reason"] == "orphan_recovered" {
        tally.recovered += 1;
    }
    // Every task event the client received is stored exactly once.
    let mut stored: HashMap<(String, Value), usize> = HashMap::new();
    for event in records
        .iter()
        .filter(|e| e.event_type.starts_with("subagent."))
    {
        *stored
            .entry((
                event.event_type.clone(),
                Value::Object(event.metadata.clone()),
            ))
            .or_default() += 1;
    }
    for frame in received.iter().filter(|f| f.event == "custom") {
        let payload: Value = serde_json::from_str(&frame.data).unwrap();
        let Ok(mapped) = map_task_event(&payload) else {
            continue;
        };
        let key = (
            mapped.event_type.as_str().to_owned(),
            Value::Object(mapped.metadata),
        );
        assert_eq!(
            stored.get(&key),
            Some(&1),
            "run {run}: the received task event {} (frame {}) is in /events once",
            frame.data,
            frame.id
        );
        tally.task_events += 1;
    }
    // An id names one frame forever.
    let replay = resume(api, thread, run, -1).await;
    let by_id: HashMap<u64, &Frame> = replay.iter().map(|f| (f.id, f)).collect();
    for frame in received {
        assert_eq!(
            by_id.get(&frame.id).copied(),
            Some(frame),
            "run {run}: frame {} replays as the client received it",
            frame.id
        );
    }
    // Resuming from the last id held, and from a lower one.
    let last = received.last().unwrap();
    let lower = dice.roll(1, last.id);
    // A client holding `end` has nothing to resume.
    let cursors = if last.event == "end" {
        vec![lower.min(last.id - 1)]
    } else {
        vec![last.id, lower]
    };
    for cursor in cursors {
        let missed = resume(api, thread, run, cursor as i64).await;
        let events: Vec<&str> = missed.iter().map(|f| f.event.as_str()).collect();
        assert!(
            missed.iter().all(|f| f.id > cursor),
            "run {run}: resume after {cursor} gets only later frames: {events:?}"
        );
        assert_eq!(
            events.last(),
            Some(&"end"),
            "run {run}: resume after {cursor} ends with end"
        );
        if record["status"] == "error" {
            assert!(
                events.contains(&"error"),
                "run {run}: resume after {cursor} of a failed run shows its error: {events:?}"
            );
        }
        let expected: Vec<&Frame> = replay.iter().filter(|f| f.id > cursor).collect();
        assert_eq!(
            missed.iter().collect::<Vec<_>>(),
            expected,
            "run {run}: resume after {cursor} equals the replay's tail"
        );
        tally.resumes += 1;
    }
    tally.kills += 1;
    tally.frames += received.len();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_on_sqlite_loses_no_received_event_and_reuses_no_frame_id() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), None);
    let mut dice = Dice::seeded();
    let mut tally = Tally::default();
    let (mut process, mut api) = Serve::start(dir.path());
    for kill in 0..SQLITE_KILLS {
        let thread = format!("t-crash-{kill}");
        let kill_after = dice.roll(2, 60);
        let (run, received) = stream_and_kill(&api, &thread, kill_after, process).await;
        // The restart recovers the run.
        (process, api) = Serve::start(dir.path());
        check_kill(&api, &thread, &run, &received, &mut dice, &mut tally).await;
    }
    process.kill();
    eprintln!("crash harness (SQLite): {tally:?}");
    assert_eq!(tally.kills, SQLITE_KILLS);
    assert!(tally.task_events > 0, "some kills came after task events");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_on_postgres_with_two_gateways_loses_nothing_received() {
    let db = TestDb::new().await;
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    for dir in &dirs {
        write_config(dir.path(), Some(&db.url));
    }
    let mut dice = Dice::seeded();
    let mut tally = Tally::default();
    let mut gateways = [Serve::start(dirs[0].path()), Serve::start(dirs[1].path())];
    for kill in 0..POSTGRES_KILLS {
        // The gateways take turns: one streams and is killed, the other takes over.
        let (victim, survivor) = (kill % 2, 1 - kill % 2);
        let thread = format!("t-pg-crash-{kill}");
        let kill_after = dice.roll(2, 60);
        let replacement = Serve::start(dirs[victim].path());
        let (process, api) = std::mem::replace(&mut gateways[victim], replacement);
        let (run, received) = stream_and_kill(&api, &thread, kill_after, process).await;
        let survivor_api = gateways[survivor].1.clone();
        check_kill(
            &survivor_api,
            &thread,
            &run,
            &received,
            &mut dice,
            &mut tally,
        )
        .await;
    }
    for (process, _) in gateways {
        process.kill();
    }
    eprintln!("crash harness (PostgreSQL, two gateways): {tally:?}");
    assert_eq!(tally.kills, POSTGRES_KILLS);
    assert!(tally.task_events > 0, "some kills came after task events");
}

/// The runs `api`'s process has finished (after their final writes), as its `/metrics`
/// counts them.
async fn finished_runs(api: &str) -> u64 {
    let base = api.trim_end_matches("/api");
    let text = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|line| line.starts_with("subflow_runs_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_paused_past_its_lease_tells_its_client_only_what_the_log_holds() {
    let db = TestDb::new().await;
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    for dir in &dirs {
        write_config(dir.path(), Some(&db.url));
    }
    let (holder, api) = Serve::start(dirs[0].path());
    let (_other, other_api) = Serve::start(dirs[1].path());
    let mut dice = Dice::seeded();
    let mut recovered = 0;
    for pause in 0..PAUSES {
        let thread = format!("t-pause-{pause}");
        let mut client = Client::start(&api, &thread).await;
        client.read_until(dice.roll(2, 40)).await;
        let run = client.run_id();

        holder.signal("STOP");
        // The other gateway finds the lease expired and ends the run.
        let (record, _) = wait_ended(&other_api, &thread, &run).await;
        holder.signal("CONT");
        client.read_until(u64::MAX).await;
        let (text, received) = (&client.text, &client.frames);

        let replay = resume(&other_api, &thread, &run, -1).await;
        let by_id: HashMap<u64, &Frame> = replay.iter().map(|f| (f.id, f)).collect();
        for frame in received {
            assert_eq!(
                by_id.get(&frame.id).copied(),
                Some(frame),
                "pause {pause}, run {run}: frame {} is the log's frame {}",
                frame.id,
                frame.id
            );
        }
        if record["stop_reason"] == "orphan_recovered" {
            recovered += 1;
            assert!(
                text.contains("\"error\":\"lease_lost\"")
                    && text.ends_with("event: end\ndata: null\n\n"),
                "pause {pause}, run {run}: the paused gateway's client is told the lease was lost and the stream ends: {text:?}"
            );
        }
        // The resumed gateway has tried every write it still had once it counts the run
        // finished.
        let finished = async {
            while finished_runs(&api).await <= pause as u64 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(PATIENCE, finished)
            .await
            .expect("the resumed gateway finishes the run");
        let records = events(&other_api, &thread, &run).await;
        let types: Vec<&str> = records.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(
            types.iter().filter(|t| **t == "run.end").count(),
            1,
            "pause {pause}, run {run}: one run.end: {types:?}"
        );
        assert_eq!(
            types.last(),
            Some(&"run.end"),
            "pause {pause}, run {run}: nothing follows run.end: {types:?}"
        );
        let stored = get(&other_api, &format!("/threads/{thread}/runs/{run}")).await;
        assert_eq!(stored["status"], record["status"], "the run's end stands");
        let thread_record = get(&other_api, &format!("/threads/{thread}")).await;
        let expected = if record["status"] == "success" {
            "idle"
        } else {
            "error"
        };
        assert_eq!(
            thread_record["status"], expected,
            "pause {pause}: the thread's status is the recovery's: {thread_record}"
        );
    }
    eprintln!("paused gateway: {recovered} of {PAUSES} runs recovered by the other gateway");
    assert!(recovered > 0, "some pauses landed while the run was going");
}
