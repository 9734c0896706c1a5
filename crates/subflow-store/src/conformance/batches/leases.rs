//! Batch conformance cases for claims and outcomes: promotion and leasing, pauses,
//! successes and failures, lease expiry with fencing, and releases.

use std::sync::Arc;

use super::*;

/// docs/batches.md#claim-pass: 4 items, live 2, running 1 give one lease; counts pending 2,
/// queued 1, leased 1. The claimed item carries its prompt, attempt 1 and the pass's
/// lease owner; the batch is running.
pub async fn batches_a_claim_promotes_up_to_live_and_leases_up_to_running(store: Arc<dyn Store>) {
    let id = submit(&*store, new_batch("a", 4, 2, 1, 3)).await.id;
    let first = pass(&*store, &claim(WORKER, 8, LIVE)).await;
    assert_eq!(first.promoted, 2);
    assert_eq!(first.expired, 0);
    assert_eq!(first.claimed.len(), 1);
    let claimed = &first.claimed[0];
    assert_eq!(claimed.item.item_key, "item-1");
    assert_eq!(claimed.item.prompt, "Analyse item 1");
    assert_eq!(claimed.item.status, BatchItemStatus::Leased);
    assert_eq!(claimed.item.attempt, 1);
    assert_eq!(claimed.batch.id, id);
    assert_eq!(claimed.batch.execution_spec["model"], "scripted");
    let owner_parts: Vec<&str> = first.lease_owner.split(':').collect();
    assert_eq!(owner_parts.len(), 3, "{}", first.lease_owner);
    assert_eq!(owner_parts[..2], ["host-a", WORKER]);
    assert_eq!(owner_parts[2].len(), 16);
    assert!(owner_parts[2].chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(claimed.item.lease_owner.as_ref(), Some(&first.lease_owner));
    let stored = batch(&*store, &id).await;
    assert_eq!(stored.status, BatchStatus::Running);
    assert_eq!(stored.counts, counts(2, 1, 1, 0, [0, 0, 0]));
    assert_counts_match(&*store, &id).await;

    let second = pass(&*store, &claim(WORKER, 8, LIVE)).await;
    assert!(second.claimed.is_empty(), "the running cap is reached");
    assert_ne!(
        second.lease_owner, first.lease_owner,
        "each pass mints a token"
    );
    for worker in ["", "worker-1", "0123456789ABCDEF0123456789abcdeg"] {
        let error = store.claim_pass(&claim(worker, 1, LIVE)).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("invalid query: worker_id must be 32 hex digits, got '{worker}'")
        );
    }
    let mut long_host = claim(WORKER, 0, LIVE);
    long_host.hostname = "h".repeat(300);
    assert_eq!(
        pass(&*store, &long_host).await.lease_owner.chars().count(),
        128
    );
}

/// A worker holding admission slots: the first `admitted` claims of the pass start
/// `running` (with `started_at`) in its transaction, the rest stay `leased`; a running
/// claim is held like any other, and `admitted` beyond `free_slots` is refused.
pub async fn batches_admitted_claims_start_running_in_the_pass(store: Arc<dyn Store>) {
    let id = submit(&*store, new_batch("a", 5, 5, 5, 3)).await.id;
    let mut request = claim(WORKER, 3, LIVE);
    request.admitted = 2;
    let first = pass(&*store, &request).await;
    let statuses: Vec<_> = first.claimed.iter().map(|c| c.item.status).collect();
    assert_eq!(
        statuses,
        [
            BatchItemStatus::Running,
            BatchItemStatus::Running,
            BatchItemStatus::Leased
        ]
    );
    assert!(first.claimed[0].item.started_at.is_some());
    assert!(first.claimed[2].item.started_at.is_none());
    assert!(first.claimed.iter().all(|c| c.item.attempt == 1));
    let stored = batch(&*store, &id).await;
    assert_eq!(stored.status, BatchStatus::Running);
    assert_eq!(stored.counts, counts(0, 2, 1, 2, [0, 0, 0]));
    assert_counts_match(&*store, &id).await;

    let running = first.claimed[0].lease();
    assert!(
        !store.mark_running(&running).await.expect("mark running"),
        "a running claim is not started twice"
    );
    assert_eq!(
        store
            .finish_success(&running, &success("done"))
            .await
            .expect("finish"),
        Some(BatchItemStatus::Succeeded)
    );
    assert!(
        store
            .mark_running(&first.claimed[2].lease())
            .await
            .expect("mark running")
    );
    assert_eq!(
        batch(&*store, &id).await.counts,
        counts(0, 2, 0, 2, [1, 0, 0])
    );
    assert_counts_match(&*store, &id).await;

    let mut over = claim(WORKER, 1, LIVE);
    over.admitted = 2;
    let error = store.claim_pass(&over).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid query: admitted (2) must not exceed free_slots (1)"
    );
    assert_eq!(
        batch(&*store, &id).await.counts,
        counts(0, 2, 0, 2, [1, 0, 0])
    );
}

/// Outcomes written together: each lands as its single write would, its status at its
/// index, a stale lease and a repeat fenced out (`None`) without spoiling the others,
/// both batches' counts kept; the same list again changes nothing.
pub async fn batches_finish_attempts_write_each_outcome_at_its_index(store: Arc<dyn Store>) {
    let a = submit(&*store, new_batch("a", 3, 3, 3, 2)).await.id;
    let b = submit(&*store, new_batch("b", 1, 1, 1, 1)).await.id;
    let claims = pass(&*store, &claim(WORKER, 4, LIVE)).await.claimed;
    assert_eq!(claims.len(), 4);
    let mut stale = claims[2].lease();
    stale.lease_owner.push('x');
    let outcomes = vec![
        (
            claims[0].lease(),
            AttemptOutcome::Succeeded(success("first")),
        ),
        (claims[1].lease(), AttemptOutcome::Failed(failure("boom"))),
        (stale, AttemptOutcome::Succeeded(success("stale"))),
        (claims[3].lease(), AttemptOutcome::Failed(failure("last"))),
        (
            claims[0].lease(),
            AttemptOutcome::Failed(failure("a repeat in the same call")),
        ),
    ];
    let statuses = store.finish_attempts(&outcomes).await.expect("finish");
    assert_eq!(
        statuses,
        [
            Some(BatchItemStatus::Succeeded),
            Some(BatchItemStatus::Queued),
            None,
            Some(BatchItemStatus::Failed),
            None,
        ]
    );
    let first = item(&*store, &a, &claims[0].item.id).await;
    assert_eq!(first.result.as_deref(), Some("first"));
    assert_eq!(first.token_usage.map(|u| u.total_tokens), Some(15));
    let second = item(&*store, &a, &claims[1].item.id).await;
    assert_eq!(second.error.as_deref(), Some("boom"));
    assert_eq!(second.status, BatchItemStatus::Queued);
    let third = item(&*store, &a, &claims[2].item.id).await;
    assert_eq!(
        third.status,
        BatchItemStatus::Leased,
        "the stale write changed nothing"
    );
    assert_eq!(
        batch(&*store, &a).await.counts,
        counts(0, 1, 1, 0, [1, 0, 0])
    );
    let other = batch(&*store, &b).await;
    assert_eq!(other.status, BatchStatus::Failed);
    assert_eq!(other.counts, counts(0, 0, 0, 0, [0, 1, 0]));
    assert_counts_match(&*store, &a).await;
    assert_counts_match(&*store, &b).await;

    let again = store
        .finish_attempts(&outcomes)
        .await
        .expect("finish again");
    assert_eq!(again, [None; 5]);
    assert_eq!(
        batch(&*store, &a).await.counts,
        counts(0, 1, 1, 0, [1, 0, 0])
    );
    assert!(
        store
            .finish_attempts(&[])
            .await
            .expect("nothing")
            .is_empty()
    );
}

/// Free slots are shared over the batches in creation order; no free slot still
/// promotes but leases nothing.
pub async fn batches_claims_share_free_slots_across_batches_in_creation_order(
    store: Arc<dyn Store>,
) {
    let a = submit(&*store, new_batch("a", 5, 5, 2, 3)).await.id;
    let b = submit(&*store, new_batch("b", 5, 5, 5, 3)).await.id;
    let idle = pass(&*store, &claim(WORKER, 0, LIVE)).await;
    assert!(idle.claimed.is_empty());
    assert_eq!(idle.promoted, 10);
    assert_eq!(batch(&*store, &a).await.status, BatchStatus::Queued);
    let first = pass(&*store, &claim(WORKER, 3, LIVE)).await;
    let mut got: Vec<(String, String)> = first
        .claimed
        .iter()
        .map(|c| (c.batch.id.clone(), c.item.item_key.clone()))
        .collect();
    got.sort();
    let mut want = vec![
        (a.clone(), "item-1".to_owned()),
        (a.clone(), "item-2".to_owned()),
        (b.clone(), "item-1".to_owned()),
    ];
    want.sort();
    assert_eq!(got, want);
    let again = pass(&*store, &claim(WORKER, 10, LIVE)).await;
    assert_eq!(again.claimed.len(), 4, "a is at its cap, b takes four more");
    assert!(again.claimed.iter().all(|c| c.batch.id == b));
    assert_eq!(
        batch(&*store, &a).await.counts,
        counts(0, 3, 2, 0, [0, 0, 0])
    );
    assert_eq!(
        batch(&*store, &b).await.counts,
        counts(0, 0, 5, 0, [0, 0, 0])
    );
    assert_counts_match(&*store, &a).await;
    assert_counts_match(&*store, &b).await;
}

/// docs/usage-and-cost.md#budgets: `mark_budget` keeps the highest level and returns the
/// one before, so each crossing is reported once; at the limit it pauses the batch with
/// `pause_reason` `budget`, which resume clears and a manual pause never sets.
pub async fn batches_a_budget_level_only_rises_and_its_limit_pauses_with_a_reason(
    store: Arc<dyn Store>,
) {
    let id = submit(&*store, new_batch("a", 3, 3, 3, 3)).await.id;
    let (marked, before) = store
        .mark_budget(&owner(), &id, 1, false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((before, marked.budget_level), (0, 1));
    assert_eq!(marked.status, BatchStatus::Queued);
    let (_, before) = store
        .mark_budget(&owner(), &id, 1, false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        before, 1,
        "a second worker at the same level reports nothing"
    );
    let (lower, before) = store
        .mark_budget(&owner(), &id, 0, false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((before, lower.budget_level), (1, 1), "a level never falls");
    let (stopped, before) = store
        .mark_budget(&owner(), &id, 3, true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(before, 1);
    assert_eq!(stopped.status, BatchStatus::Paused);
    assert_eq!(stopped.pause_reason.as_deref(), Some("budget"));
    assert_eq!(batch(&*store, &id).await, stopped, "stored as returned");
    assert!(
        pass(&*store, &claim(WORKER, 4, LIVE))
            .await
            .claimed
            .is_empty()
    );
    let resumed = store.resume_batch(&owner(), &id).await.unwrap().unwrap();
    assert_eq!(
        (resumed.status, resumed.pause_reason, resumed.budget_level),
        (BatchStatus::Queued, None, 3)
    );
    let by_hand = store.pause_batch(&owner(), &id).await.unwrap().unwrap();
    assert_eq!(
        (by_hand.status, by_hand.pause_reason),
        (BatchStatus::Paused, None)
    );
    let stranger = BatchScope::user("someone-else");
    assert_eq!(
        store.mark_budget(&stranger, &id, 3, true).await.unwrap(),
        None
    );
}

/// docs/batches.md#claim-pass: a paused batch gives no claims; pause applies to queued and
/// running batches only, resume to paused ones, and the rest are no-ops.
pub async fn batches_paused_batches_give_no_claims_until_resumed(store: Arc<dyn Store>) {
    let id = submit(&*store, new_batch("a", 2, 2, 2, 3)).await.id;
    let paused = store.pause_batch(&owner(), &id).await.unwrap().unwrap();
    assert_eq!(paused.status, BatchStatus::Paused);
    let again = store.pause_batch(&owner(), &id).await.unwrap().unwrap();
    assert_eq!(again, paused, "pausing a paused batch changes nothing");
    let idle = pass(&*store, &claim(WORKER, 4, LIVE)).await;
    assert!(idle.claimed.is_empty());
    assert_eq!(idle.promoted, 0, "a paused batch promotes nothing either");
    let resumed = store.resume_batch(&owner(), &id).await.unwrap().unwrap();
    assert_eq!(resumed.status, BatchStatus::Queued);
    let noop = store.resume_batch(&owner(), &id).await.unwrap().unwrap();
    assert_eq!(noop, resumed);
    let work = pass(&*store, &claim(WORKER, 1, LIVE)).await;
    assert_eq!(work.claimed.len(), 1);
    assert_eq!(batch(&*store, &id).await.status, BatchStatus::Running);
    let paused = store.pause_batch(&owner(), &id).await.unwrap().unwrap();
    assert_eq!(paused.status, BatchStatus::Paused, "a running batch pauses");
    assert!(
        pass(&*store, &claim(WORKER, 4, LIVE))
            .await
            .claimed
            .is_empty()
    );
    let lease = work.claimed[0].lease();
    assert!(
        store.mark_running(&lease).await.unwrap(),
        "a claimed item still runs"
    );
    let resumed = store.resume_batch(&owner(), &id).await.unwrap().unwrap();
    assert_eq!(resumed.status, BatchStatus::Queued);
    store
        .finish_success(&lease, &success("done"))
        .await
        .unwrap();
    assert_eq!(
        batch(&*store, &id).await.status,
        BatchStatus::Running,
        "a finalise with work remaining moves a queued batch to running"
    );
}

/// Mark running, renew and succeed: the item stores its result fields, the batch
/// completes once every item is terminal.
pub async fn batches_successes_complete_the_batch_with_their_results(store: Arc<dyn Store>) {
    let id = submit(&*store, new_batch("a", 2, 2, 2, 3)).await.id;
    let claimed = pass(&*store, &claim(WORKER, 2, LIVE)).await;
    assert_eq!(claimed.claimed.len(), 2);
    let first = claimed.claimed[0].lease();
    let second = claimed.claimed[1].lease();
    assert!(store.mark_running(&first).await.unwrap());
    assert!(
        !store.mark_running(&first).await.unwrap(),
        "already running"
    );
    let running = item(&*store, &id, &first.item_id).await;
    assert_eq!(running.status, BatchItemStatus::Running);
    assert!(running.started_at.is_some());
    let before = running.lease_expires_at.unwrap();
    let Renewal::Held { expires_at } = store.renew_lease(&first, LIVE).await.unwrap() else {
        panic!("the owner holds the lease");
    };
    assert!(expires_at >= before);
    assert_eq!(
        item(&*store, &id, &first.item_id).await.lease_expires_at,
        Some(expires_at)
    );
    assert_eq!(
        store
            .finish_success(&first, &success("first answer"))
            .await
            .unwrap(),
        Some(BatchItemStatus::Succeeded)
    );
    let done = item(&*store, &id, &first.item_id).await;
    assert_eq!(done.status, BatchItemStatus::Succeeded);
    assert_eq!(done.result.as_deref(), Some("first answer"));
    assert_eq!(done.result_preview.as_deref(), Some("first an"));
    assert_eq!(done.model_name.as_deref(), Some("scripted-1"));
    assert_eq!(done.token_usage.unwrap().total_tokens, 15);
    assert_eq!((done.lease_owner, done.lease_expires_at), (None, None));
    assert!(done.completed_at.is_some());
    assert_eq!(batch(&*store, &id).await.status, BatchStatus::Running);
    assert_eq!(
        store
            .finish_success(&first, &success("again"))
            .await
            .unwrap(),
        None,
        "a finished item takes no second outcome"
    );
    // A leased item that never ran may succeed too (fast executions).
    let mut truncated = success("second");
    truncated.result_truncated = true;
    truncated.stop_reason = Some(SubagentStopReason::TokenCapped);
    store.finish_success(&second, &truncated).await.unwrap();
    let second = item(&*store, &id, &second.item_id).await;
    assert!(second.result_truncated);
    assert_eq!(second.stop_reason, Some(SubagentStopReason::TokenCapped));
    let finished = batch(&*store, &id).await;
    assert_eq!(finished.status, BatchStatus::Completed);
    assert!(finished.completed_at.is_some());
    assert_eq!(finished.counts, counts(0, 0, 0, 0, [2, 0, 0]));
    assert_counts_match(&*store, &id).await;
}

/// docs/batches.md#item-states: a failure requeues the item while attempts remain (no backoff),
/// then fails it; a batch with failures and no success fails.
pub async fn batches_failures_requeue_until_max_attempts_then_fail_the_batch(
    store: Arc<dyn Store>,
) {
    let id = submit(&*store, new_batch("a", 1, 1, 1, 2)).await.id;
    let lease = only(&pass(&*store, &claim(WORKER, 1, LIVE)).await);
    store.mark_running(&lease).await.unwrap();
    assert_eq!(
        store
            .finish_failure(&lease, &failure("boom 1"))
            .await
            .unwrap(),
        Some(BatchItemStatus::Queued)
    );
    let requeued = item(&*store, &id, &lease.item_id).await;
    assert_eq!(requeued.attempt, 1);
    assert_eq!(requeued.error.as_deref(), Some("boom 1"));
    assert_eq!(requeued.lease_owner, None);
    assert_eq!(batch(&*store, &id).await.status, BatchStatus::Running);
    let retry = pass(&*store, &claim(WORKER, 1, LIVE)).await;
    let lease = only(&retry);
    assert_eq!(retry.claimed[0].item.attempt, 2);
    assert_eq!(
        store
            .finish_failure(&lease, &failure("boom 2"))
            .await
            .unwrap(),
        Some(BatchItemStatus::Failed)
    );
    let failed = item(&*store, &id, &lease.item_id).await;
    assert_eq!(failed.status, BatchItemStatus::Failed);
    assert_eq!(failed.attempt, 2);
    assert_eq!(failed.error.as_deref(), Some("boom 2"));
    assert_eq!(failed.stop_reason, Some(SubagentStopReason::TurnCapped));
    let failed_batch = batch(&*store, &id).await;
    assert_eq!(failed_batch.status, BatchStatus::Failed);
    assert!(failed_batch.completed_at.is_some());
    assert!(
        pass(&*store, &claim(WORKER, 1, LIVE))
            .await
            .claimed
            .is_empty()
    );
    let RetryOutcome::Retried { batch: revived, .. } = store
        .retry_item(&owner(), &id, &lease.item_id)
        .await
        .unwrap()
    else {
        panic!("a failed item retries");
    };
    assert_eq!(
        (revived.status, revived.completed_at),
        (BatchStatus::Queued, None),
        "a retry moves a failed batch back to queued"
    );
}

/// docs/batches.md#batch-states: failed and succeeded items give `completed`; a paused batch whose
/// last item finishes still completes.
pub async fn batches_mixed_outcomes_complete_and_paused_batches_still_finish(
    store: Arc<dyn Store>,
) {
    let id = submit(&*store, new_batch("a", 2, 2, 2, 1)).await.id;
    let claimed = pass(&*store, &claim(WORKER, 2, LIVE)).await;
    let (a, b) = (claimed.claimed[0].lease(), claimed.claimed[1].lease());
    store.finish_failure(&a, &failure("no")).await.unwrap();
    store.pause_batch(&owner(), &id).await.unwrap();
    store.finish_success(&b, &success("yes")).await.unwrap();
    let batch = batch(&*store, &id).await;
    assert_eq!(batch.status, BatchStatus::Completed);
    assert_eq!(batch.counts, counts(0, 0, 0, 0, [1, 1, 0]));
}

/// docs/batches.md#leases-and-fencing, docs/batches.md#item-states: an expired lease is recovered by the next pass; a
/// never-started item gets its attempt back; running after expiry is refused; the old
/// owner's writes change nothing after a reclaim; a running item at `max_attempts`
/// fails with the lease message.
pub async fn batches_expired_leases_are_recovered_and_the_old_owner_is_fenced_out(
    store: Arc<dyn Store>,
) {
    let id = submit(&*store, new_batch("a", 1, 1, 1, 2)).await.id;
    let stale = only(&pass(&*store, &claim(WORKER, 1, ENDED)).await);
    assert!(
        !store.mark_running(&stale).await.unwrap(),
        "a lease that ended by the database clock cannot start running"
    );
    let second = pass(&*store, &claim("ffffffffffffffffffffffffffffffff", 1, LIVE)).await;
    assert_eq!(second.expired, 1);
    let fresh = only(&second);
    assert_ne!(fresh.lease_owner, stale.lease_owner);
    assert_eq!(
        second.claimed[0].item.attempt, 1,
        "the unstarted attempt was given back"
    );
    assert_eq!(
        second.claimed[0].item.error.as_deref(),
        Some(LEASE_EXPIRED_RETRYING)
    );
    let before = item(&*store, &id, &fresh.item_id).await;
    assert!(!store.mark_running(&stale).await.unwrap());
    assert_eq!(
        store.renew_lease(&stale, LIVE).await.unwrap(),
        Renewal::Lost
    );
    assert_eq!(
        store
            .finish_success(&stale, &success("late"))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .finish_failure(&stale, &failure("late"))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .release_claim(&stale, &ReleaseReason::ShutdownBeforeAdmission)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        item(&*store, &id, &fresh.item_id).await,
        before,
        "the stale owner changed nothing"
    );
    // The new owner runs, stops renewing (a renewal of 0 ends the lease), and the
    // pass that finds it expired at max_attempts... has attempts left: attempt 1 of 2.
    assert!(store.mark_running(&fresh).await.unwrap());
    store.renew_lease(&fresh, ENDED).await.unwrap();
    let third = pass(&*store, &claim(WORKER, 1, LIVE)).await;
    assert_eq!(third.expired, 1);
    let last = only(&third);
    assert_eq!(
        third.claimed[0].item.attempt, 2,
        "a started attempt is not given back"
    );
    assert!(store.mark_running(&last).await.unwrap());
    store.renew_lease(&last, ENDED).await.unwrap();
    let fourth = pass(&*store, &claim(WORKER, 1, LIVE)).await;
    assert_eq!(fourth.expired, 1);
    assert!(fourth.claimed.is_empty());
    let failed = item(&*store, &id, &last.item_id).await;
    assert_eq!(failed.status, BatchItemStatus::Failed);
    assert_eq!(failed.attempt, 2);
    assert_eq!(failed.error.as_deref(), Some(LEASE_EXPIRED_FINAL));
    assert_eq!(batch(&*store, &id).await.status, BatchStatus::Failed);
    assert_counts_match(&*store, &id).await;
}

/// docs/batches.md#claim-pass: expired leases in a paused batch return to queued and wait for
/// the resume.
pub async fn batches_expired_leases_in_paused_batches_requeue_and_wait(store: Arc<dyn Store>) {
    let id = submit(&*store, new_batch("a", 1, 1, 1, 3)).await.id;
    let lease = only(&pass(&*store, &claim(WORKER, 1, LIVE)).await);
    store.mark_running(&lease).await.unwrap();
    store.pause_batch(&owner(), &id).await.unwrap();
    store.renew_lease(&lease, ENDED).await.unwrap();
    let recovery = pass(&*store, &claim(WORKER, 1, LIVE)).await;
    assert_eq!(recovery.expired, 1);
    assert!(recovery.claimed.is_empty());
    let waiting = item(&*store, &id, &lease.item_id).await;
    assert_eq!(waiting.status, BatchItemStatus::Queued);
    assert_eq!(waiting.attempt, 1);
    assert_eq!(batch(&*store, &id).await.status, BatchStatus::Paused);
    store.resume_batch(&owner(), &id).await.unwrap();
    let resumed = pass(&*store, &claim(WORKER, 1, LIVE)).await;
    assert_eq!(resumed.claimed.len(), 1);
    assert_eq!(resumed.claimed[0].item.attempt, 2);
}

/// docs/batches.md#item-states, docs/batches.md#claim-pass: admission rejection, shutdown before admission and a
/// drained stale execution requeue the item with their message and give the attempt
/// back.
pub async fn batches_releases_give_the_attempt_back_with_their_message(store: Arc<dyn Store>) {
    let id = submit(&*store, new_batch("a", 1, 1, 1, 1)).await.id;
    let reasons = [
        (
            ReleaseReason::AdmissionRejected("Subagent admission queue is full".into()),
            "Subagent admission queue is full",
        ),
        (
            ReleaseReason::ShutdownBeforeAdmission,
            STOPPED_BEFORE_ADMISSION,
        ),
        (
            ReleaseReason::StaleExecutionDrained,
            DRAINED_STALE_EXECUTION,
        ),
    ];
    for (reason, message) in reasons {
        let claimed = pass(&*store, &claim(WORKER, 1, LIVE)).await;
        assert_eq!(
            claimed.claimed[0].item.attempt, 1,
            "max_attempts 1 is never used up by releases"
        );
        let lease = only(&claimed);
        assert_eq!(
            store.release_claim(&lease, &reason).await.unwrap(),
            Some(BatchItemStatus::Queued)
        );
        let released = item(&*store, &id, &lease.item_id).await;
        assert_eq!(released.status, BatchItemStatus::Queued);
        assert_eq!(released.attempt, 0);
        assert_eq!(released.error.as_deref(), Some(message));
        assert_eq!(released.lease_owner, None);
        assert_eq!(
            store.release_claim(&lease, &reason).await.unwrap(),
            None,
            "a released claim is gone"
        );
    }
    assert_counts_match(&*store, &id).await;
}
