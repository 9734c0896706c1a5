//! The background work of a serving gateway (docs/api.md#resume-and-rejoin, docs/api.md#cancel): relaying the store's
//! notices to this process's watchers and cancel requests to the runs executing here,
//! pruning logs past `streams.retention_seconds`, and recovering orphaned runs — at
//! start on a single-process store, and every third of a lease on a shared one.

use std::time::Duration;

use serde_json::{Map, json};
use subflow_contracts::{
    EventCategory, EventType, NewEvent, RunStatus, RunStopReason, ThreadStatus,
};
use subflow_store::{NewFrame, OrphanScope, OrphanedRun, RunStatusUpdate, StreamNotice};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::AppState;

/// The failure a recovered run reports.
pub(crate) const ORPHAN_MESSAGE: &str =
    "The process executing the run stopped before the run ended (its run lease expired)";

/// How often cancel requests for runs executing here are read, in case a notice was lost.
const CANCEL_POLL: Duration = Duration::from_secs(1);

/// How long a failed `LISTEN` waits before it is tried again.
const LISTEN_RETRY: Duration = Duration::from_secs(1);

/// Orphans recovered per sweep.
const SWEEP_LIMIT: u32 = 100;

/// The running background work; it stops when this is dropped.
#[derive(Debug)]
pub(crate) struct Upkeep {
    _stop: DropGuard,
}

/// Recovers what a stopped process left behind, then starts the background work.
pub(crate) async fn start(state: &AppState) -> Upkeep {
    if !state.store.is_shared() {
        // One process per store: every run still active was left by a process that
        // stopped. Pass after pass, until a pass finds nothing more to recover.
        while recover_orphans(state, OrphanScope::AllActive).await > 0 {}
    }
    let stop = CancellationToken::new();
    tokio::spawn(relay_notices(state.clone(), stop.clone()));
    tokio::spawn(prune(state.clone(), stop.clone()));
    if state.store.is_shared() {
        tokio::spawn(sweep_orphans(state.clone(), stop.clone()));
    }
    Upkeep {
        _stop: stop.drop_guard(),
    }
}

/// Relays store notices to watchers and cancels runs executing here that someone asked
/// to cancel: on a notice, and on a shared store every [`CANCEL_POLL`] regardless, since
/// a notice sent while the `LISTEN` connection was down is lost.
async fn relay_notices(state: AppState, stop: CancellationToken) {
    let mut poll = tokio::time::interval(CANCEL_POLL);
    let shared = state.store.is_shared();
    loop {
        let mut notices = tokio::select! {
            () = stop.cancelled() => return,
            listened = state.store.listen() => match listened {
                Ok(notices) => notices,
                Err(error) => {
                    tracing::warn!(%error, "listening for stream notices failed; retrying");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(LISTEN_RETRY) => continue,
                    }
                }
            },
        };
        // Whatever happened while nobody listened must be re-read.
        state.streams.announce(StreamNotice::Resync);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                notice = notices.recv() => {
                    let Some(notice) = notice else { break };
                    match &notice {
                        StreamNotice::CancelRequested { run_id } => {
                            cancel_requested(&state, vec![run_id.clone()]).await;
                        }
                        StreamNotice::Resync => {
                            cancel_requested(&state, state.active.run_ids()).await;
                        }
                        StreamNotice::Appended { .. } => {}
                    }
                    state.streams.announce(notice);
                }
                _ = poll.tick(), if shared => {
                    cancel_requested(&state, state.active.run_ids()).await;
                }
            }
        }
    }
}

/// Cancels the runs among `run_ids` that execute here and have a cancel request, and
/// the tasks of theirs that have one.
async fn cancel_requested(state: &AppState, mut run_ids: Vec<String>) {
    run_ids.retain(|run_id| state.active.get(run_id).is_some());
    if run_ids.is_empty() {
        return;
    }
    match state.store.take_cancel_requests(&run_ids).await {
        Ok(requested) => {
            for run_id in requested {
                if let Some(run) = state.active.get(&run_id) {
                    tracing::info!(run_id, "cancelling the run on a remote request");
                    run.cancel.cancel();
                }
            }
        }
        Err(error) => tracing::warn!(%error, "reading cancel requests failed"),
    }
    match state.store.take_task_cancel_requests(&run_ids).await {
        Ok(requested) => {
            for (run_id, task_id) in requested {
                if let Some(run) = state.active.get(&run_id) {
                    tracing::info!(run_id, task_id, "cancelling a task on a remote request");
                    run.tasks.cancel(&task_id);
                }
            }
        }
        Err(error) => tracing::warn!(%error, "reading task cancel requests failed"),
    }
}

/// Prunes logs past the retention, every minute (or every retention, when shorter).
async fn prune(state: AppState, stop: CancellationToken) {
    let retention = state.streams.config().retention;
    let every = retention.clamp(Duration::from_secs(1), Duration::from_secs(60));
    let mut ticks = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => match state.store.prune_streams(retention).await {
                Ok(0) => {}
                Ok(pruned) => tracing::debug!(pruned, "pruned stream logs"),
                Err(error) => tracing::warn!(%error, "pruning stream logs failed"),
            },
        }
    }
}

/// Recovers runs whose lease expired, at start and every third of a lease.
async fn sweep_orphans(state: AppState, stop: CancellationToken) {
    let every = (state.streams.config().lease / 3).max(Duration::from_millis(100));
    let mut ticks = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {
                recover_orphans(&state, OrphanScope::ExpiredLeases).await;
            }
        }
    }
}

/// Recovers up to [`SWEEP_LIMIT`] runs orphaned in `scope`; returns how many.
pub(crate) async fn recover_orphans(state: &AppState, scope: OrphanScope) -> usize {
    let orphans = match state.store.find_orphaned_runs(scope, SWEEP_LIMIT).await {
        Ok(orphans) => orphans,
        Err(error) => {
            tracing::warn!(%error, "looking for orphaned runs failed");
            return 0;
        }
    };
    let mut recovered = 0;
    for orphan in orphans {
        if state.active.get(&orphan.run_id).is_some() {
            // Executing here: its lease is renewed by its own pump.
            continue;
        }
        if recover(state, &orphan, scope).await {
            recovered += 1;
        }
    }
    recovered
}

/// Makes one orphan `error`/`orphan_recovered`, closes its log with `error` and `end`,
/// and records the failure as `run.error` and `run.end` (`recovered: true`) events with
/// the thread in `error`.
async fn recover(state: &AppState, orphan: &OrphanedRun, scope: OrphanScope) -> bool {
    let update = RunStatusUpdate {
        lease_owner: None,
        status: RunStatus::Error,
        stop_reason: Some(RunStopReason::OrphanRecovered),
        error: Some(ORPHAN_MESSAGE.to_owned()),
    };
    let closing = [
        NewFrame {
            event: "error".into(),
            data: json!({"message": ORPHAN_MESSAGE, "name": "OrphanRecovered"}).to_string(),
        },
        NewFrame {
            event: "end".into(),
            data: "null".into(),
        },
    ];
    let run_id = orphan.run_id.as_str();
    let recovered = match state
        .store
        .recover_orphan(run_id, scope, &update, &closing)
        .await
    {
        Ok(Some(recovered)) => recovered,
        Ok(None) => return false,
        Err(error) => {
            tracing::error!(%error, run_id, "recovering an orphaned run failed");
            return false;
        }
    };
    tracing::warn!(run_id, thread_id = %recovered.thread_id, "recovered an orphaned run");
    if recovered.was_active {
        let owner = match state.store.get_run(&recovered.thread_id, run_id).await {
            Ok(run) => run.map(|r| r.owner),
            Err(_) => None,
        };
        let metadata = Map::from_iter([("error_type".to_owned(), json!("OrphanRecovered"))]);
        let event = NewEvent::new(
            &recovered.thread_id,
            run_id,
            EventType::RunError.as_str(),
            EventCategory::Error.as_str(),
            json!(ORPHAN_MESSAGE),
            metadata,
        )
        .with_user(owner.clone());
        // After the takeover made the status durable: the run's one `run.end` (docs/events.md#catalogue).
        let end = NewEvent::run_end(
            &recovered.thread_id,
            run_id,
            RunStatus::Error,
            json!({}),
            true,
        )
        .with_user(owner);
        if let Err(error) = state.store.append(&[event, end]).await {
            tracing::error!(%error, run_id, "recording the recovery as run.error and run.end failed");
        }
        if let Err(error) = state
            .store
            .set_thread_status(&recovered.thread_id, ThreadStatus::Error)
            .await
        {
            tracing::error!(%error, run_id, "marking the recovered run's thread failed");
        }
    }
    true
}
