//! The property test of durable batches: random histories of submits, claims,
//! mark-running, renewals, outcomes, releases, lease expiries, pauses, resumes, cancels
//! and retries, with the invariants checked after every step. Backends run it from
//! their own tests with `proptest`, on a fresh store per history.
//!
//! Expiry comes from a lease of 0 (ended by the next call on any backend) and, when the
//! store reads a [`ManualClock`], from moving that clock past 30-second leases.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use subflow_contracts::{BatchItemStatus, BatchStatus};

use crate::batches::ManualClock;
use crate::{
    BatchCounts, BatchItem, BatchQuery, BatchRecord, BatchScope, ClaimRequest, ItemFailure,
    ItemLease, ItemQuery, ItemSuccess, NewBatch, NewItem, ReleaseReason, Renewal, Store,
};

/// How long a claim's lease lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseLength {
    /// Ended by the next call.
    Ended,
    /// 30 seconds: expires when the test clock moves far enough.
    Short,
    /// 10 minutes.
    Long,
}

impl LeaseLength {
    fn duration(self) -> Duration {
        match self {
            LeaseLength::Ended => Duration::ZERO,
            LeaseLength::Short => Duration::from_secs(30),
            LeaseLength::Long => Duration::from_secs(600),
        }
    }
}

/// One step of a history. Indexes pick among what exists (modulo its count), so every
/// generated history is meaningful; a `lease` index may name a lease that is stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Submit a batch; `again` resubmits the key of an earlier batch instead.
    Submit {
        /// 1–6 items.
        items: u8,
        /// `max_live_items`.
        live: u8,
        /// `max_running_items` (at most `live`).
        running: u8,
        /// `max_attempts`.
        attempts: u8,
        /// Reuse an earlier submission key.
        again: bool,
    },
    /// A claim pass of one of three workers.
    Claim {
        /// Which worker.
        worker: u8,
        /// Its free slots.
        free: u8,
        /// Of those, the admission slots it holds: claims that start running at once.
        admitted: u8,
        /// The lease it takes.
        lease: LeaseLength,
    },
    /// Mark a claimed item running.
    MarkRunning {
        /// Which lease.
        lease: u8,
    },
    /// Renew a lease (to 0 when `end`, i.e. let it expire).
    Renew {
        /// Which lease.
        lease: u8,
        /// Renew to 0 instead of 10 minutes.
        end: bool,
    },
    /// Finish with a result.
    Succeed {
        /// Which lease.
        lease: u8,
    },
    /// Finish with an error.
    Fail {
        /// Which lease.
        lease: u8,
    },
    /// Hand the claim back.
    Release {
        /// Which lease.
        lease: u8,
        /// Which of the three reasons.
        reason: u8,
    },
    /// Move the test clock forward (no-op without one).
    Advance {
        /// Seconds.
        seconds: u16,
    },
    /// Pause a batch.
    Pause {
        /// Which batch.
        batch: u8,
    },
    /// Resume a batch.
    Resume {
        /// Which batch.
        batch: u8,
    },
    /// Cancel a batch.
    Cancel {
        /// Which batch.
        batch: u8,
    },
    /// Retry an item of a batch.
    Retry {
        /// Which batch.
        batch: u8,
        /// Which item (position).
        item: u8,
    },
}

fn lease_length() -> impl Strategy<Value = LeaseLength> {
    prop_oneof![
        Just(LeaseLength::Ended),
        Just(LeaseLength::Short),
        Just(LeaseLength::Long)
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let index = any::<u8>();
    prop_oneof![
        2 => (1u8..=6, 1u8..=4, 1u8..=4, 1u8..=3, prop::bool::weighted(0.15)).prop_map(
            |(items, live, running, attempts, again)| Op::Submit {
                items,
                live,
                running: running.min(live),
                attempts,
                again,
            }
        ),
        4 => (0u8..3, 0u8..=4, 0u8..=4, lease_length()).prop_map(
            |(worker, free, admitted, lease)| Op::Claim {
                worker,
                free,
                admitted: admitted.min(free),
                lease,
            }
        ),
        3 => index.prop_map(|lease| Op::MarkRunning { lease }),
        2 => (index, any::<bool>()).prop_map(|(lease, end)| Op::Renew { lease, end }),
        3 => index.prop_map(|lease| Op::Succeed { lease }),
        3 => index.prop_map(|lease| Op::Fail { lease }),
        2 => (index, 0u8..3).prop_map(|(lease, reason)| Op::Release { lease, reason }),
        2 => (1u16..=90).prop_map(|seconds| Op::Advance { seconds }),
        1 => index.prop_map(|batch| Op::Pause { batch }),
        1 => index.prop_map(|batch| Op::Resume { batch }),
        1 => index.prop_map(|batch| Op::Cancel { batch }),
        2 => (index, index).prop_map(|(batch, item)| Op::Retry { batch, item }),
    ]
}

/// Histories of 1–`max_len` steps.
pub fn history(max_len: usize) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..=max_len)
}

/// Everything the checker reads back after a step.
#[derive(Debug, Clone, PartialEq)]
struct State {
    batches: Vec<(BatchRecord, Vec<BatchItem>)>,
}

impl State {
    fn item(&self, item_id: &str) -> Option<(&BatchRecord, &BatchItem)> {
        self.batches.iter().find_map(|(batch, items)| {
            items
                .iter()
                .find(|item| item.id == item_id)
                .map(|item| (batch, item))
        })
    }
}

fn scope() -> BatchScope {
    BatchScope::thread("u1", "t1")
}

async fn read(store: &dyn Store, ids: &[String]) -> State {
    let mut batches = Vec::new();
    for id in ids {
        let batch = store
            .get_batch(&scope(), id)
            .await
            .expect("get_batch")
            .expect("a submitted batch exists");
        let query = ItemQuery {
            status: None,
            offset: 0,
            limit: 500,
        };
        let mut items = Vec::new();
        for listed in store.list_items(&scope(), id, &query).await.expect("list") {
            // Read each item whole, result included.
            items.push(
                store
                    .get_item(&scope(), id, &listed.id)
                    .await
                    .expect("get_item")
                    .expect("a listed item exists"),
            );
        }
        batches.push((batch, items));
    }
    State { batches }
}

/// The invariants every state satisfies.
fn check_state(state: &State, step: usize, op: &Op) {
    for (batch, items) in &state.batches {
        let at = format!("after step {step} ({op:?}), batch {}", batch.id);
        assert_eq!(
            batch.counts,
            BatchCounts::of(items.iter().map(|i| i.status)),
            "{at}: counts equal the items' statuses"
        );
        assert_eq!(batch.total_items, items.len() as u64, "{at}");
        assert!(
            batch.counts.active() <= u64::from(batch.max_live_items),
            "{at}: live cap"
        );
        assert!(
            batch.counts.leased_or_running() <= u64::from(batch.max_running_items),
            "{at}: running cap"
        );
        for item in items {
            assert!(
                item.attempt <= batch.max_attempts,
                "{at}: attempts of {item:?}"
            );
            assert_eq!(
                item.status.is_leased(),
                item.lease_owner.is_some() && item.lease_expires_at.is_some(),
                "{at}: a lease exactly while leased or running: {item:?}"
            );
            assert_eq!(
                item.status.is_terminal(),
                item.completed_at.is_some(),
                "{at}: completed_at exactly when terminal: {item:?}"
            );
            if item.status == BatchItemStatus::Pending {
                assert_eq!(item.attempt, 0, "{at}: a pending item has no attempt");
            }
            if item.status == BatchItemStatus::Succeeded {
                assert!(item.result.is_some(), "{at}: {item:?}");
            }
        }
        let finished = batch.counts.unfinished() == 0;
        match batch.status {
            BatchStatus::Cancelled => {
                assert!(finished, "{at}: a cancelled batch has no live items");
                assert!(batch.completed_at.is_some(), "{at}");
            }
            BatchStatus::Completed | BatchStatus::Failed => {
                assert!(finished, "{at}: a finished batch has only finished items");
                assert!(batch.completed_at.is_some(), "{at}");
                let failed = batch.counts.failed > 0 && batch.counts.succeeded == 0;
                assert_eq!(batch.status == BatchStatus::Failed, failed, "{at}");
            }
            BatchStatus::Queued | BatchStatus::Running | BatchStatus::Paused => {
                assert!(
                    !finished,
                    "{at}: every item is finished, yet the batch is active"
                );
                assert_eq!(batch.completed_at, None, "{at}");
            }
        }
    }
}

/// What may differ between two states: a terminal item only moves by a retry of it
/// (failed → pending).
fn check_step(before: &State, after: &State, step: usize, op: &Op, retried: Option<&str>) {
    for (batch, items) in &after.batches {
        for item in items {
            let Some((_, old)) = before.item(&item.id) else {
                continue;
            };
            if old.status.is_terminal() && old.status != item.status {
                assert_eq!(
                    (old.status, item.status, retried),
                    (
                        BatchItemStatus::Failed,
                        BatchItemStatus::Pending,
                        Some(item.id.as_str())
                    ),
                    "after step {step} ({op:?}): a terminal item of {} moved",
                    batch.id
                );
            }
        }
    }
}

/// Runs `ops` on `store` (a fresh one), checking the invariants after every step.
/// `clock` is the store's test clock, if it reads one.
pub async fn check_history(store: Arc<dyn Store>, clock: Option<Arc<ManualClock>>, ops: &[Op]) {
    let mut ids: Vec<String> = Vec::new();
    let mut keys: Vec<String> = Vec::new();
    let mut leases: Vec<ItemLease> = Vec::new();
    let mut state = read(&*store, &ids).await;
    let pick = |n: u8, len: usize| (len > 0).then(|| n as usize % len);
    for (step, op) in ops.iter().enumerate() {
        let mut retried: Option<String> = None;
        // A worker write with a lease its item no longer holds must change nothing.
        let mut stale = false;
        match op {
            Op::Submit {
                items,
                live,
                running,
                attempts,
                again,
            } => {
                let key = match pick(step as u8, keys.len()) {
                    Some(i) if *again => keys[i].clone(),
                    _ => format!("run:{step}"),
                };
                let new = NewBatch {
                    thread_id: "t1".into(),
                    user_id: "u1".into(),
                    run_id: Some("run".into()),
                    tool_call_id: Some(format!("call-{step}")),
                    submission_key: key.clone(),
                    title: String::new(),
                    subagent_type: "general-purpose".into(),
                    max_live_items: u32::from(*live),
                    max_running_items: u32::from(*running),
                    max_attempts: u32::from(*attempts),
                    execution_spec: serde_json::json!({}),
                    items: (0..*items)
                        .map(|i| NewItem {
                            item_key: format!("k{i}"),
                            prompt: format!("p{i}"),
                            acceptance_criteria: Vec::new(),
                        })
                        .collect(),
                };
                let submitted = store.submit_batch(new).await.expect("submit");
                if submitted.created {
                    assert!(
                        !keys.contains(&key),
                        "step {step}: a used key created a batch"
                    );
                    ids.push(submitted.batch.id);
                    keys.push(key);
                } else {
                    assert!(keys.contains(&key), "step {step}: a new key was refused");
                }
            }
            Op::Claim {
                worker,
                free,
                admitted,
                lease,
            } => {
                let request = ClaimRequest {
                    hostname: "host".into(),
                    worker_id: format!("{worker:032x}"),
                    free_slots: u32::from(*free),
                    lease: lease.duration(),
                    admitted: u32::from(*admitted),
                };
                let pass = store.claim_pass(&request).await.expect("claim pass");
                assert!(
                    pass.claimed.len() <= usize::from(*free),
                    "step {step}: more claims than free slots"
                );
                for (index, claimed) in pass.claimed.iter().enumerate() {
                    let before = state
                        .batches
                        .iter()
                        .find(|(b, _)| b.id == claimed.batch.id)
                        .map(|(b, _)| b.status);
                    assert!(
                        matches!(before, Some(BatchStatus::Queued | BatchStatus::Running)),
                        "step {step}: a claim in a batch that was {before:?}"
                    );
                    // The first `admitted` claims start running in the pass.
                    let expected = if index < usize::from(*admitted) {
                        BatchItemStatus::Running
                    } else {
                        BatchItemStatus::Leased
                    };
                    assert_eq!(claimed.item.status, expected, "step {step}");
                    if expected == BatchItemStatus::Running {
                        assert!(
                            claimed.item.started_at.is_some(),
                            "step {step}: a claim started without started_at"
                        );
                    }
                    assert_eq!(claimed.item.lease_owner.as_ref(), Some(&pass.lease_owner));
                    leases.push(claimed.lease());
                }
            }
            Op::MarkRunning { lease }
            | Op::Renew { lease, .. }
            | Op::Succeed { lease }
            | Op::Fail { lease }
            | Op::Release { lease, .. } => {
                let Some(index) = pick(*lease, leases.len()) else {
                    continue;
                };
                let lease = leases[index].clone();
                stale = state.item(&lease.item_id).is_none_or(|(_, item)| {
                    !item.status.is_leased()
                        || item.lease_owner.as_deref() != Some(&lease.lease_owner)
                });
                let changed = match op {
                    Op::MarkRunning { .. } => store.mark_running(&lease).await.expect("mark"),
                    Op::Renew { end, .. } => {
                        let ttl = if *end {
                            Duration::ZERO
                        } else {
                            Duration::from_secs(600)
                        };
                        matches!(
                            store.renew_lease(&lease, ttl).await.expect("renew"),
                            Renewal::Held { .. }
                        )
                    }
                    Op::Succeed { .. } => {
                        let outcome = ItemSuccess {
                            result: format!("result of step {step}"),
                            result_preview: "result".into(),
                            result_truncated: false,
                            model_name: Some("m".into()),
                            stop_reason: None,
                            token_usage: None,
                        };
                        store
                            .finish_success(&lease, &outcome)
                            .await
                            .expect("success")
                            .is_some()
                    }
                    Op::Fail { .. } => {
                        let outcome = ItemFailure {
                            error: format!("error of step {step}"),
                            model_name: None,
                            stop_reason: None,
                            token_usage: None,
                        };
                        store
                            .finish_failure(&lease, &outcome)
                            .await
                            .expect("failure")
                            .is_some()
                    }
                    Op::Release { reason, .. } => {
                        let reason = match reason {
                            0 => ReleaseReason::AdmissionRejected("queue full".into()),
                            1 => ReleaseReason::ShutdownBeforeAdmission,
                            _ => ReleaseReason::StaleExecutionDrained,
                        };
                        store
                            .release_claim(&lease, &reason)
                            .await
                            .expect("release")
                            .is_some()
                    }
                    _ => unreachable!("matched above"),
                };
                if stale {
                    assert!(!changed, "step {step}: a stale lease wrote ({op:?})");
                }
            }
            Op::Advance { seconds } => {
                if let Some(clock) = &clock {
                    clock.advance(Duration::from_secs(u64::from(*seconds)));
                }
            }
            Op::Pause { batch } | Op::Resume { batch } | Op::Cancel { batch } => {
                let Some(index) = pick(*batch, ids.len()) else {
                    continue;
                };
                let id = &ids[index];
                let done = match op {
                    Op::Pause { .. } => store.pause_batch(&scope(), id).await,
                    Op::Resume { .. } => store.resume_batch(&scope(), id).await,
                    _ => store.cancel_batch(&scope(), id).await,
                };
                assert!(done.expect("control").is_some(), "step {step}: own batch");
            }
            Op::Retry { batch, item } => {
                let Some(index) = pick(*batch, ids.len()) else {
                    continue;
                };
                let (record, items) = &state.batches[index];
                let target = &items[*item as usize % items.len()];
                let outcome = store
                    .retry_item(&scope(), &record.id, &target.id)
                    .await
                    .expect("retry");
                if matches!(outcome, crate::RetryOutcome::Retried { .. }) {
                    assert_eq!(target.status, BatchItemStatus::Failed, "step {step}");
                    assert_ne!(record.status, BatchStatus::Cancelled, "step {step}");
                    retried = Some(target.id.clone());
                }
            }
        }
        let after = read(&*store, &ids).await;
        check_state(&after, step, op);
        check_step(&state, &after, step, op, retried.as_deref());
        if stale {
            assert_eq!(
                after, state,
                "step {step} ({op:?}): a stale lease owner changed something"
            );
        }
        state = after;
    }
    // Every claim ever made left a consistent record; the totals agree with the batches.
    let totals = store.batch_totals().await.expect("totals");
    let mut sum = BatchCounts::default();
    let mut per_status: HashMap<BatchStatus, u64> = HashMap::new();
    for (batch, _) in &state.batches {
        for (status, n) in batch.counts.iter() {
            sum.add(status, n);
        }
        *per_status.entry(batch.status).or_default() += 1;
    }
    assert_eq!(totals.items, sum);
    for (status, n) in totals.batches {
        assert_eq!(per_status.get(&status).copied().unwrap_or(0), n, "{status}");
    }
    let listed = store
        .list_batches(
            &BatchScope::user("u1"),
            &BatchQuery {
                status: None,
                limit: 100,
                offset: 0,
            },
        )
        .await
        .expect("list");
    assert_eq!(listed.len(), ids.len().min(100));
}
