//! Batch conformance cases for `batch_activity`: the items' usage per model and the
//! recent completions that the progress fields and `/token-usage` are computed from.

use super::*;
use crate::batches::activity::ACTIVITY_MAX_BATCHES;
use crate::batches::{ActivityQuery, BatchActivity, ModelItemUsage};

/// A usage whose cache counts grow with its output, so that sums of them are usages too
/// and every backend's sum of the cache counts is checked.
fn usage(input: i64, output: i64) -> ItemUsage {
    ItemUsage {
        input_tokens: input,
        output_tokens: output,
        total_tokens: input + output,
        cache_read_tokens: 2 * output,
        cache_write_tokens: output,
    }
}

fn done_on(model: &str, input: i64, output: i64) -> ItemSuccess {
    ItemSuccess {
        model_name: Some(model.into()),
        token_usage: Some(usage(input, output)),
        ..success("done")
    }
}

fn failed_on(model: &str, input: i64, output: i64) -> ItemFailure {
    ItemFailure {
        model_name: Some(model.into()),
        token_usage: Some(usage(input, output)),
        ..failure("boom")
    }
}

async fn activity(
    store: &dyn Store,
    scope: &BatchScope,
    ids: Option<&[&str]>,
    since: &str,
) -> Vec<BatchActivity> {
    let query = ActivityQuery {
        batch_ids: ids.map(|ids| ids.iter().map(|id| id.to_string()).collect()),
        completed_since: since.into(),
    };
    store.batch_activity(scope, &query).await.expect("activity")
}

fn model(name: &str, items: u64, input: i64, output: i64) -> ModelItemUsage {
    ModelItemUsage {
        model_name: Some(name.into()),
        items,
        usage: usage(input, output),
    }
}

/// Usage is summed per batch and model over the items that report it (a requeued
/// failure's included, a retried item's gone); only `succeeded` and `failed` items
/// finished since the given moment are recent completions, and the earliest start among
/// them opens the rate's window; foreign batches never show.
pub async fn batches_activity_sums_usage_per_model_and_counts_recent_completions(
    store: Arc<dyn Store>,
) {
    let a = submit(&*store, new_batch("a", 4, 4, 4, 2)).await.id;
    let b = submit(&*store, new_batch("b", 1, 1, 1, 1)).await.id;
    let mut stranger = new_batch("s", 1, 1, 1, 1);
    stranger.user_id = "u2".into();
    let stranger = submit(&*store, stranger).await.id;
    let mut elsewhere = new_batch("e", 1, 1, 1, 1);
    elsewhere.thread_id = "t2".into();
    let elsewhere = submit(&*store, elsewhere).await.id;
    assert_eq!(
        activity(&*store, &owner(), Some(&[&a]), "").await,
        Vec::<BatchActivity>::new(),
        "waiting items have no activity"
    );

    let before = crate::now_rfc3339();
    let claimed = pass(&*store, &claim(WORKER, 8, LIVE)).await;
    let lease = |batch: &str, n: usize| {
        claimed
            .claimed
            .iter()
            .filter(|c| c.item.batch_id == batch)
            .nth(n)
            .expect("claimed")
            .lease()
    };
    assert!(store.mark_running(&lease(&a, 0)).await.unwrap());
    let started = item(&*store, &a, &lease(&a, 0).item_id)
        .await
        .started_at
        .expect("running items have started");
    store
        .finish_success(&lease(&a, 0), &done_on("gpt", 10, 5))
        .await
        .unwrap();
    store
        .finish_success(&lease(&a, 1), &done_on("claude", 100, 50))
        .await
        .unwrap();
    assert_eq!(
        store
            .finish_failure(&lease(&a, 2), &failed_on("gpt", 1, 1))
            .await
            .unwrap(),
        Some(BatchItemStatus::Queued),
        "a failure with attempts left is no completion"
    );
    store
        .finish_success(&lease(&b, 0), &done_on("gpt", 7, 3))
        .await
        .unwrap();
    for foreign in [&stranger, &elsewhere] {
        store
            .finish_success(&lease(foreign, 0), &done_on("gpt", 1000, 1000))
            .await
            .unwrap();
    }

    let found = activity(&*store, &owner(), Some(&[&a]), &before).await;
    assert_eq!(found.len(), 1);
    let a_activity = &found[0];
    assert_eq!(a_activity.batch_id, a);
    assert_eq!(
        a_activity.by_model,
        vec![model("claude", 1, 100, 50), model("gpt", 2, 11, 6)]
    );
    assert_eq!(a_activity.recent_completions, 2);
    assert_eq!(
        a_activity.recent_first_start.as_deref(),
        Some(started.as_str())
    );

    let later = activity(
        &*store,
        &owner(),
        Some(&[&a]),
        "9999-01-01T00:00:00.000000Z",
    )
    .await;
    assert_eq!(
        later[0].by_model, a_activity.by_model,
        "usage has no window"
    );
    assert_eq!(
        (
            later[0].recent_completions,
            later[0].recent_first_start.clone()
        ),
        (0, None)
    );

    let mut mine = vec![a.clone(), b.clone()];
    mine.sort();
    let every = activity(&*store, &owner(), None, &before).await;
    assert_eq!(
        every.iter().map(|x| x.batch_id.clone()).collect::<Vec<_>>(),
        mine,
        "the scope's batches by id, no foreign ones"
    );
    assert_eq!(
        BatchActivity::find(&every, &b).by_model,
        vec![model("gpt", 1, 7, 3)]
    );
    let by_user = activity(&*store, &BatchScope::user("u1"), None, &before).await;
    assert_eq!(by_user.len(), 3, "a user scope spans the user's threads");
    assert!(
        activity(&*store, &owner(), Some(&[&stranger, &elsewhere]), &before)
            .await
            .is_empty()
    );
    assert!(
        activity(&*store, &owner(), Some(&[]), &before)
            .await
            .is_empty()
    );

    // The requeued item fails for good, then is retried: its usage leaves the sums.
    let again = only(&pass(&*store, &claim(WORKER, 1, LIVE)).await);
    store
        .finish_failure(&again, &failed_on("gpt", 2, 2))
        .await
        .unwrap();
    let failed = activity(&*store, &owner(), Some(&[&a]), &before).await;
    assert_eq!(failed[0].recent_completions, 3);
    assert_eq!(failed[0].by_model[1], model("gpt", 2, 12, 7));
    let RetryOutcome::Retried { .. } = store
        .retry_item(&owner(), &a, &again.item_id)
        .await
        .unwrap()
    else {
        panic!("a failed item retries");
    };
    let retried = activity(&*store, &owner(), Some(&[&a]), &before).await;
    assert_eq!(retried[0].recent_completions, 2);
    assert_eq!(retried[0].by_model[1], model("gpt", 1, 10, 5));

    let too_many: Vec<String> = (0..=ACTIVITY_MAX_BATCHES)
        .map(|i| format!("b{i}"))
        .collect();
    let refused = store
        .batch_activity(
            &owner(),
            &ActivityQuery {
                batch_ids: Some(too_many),
                completed_since: before,
            },
        )
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidQuery(_))),
        "{refused:?}"
    );
}
