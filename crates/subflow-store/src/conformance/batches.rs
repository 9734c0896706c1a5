//! Conformance cases of [`BatchStore`](crate::BatchStore): durable batches, every
//! transition of SPEC §12.4 and §12.5, fencing, claims and heartbeats.
//!
//! [`conformance_tests!`](crate::conformance_tests) expands these through
//! [`batch_conformance_tests!`](crate::batch_conformance_tests), so every backend runs
//! them. Lease expiry is reached without waiting: a claim or renewal with a lease of 0
//! ends at once by any clock, the database's included.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, json};
use subflow_contracts::{BatchItemStatus, BatchStatus, SubagentStopReason};

use crate::batches::{
    CANCELLED_BY_USER, DEFAULT_TITLE, DRAINED_STALE_EXECUTION, EXPORT_PAGE, LEASE_EXPIRED_FINAL,
    LEASE_EXPIRED_RETRYING, STOPPED_BEFORE_ADMISSION,
};
use crate::{
    BatchCounts, BatchItem, BatchQuery, BatchRecord, BatchScope, ClaimPass, ClaimRequest, Error,
    ItemFailure, ItemLease, ItemQuery, ItemSuccess, ItemUsage, NewBatch, NewItem, NewThread,
    ReleaseReason, Renewal, RetryOutcome, Store, WorkerHeartbeat,
};

/// Expands to one `#[tokio::test]` per batch case; invoked by `conformance_tests!`.
#[doc(hidden)]
#[macro_export]
macro_rules! batch_conformance_tests {
    ($factory:expr) => {
        $crate::batch_conformance_tests!(@cases $factory;
            batches_submit_stores_a_queued_batch_of_pending_items,
            batches_a_duplicate_submission_key_inserts_nothing,
            batches_invalid_submissions_name_the_problem_and_write_nothing,
            batches_reads_are_scoped_to_the_owner_and_thread,
            batches_items_page_by_offset_and_status_and_export_in_pages_of_500,
            batches_a_claim_promotes_up_to_live_and_leases_up_to_running,
            batches_claims_share_free_slots_across_batches_in_creation_order,
            batches_paused_batches_give_no_claims_until_resumed,
            batches_successes_complete_the_batch_with_their_results,
            batches_failures_requeue_until_max_attempts_then_fail_the_batch,
            batches_mixed_outcomes_complete_and_paused_batches_still_finish,
            batches_expired_leases_are_recovered_and_the_old_owner_is_fenced_out,
            batches_expired_leases_in_paused_batches_requeue_and_wait,
            batches_releases_give_the_attempt_back_with_their_message,
            batches_cancel_stops_every_item_at_once_and_fences_late_writes,
            batches_retry_revives_a_failed_item_and_its_batch,
            batches_go_with_their_thread,
            batches_heartbeats_count_live_workers,
            batches_totals_count_batches_and_items_by_status,
            batches_concurrent_claim_passes_never_lease_an_item_twice,
        );
    };
    (@cases $factory:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $factory.await;
                $crate::conformance::batches::$case(fixture.store.clone()).await;
            }
        )+
    };
}

/// Long enough that a lease taken in a test never expires during it.
const LIVE: Duration = Duration::from_secs(600);

/// A lease that has ended by the time anyone reads it.
const ENDED: Duration = Duration::ZERO;

const WORKER: &str = "0123456789abcdef0123456789abcdef";

/// A batch of `n` items `item-1…` in thread `t1` of user `u1`.
pub fn new_batch(key: &str, n: usize, live: u32, running: u32, attempts: u32) -> NewBatch {
    NewBatch {
        thread_id: "t1".into(),
        user_id: "u1".into(),
        run_id: Some("r1".into()),
        tool_call_id: Some(format!("call-{key}")),
        submission_key: format!("r1:{key}"),
        title: "Analyse the items".into(),
        subagent_type: "general-purpose".into(),
        max_live_items: live,
        max_running_items: running,
        max_attempts: attempts,
        execution_spec: json!({"model": "scripted", "trace_id": "abc", "permissions": ["runs:write"]}),
        items: (1..=n)
            .map(|i| NewItem {
                item_key: format!("item-{i}"),
                prompt: format!("Analyse item {i}"),
                acceptance_criteria: vec![format!("mentions {i}")],
            })
            .collect(),
    }
}

fn owner() -> BatchScope {
    BatchScope::thread("u1", "t1")
}

/// A claim request of worker `worker` (a 32-hex id) with `free` slots.
pub fn claim(worker: &str, free: u32, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        hostname: "host-a".into(),
        worker_id: worker.into(),
        free_slots: free,
        lease,
    }
}

fn success(text: &str) -> ItemSuccess {
    ItemSuccess {
        result: text.into(),
        result_preview: text.chars().take(8).collect(),
        result_truncated: false,
        model_name: Some("scripted-1".into()),
        stop_reason: None,
        token_usage: Some(ItemUsage {
            input_tokens: 10,
            output_tokens: 5,
            total_tokens: 15,
        }),
    }
}

fn failure(text: &str) -> ItemFailure {
    ItemFailure {
        error: text.into(),
        model_name: Some("scripted-1".into()),
        stop_reason: Some(SubagentStopReason::TurnCapped),
        token_usage: None,
    }
}

async fn submit(store: &dyn Store, batch: NewBatch) -> BatchRecord {
    let submitted = store.submit_batch(batch).await.expect("submit");
    assert!(submitted.created);
    submitted.batch
}

async fn batch(store: &dyn Store, id: &str) -> BatchRecord {
    store
        .get_batch(&owner(), id)
        .await
        .unwrap()
        .expect("the batch exists")
}

async fn items(store: &dyn Store, id: &str) -> Vec<BatchItem> {
    let query = ItemQuery {
        status: None,
        offset: 0,
        limit: 500,
    };
    store.list_items(&owner(), id, &query).await.unwrap()
}

async fn item(store: &dyn Store, batch_id: &str, item_id: &str) -> BatchItem {
    store
        .get_item(&owner(), batch_id, item_id)
        .await
        .unwrap()
        .expect("the item exists")
}

async fn pass(store: &dyn Store, request: &ClaimRequest) -> ClaimPass {
    store.claim_pass(request).await.expect("claim pass")
}

fn counts(pending: u64, queued: u64, leased: u64, running: u64, done: [u64; 3]) -> BatchCounts {
    BatchCounts {
        pending,
        queued,
        leased,
        running,
        succeeded: done[0],
        failed: done[1],
        cancelled: done[2],
    }
}

/// Asserts the stored counts equal the items' statuses.
async fn assert_counts_match(store: &dyn Store, id: &str) {
    let batch = batch(store, id).await;
    let items = items(store, id).await;
    assert_eq!(
        batch.counts,
        BatchCounts::of(items.iter().map(|i| i.status)),
        "counts of {id}"
    );
    assert_eq!(batch.counts.total(), batch.total_items);
}

/// The one item a pass claimed.
fn only(pass: &ClaimPass) -> ItemLease {
    assert_eq!(pass.claimed.len(), 1, "{pass:#?}");
    pass.claimed[0].lease()
}

// ---------------------------------------------------------------------------------

/// Submit: `queued`, every item `pending` at attempt 0 in position order, public and
/// hidden fields stored, ids of the documented shape.
pub async fn batches_submit_stores_a_queued_batch_of_pending_items(store: Arc<dyn Store>) {
    let mut new = new_batch("a", 3, 2, 1, 3);
    new.title = "   ".into();
    let batch = submit(&*store, new).await;
    assert!(batch.id.starts_with("subagent-batch-"));
    assert_eq!(batch.id.len(), "subagent-batch-".len() + 32);
    assert_eq!(batch.status, BatchStatus::Queued);
    assert_eq!(batch.title, DEFAULT_TITLE);
    assert_eq!(batch.total_items, 3);
    assert_eq!(batch.counts, counts(3, 0, 0, 0, [0, 0, 0]));
    assert_eq!(
        (
            batch.max_live_items,
            batch.max_running_items,
            batch.max_attempts
        ),
        (2, 1, 3)
    );
    assert_eq!(batch.completed_at, None);
    let stored = self::batch(&*store, &batch.id).await;
    assert_eq!(stored, batch, "what submit returned is what is stored");
    assert_eq!(stored.submission_key, "r1:a");
    assert_eq!(stored.tool_call_id.as_deref(), Some("call-a"));
    assert_eq!(stored.run_id.as_deref(), Some("r1"));
    assert_eq!(stored.execution_spec["permissions"], json!(["runs:write"]));
    let items = items(&*store, &batch.id).await;
    assert_eq!(items.len(), 3);
    for (index, item) in items.iter().enumerate() {
        assert!(item.id.starts_with("batch-item-"));
        assert_eq!(item.id.len(), "batch-item-".len() + 32);
        assert_eq!(item.batch_id, batch.id);
        assert_eq!(item.position, index as u32);
        assert_eq!(item.item_key, format!("item-{}", index + 1));
        assert_eq!(item.prompt, format!("Analyse item {}", index + 1));
        assert_eq!(
            item.acceptance_criteria,
            [format!("mentions {}", index + 1)]
        );
        assert_eq!(item.status, BatchItemStatus::Pending);
        assert_eq!(item.attempt, 0);
        assert_eq!(item.acceptance_verdict, None);
        assert_eq!(
            (item.lease_owner.as_ref(), item.result.as_ref()),
            (None, None)
        );
    }
    assert_eq!(items.iter().map(|i| &i.id).collect::<HashSet<_>>().len(), 3);
}

/// A repeated `submission_key` of the same user returns the first batch and inserts
/// nothing; another user's identical key is a batch of its own.
pub async fn batches_a_duplicate_submission_key_inserts_nothing(store: Arc<dyn Store>) {
    let first = submit(&*store, new_batch("a", 2, 2, 1, 3)).await;
    let again = store
        .submit_batch(new_batch("a", 5, 5, 5, 1))
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.batch, first);
    assert_eq!(items(&*store, &first.id).await.len(), 2);
    let mut other = new_batch("a", 1, 1, 1, 1);
    other.user_id = "u2".into();
    let other = store.submit_batch(other).await.unwrap();
    assert!(other.created);
    assert_ne!(other.batch.id, first.id);
    let listed = store
        .list_batches(
            &owner(),
            &BatchQuery {
                status: None,
                limit: 100,
            },
        )
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
}

/// Bad input is an [`Error::InvalidBatch`] naming what to fix, and nothing is written.
pub async fn batches_invalid_submissions_name_the_problem_and_write_nothing(store: Arc<dyn Store>) {
    type Change = fn(&mut NewBatch);
    let cases: &[(Change, &str)] = &[
        (
            |b| b.items.clear(),
            "a batch must have 1-100000 items, got 0",
        ),
        (
            |b| b.items[1].item_key = "k".repeat(129),
            "item key must have 1-128 characters, got 129 at position 1",
        ),
        (
            |b| b.items[0].item_key = String::new(),
            "item key must have 1-128 characters, got 0 at position 0",
        ),
        (
            |b| b.items[2].item_key = "item-1".into(),
            "item keys must be unique: 'item-1' repeats at position 2",
        ),
        (
            |b| b.items[0].prompt = "p".repeat(100_001),
            "item prompt must have 1-100000 characters, got 100001 at position 0",
        ),
        (
            |b| b.items[0].prompt = String::new(),
            "item prompt must have 1-100000 characters, got 0 at position 0",
        ),
        (
            |b| b.items[1].acceptance_criteria = vec!["c".into(); 21],
            "an item may have at most 20 acceptance criteria, got 21 at position 1",
        ),
        (
            |b| b.items[0].acceptance_criteria = vec!["c".repeat(501)],
            "an acceptance criterion may have at most 500 characters, got 501 at position 0",
        ),
        (
            |b| b.max_running_items = 3,
            "max_running_items (3) must not exceed max_live_items (2)",
        ),
        (
            |b| b.max_live_items = 0,
            "max_live_items must be at least 1, got 0",
        ),
        (
            |b| b.max_running_items = 0,
            "max_running_items must be at least 1, got 0",
        ),
        (|b| b.max_attempts = 11, "max_attempts must be 1-10, got 11"),
        (
            |b| b.title = "t".repeat(257),
            "title must have at most 256 characters, got 257",
        ),
        (
            |b| b.submission_key = String::new(),
            "submission_key must have 1-512 characters, got 0",
        ),
    ];
    for (change, message) in cases {
        let mut bad = new_batch("bad", 3, 2, 2, 3);
        change(&mut bad);
        let error = store.submit_batch(bad).await.unwrap_err();
        assert!(matches!(error, Error::InvalidBatch(_)), "{error:?}");
        assert!(error.is_invalid_input());
        assert_eq!(error.to_string(), *message);
    }
    let mut bad_thread = new_batch("bad", 1, 1, 1, 1);
    bad_thread.thread_id = "not a thread".into();
    let error = store.submit_batch(bad_thread).await.unwrap_err();
    assert!(matches!(error, Error::InvalidThreadId(_)), "{error:?}");
    let everything = BatchScope::user("u1");
    let query = BatchQuery {
        status: None,
        limit: 100,
    };
    assert!(
        store
            .list_batches(&everything, &query)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.batch_totals().await.unwrap().items.total(), 0);
}

/// Another user's batch, or one of another thread, reads as missing everywhere; the
/// user scope sees every thread; lists are newest first with a status filter and limit.
pub async fn batches_reads_are_scoped_to_the_owner_and_thread(store: Arc<dyn Store>) {
    let a = submit(&*store, new_batch("a", 1, 1, 1, 1)).await;
    let b = submit(&*store, new_batch("b", 1, 1, 1, 1)).await;
    let mut other_thread = new_batch("c", 1, 1, 1, 1);
    other_thread.thread_id = "t2".into();
    let c = submit(&*store, other_thread).await;
    let stranger = BatchScope::thread("u2", "t1");
    let wrong_thread = BatchScope::thread("u1", "t2");
    let item_id = items(&*store, &a.id).await[0].id.clone();
    assert_eq!(store.get_batch(&stranger, &a.id).await.unwrap(), None);
    assert_eq!(store.get_batch(&wrong_thread, &a.id).await.unwrap(), None);
    assert_eq!(
        store
            .get_batch(&owner(), "subagent-batch-nope")
            .await
            .unwrap(),
        None
    );
    let page = ItemQuery {
        status: None,
        offset: 0,
        limit: 10,
    };
    assert!(
        store
            .list_items(&stranger, &a.id, &page)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.get_item(&stranger, &a.id, &item_id).await.unwrap(),
        None
    );
    assert_eq!(
        store.get_item(&owner(), &b.id, &item_id).await.unwrap(),
        None,
        "an item is read through its own batch only"
    );
    assert!(
        store
            .export_items(&stranger, &a.id, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.pause_batch(&stranger, &a.id).await.unwrap(), None);
    assert_eq!(store.resume_batch(&stranger, &a.id).await.unwrap(), None);
    assert_eq!(store.cancel_batch(&stranger, &a.id).await.unwrap(), None);
    assert_eq!(
        store.retry_item(&stranger, &a.id, &item_id).await.unwrap(),
        RetryOutcome::BatchNotFound
    );
    assert_eq!(batch(&*store, &a.id).await.status, BatchStatus::Queued);
    let any_thread = BatchScope::user("u1");
    assert!(store.get_batch(&any_thread, &c.id).await.unwrap().is_some());

    let all = BatchQuery {
        status: None,
        limit: 100,
    };
    let ids = |batches: Vec<BatchRecord>| batches.into_iter().map(|b| b.id).collect::<Vec<_>>();
    let newest_first = |mut batches: Vec<&BatchRecord>| {
        batches.sort_by(|x, y| (&y.created_at, &y.id).cmp(&(&x.created_at, &x.id)));
        batches
            .into_iter()
            .map(|b| b.id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(store.list_batches(&owner(), &all).await.unwrap()),
        newest_first(vec![&a, &b])
    );
    assert_eq!(
        ids(store.list_batches(&any_thread, &all).await.unwrap()),
        newest_first(vec![&a, &b, &c])
    );
    let one = BatchQuery {
        status: None,
        limit: 1,
    };
    assert_eq!(
        ids(store.list_batches(&any_thread, &one).await.unwrap()),
        newest_first(vec![&a, &b, &c])[..1]
    );
    store.pause_batch(&owner(), &b.id).await.unwrap();
    let paused = BatchQuery {
        status: Some(BatchStatus::Paused),
        limit: 100,
    };
    assert_eq!(
        ids(store.list_batches(&any_thread, &paused).await.unwrap()),
        std::slice::from_ref(&b.id)
    );
    assert!(
        store
            .list_batches(&stranger, &all)
            .await
            .unwrap()
            .is_empty()
    );
    for limit in [0, 101] {
        let error = store
            .list_batches(
                &owner(),
                &BatchQuery {
                    status: None,
                    limit,
                },
            )
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("invalid query: limit must be between 1 and 100, got {limit}")
        );
    }
}

/// Items page by offset and status in position order without results; the export
/// pages by position, 500 at a time, with results.
pub async fn batches_items_page_by_offset_and_status_and_export_in_pages_of_500(
    store: Arc<dyn Store>,
) {
    let id = submit(&*store, new_batch("a", 1_001, 2, 1, 1)).await.id;
    let lease = only(&pass(&*store, &claim(WORKER, 1, LIVE)).await);
    store
        .finish_success(&lease, &success("the first result"))
        .await
        .unwrap();
    let query = |status, offset, limit| ItemQuery {
        status,
        offset,
        limit,
    };
    let page = store
        .list_items(&owner(), &id, &query(None, 998, 500))
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|i| i.position).collect::<Vec<_>>(),
        [998, 999, 1000]
    );
    let first = store
        .list_items(&owner(), &id, &query(None, 0, 1))
        .await
        .unwrap();
    assert_eq!(first[0].status, BatchItemStatus::Succeeded);
    assert_eq!(first[0].result, None, "listings leave the result out");
    assert_eq!(first[0].result_preview.as_deref(), Some("the firs"));
    let queued = store
        .list_items(&owner(), &id, &query(Some(BatchItemStatus::Queued), 0, 500))
        .await
        .unwrap();
    assert_eq!(queued.iter().map(|i| i.position).collect::<Vec<_>>(), [1]);
    let pending = store
        .list_items(
            &owner(),
            &id,
            &query(Some(BatchItemStatus::Pending), 10, 500),
        )
        .await
        .unwrap();
    assert_eq!(pending.len(), 500);
    assert_eq!(pending[0].position, 12);
    for limit in [0, 501] {
        let error = store
            .list_items(&owner(), &id, &query(None, 0, limit))
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("invalid query: limit must be between 1 and 500, got {limit}")
        );
    }
    let mut exported = Vec::new();
    let mut after = None;
    let mut pages = Vec::new();
    loop {
        let page = store.export_items(&owner(), &id, after).await.unwrap();
        pages.push(page.len());
        let Some(last) = page.last() else { break };
        after = Some(last.position);
        exported.extend(page);
    }
    assert_eq!(pages, [EXPORT_PAGE as usize, 500, 1, 0]);
    assert_eq!(
        exported.iter().map(|i| i.position).collect::<Vec<_>>(),
        (0..1_001).collect::<Vec<_>>()
    );
    assert_eq!(exported[0].result.as_deref(), Some("the first result"));
    assert_eq!(
        item(&*store, &id, &exported[0].id).await.result.as_deref(),
        Some("the first result")
    );
}

/// SPEC §16 item 70: 4 items, live 2, running 1 give one lease; counts pending 2,
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

/// SPEC §16 item 71: a paused batch gives no claims; pause applies to queued and
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

/// SPEC §16 item 75: a failure requeues the item while attempts remain (no backoff),
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

/// SPEC §16 item 76: failed and succeeded items give `completed`; a paused batch whose
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

/// SPEC §16 items 73 and 74: an expired lease is recovered by the next pass; a
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
    assert_eq!(store.finish_cancelled(&stale).await.unwrap(), None);
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

/// SPEC §16 item 72: expired leases in a paused batch return to queued and wait for
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

/// SPEC §16 items 77 and 82: admission rejection, shutdown before admission and a
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

/// SPEC §16 item 78: cancel stops every non-terminal item at once (leases cleared,
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
    assert_eq!(store.finish_cancelled(&running).await.unwrap(), None);
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

/// SPEC §16 item 79: only failed items retry, never in a cancelled batch; a retry
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
    assert_eq!(item.attempt, 0);
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
