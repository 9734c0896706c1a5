//! Conformance cases of [`BatchStore`](crate::BatchStore): durable batches, every
//! transition of docs/batches.md#batch-states, docs/batches.md#item-states, fencing, claims and heartbeats.
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
    AttemptOutcome, BatchCounts, BatchItem, BatchQuery, BatchRecord, BatchScope, ClaimPass,
    ClaimRequest, Error, ItemFailure, ItemLease, ItemQuery, ItemSuccess, ItemUsage, NewBatch,
    NewItem, NewThread, ReleaseReason, Renewal, RetryOutcome, Store, WorkerHeartbeat,
};

mod activity;
mod control;
mod leases;

pub use activity::*;
pub use control::*;
pub use leases::*;

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
            batches_a_result_as_short_as_its_preview_reads_back_whole,
            batches_a_claim_promotes_up_to_live_and_leases_up_to_running,
            batches_claims_share_free_slots_across_batches_in_creation_order,
            batches_admitted_claims_start_running_in_the_pass,
            batches_finish_attempts_write_each_outcome_at_its_index,
            batches_paused_batches_give_no_claims_until_resumed,
            batches_a_budget_level_only_rises_and_its_limit_pauses_with_a_reason,
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
            batches_activity_sums_usage_per_model_and_counts_recent_completions,
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
        admitted: 0,
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
            cache_read_tokens: 4,
            cache_write_tokens: 0,
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
                offset: 0,
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
        offset: 0,
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
        offset: 0,
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
        offset: 0,
    };
    assert_eq!(
        ids(store.list_batches(&any_thread, &one).await.unwrap()),
        newest_first(vec![&a, &b, &c])[..1]
    );
    let second = BatchQuery {
        status: None,
        limit: 2,
        offset: 1,
    };
    assert_eq!(
        ids(store.list_batches(&any_thread, &second).await.unwrap()),
        newest_first(vec![&a, &b, &c])[1..]
    );
    store.pause_batch(&owner(), &b.id).await.unwrap();
    let paused = BatchQuery {
        status: Some(BatchStatus::Paused),
        limit: 100,
        offset: 0,
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
                    offset: 0,
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

/// A result no longer than its preview (kept once, as the preview) reads back as the
/// result from the export and the item, and listings still leave it out.
pub async fn batches_a_result_as_short_as_its_preview_reads_back_whole(store: Arc<dyn Store>) {
    let id = submit(&*store, new_batch("a", 1, 1, 1, 1)).await.id;
    let lease = only(&pass(&*store, &claim(WORKER, 1, LIVE)).await);
    let short = success("short");
    assert_eq!(short.result, short.result_preview);
    store.finish_success(&lease, &short).await.unwrap();
    let exported = store.export_items(&owner(), &id, None).await.unwrap();
    assert_eq!(exported[0].result.as_deref(), Some("short"));
    assert_eq!(exported[0].result_preview.as_deref(), Some("short"));
    let stored = item(&*store, &id, &exported[0].id).await;
    assert_eq!(stored.result.as_deref(), Some("short"));
    let query = ItemQuery {
        status: None,
        offset: 0,
        limit: 10,
    };
    let listed = store.list_items(&owner(), &id, &query).await.unwrap();
    assert_eq!(listed[0].result, None, "listings leave the result out");
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
