//! The worker's behaviours of docs/batches.md, each on the memory store and on SQLite.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;
use subflow_batches::item::item_prompt;
use subflow_batches::{AttemptEnd, Options, Step};
use subflow_contracts::{BatchItemStatus, BatchStatus};
use subflow_runtime::admission::{AdmissionConfig, AdmissionPolicy};
use subflow_store::batches::{BatchScope, DRAINED_STALE_EXECUTION, STOPPED_BEFORE_ADMISSION};
use subflow_store::{BatchStore, ClaimRequest};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::faults::Faults;
use crate::harness::{Backend, Ends, env, run_until_idle, subagent_turns};

/// One `#[tokio::test]` per backend, on paused time, for `async fn $name(Backend)`.
macro_rules! on_every_backend {
    ($($name:ident),+ $(,)?) => {
        mod memory {
            $(#[tokio::test(start_paused = true)]
            async fn $name() { super::$name(super::Backend::Memory).await })+
        }
        mod sqlite {
            $(#[tokio::test(start_paused = true)]
            async fn $name() { super::$name(super::Backend::Sqlite).await })+
        }
    };
}

on_every_backend!(
    items_complete_with_their_results_as_soon_as_they_end,
    a_failing_item_is_retried_until_max_attempts_then_fails_the_batch,
    results_are_capped_and_errors_cut_at_4000_characters,
    cancelling_the_batch_stops_a_running_item_at_its_next_renewal,
    a_lost_lease_cancels_the_local_execution_and_writes_nothing,
    an_admission_rejection_gives_the_attempt_back,
    shutdown_finalises_nothing_and_hands_back_claims_that_land_during_it,
    a_reclaimed_item_whose_old_execution_still_runs_is_drained_first,
    a_failed_outcome_write_is_retried_once_then_the_claim_is_released,
    a_claim_that_cannot_be_marked_running_is_handed_back_once_the_store_takes_writes,
    a_running_worker_heartbeats_and_leaves_no_row_when_stopped,
    a_freed_slot_is_refilled_at_once_not_at_the_next_poll,
);

fn slow() -> serde_json::Value {
    subagent_turns(json!([{"text": "late", "delay_ms": 600_000}]))
}

async fn items_complete_with_their_results_as_soon_as_they_end(backend: Backend) {
    let env = env(backend, json!([]), AdmissionConfig::default()).await;
    let prompts = ["Summarise A", "Summarise B", "Summarise C"];
    let batch = env.submit(&prompts, 3, 3).await;
    let ends = Arc::new(Ends::default());
    let mut worker = env.worker(&ends, |_| {});
    let began = Instant::now();
    let step = worker.claim_and_run_once().await.unwrap();
    assert_eq!(
        step,
        Step::Pass {
            claimed: 3,
            started: 3,
            released: 0,
            recovered: 0
        }
    );
    worker.wait_idle().await;
    assert!(
        began.elapsed() < Duration::from_secs(40),
        "finalised without waiting for a renewal"
    );
    let stored = env.batch(&batch.id).await;
    assert_eq!(stored.status, BatchStatus::Completed);
    assert_eq!(stored.counts.succeeded, 3);
    assert!(stored.completed_at.is_some());
    for (item, prompt) in env.items(&batch.id).await.iter().zip(prompts) {
        assert_eq!(item.status, BatchItemStatus::Succeeded);
        assert_eq!(item.attempt, 1);
        // Every subagent answers `echo: <its prompt>`: the prompt is the preamble first.
        let expected = format!("echo: {}", item_prompt(&item.item_key, prompt));
        assert!(expected.starts_with(&format!(
            "echo: [Durable batch item \"{}\"] This item may be executed more than once",
            item.item_key
        )));
        assert_eq!(item.result.as_deref(), Some(expected.as_str()));
        assert_eq!(item.result_preview.as_deref(), Some(expected.as_str()));
        assert!(!item.result_truncated);
        assert_eq!(item.model_name.as_deref(), Some("scripted"));
        let usage = item.token_usage.expect("usage is summed");
        assert!(usage.total_tokens > 0);
        assert_eq!(usage.total_tokens, usage.input_tokens + usage.output_tokens);
        assert_eq!(item.error, None);
    }
    assert_eq!(
        ends.seen(),
        [AttemptEnd::Finished(BatchItemStatus::Succeeded); 3]
    );
    assert_eq!(worker.handle().executions(), 0);
}

async fn a_failing_item_is_retried_until_max_attempts_then_fails_the_batch(backend: Backend) {
    let failing = subagent_turns(json!([{"error": "provider down"}]));
    let env = env(backend, failing, AdmissionConfig::default()).await;
    let batch = env.submit(&["Try it"], 2, 1).await;
    let ends = Arc::new(Ends::default());
    let mut worker = env.worker(&ends, |_| {});

    worker.claim_and_run_once().await.unwrap();
    worker.wait_idle().await;
    let item = &env.items(&batch.id).await[0];
    assert_eq!((item.status, item.attempt), (BatchItemStatus::Queued, 1));
    assert_eq!(
        item.error.as_deref(),
        Some("The model request failed: provider down")
    );
    assert_eq!(env.batch(&batch.id).await.status, BatchStatus::Running);

    assert_eq!(run_until_idle(&mut worker).await, 1);
    let item = &env.items(&batch.id).await[0];
    assert_eq!((item.status, item.attempt), (BatchItemStatus::Failed, 2));
    let stored = env.batch(&batch.id).await;
    assert_eq!(stored.status, BatchStatus::Failed);
    assert_eq!(
        ends.seen(),
        [
            AttemptEnd::Finished(BatchItemStatus::Queued),
            AttemptEnd::Finished(BatchItemStatus::Failed)
        ]
    );
}

async fn results_are_capped_and_errors_cut_at_4000_characters(backend: Backend) {
    let rules = json!([
        {"agent": "subagent:general-purpose", "contains": "long answer", "turns": [{"text": "é".repeat(1500)}]},
        {"agent": "subagent:general-purpose", "contains": "long failure", "turns": [{"error": "x".repeat(5000)}]}
    ]);
    let env = env(backend, rules, AdmissionConfig::default()).await;
    let batch = env.submit(&["a long answer", "a long failure"], 1, 2).await;
    let ends = Arc::new(Ends::default());
    let mut worker = env.worker(&ends, |options| {
        options.max_result_chars = 1000;
        options.result_preview_max_chars = 64;
    });
    run_until_idle(&mut worker).await;
    let items = env.items(&batch.id).await;
    let answer = &items[0];
    assert_eq!(answer.status, BatchItemStatus::Succeeded);
    assert!(answer.result_truncated);
    assert_eq!(answer.result.as_deref(), Some("é".repeat(1000).as_str()));
    assert_eq!(
        answer.result_preview.as_deref(),
        Some("é".repeat(64).as_str())
    );
    let failure = &items[1];
    assert_eq!(failure.status, BatchItemStatus::Failed);
    let error = failure.error.as_deref().unwrap();
    assert_eq!(error.chars().count(), 4000);
    assert!(error.starts_with("The model request failed: xxx"));
    assert_eq!(env.batch(&batch.id).await.status, BatchStatus::Completed);
}

async fn cancelling_the_batch_stops_a_running_item_at_its_next_renewal(backend: Backend) {
    let env = env(backend, slow(), AdmissionConfig::default()).await;
    let batch = env.submit(&["Take your time"], 3, 1).await;
    let ends = Arc::new(Ends::default());
    let mut worker = env.worker(&ends, |_| {});
    let began = Instant::now();
    worker.claim_and_run_once().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        env.items(&batch.id).await[0].status,
        BatchItemStatus::Running
    );

    let scope = BatchScope::user("u1");
    env.store.cancel_batch(&scope, &batch.id).await.unwrap();
    let item = &env.items(&batch.id).await[0];
    assert_eq!(item.status, BatchItemStatus::Cancelled, "fenced at once");
    worker.wait_idle().await;
    // The renewal at 40 s found the cancel request; the model would have taken 600 s.
    assert!(began.elapsed() < Duration::from_secs(60));
    assert_eq!(ends.seen(), [AttemptEnd::Stopped]);
    let item = &env.items(&batch.id).await[0];
    assert_eq!(item.status, BatchItemStatus::Cancelled);
    assert_eq!(item.error.as_deref(), Some("Cancelled by user"));
    assert_eq!(item.result, None);
    assert_eq!(env.batch(&batch.id).await.status, BatchStatus::Cancelled);
}

async fn a_lost_lease_cancels_the_local_execution_and_writes_nothing(backend: Backend) {
    let env = env(backend, slow(), AdmissionConfig::default()).await;
    let batch = env.submit(&["Take your time"], 3, 1).await;
    let ends = Arc::new(Ends::default());
    let mut worker = env.worker(&ends, |_| {});
    let began = Instant::now();
    worker.claim_and_run_once().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The database clock passes the lease; another worker recovers and claims the item.
    env.clock.advance(Duration::from_secs(121));
    let other = env
        .store
        .claim_pass(&ClaimRequest {
            hostname: "elsewhere".into(),
            worker_id: "f".repeat(32),
            free_slots: 1,
            lease: Duration::from_secs(120),
            admitted: 0,
        })
        .await
        .unwrap();
    assert_eq!((other.expired, other.claimed.len()), (1, 1));

    worker.wait_idle().await;
    assert!(began.elapsed() < Duration::from_secs(60));
    assert_eq!(ends.seen(), [AttemptEnd::Stopped]);
    let item = &env.items(&batch.id).await[0];
    assert_eq!(item.status, BatchItemStatus::Leased);
    assert_eq!(item.lease_owner, Some(other.lease_owner.clone()));
    assert_eq!(item.attempt, 2, "the first attempt ran, so it counts");
}

async fn an_admission_rejection_gives_the_attempt_back(backend: Backend) {
    let admission = AdmissionConfig {
        max_running: 1,
        admission_policy: AdmissionPolicy::Reject,
        ..AdmissionConfig::default()
    };
    let env = env(backend, json!([]), admission).await;
    let batch = env.submit(&["Wait your turn"], 3, 1).await;
    // A `task` execution holds the process's only slot.
    let held = env.runtime.admission().admit().await.unwrap();
    let ends = Arc::new(Ends::default());
    let mut worker = env.worker(&ends, |_| {});
    worker.claim_and_run_once().await.unwrap();
    worker.wait_idle().await;
    assert_eq!(ends.seen(), [AttemptEnd::Released]);
    let item = &env.items(&batch.id).await[0];
    assert_eq!((item.status, item.attempt), (BatchItemStatus::Queued, 0));
    assert_eq!(
        item.error.as_deref(),
        Some("Subagent admission rejected: all 1 execution slots are busy")
    );

    drop(held);
    run_until_idle(&mut worker).await;
    let item = &env.items(&batch.id).await[0];
    assert_eq!((item.status, item.attempt), (BatchItemStatus::Succeeded, 1));
}

async fn shutdown_finalises_nothing_and_hands_back_claims_that_land_during_it(backend: Backend) {
    let env = env(backend, slow(), AdmissionConfig::default()).await;
    let running = env.submit(&["Already running"], 3, 1).await;
    let ends = Arc::new(Ends::default());
    let gate = Arc::new(Semaphore::new(1));
    let mut faults = Faults::new(env.batches());
    faults.claim_gate = Some(gate.clone());
    let faults = Arc::new(faults);
    let store: Arc<dyn BatchStore> = faults.clone();
    let mut options = Options::new(store, env.runtime.clone(), "test-host");
    options.metrics = ends.clone();
    let worker = options.build().unwrap();
    let handle = worker.handle();
    let stop = CancellationToken::new();
    let began = Instant::now();
    let task = tokio::spawn(worker.run(stop.clone().cancelled_owned()));

    // The first pass (through the gate's one permit) starts the running item.
    faults.claim_ran.notified().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(handle.executions(), 1);
    assert_eq!(
        env.items(&running.id).await[0].status,
        BatchItemStatus::Running
    );

    // The next pass claims a new item and is held; shutdown arrives meanwhile.
    let landing = env.submit(&["Claimed during shutdown"], 3, 1).await;
    faults.claim_ran.notified().await;
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(10)).await;
    gate.add_permits(1);
    task.await.unwrap().unwrap();
    assert!(began.elapsed() <= Duration::from_secs(6));
    assert!(!handle.is_running());
    assert_eq!(handle.executions(), 0);

    let landed = &env.items(&landing.id).await[0];
    assert_eq!(
        (landed.status, landed.attempt),
        (BatchItemStatus::Queued, 0)
    );
    assert_eq!(landed.error.as_deref(), Some(STOPPED_BEFORE_ADMISSION));
    let still = &env.items(&running.id).await[0];
    assert_eq!(
        still.status,
        BatchItemStatus::Running,
        "nothing is finalised; lease expiry hands the item on"
    );
    assert_eq!(still.result, None);
    let mut seen = ends.seen();
    seen.sort_by_key(|end| format!("{end:?}"));
    assert_eq!(seen, [AttemptEnd::Released, AttemptEnd::Stopped]);
}

async fn a_reclaimed_item_whose_old_execution_still_runs_is_drained_first(backend: Backend) {
    let env = env(backend, slow(), AdmissionConfig::default()).await;
    let batch = env.submit(&["Take your time"], 3, 1).await;
    let ends = Arc::new(Ends::default());
    let mut worker = env.worker(&ends, |_| {});
    worker.claim_and_run_once().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The lease ran out while this process still runs the item, and it claims it again.
    env.clock.advance(Duration::from_secs(121));
    let step = worker.claim_and_run_once().await.unwrap();
    assert_eq!(
        step,
        Step::Pass {
            claimed: 1,
            started: 0,
            released: 1,
            recovered: 1
        }
    );
    assert_eq!(
        worker.handle().executions(),
        0,
        "the stale execution is gone"
    );
    let item = &env.items(&batch.id).await[0];
    assert_eq!(item.status, BatchItemStatus::Queued);
    assert_eq!(item.error.as_deref(), Some(DRAINED_STALE_EXECUTION));
    assert_eq!(item.attempt, 1, "the release used no attempt");
    assert_eq!(ends.seen(), [AttemptEnd::Stopped, AttemptEnd::Released]);
}

async fn a_failed_outcome_write_is_retried_once_then_the_claim_is_released(backend: Backend) {
    let env = env(backend, json!([]), AdmissionConfig::default()).await;
    let batch = env.submit(&["First", "Second"], 3, 1).await;
    let ends = Arc::new(Ends::default());
    let faults = Arc::new(Faults::new(env.batches()));
    let store: Arc<dyn BatchStore> = faults.clone();
    let mut options = Options::new(store, env.runtime.clone(), "test-host");
    options.metrics = ends.clone();
    let mut worker = options.build().unwrap();

    faults.failing_finishes.store(1, Ordering::SeqCst);
    worker.claim_and_run_once().await.unwrap();
    worker.wait_idle().await;
    assert_eq!(faults.finish_calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        env.items(&batch.id).await[0].status,
        BatchItemStatus::Succeeded
    );

    faults.failing_finishes.store(2, Ordering::SeqCst);
    worker.claim_and_run_once().await.unwrap();
    worker.wait_idle().await;
    assert_eq!(
        faults.finish_calls.load(Ordering::SeqCst),
        4,
        "one retry only"
    );
    let second = &env.items(&batch.id).await[1];
    assert_eq!(
        (second.status, second.attempt),
        (BatchItemStatus::Queued, 0),
        "handed back at once, its attempt given back, not left to lease expiry: {second:?}"
    );
    assert_eq!(
        second.error.as_deref(),
        Some(subflow_store::batches::OUTCOME_UNSTORED)
    );
    assert_eq!(
        ends.seen(),
        [
            AttemptEnd::Finished(BatchItemStatus::Succeeded),
            AttemptEnd::Released
        ]
    );
    worker.claim_and_run_once().await.unwrap();
    worker.wait_idle().await;
    assert_eq!(
        env.items(&batch.id).await[1].status,
        BatchItemStatus::Succeeded,
        "it ran again"
    );
}

async fn a_claim_that_cannot_be_marked_running_is_handed_back_once_the_store_takes_writes(
    backend: Backend,
) {
    let env = env(backend, json!([]), AdmissionConfig::default()).await;
    let batch = env.submit(&["Only"], 3, 1).await;
    let ends = Arc::new(Ends::default());
    let faults = Arc::new(Faults::new(env.batches()));
    faults.leave_leased.store(true, Ordering::SeqCst);
    let store: Arc<dyn BatchStore> = faults.clone();
    let mut options = Options::new(store, env.runtime.clone(), "test-host");
    options.metrics = ends.clone();
    let mut worker = options.build().unwrap();

    // The store takes no writes: marking the item running fails, and so do the first
    // three hand-backs (each tried twice) before one lands.
    faults.failing_starts.store(1, Ordering::SeqCst);
    faults.failing_releases.store(3, Ordering::SeqCst);
    worker.claim_and_run_once().await.unwrap();
    worker.wait_idle().await;
    assert_eq!(faults.release_calls.load(Ordering::SeqCst), 4);
    let item = &env.items(&batch.id).await[0];
    assert_eq!(
        (item.status, item.attempt),
        (BatchItemStatus::Queued, 0),
        "handed back, its attempt given back, not left leased for a lease: {item:?}"
    );
    assert_eq!(
        item.error.as_deref(),
        Some(subflow_store::batches::START_UNSTORED)
    );
    assert_eq!(ends.seen(), [AttemptEnd::Released]);

    worker.claim_and_run_once().await.unwrap();
    worker.wait_idle().await;
    assert_eq!(
        env.items(&batch.id).await[0].status,
        BatchItemStatus::Succeeded,
        "it ran again"
    );
}

async fn a_running_worker_heartbeats_and_leaves_no_row_when_stopped(backend: Backend) {
    let env = env(backend, json!([]), AdmissionConfig::default()).await;
    let ends = Arc::new(Ends::default());
    let worker = env.worker(&ends, |_| {});
    let handle = worker.handle();
    assert_eq!(handle.max_running(), 3);
    assert_eq!(handle.worker_id().len(), 32);
    let stop = CancellationToken::new();
    let task = tokio::spawn(worker.run(stop.clone().cancelled_owned()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(handle.is_running());
    let lease = Duration::from_secs(120);
    assert_eq!(env.store.live_workers(lease).await.unwrap(), 1);
    // A batch submitted while it runs is picked up by its claim passes.
    let batch = env.submit(&["Pick me up"], 3, 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(env.batch(&batch.id).await.status, BatchStatus::Completed);
    stop.cancel();
    task.await.unwrap().unwrap();
    assert!(!handle.is_running());
    assert_eq!(env.store.live_workers(lease).await.unwrap(), 0);
}

async fn a_freed_slot_is_refilled_at_once_not_at_the_next_poll(backend: Backend) {
    let admission = AdmissionConfig {
        max_running: 2,
        ..AdmissionConfig::default()
    };
    let second = subagent_turns(json!([{"text": "ok", "delay_ms": 1000}]));
    let env = env(backend, second, admission).await;
    let batch = env.submit(&["A", "B", "C", "D", "E", "F"], 3, 2).await;
    let ends = Arc::new(Ends::default());
    let worker = env.worker(&ends, |options| {
        options.poll_interval = Duration::from_secs(3600);
    });
    let stop = CancellationToken::new();
    let began = Instant::now();
    let task = tokio::spawn(worker.run(stop.clone().cancelled_owned()));
    while env.batch(&batch.id).await.status != BatchStatus::Completed {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Three rounds of two one-second items, the first claimed by the first poll and
    // each later one as soon as a slot freed, not an hour later at the next poll.
    let took = began.elapsed();
    assert!(took < Duration::from_secs(60), "{took:?}");
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(env.batch(&batch.id).await.counts.succeeded, 6);
}
