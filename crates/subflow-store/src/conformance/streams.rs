//! Conformance cases of [`StreamStore`](crate::StreamStore): run stream logs, leases,
//! orphan recovery and cancel requests (docs/api.md#resume-and-rejoin, docs/api.md#cancel).
//!
//! [`conformance_tests!`](crate::conformance_tests) expands these through
//! [`stream_conformance_tests!`](crate::stream_conformance_tests), so every backend runs them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, json};
use subflow_contracts::{RunStatus, RunStopReason};

use crate::{
    Error, FrameBatch, NewFrame, NewRun, NewThread, OrphanScope, RunStatusUpdate, Store,
    StreamFrame, StreamNotice, StreamNotices,
};

/// Expands to one `#[tokio::test]` per stream case; invoked by `conformance_tests!`.
#[doc(hidden)]
#[macro_export]
macro_rules! stream_conformance_tests {
    ($factory:expr) => {
        $crate::stream_conformance_tests!(@cases $factory;
            streams_append_read_and_bound_a_log,
            streams_retries_skip_stored_frames_and_holes_are_refused,
            streams_an_ended_log_takes_nothing_more,
            streams_pruning_drops_old_ended_logs_and_keeps_their_bounds,
            streams_logs_and_leases_go_with_their_runs,
            streams_leases_are_held_renewed_released_and_expire,
            streams_expired_leases_are_recovered_once_with_closing_frames,
            streams_fenced_appends_need_the_lease_and_lose_it_to_a_recovery,
            streams_events_and_frames_are_appended_in_order_and_fenced_alike,
            streams_fenced_status_usage_and_checkpoints_need_the_lease,
            streams_startup_recovery_takes_every_active_run,
            streams_cancel_requests_are_stored_taken_once_and_announced,
            streams_task_cancel_requests_are_stored_per_task_taken_once_and_announced,
            streams_appends_and_recoveries_are_announced_with_the_last_id,
        );
    };
    (@cases $factory:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $factory.await;
                $crate::conformance::streams::$case(fixture.store.clone()).await;
            }
        )+
    };
}

/// Long enough that a lease taken in a test never expires during it.
const LIVE: Duration = Duration::from_secs(600);

/// A notice must arrive well within this; it only bounds a failing test.
const NOTICE_WAIT: Duration = Duration::from_secs(10);

async fn run_in(store: &dyn Store, thread: &str, run: &str, status: RunStatus) {
    if store.get_thread(thread).await.unwrap().is_none() {
        store
            .create_thread(NewThread {
                thread_id: thread.into(),
                owner: "u1".into(),
                metadata: Map::new(),
            })
            .await
            .unwrap();
    }
    store
        .create_run(NewRun {
            run_id: run.into(),
            thread_id: thread.into(),
            owner: "u1".into(),
            assistant_id: "lead_agent".into(),
            model_name: None,
            trace_id: None,
            metadata: Map::new(),
            multitask_strategy: "reject".into(),
            kwargs: json!({}),
        })
        .await
        .unwrap();
    if status != RunStatus::Pending {
        set_status(store, run, RunStatus::Running).await;
    }
    if !status.is_active() {
        set_status(store, run, status).await;
    }
}

async fn set_status(store: &dyn Store, run: &str, status: RunStatus) {
    let update = RunStatusUpdate {
        lease_owner: None,
        status,
        stop_reason: None,
        error: None,
    };
    assert!(store.update_run_status(run, &update).await.unwrap());
}

fn frame(id: i64, event: &str, data: &str) -> StreamFrame {
    StreamFrame {
        id,
        event: event.into(),
        data: data.into(),
    }
}

fn batch(thread: &str, run: &str, ids: std::ops::RangeInclusive<i64>, ends: bool) -> FrameBatch {
    FrameBatch {
        run_id: run.into(),
        thread_id: thread.into(),
        frames: ids
            .map(|id| frame(id, "values", &format!(r#"{{"n":{id}}}"#)))
            .collect(),
        ends,
        lease_owner: None,
    }
}

async fn ids(store: &dyn Store, run: &str) -> Vec<i64> {
    let frames = store.read_frames(run, 0, 2000).await.unwrap();
    frames.iter().map(|f| f.id).collect()
}

/// Recovers `run`, whose lease expired, as another process would.
async fn recover_expired(store: &dyn Store, run: &str) {
    store
        .recover_orphan(
            run,
            OrphanScope::ExpiredLeases,
            &orphan_update(),
            &closing(),
        )
        .await
        .unwrap()
        .expect("the run is recovered");
}

fn orphan_update() -> RunStatusUpdate {
    RunStatusUpdate {
        lease_owner: None,
        status: RunStatus::Error,
        stop_reason: Some(RunStopReason::OrphanRecovered),
        error: Some("the run's process stopped".into()),
    }
}

fn closing() -> Vec<NewFrame> {
    vec![
        NewFrame {
            event: "error".into(),
            data: r#"{"message":"lost","name":"OrphanRecovered"}"#.into(),
        },
        NewFrame {
            event: "end".into(),
            data: "null".into(),
        },
    ]
}

async fn orphans(store: &dyn Store, scope: OrphanScope) -> BTreeSet<String> {
    store
        .find_orphaned_runs(scope, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.run_id)
        .collect()
}

async fn next_notice(notices: &mut StreamNotices) -> StreamNotice {
    tokio::time::timeout(NOTICE_WAIT, notices.recv())
        .await
        .expect("a notice arrives")
        .expect("the notice source stays open")
}

/// Frames come back in id order, byte for byte, paged by `after_id` and `limit`, and the
/// log reports its bounds.
pub async fn streams_append_read_and_bound_a_log(store: Arc<dyn Store>) {
    run_in(&*store, "t1", "r1", RunStatus::Running).await;
    assert_eq!(store.stream_log("r1").await.unwrap(), None);
    let data = r#"{"z":1,"a":"é ✓","n":null}"#;
    let first = FrameBatch {
        run_id: "r1".into(),
        thread_id: "t1".into(),
        frames: vec![
            frame(1, "metadata", r#"{"run_id":"r1","thread_id":"t1"}"#),
            frame(2, "values", data),
        ],
        ends: false,
        lease_owner: None,
    };
    let outcome = store.append_frames(&first).await.unwrap();
    assert_eq!((outcome.written, outcome.skipped), (2, 0));
    store
        .append_frames(&batch("t1", "r1", 3..=5, false))
        .await
        .unwrap();
    let all = store.read_frames("r1", 0, 2000).await.unwrap();
    assert_eq!(
        all.iter().map(|f| f.id).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(all[0].event, "metadata");
    assert_eq!(all[1].data, data, "data is kept byte for byte");
    let page = store.read_frames("r1", 2, 2).await.unwrap();
    assert_eq!(page.iter().map(|f| f.id).collect::<Vec<_>>(), [3, 4]);
    assert!(store.read_frames("r1", 5, 10).await.unwrap().is_empty());
    assert!(store.read_frames("nope", 0, 10).await.unwrap().is_empty());
    let log = store.stream_log("r1").await.unwrap().unwrap();
    assert_eq!(log.thread_id, "t1");
    assert_eq!(
        (log.last_id, log.earliest_id, log.latest_id),
        (5, Some(1), Some(5))
    );
    assert!(!log.ended && !log.pruned);
    for (after, limit) in [(-1, 10), (0, 0), (0, 2001)] {
        assert!(
            matches!(
                store.read_frames("r1", after, limit).await,
                Err(Error::InvalidQuery(_))
            ),
            "after {after}, limit {limit}"
        );
    }
}

/// A retried batch writes nothing twice; a batch that would leave a hole, or names no
/// run of that thread, is a typed error and writes nothing.
pub async fn streams_retries_skip_stored_frames_and_holes_are_refused(store: Arc<dyn Store>) {
    run_in(&*store, "t1", "r1", RunStatus::Running).await;
    run_in(&*store, "t2", "r2", RunStatus::Running).await;
    store
        .append_frames(&batch("t1", "r1", 1..=3, false))
        .await
        .unwrap();
    let again = store
        .append_frames(&batch("t1", "r1", 1..=3, false))
        .await
        .unwrap();
    assert_eq!((again.written, again.skipped), (0, 3));
    let overlapping = store
        .append_frames(&batch("t1", "r1", 2..=5, false))
        .await
        .unwrap();
    assert_eq!((overlapping.written, overlapping.skipped), (2, 2));
    let hole = store.append_frames(&batch("t1", "r1", 7..=8, false)).await;
    assert!(matches!(hole, Err(Error::InvalidFrame(_))), "{hole:?}");
    let mut unordered = batch("t1", "r1", 6..=7, false);
    unordered.frames.swap(0, 1);
    assert!(matches!(
        store.append_frames(&unordered).await,
        Err(Error::InvalidFrame(_))
    ));
    assert_eq!(ids(&*store, "r1").await, [1, 2, 3, 4, 5]);
    for (thread, run) in [("t1", "missing"), ("t1", "r2"), ("t2", "r1")] {
        let error = store
            .append_frames(&batch(thread, run, 1..=1, false))
            .await
            .expect_err("no such run in that thread");
        assert!(matches!(error, Error::RunNotFound(_)), "{error:?}");
        assert!(error.is_invalid_input());
    }
    assert!(ids(&*store, "r2").await.is_empty());
    assert_eq!(store.stream_log("r1").await.unwrap().unwrap().last_id, 5);
}

/// Once a batch ends the log, later frames are skipped.
pub async fn streams_an_ended_log_takes_nothing_more(store: Arc<dyn Store>) {
    run_in(&*store, "t1", "r1", RunStatus::Running).await;
    store
        .append_frames(&batch("t1", "r1", 1..=2, true))
        .await
        .unwrap();
    assert!(store.stream_log("r1").await.unwrap().unwrap().ended);
    let late = store
        .append_frames(&batch("t1", "r1", 3..=4, false))
        .await
        .unwrap();
    assert_eq!((late.written, late.skipped), (0, 2));
    assert_eq!(ids(&*store, "r1").await, [1, 2]);
}

/// Pruning drops the frames of logs that ended at least the retention ago, never of
/// open logs, and keeps what a `gap` reports.
pub async fn streams_pruning_drops_old_ended_logs_and_keeps_their_bounds(store: Arc<dyn Store>) {
    run_in(&*store, "t1", "ended", RunStatus::Success).await;
    run_in(&*store, "t1", "open", RunStatus::Running).await;
    store
        .append_frames(&batch("t1", "ended", 1..=3, true))
        .await
        .unwrap();
    store
        .append_frames(&batch("t1", "open", 1..=2, false))
        .await
        .unwrap();
    assert_eq!(
        store
            .prune_streams(Duration::from_secs(3600))
            .await
            .unwrap(),
        0,
        "ended just now, within the retention"
    );
    assert_eq!(ids(&*store, "ended").await, [1, 2, 3]);
    assert_eq!(store.prune_streams(Duration::ZERO).await.unwrap(), 1);
    assert!(ids(&*store, "ended").await.is_empty());
    let log = store.stream_log("ended").await.unwrap().unwrap();
    assert_eq!(
        (log.last_id, log.earliest_id, log.latest_id),
        (3, None, None)
    );
    assert!(log.ended && log.pruned);
    assert_eq!(ids(&*store, "open").await, [1, 2], "open logs are kept");
    assert_eq!(
        store.prune_streams(Duration::ZERO).await.unwrap(),
        0,
        "pruned once"
    );
}

/// Deleting a run, or its thread, deletes its log, lease and cancel requests.
pub async fn streams_logs_and_leases_go_with_their_runs(store: Arc<dyn Store>) {
    run_in(&*store, "t1", "r1", RunStatus::Running).await;
    run_in(&*store, "t1", "r2", RunStatus::Running).await;
    run_in(&*store, "t2", "r3", RunStatus::Running).await;
    for (thread, run) in [("t1", "r1"), ("t1", "r2"), ("t2", "r3")] {
        store
            .append_frames(&batch(thread, run, 1..=2, false))
            .await
            .unwrap();
        assert!(
            store
                .acquire_run_lease(run, "owner-a", Duration::ZERO)
                .await
                .unwrap()
        );
        assert!(store.request_cancel(run).await.unwrap());
    }
    assert!(store.delete_run("t1", "r1").await.unwrap());
    assert_eq!(store.stream_log("r1").await.unwrap(), None);
    assert!(ids(&*store, "r1").await.is_empty());
    assert!(store.delete_thread("t2").await.unwrap());
    assert_eq!(store.stream_log("r3").await.unwrap(), None);
    assert_eq!(
        orphans(&*store, OrphanScope::ExpiredLeases).await,
        BTreeSet::from(["r2".to_owned()])
    );
    assert_eq!(
        store
            .take_cancel_requests(&["r1".into(), "r2".into(), "r3".into()])
            .await
            .unwrap(),
        ["r2"]
    );
    assert!(matches!(
        store.acquire_run_lease("r1", "owner-a", LIVE).await,
        Err(Error::RunNotFound(_))
    ));
    assert_eq!(ids(&*store, "r2").await, [1, 2]);
}

/// One owner at a time; renewals and releases need the owner; an expired lease can be
/// taken over.
pub async fn streams_leases_are_held_renewed_released_and_expire(store: Arc<dyn Store>) {
    run_in(&*store, "t1", "r1", RunStatus::Running).await;
    run_in(&*store, "t1", "r2", RunStatus::Running).await;
    assert!(store.acquire_run_lease("r1", "a", LIVE).await.unwrap());
    assert!(!store.acquire_run_lease("r1", "b", LIVE).await.unwrap());
    assert!(
        store.acquire_run_lease("r1", "a", LIVE).await.unwrap(),
        "re-entrant"
    );
    assert!(!store.renew_run_lease("r1", "b", LIVE).await.unwrap());
    assert!(store.renew_run_lease("r1", "a", LIVE).await.unwrap());
    assert!(!store.release_run_lease("r1", "b").await.unwrap());
    assert!(store.release_run_lease("r1", "a").await.unwrap());
    assert!(!store.renew_run_lease("r1", "a", LIVE).await.unwrap());
    assert!(!store.release_run_lease("r1", "a").await.unwrap());
    assert!(store.acquire_run_lease("r1", "b", LIVE).await.unwrap());
    assert!(matches!(
        store.acquire_run_lease("missing", "a", LIVE).await,
        Err(Error::RunNotFound(_))
    ));

    assert!(
        store
            .acquire_run_lease("r2", "a", Duration::ZERO)
            .await
            .unwrap()
    );
    assert_eq!(
        orphans(&*store, OrphanScope::ExpiredLeases).await,
        BTreeSet::from(["r2".to_owned()]),
        "only the expired lease"
    );
    assert!(
        store.acquire_run_lease("r2", "c", LIVE).await.unwrap(),
        "an expired lease is free"
    );
    assert!(!store.renew_run_lease("r2", "a", LIVE).await.unwrap());
    assert!(
        orphans(&*store, OrphanScope::ExpiredLeases)
            .await
            .is_empty()
    );
}

/// An expired lease makes an active run `error`/`orphan_recovered` and closes its log
/// with the next ids, once; live leases and renewed runs are left alone.
pub async fn streams_expired_leases_are_recovered_once_with_closing_frames(store: Arc<dyn Store>) {
    run_in(&*store, "t1", "lost", RunStatus::Running).await;
    run_in(&*store, "t1", "live", RunStatus::Running).await;
    run_in(&*store, "t2", "flushed", RunStatus::Success).await;
    store
        .append_frames(&batch("t1", "lost", 1..=2, false))
        .await
        .unwrap();
    store
        .append_frames(&batch("t2", "flushed", 1..=3, true))
        .await
        .unwrap();
    for (run, ttl) in [
        ("lost", Duration::ZERO),
        ("live", LIVE),
        ("flushed", Duration::ZERO),
    ] {
        assert!(store.acquire_run_lease(run, "gone", ttl).await.unwrap());
    }
    assert_eq!(
        orphans(&*store, OrphanScope::ExpiredLeases).await,
        BTreeSet::from(["lost".to_owned(), "flushed".to_owned()])
    );

    let recovered = store
        .recover_orphan(
            "lost",
            OrphanScope::ExpiredLeases,
            &orphan_update(),
            &closing(),
        )
        .await
        .unwrap()
        .expect("the lost run is recovered");
    assert_eq!(recovered.thread_id, "t1");
    assert!(recovered.was_active);
    assert_eq!(recovered.frames_appended, 2);
    let run = store.get_run("t1", "lost").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Error);
    assert_eq!(run.stop_reason, Some(RunStopReason::OrphanRecovered));
    assert_eq!(run.error.as_deref(), Some("the run's process stopped"));
    let frames = store.read_frames("lost", 0, 100).await.unwrap();
    let events: Vec<(i64, &str)> = frames.iter().map(|f| (f.id, f.event.as_str())).collect();
    assert_eq!(
        events,
        [(1, "values"), (2, "values"), (3, "error"), (4, "end")]
    );
    assert_eq!(frames[3].data, "null");
    assert!(store.stream_log("lost").await.unwrap().unwrap().ended);
    assert!(
        store
            .recover_orphan(
                "lost",
                OrphanScope::ExpiredLeases,
                &orphan_update(),
                &closing()
            )
            .await
            .unwrap()
            .is_none(),
        "recovered once"
    );
    let late = store
        .append_frames(&batch("t1", "lost", 3..=3, false))
        .await
        .unwrap();
    assert_eq!(late.written, 0, "the old owner is fenced out");

    assert!(
        store
            .recover_orphan(
                "live",
                OrphanScope::ExpiredLeases,
                &orphan_update(),
                &closing()
            )
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        store.get_run("t1", "live").await.unwrap().unwrap().status,
        RunStatus::Running
    );

    let flushed = store
        .recover_orphan(
            "flushed",
            OrphanScope::ExpiredLeases,
            &orphan_update(),
            &closing(),
        )
        .await
        .unwrap()
        .expect("a stale lease is cleared");
    assert!(!flushed.was_active);
    assert_eq!(flushed.frames_appended, 0, "its log had already ended");
    assert_eq!(
        store
            .get_run("t2", "flushed")
            .await
            .unwrap()
            .unwrap()
            .status,
        RunStatus::Success,
        "a finished run keeps its status"
    );
    assert_eq!(ids(&*store, "flushed").await, [1, 2, 3]);
    assert!(
        orphans(&*store, OrphanScope::ExpiredLeases)
            .await
            .is_empty()
    );
}

/// Run events appended with frames are stored with them, once however often the pair is
/// retried; frames refused (lost lease) are not stored, and an empty set of events is a
/// plain frame append.
pub async fn streams_events_and_frames_are_appended_in_order_and_fenced_alike(
    store: Arc<dyn Store>,
) {
    run_in(&*store, "t1", "r1", RunStatus::Running).await;
    assert!(store.acquire_run_lease("r1", "a", LIVE).await.unwrap());
    let fenced = |ids, owner: &str| FrameBatch {
        lease_owner: Some(owner.to_owned()),
        ..batch("t1", "r1", ids, false)
    };
    let step = |n: usize| super::trace("t1", "r1", n);
    let events = [step(1), step(2)];
    let written = store
        .append_events_and_frames(&events, &fenced(1..=2, "a"))
        .await
        .unwrap();
    assert_eq!((written.written, written.skipped), (2, 0));
    let retried = [step(1), step(2), step(3)];
    let retried_events = [events[0].clone(), events[1].clone(), retried[2].clone()];
    let written = store
        .append_events_and_frames(&retried_events, &fenced(1..=3, "a"))
        .await
        .unwrap();
    assert_eq!((written.written, written.skipped), (1, 2));
    let stored = store
        .list_events(&crate::EventQuery::run("t1", "r1"))
        .await
        .unwrap();
    let stored_ids: Vec<_> = stored.iter().map(|e| e.event_id).collect();
    assert_eq!(
        stored_ids,
        retried_events
            .iter()
            .map(|e| e.event_id)
            .collect::<Vec<_>>(),
        "each event once, in order"
    );
    assert_eq!(ids(&*store, "r1").await, [1, 2, 3]);

    assert!(matches!(
        store
            .append_events_and_frames(&[step(4)], &fenced(4..=4, "b"))
            .await,
        Err(Error::LeaseLost(_))
    ));
    assert_eq!(
        ids(&*store, "r1").await,
        [1, 2, 3],
        "no frame past the fence"
    );
    let written = store
        .append_events_and_frames(&[], &fenced(4..=5, "a"))
        .await
        .unwrap();
    assert_eq!((written.written, written.skipped), (2, 0));
    assert_eq!(ids(&*store, "r1").await, [1, 2, 3, 4, 5]);
}

/// At the start of a single-process backend, every active or leased run is an orphan,
/// whatever its lease says; a run that never logged a frame gets a log of its closing frames.
/// A fenced append lands only while its owner holds the lease; after another process
/// recovered the run (or took its expired lease) the stale owner's frames are refused
/// whole, the log keeps the recovery's closing frames, and an unfenced append still works.
pub async fn streams_fenced_appends_need_the_lease_and_lose_it_to_a_recovery(
    store: Arc<dyn Store>,
) {
    run_in(&*store, "t1", "r1", RunStatus::Running).await;
    let fenced = |ids, owner: &str| FrameBatch {
        lease_owner: Some(owner.to_owned()),
        ..batch("t1", "r1", ids, false)
    };
    assert!(matches!(
        store.append_frames(&fenced(1..=1, "a")).await,
        Err(Error::LeaseLost(run)) if run == "r1"
    ));
    assert!(
        ids(&*store, "r1").await.is_empty(),
        "no lease, nothing written"
    );
    assert!(
        store
            .acquire_run_lease("r1", "a", Duration::ZERO)
            .await
            .unwrap()
    );
    let written = store.append_frames(&fenced(1..=2, "a")).await.unwrap();
    assert_eq!((written.written, written.skipped), (2, 0));
    assert!(matches!(
        store.append_frames(&fenced(3..=3, "b")).await,
        Err(Error::LeaseLost(_))
    ));

    // The lease expired (ttl 0): another process recovers the run.
    recover_expired(&*store, "r1").await;
    let recovered = ids(&*store, "r1").await;
    assert_eq!(recovered, [1, 2, 3, 4]);
    assert!(matches!(
        store.append_frames(&fenced(3..=5, "a")).await,
        Err(Error::LeaseLost(_))
    ));
    assert_eq!(
        ids(&*store, "r1").await,
        recovered,
        "the stale owner wrote nothing"
    );
    let frames = store.read_frames("r1", 2, 10).await.unwrap();
    assert_eq!(
        frames[0].event,
        closing()[0].event,
        "frame 3 is the recovery's"
    );

    run_in(&*store, "t1", "r2", RunStatus::Running).await;
    assert!(store.acquire_run_lease("r2", "a", LIVE).await.unwrap());
    assert!(
        store
            .acquire_run_lease("r2", "b", Duration::ZERO)
            .await
            .is_ok()
    );
    store
        .append_frames(&batch("t1", "r2", 1..=1, false))
        .await
        .expect("an unfenced append needs no lease");
}

/// A run's status, usage and checkpoint writes made under a lease owner land only while
/// it holds the run's lease: after another process recovered the run, each is refused
/// with [`Error::LeaseLost`] and changes nothing; the same writes without an owner work.
pub async fn streams_fenced_status_usage_and_checkpoints_need_the_lease(store: Arc<dyn Store>) {
    run_in(&*store, "t1", "r1", RunStatus::Running).await;
    assert!(
        store
            .acquire_run_lease("r1", "a", Duration::ZERO)
            .await
            .unwrap()
    );
    let usage = |tokens: i64| crate::RunUsage {
        total_tokens: tokens,
        ..Default::default()
    };
    let checkpoint = |id: &str, owner: Option<&str>| crate::NewCheckpoint {
        thread_id: "t1".into(),
        checkpoint_id: id.into(),
        parent_checkpoint_id: None,
        run_id: Some("r1".into()),
        values: json!({"messages": []}),
        metadata: Map::new(),
        lease_owner: owner.map(str::to_owned),
    };
    assert!(
        store
            .save_run_usage("r1", &usage(5), Some("a"))
            .await
            .unwrap()
    );
    store
        .put_checkpoint(checkpoint("c1", Some("a")))
        .await
        .expect("the holder writes");

    recover_expired(&*store, "r1").await;
    assert!(matches!(
        store.save_run_usage("r1", &usage(9), Some("a")).await,
        Err(Error::LeaseLost(_))
    ));
    assert!(matches!(
        store.put_checkpoint(checkpoint("c2", Some("a"))).await,
        Err(Error::LeaseLost(_))
    ));
    let late = RunStatusUpdate {
        lease_owner: Some("a".into()),
        status: RunStatus::Success,
        stop_reason: None,
        error: None,
    };
    assert!(matches!(
        store.update_run_status("r1", &late).await,
        Err(Error::LeaseLost(_)) | Ok(false)
    ));
    let run = store.get_run("t1", "r1").await.unwrap().unwrap();
    assert_eq!(run.usage.total_tokens, 5, "the stale usage did not land");
    assert_eq!(run.status, RunStatus::Error, "the recovery's status stays");
    let latest = store.latest_checkpoint("t1").await.unwrap().unwrap();
    assert_eq!(
        latest.checkpoint_id, "c1",
        "the stale checkpoint did not land"
    );

    assert!(store.save_run_usage("r1", &usage(7), None).await.unwrap());
    store
        .put_checkpoint(checkpoint("c3", None))
        .await
        .expect("an unfenced write needs no lease");
    let orphan_owner = crate::NewCheckpoint {
        run_id: None,
        ..checkpoint("c4", Some("a"))
    };
    assert!(
        store
            .put_checkpoint(orphan_owner)
            .await
            .unwrap_err()
            .is_invalid_input(),
        "a lease owner without a run is refused"
    );
}

pub async fn streams_startup_recovery_takes_every_active_run(store: Arc<dyn Store>) {
    run_in(&*store, "t1", "pending", RunStatus::Pending).await;
    run_in(&*store, "t1", "leased", RunStatus::Running).await;
    run_in(&*store, "t1", "done", RunStatus::Success).await;
    assert!(
        store
            .acquire_run_lease("leased", "previous", LIVE)
            .await
            .unwrap()
    );
    assert_eq!(
        orphans(&*store, OrphanScope::AllActive).await,
        BTreeSet::from(["pending".to_owned(), "leased".to_owned()])
    );
    for run in ["pending", "leased"] {
        let recovered = store
            .recover_orphan(run, OrphanScope::AllActive, &orphan_update(), &closing())
            .await
            .unwrap()
            .expect("recovered");
        assert!(recovered.was_active);
        assert_eq!(
            store.get_run("t1", run).await.unwrap().unwrap().status,
            RunStatus::Error
        );
    }
    assert_eq!(ids(&*store, "pending").await, [1, 2]);
    let log = store.stream_log("pending").await.unwrap().unwrap();
    assert_eq!((log.last_id, log.ended), (2, true));
    assert!(orphans(&*store, OrphanScope::AllActive).await.is_empty());
    assert!(
        store
            .recover_orphan("done", OrphanScope::AllActive, &orphan_update(), &closing())
            .await
            .unwrap()
            .is_none()
    );
}

/// A cancel request is stored for an active run only, announced, and taken once.
pub async fn streams_cancel_requests_are_stored_taken_once_and_announced(store: Arc<dyn Store>) {
    run_in(&*store, "t1", "r1", RunStatus::Running).await;
    run_in(&*store, "t1", "r2", RunStatus::Success).await;
    run_in(&*store, "t1", "r3", RunStatus::Pending).await;
    let mut notices = store.listen().await.unwrap();
    assert!(store.request_cancel("r1").await.unwrap());
    assert_eq!(
        next_notice(&mut notices).await,
        StreamNotice::CancelRequested {
            run_id: "r1".into()
        }
    );
    assert!(!store.request_cancel("r2").await.unwrap(), "already ended");
    assert!(!store.request_cancel("missing").await.unwrap());
    assert!(store.request_cancel("r3").await.unwrap());
    let runs = ["r1".to_owned(), "r2".to_owned(), "r3".to_owned()];
    let mut taken = store.take_cancel_requests(&runs).await.unwrap();
    taken.sort();
    assert_eq!(taken, ["r1", "r3"]);
    assert!(store.take_cancel_requests(&runs).await.unwrap().is_empty());
    assert!(store.request_cancel("r1").await.unwrap());
    assert!(store.acquire_run_lease("r1", "a", LIVE).await.unwrap());
    assert!(store.release_run_lease("r1", "a").await.unwrap());
    assert!(
        store.take_cancel_requests(&runs).await.unwrap().is_empty(),
        "released with the lease"
    );
}

/// A task cancel request is stored for a task of an active run only, announced like a
/// run's, taken once per task, and forgotten with the run's lease.
pub async fn streams_task_cancel_requests_are_stored_per_task_taken_once_and_announced(
    store: Arc<dyn Store>,
) {
    run_in(&*store, "t1", "r1", RunStatus::Running).await;
    run_in(&*store, "t1", "r2", RunStatus::Success).await;
    let mut notices = store.listen().await.unwrap();
    assert!(store.request_task_cancel("r1", "call_b").await.unwrap());
    assert_eq!(
        next_notice(&mut notices).await,
        StreamNotice::CancelRequested {
            run_id: "r1".into()
        }
    );
    assert!(store.request_task_cancel("r1", "call_a").await.unwrap());
    assert!(
        store.request_task_cancel("r1", "call_a").await.unwrap(),
        "a repeat is one request"
    );
    assert!(
        !store.request_task_cancel("r2", "call_a").await.unwrap(),
        "ended"
    );
    assert!(
        !store
            .request_task_cancel("missing", "call_a")
            .await
            .unwrap()
    );
    let runs = ["r1".to_owned(), "r2".to_owned()];
    // A run's own cancel requests are apart from its tasks'.
    assert!(store.take_cancel_requests(&runs).await.unwrap().is_empty());
    assert_eq!(
        store.take_task_cancel_requests(&runs).await.unwrap(),
        [
            ("r1".to_owned(), "call_a".to_owned()),
            ("r1".to_owned(), "call_b".to_owned())
        ]
    );
    assert!(
        store
            .take_task_cancel_requests(&runs)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.request_task_cancel("r1", "call_c").await.unwrap());
    assert!(store.acquire_run_lease("r1", "a", LIVE).await.unwrap());
    assert!(store.release_run_lease("r1", "a").await.unwrap());
    assert!(
        store
            .take_task_cancel_requests(&runs)
            .await
            .unwrap()
            .is_empty(),
        "released with the lease"
    );
}

/// Appends, the end of a log and recoveries are announced with the log's latest id.
pub async fn streams_appends_and_recoveries_are_announced_with_the_last_id(store: Arc<dyn Store>) {
    run_in(&*store, "t1", "r1", RunStatus::Running).await;
    run_in(&*store, "t1", "r2", RunStatus::Running).await;
    let mut notices = store.listen().await.unwrap();
    store
        .append_frames(&batch("t1", "r1", 1..=3, false))
        .await
        .unwrap();
    assert_eq!(
        next_notice(&mut notices).await,
        StreamNotice::Appended {
            run_id: "r1".into(),
            last_id: 3
        }
    );
    store
        .append_frames(&batch("t1", "r1", 4..=4, true))
        .await
        .unwrap();
    assert_eq!(
        next_notice(&mut notices).await,
        StreamNotice::Appended {
            run_id: "r1".into(),
            last_id: 4
        }
    );
    assert!(
        store
            .acquire_run_lease("r2", "gone", Duration::ZERO)
            .await
            .unwrap()
    );
    store
        .recover_orphan(
            "r2",
            OrphanScope::ExpiredLeases,
            &orphan_update(),
            &closing(),
        )
        .await
        .unwrap()
        .expect("recovered");
    assert_eq!(
        next_notice(&mut notices).await,
        StreamNotice::Appended {
            run_id: "r2".into(),
            last_id: 2
        }
    );
}
