//! Batch conformance cases for control and bookkeeping: cancel, retry, deletion with the
//! thread, worker heartbeats, totals and concurrent claim passes.

use std::sync::Arc;

use super::*;

/// docs/batches.md#item-states: cancel stops every non-terminal item at once (leases cleared,
/// `Cancelled by user`), keeps finished ones, and fences the workers' late writes.
pub async fn batches_cancel_stops_every_item_at_once_and_fences_late_writes(store: Arc<dyn Store>) {
    let id = submit(&*store, new_batch("a", 5, 3, 2, 3)).await.id;
    let claimed = pass(&*store, &claim(WORKER, 2, LIVE)).await;
    let (done, running) = (claimed.claimed[0].lease(), claimed.claimed[1].lease());
    store.finish_success(&done, &success("kept")).await.unwrap();
    store.mark_running(&running).await.unwrap();
    let cancelled = store.cancel_batch(&owner(), &id).await.unwrap().unwrap();
    assert_eq!(cancelled.status, BatchStatus::Cancelled);
    assert!(cancelled.completed_at.is_some());
    assert_eq!(cancelled.counts, counts(0, 0, 0, 0, [1, 0, 4]));
    for item in items(&*store, &id).await {
        if item.id == done.item_id {
            assert_eq!(item.status, BatchItemStatus::Succeeded);
            assert_eq!(item.cancel_requested_at, None);
            continue;
        }
        assert_eq!(item.status, BatchItemStatus::Cancelled, "{item:?}");
        assert_eq!(item.error.as_deref(), Some(CANCELLED_BY_USER));
        assert!(item.cancel_requested_at.is_some());
        assert!(item.completed_at.is_some());
        assert_eq!((item.lease_owner, item.lease_expires_at), (None, None));
    }
    assert_eq!(
        store.renew_lease(&running, LIVE).await.unwrap(),
        Renewal::CancelRequested
    );
    assert_eq!(
        store
            .finish_success(&running, &success("late"))
            .await
            .unwrap(),
        None
    );
    assert!(
        pass(&*store, &claim(WORKER, 5, LIVE))
            .await
            .claimed
            .is_empty()
    );
    let again = store.cancel_batch(&owner(), &id).await.unwrap().unwrap();
    assert_eq!(again, cancelled, "cancelling twice changes nothing");
    let paused = store.pause_batch(&owner(), &id).await.unwrap().unwrap();
    assert_eq!(paused.status, BatchStatus::Cancelled);
    assert_counts_match(&*store, &id).await;
}

/// docs/batches.md#routes: only failed items retry, never in a cancelled batch; a retry
/// resets the item and revives a finished batch.
pub async fn batches_retry_revives_a_failed_item_and_its_batch(store: Arc<dyn Store>) {
    let id = submit(&*store, new_batch("a", 2, 2, 2, 1)).await.id;
    let claimed = pass(&*store, &claim(WORKER, 2, LIVE)).await;
    let (bad, good) = (claimed.claimed[0].lease(), claimed.claimed[1].lease());
    store.finish_failure(&bad, &failure("boom")).await.unwrap();
    store.finish_success(&good, &success("fine")).await.unwrap();
    assert_eq!(batch(&*store, &id).await.status, BatchStatus::Completed);
    assert_eq!(
        store
            .retry_item(&owner(), &id, &good.item_id)
            .await
            .unwrap(),
        RetryOutcome::NotFailed
    );
    assert_eq!(
        store
            .retry_item(&owner(), &id, "batch-item-unknown")
            .await
            .unwrap(),
        RetryOutcome::NotFailed
    );
    let RetryOutcome::Retried { batch, item } =
        store.retry_item(&owner(), &id, &bad.item_id).await.unwrap()
    else {
        panic!("a failed item retries");
    };
    assert_eq!(item.status, BatchItemStatus::Pending);
    assert_eq!((item.attempt, item.retries), (0, 1), "the retry is counted");
    assert_eq!(
        (
            item.error,
            item.result,
            item.acceptance_verdict,
            item.completed_at
        ),
        (None, None, None, None)
    );
    assert_eq!(batch.status, BatchStatus::Queued);
    assert_eq!(batch.completed_at, None);
    assert_eq!(batch.counts, counts(1, 0, 0, 0, [1, 0, 0]));
    assert_eq!(self::batch(&*store, &id).await, *batch);
    let again = only(&pass(&*store, &claim(WORKER, 1, LIVE)).await);
    assert_eq!(again.item_id, bad.item_id);
    store
        .finish_failure(&again, &failure("boom"))
        .await
        .unwrap();
    assert_eq!(
        self::batch(&*store, &id).await.status,
        BatchStatus::Completed
    );
    let ran_again = self::item(&*store, &id, &bad.item_id).await;
    assert_eq!(
        (ran_again.status, ran_again.attempt, ran_again.retries),
        (BatchItemStatus::Failed, 1, 1),
        "an item that failed again after a retry still shows it ran before"
    );
    let listed = items(&*store, &id).await;
    assert!(listed.iter().any(|i| i.id == bad.item_id && i.retries == 1));

    let other = submit(&*store, new_batch("b", 2, 2, 2, 1)).await.id;
    let lease = pass(&*store, &claim(WORKER, 1, LIVE)).await.claimed[0].lease();
    store
        .finish_failure(&lease, &failure("boom"))
        .await
        .unwrap();
    assert_eq!(
        store
            .retry_item(&owner(), &id, &lease.item_id)
            .await
            .unwrap(),
        RetryOutcome::NotFailed,
        "an item of another batch"
    );
    store.cancel_batch(&owner(), &other).await.unwrap();
    assert_eq!(
        store
            .retry_item(&owner(), &other, &lease.item_id)
            .await
            .unwrap(),
        RetryOutcome::BatchCancelled
    );
    assert_eq!(
        self::item(&*store, &other, &lease.item_id).await.status,
        BatchItemStatus::Failed
    );
}

/// Deleting a thread deletes its batches and their items, and no other thread's.
pub async fn batches_go_with_their_thread(store: Arc<dyn Store>) {
    for thread in ["t1", "t2"] {
        store
            .create_thread(NewThread {
                thread_id: thread.into(),
                owner: "u1".into(),
                metadata: Map::new(),
            })
            .await
            .unwrap();
    }
    let gone = submit(&*store, new_batch("a", 3, 2, 1, 1)).await.id;
    let item_id = items(&*store, &gone).await[0].id.clone();
    let mut kept = new_batch("b", 2, 2, 1, 1);
    kept.thread_id = "t2".into();
    let kept = submit(&*store, kept).await.id;
    assert!(store.delete_thread("t1").await.unwrap());
    assert_eq!(store.get_batch(&owner(), &gone).await.unwrap(), None);
    assert_eq!(
        store.get_item(&owner(), &gone, &item_id).await.unwrap(),
        None
    );
    let totals = store.batch_totals().await.unwrap();
    assert_eq!(
        totals.items.total(),
        2,
        "only the kept batch's items remain"
    );
    assert!(
        store
            .get_batch(&BatchScope::user("u1"), &kept)
            .await
            .unwrap()
            .is_some()
    );
    // The key of a deleted batch may be used again.
    submit(&*store, new_batch("a", 1, 1, 1, 1)).await;
}

/// Heartbeats upsert one row per worker; live workers are those heard from within
/// the window; a stopping worker removes its row.
pub async fn batches_heartbeats_count_live_workers(store: Arc<dyn Store>) {
    let worker = |id: &str| WorkerHeartbeat {
        worker_id: id.into(),
        hostname: "host-a".into(),
        started_at: crate::now_rfc3339(),
    };
    assert_eq!(store.live_workers(LIVE).await.unwrap(), 0);
    store.heartbeat(&worker("w1")).await.unwrap();
    store.heartbeat(&worker("w1")).await.unwrap();
    store.heartbeat(&worker("w2")).await.unwrap();
    assert_eq!(store.live_workers(LIVE).await.unwrap(), 2);
    assert_eq!(
        store.live_workers(Duration::ZERO).await.unwrap(),
        0,
        "no heartbeat is younger than nothing"
    );
    assert!(store.remove_worker("w1").await.unwrap());
    assert!(!store.remove_worker("w1").await.unwrap());
    assert_eq!(store.live_workers(LIVE).await.unwrap(), 1);
}

/// The gauges' totals: batches per status (all six) and items per status over every
/// user.
pub async fn batches_totals_count_batches_and_items_by_status(store: Arc<dyn Store>) {
    let empty = store.batch_totals().await.unwrap();
    assert_eq!(empty.batches.len(), 6);
    assert!(empty.batches.iter().all(|(_, n)| *n == 0));
    let a = submit(&*store, new_batch("a", 3, 3, 1, 1)).await.id;
    let mut other = new_batch("b", 2, 2, 2, 1);
    other.user_id = "u2".into();
    submit(&*store, other).await;
    let lease = only(&pass(&*store, &claim(WORKER, 1, LIVE)).await);
    store.mark_running(&lease).await.unwrap();
    store.pause_batch(&owner(), &a).await.unwrap();
    let totals = store.batch_totals().await.unwrap();
    let of = |status| {
        totals
            .batches
            .iter()
            .find(|(s, _)| *s == status)
            .map(|(_, n)| *n)
    };
    assert_eq!(of(BatchStatus::Paused), Some(1));
    assert_eq!(of(BatchStatus::Queued), Some(1));
    assert_eq!(of(BatchStatus::Completed), Some(0));
    assert_eq!(totals.items, counts(0, 4, 0, 1, [0, 0, 0]));
}

/// Concurrent passes of several workers never lease one item twice and never exceed
/// a batch's running cap.
pub async fn batches_concurrent_claim_passes_never_lease_an_item_twice(store: Arc<dyn Store>) {
    let id = submit(&*store, new_batch("a", 40, 40, 12, 1)).await.id;
    let mut passes = Vec::new();
    for worker in 0..6 {
        let store = store.clone();
        passes.push(tokio::spawn(async move {
            let mut claimed = Vec::new();
            for _ in 0..3 {
                let request = claim(&format!("{worker:032x}"), 2, LIVE);
                let pass = store.claim_pass(&request).await.expect("claim pass");
                claimed.extend(pass.claimed.into_iter().map(|c| c.item.id));
            }
            claimed
        }));
    }
    let mut all = Vec::new();
    for pass in passes {
        all.extend(pass.await.unwrap());
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "an item was leased twice");
    assert!(!all.is_empty());
    assert!(
        all.len() <= 12,
        "the running cap of 12 holds: {}",
        all.len()
    );
    let batch = batch(&*store, &id).await;
    assert_eq!(batch.counts.leased, all.len() as u64);
    assert_counts_match(&*store, &id).await;
}
