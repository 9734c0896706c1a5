//! Conformance cases of [`CheckpointStore`](crate::CheckpointStore): thread state
//! checkpoints (docs/api.md#objects).

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::new_thread;
use crate::{Checkpoint, Error, NewCheckpoint, Store};

/// Expands to one `#[tokio::test]` per checkpoint case; invoked by `conformance_tests!`.
#[doc(hidden)]
#[macro_export]
macro_rules! checkpoint_conformance_tests {
    ($factory:expr) => {
        $crate::checkpoint_conformance_tests!(@cases $factory;
            checkpoints_round_trip_and_latest_is_the_newest,
            checkpoints_list_newest_first_with_limit_and_before,
            checkpoint_paging_with_limit_one_equals_the_full_list,
            an_invalid_checkpoint_thread_id_is_a_typed_error,
            checkpoints_of_other_threads_never_appear,
            deleting_run_checkpoints_removes_only_that_run,
            deleting_a_thread_removes_its_checkpoints,
            identical_checkpoint_histories_give_identical_results,
            any_sequence_of_states_reads_back_exactly_by_every_route,
            a_rollback_leaves_later_runs_checkpoints_whole,
            a_checkpoint_is_found_by_id_in_its_thread_only,
        );
    };
    (@cases $factory:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $factory.await;
                $crate::conformance::checkpoints::$case(fixture.store.clone()).await;
            }
        )+
    };
}

/// Checkpoint `n` of `thread`: values and metadata with keys deliberately out of
/// alphabetical order, so a backend that reorders keys is caught.
fn checkpoint(thread: &str, id: &str, parent: Option<&str>, run: Option<&str>) -> NewCheckpoint {
    let values = json!({
        "title": format!("Thread {thread}"),
        "messages": [
            {"type": "human", "content": format!("question at {id}"), "id": format!("h-{id}")},
            {"type": "ai", "content": "", "tool_calls": [
                {"name": "task", "id": "call_1", "args": {"zeta": 1, "alpha": [1.5, null, true]}}
            ], "id": format!("a-{id}")}
        ],
        "b": {"z": 1, "a": 2}
    });
    let Value::Object(metadata) = json!({
        "step": 3,
        "deerflow_trace_id": "0af7651916cd43dd8448eb211c80319c",
        "source": "loop",
        "checkpoint_ns": ""
    }) else {
        unreachable!()
    };
    NewCheckpoint {
        lease_owner: None,
        thread_id: thread.into(),
        checkpoint_id: id.into(),
        parent_checkpoint_id: parent.map(Into::into),
        run_id: run.map(Into::into),
        values,
        metadata,
    }
}

/// Writes `count` chained checkpoints `{prefix}{n}` (n from 1) to `thread` in `run`.
async fn put_chain(store: &dyn Store, thread: &str, prefix: &str, run: &str, count: usize) {
    let mut parent: Option<String> = None;
    for n in 1..=count {
        let id = format!("{prefix}{n}");
        store
            .put_checkpoint(checkpoint(thread, &id, parent.as_deref(), Some(run)))
            .await
            .expect("put_checkpoint");
        parent = Some(id);
    }
}

fn checkpoint_ids(checkpoints: &[Checkpoint]) -> Vec<&str> {
    checkpoints
        .iter()
        .map(|c| c.checkpoint_id.as_str())
        .collect()
}

/// Every field of a checkpoint but `created_at`, with the JSON as its exact text.
fn checkpoint_text(checkpoint: &Checkpoint) -> String {
    format!(
        "{}|{}|{:?}|{:?}|{}|{}",
        checkpoint.thread_id,
        checkpoint.checkpoint_id,
        checkpoint.parent_checkpoint_id,
        checkpoint.run_id,
        serde_json::to_string(&checkpoint.values).unwrap(),
        serde_json::to_string(&checkpoint.metadata).unwrap()
    )
}

/// A checkpoint comes back exactly as written, JSON key order included, and the latest
/// is the one written last.
pub async fn checkpoints_round_trip_and_latest_is_the_newest(store: Arc<dyn Store>) {
    assert_eq!(store.latest_checkpoint("t1").await.unwrap(), None);
    let first = checkpoint("t1", "c1", None, None);
    let stored = store.put_checkpoint(first.clone()).await.unwrap();
    assert_eq!(
        (
            &stored.thread_id,
            &stored.checkpoint_id,
            &stored.parent_checkpoint_id,
            &stored.run_id,
            &stored.values,
            &stored.metadata
        ),
        (
            &first.thread_id,
            &first.checkpoint_id,
            &first.parent_checkpoint_id,
            &first.run_id,
            &first.values,
            &first.metadata
        )
    );
    let created = time::OffsetDateTime::parse(
        &stored.created_at,
        &time::format_description::well_known::Rfc3339,
    );
    assert!(
        created.is_ok(),
        "created_at {} is RFC 3339",
        stored.created_at
    );
    let latest = store.latest_checkpoint("t1").await.unwrap().unwrap();
    assert_eq!(latest, stored, "read back as written");
    assert_eq!(
        serde_json::to_string(&latest.values).unwrap(),
        serde_json::to_string(&first.values).unwrap(),
        "values key order is kept"
    );
    assert_eq!(
        serde_json::to_string(&latest.metadata).unwrap(),
        serde_json::to_string(&first.metadata).unwrap(),
        "metadata key order is kept"
    );

    let mut second = checkpoint("t1", "c2", Some("c1"), Some("r1"));
    second.values = json!({"messages": [], "title": null});
    second.metadata = Map::new();
    let stored = store.put_checkpoint(second.clone()).await.unwrap();
    let latest = store.latest_checkpoint("t1").await.unwrap().unwrap();
    assert_eq!(latest, stored);
    assert_eq!(latest.parent_checkpoint_id.as_deref(), Some("c1"));
    assert_eq!(latest.run_id.as_deref(), Some("r1"));
    assert_eq!(
        serde_json::to_string(&latest.values).unwrap(),
        r#"{"messages":[],"title":null}"#
    );
    // An id that does not sort last is still the newest once written last.
    store
        .put_checkpoint(checkpoint("t1", "a0", Some("c2"), Some("r1")))
        .await
        .unwrap();
    let latest = store.latest_checkpoint("t1").await.unwrap().unwrap();
    assert_eq!(
        latest.checkpoint_id, "a0",
        "newest by write order, not by id"
    );
}

/// Listing is newest first; `limit` caps it and `before` starts after a checkpoint.
pub async fn checkpoints_list_newest_first_with_limit_and_before(store: Arc<dyn Store>) {
    put_chain(&*store, "t1", "c", "r1", 7).await;
    let all = store.list_checkpoints("t1", 100, None).await.unwrap();
    assert_eq!(
        checkpoint_ids(&all),
        ["c7", "c6", "c5", "c4", "c3", "c2", "c1"]
    );
    assert_eq!(
        all[0],
        store.latest_checkpoint("t1").await.unwrap().unwrap()
    );
    let first = store.list_checkpoints("t1", 3, None).await.unwrap();
    assert_eq!(checkpoint_ids(&first), ["c7", "c6", "c5"]);
    let next = store.list_checkpoints("t1", 3, Some("c5")).await.unwrap();
    assert_eq!(checkpoint_ids(&next), ["c4", "c3", "c2"]);
    let older = store.list_checkpoints("t1", 100, Some("c2")).await.unwrap();
    assert_eq!(checkpoint_ids(&older), ["c1"]);
    assert!(
        store
            .list_checkpoints("t1", 100, Some("c1"))
            .await
            .unwrap()
            .is_empty(),
        "nothing is older than the first"
    );
    assert!(
        store
            .list_checkpoints("t1", 100, Some("missing"))
            .await
            .unwrap()
            .is_empty(),
        "an unknown `before` gives nothing"
    );
    assert!(
        store
            .list_checkpoints("t1", 0, None)
            .await
            .unwrap()
            .is_empty(),
        "limit 0 gives nothing"
    );
    assert!(
        store
            .list_checkpoints("nope", 10, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.latest_checkpoint("nope").await.unwrap(), None);
}

/// Paging with `limit = 1` from each last checkpoint id yields exactly the full list.
pub async fn checkpoint_paging_with_limit_one_equals_the_full_list(store: Arc<dyn Store>) {
    for round in 0..4 {
        put_chain(
            &*store,
            "t1",
            &format!("r{round}-"),
            &format!("r{round}"),
            3,
        )
        .await;
        put_chain(
            &*store,
            "t2",
            &format!("r{round}-"),
            &format!("r{round}"),
            1,
        )
        .await;
    }
    let full = store.list_checkpoints("t1", 1000, None).await.unwrap();
    assert_eq!(full.len(), 12);
    let mut paged = Vec::new();
    let mut before: Option<String> = None;
    loop {
        let page = store
            .list_checkpoints("t1", 1, before.as_deref())
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        assert_eq!(page.len(), 1);
        before = Some(page[0].checkpoint_id.clone());
        paged.extend(page);
        assert!(
            paged.len() <= full.len(),
            "paging must end: {before:?} repeats"
        );
    }
    assert_eq!(paged, full);
}

/// A checkpoint with an invalid thread id is a typed error and writes nothing.
pub async fn an_invalid_checkpoint_thread_id_is_a_typed_error(store: Arc<dyn Store>) {
    let too_long = "t".repeat(65);
    for thread in ["bad thread!", "", too_long.as_str(), "t/1"] {
        let error = store
            .put_checkpoint(checkpoint(thread, "c1", None, Some("r1")))
            .await
            .expect_err("an invalid thread id must fail");
        assert!(
            matches!(error, Error::InvalidThreadId(_)),
            "unexpected error {error:?}"
        );
        assert!(error.is_invalid_input());
        assert_eq!(store.latest_checkpoint(thread).await.unwrap(), None);
        assert!(
            store
                .list_checkpoints(thread, 10, None)
                .await
                .unwrap()
                .is_empty()
        );
    }
    let longest = "t".repeat(64);
    store
        .put_checkpoint(checkpoint(&longest, "c1", None, None))
        .await
        .expect("64 characters are allowed");
}

/// Reads are scoped to the thread, even when checkpoint and run ids repeat across threads.
pub async fn checkpoints_of_other_threads_never_appear(store: Arc<dyn Store>) {
    put_chain(&*store, "t1", "c", "r1", 3).await;
    put_chain(&*store, "t2", "c", "r1", 2).await;
    put_chain(&*store, "t1x", "d", "r1", 1).await;
    store
        .put_checkpoint(checkpoint("t1", "only-t1", Some("c3"), Some("r1")))
        .await
        .unwrap();
    let t1 = store.list_checkpoints("t1", 100, None).await.unwrap();
    assert_eq!(checkpoint_ids(&t1), ["only-t1", "c3", "c2", "c1"]);
    assert!(t1.iter().all(|c| c.thread_id == "t1"));
    let t2 = store.list_checkpoints("t2", 100, None).await.unwrap();
    assert_eq!(checkpoint_ids(&t2), ["c2", "c1"]);
    assert!(t2.iter().all(|c| c.thread_id == "t2"));
    let latest = store.latest_checkpoint("t2").await.unwrap().unwrap();
    assert_eq!(
        (latest.thread_id.as_str(), latest.checkpoint_id.as_str()),
        ("t2", "c2")
    );
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t2", 100, Some("c2")).await.unwrap()),
        ["c1"],
        "`before` names a checkpoint of this thread"
    );
    assert!(
        store
            .list_checkpoints("t2", 100, Some("only-t1"))
            .await
            .unwrap()
            .is_empty(),
        "a checkpoint of another thread is unknown here"
    );
    assert!(
        store
            .list_checkpoints("t", 100, None)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Rollback deletes the run's checkpoints of that thread only and returns how many.
pub async fn deleting_run_checkpoints_removes_only_that_run(store: Arc<dyn Store>) {
    put_chain(&*store, "t1", "a", "r1", 3).await;
    put_chain(&*store, "t1", "b", "r2", 2).await;
    store
        .put_checkpoint(checkpoint("t1", "none", Some("b2"), None))
        .await
        .unwrap();
    put_chain(&*store, "t1", "c", "r1", 1).await;
    put_chain(&*store, "t2", "a", "r1", 2).await;
    assert_eq!(store.delete_run_checkpoints("t1", "r1").await.unwrap(), 4);
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t1", 100, None).await.unwrap()),
        ["none", "b2", "b1"]
    );
    assert_eq!(
        store
            .latest_checkpoint("t1")
            .await
            .unwrap()
            .unwrap()
            .checkpoint_id,
        "none"
    );
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t2", 100, None).await.unwrap()),
        ["a2", "a1"],
        "the same run id in another thread is kept"
    );
    assert_eq!(store.delete_run_checkpoints("t1", "r1").await.unwrap(), 0);
    assert_eq!(store.delete_run_checkpoints("t1", "nope").await.unwrap(), 0);
    assert_eq!(store.delete_run_checkpoints("t3", "r2").await.unwrap(), 0);
    assert_eq!(store.delete_run_checkpoints("t1", "r2").await.unwrap(), 2);
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t1", 100, None).await.unwrap()),
        ["none"]
    );
    // A checkpoint id freed by a rollback may be written again, and is then the newest.
    store
        .put_checkpoint(checkpoint("t1", "a1", Some("none"), Some("r3")))
        .await
        .unwrap();
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t1", 100, None).await.unwrap()),
        ["a1", "none"]
    );
}

/// Deleting a thread deletes its checkpoints and no other thread's.
pub async fn deleting_a_thread_removes_its_checkpoints(store: Arc<dyn Store>) {
    store
        .create_thread(new_thread("t1", "u1", json!({})))
        .await
        .unwrap();
    store
        .create_thread(new_thread("t2", "u1", json!({})))
        .await
        .unwrap();
    put_chain(&*store, "t1", "c", "r1", 3).await;
    put_chain(&*store, "t2", "c", "r2", 2).await;
    assert!(store.delete_thread("t1").await.unwrap());
    assert_eq!(store.latest_checkpoint("t1").await.unwrap(), None);
    assert!(
        store
            .list_checkpoints("t1", 100, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t2", 100, None).await.unwrap()),
        ["c2", "c1"],
        "other threads keep their checkpoints"
    );
    // The thread id is free again, with no stale state behind it.
    store
        .create_thread(new_thread("t1", "u1", json!({})))
        .await
        .unwrap();
    assert_eq!(store.latest_checkpoint("t1").await.unwrap(), None);
    put_chain(&*store, "t1", "c", "r3", 1).await;
    assert_eq!(
        checkpoint_ids(&store.list_checkpoints("t1", 100, None).await.unwrap()),
        ["c1"]
    );
}

/// The same sequence of checkpoint calls gives the same results on this backend as on
/// the in-memory reference (all but `created_at`, the write time).
pub async fn identical_checkpoint_histories_give_identical_results(store: Arc<dyn Store>) {
    let reference = crate::MemoryStore::new();
    let stores: [&dyn Store; 2] = [&*store, &reference];
    for target in stores {
        target
            .create_thread(new_thread("t1", "u1", json!({})))
            .await
            .unwrap();
        put_chain(target, "t1", "a", "r1", 4).await;
        put_chain(target, "t2", "a", "r1", 2).await;
        put_chain(target, "t1", "b", "r2", 3).await;
        let mut odd = checkpoint("t1", "odd", Some("b3"), None);
        odd.values = json!({"messages": [{"type": "ai", "content": "é \u{0} \"q\" 😀", "n": 1e-7}],
                            "title": "Ünïcode", "big": u64::MAX, "neg": i64::MIN});
        target.put_checkpoint(odd).await.unwrap();
        assert!(
            target
                .put_checkpoint(checkpoint("no good", "x", None, None))
                .await
                .is_err()
        );
        assert_eq!(target.delete_run_checkpoints("t1", "r1").await.unwrap(), 4);
        put_chain(target, "t1", "c", "r3", 2).await;
        put_chain(target, "t3", "a", "r9", 1).await;
        assert!(
            !target.delete_thread("t3").await.unwrap(),
            "t3 has no record"
        );
    }
    type Reads = Vec<(String, Vec<String>)>;
    async fn reads(store: &dyn Store) -> Reads {
        let mut out = Vec::new();
        for thread in ["t1", "t2", "t3", "nope"] {
            let latest = store.latest_checkpoint(thread).await.unwrap();
            out.push((
                format!("latest {thread}"),
                latest.iter().map(checkpoint_text).collect(),
            ));
            let queries: [(u32, Option<&str>); 7] = [
                (100, None),
                (2, None),
                (0, None),
                (100, Some("b2")),
                (1, Some("odd")),
                (100, Some("a1")),
                (100, Some("missing")),
            ];
            for (limit, before) in queries {
                let page = store.list_checkpoints(thread, limit, before).await.unwrap();
                out.push((
                    format!("list {thread} {limit} {before:?}"),
                    page.iter().map(checkpoint_text).collect(),
                ));
            }
        }
        out
    }
    let ours = reads(&*store).await;
    let theirs = reads(&reference).await;
    assert!(!ours[0].1.is_empty(), "t1 has checkpoints");
    for (ours, theirs) in ours.iter().zip(&theirs) {
        assert_eq!(ours, theirs);
    }
    assert_eq!(ours.len(), theirs.len());
}

/// States as a long thread writes them: growing, a message changed in place (usage
/// added to an AI message after its tool results), shrinking (after a rollback), with
/// keys out of order, and values that are not a conversation at all.
fn state_sequence() -> Vec<Value> {
    let mut states = Vec::new();
    let mut messages: Vec<Value> = Vec::new();
    for n in 0..40 {
        messages.push(json!({"type": "human", "content": format!("question {n} {}", "x".repeat(n * 20)), "id": format!("h{n}")}));
        states.push(json!({"title": "T", "messages": messages.clone(), "b": {"z": n, "a": 1}}));
        messages.push(json!({"type": "ai", "content": "", "id": format!("a{n}"), "usage_metadata": {"total_tokens": 1}}));
        states.push(json!({"title": "T", "messages": messages.clone(), "b": {"z": n, "a": 1}}));
        let last = messages.len() - 1;
        messages[last]["usage_metadata"]["total_tokens"] = json!(n + 100);
        states.push(json!({"messages": messages.clone(), "title": "T"}));
        if n % 9 == 8 {
            messages.truncate(messages.len() / 2);
            states.push(json!({"messages": messages.clone(), "title": "T"}));
        }
    }
    states.push(json!({"title": "no messages"}));
    states.push(json!({"messages": "not a list"}));
    states.push(json!([1, "two"]));
    states.push(json!({"messages": [{"id": "restart"}]}));
    states.push(json!({"messages": [{"id": "restart"}, {"id": "again"}]}));
    states
}

/// Whatever a thread's states do, `latest_checkpoint`, `get_checkpoint` and
/// `list_checkpoints` (in pages of any size) return each exactly as written.
pub async fn any_sequence_of_states_reads_back_exactly_by_every_route(store: Arc<dyn Store>) {
    let states = state_sequence();
    let mut written = Vec::new();
    for (n, values) in states.iter().enumerate() {
        let id = format!("s{n:03}");
        let Value::Object(metadata) = json!({"step": n}) else {
            unreachable!()
        };
        let stored = store
            .put_checkpoint(NewCheckpoint {
                lease_owner: None,
                thread_id: "long".into(),
                checkpoint_id: id.clone(),
                parent_checkpoint_id: None,
                run_id: Some(format!("r{}", n / 5)),
                values: values.clone(),
                metadata,
            })
            .await
            .unwrap();
        let latest = store.latest_checkpoint("long").await.unwrap().unwrap();
        assert_eq!(checkpoint_text(&latest), checkpoint_text(&stored), "{id}");
        written.push(stored);
    }
    for stored in &written {
        let found = store
            .get_checkpoint("long", &stored.checkpoint_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(checkpoint_text(&found), checkpoint_text(stored));
    }
    let newest_first: Vec<String> = written.iter().rev().map(checkpoint_text).collect();
    for page in [1, 7, 1000] {
        let mut listed = Vec::new();
        let mut before: Option<String> = None;
        loop {
            let found = store
                .list_checkpoints("long", page, before.as_deref())
                .await
                .unwrap();
            let Some(last) = found.last() else { break };
            before = Some(last.checkpoint_id.clone());
            listed.extend(found.iter().map(checkpoint_text));
        }
        assert_eq!(listed, newest_first, "pages of {page}");
    }
}

/// Rolling back a run whose checkpoints later runs continued leaves every other
/// checkpoint reading back as written, and the thread goes on from them.
pub async fn a_rollback_leaves_later_runs_checkpoints_whole(store: Arc<dyn Store>) {
    let states = state_sequence();
    let mut written = Vec::new();
    for (n, values) in states.iter().take(30).enumerate() {
        let stored = store
            .put_checkpoint(NewCheckpoint {
                lease_owner: None,
                thread_id: "t1".into(),
                checkpoint_id: format!("c{n:02}"),
                parent_checkpoint_id: None,
                run_id: Some(format!("r{}", n / 10)),
                values: values.clone(),
                metadata: Map::new(),
            })
            .await
            .unwrap();
        written.push(stored);
    }
    assert_eq!(store.delete_run_checkpoints("t1", "r1").await.unwrap(), 10);
    let kept: Vec<String> = written
        .iter()
        .filter(|c| c.run_id.as_deref() != Some("r1"))
        .rev()
        .map(checkpoint_text)
        .collect();
    let listed = store.list_checkpoints("t1", 100, None).await.unwrap();
    assert_eq!(listed.iter().map(checkpoint_text).collect::<Vec<_>>(), kept);
    let next = json!({"messages": [{"id": "h0"}, {"id": "after the rollback"}]});
    store
        .put_checkpoint(NewCheckpoint {
            lease_owner: None,
            thread_id: "t1".into(),
            checkpoint_id: "c30".into(),
            parent_checkpoint_id: None,
            run_id: Some("r3".into()),
            values: next.clone(),
            metadata: Map::new(),
        })
        .await
        .unwrap();
    let latest = store.latest_checkpoint("t1").await.unwrap().unwrap();
    assert_eq!(latest.values, next);
    assert_eq!(store.delete_run_checkpoints("t1", "r0").await.unwrap(), 10);
    let listed = store.list_checkpoints("t1", 100, None).await.unwrap();
    assert_eq!(listed[0].values, next);
    assert_eq!(
        listed[1..].iter().map(checkpoint_text).collect::<Vec<_>>(),
        kept[..10]
    );
}

/// `get_checkpoint` finds a checkpoint by id in its own thread, and nothing elsewhere.
pub async fn a_checkpoint_is_found_by_id_in_its_thread_only(store: Arc<dyn Store>) {
    put_chain(&*store, "t1", "a", "r1", 3).await;
    let found = store.get_checkpoint("t1", "a2").await.unwrap().unwrap();
    assert_eq!(
        checkpoint_text(&found),
        checkpoint_text(
            &checkpoint("t1", "a2", Some("a1"), Some("r1"))
                .into_stored()
                .unwrap()
        )
    );
    assert_eq!(store.get_checkpoint("t2", "a2").await.unwrap(), None);
    assert_eq!(store.get_checkpoint("t1", "nope").await.unwrap(), None);
    // A thread deleted and written again with the same ids reads its new values.
    store
        .create_thread(new_thread("t1", "u1", json!({})))
        .await
        .unwrap();
    store.delete_thread("t1").await.unwrap();
    let values = json!({"messages": [{"id": "new"}]});
    store
        .put_checkpoint(NewCheckpoint {
            lease_owner: None,
            thread_id: "t1".into(),
            checkpoint_id: "a1".into(),
            parent_checkpoint_id: None,
            run_id: None,
            values: values.clone(),
            metadata: Map::new(),
        })
        .await
        .unwrap();
    let mut grown = values.clone();
    grown["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"id": "more"}));
    store
        .put_checkpoint(NewCheckpoint {
            lease_owner: None,
            thread_id: "t1".into(),
            checkpoint_id: "a2".into(),
            parent_checkpoint_id: Some("a1".into()),
            run_id: None,
            values: grown.clone(),
            metadata: Map::new(),
        })
        .await
        .unwrap();
    assert_eq!(
        store
            .get_checkpoint("t1", "a2")
            .await
            .unwrap()
            .unwrap()
            .values,
        grown
    );
    assert_eq!(
        store
            .get_checkpoint("t1", "a1")
            .await
            .unwrap()
            .unwrap()
            .values,
        values
    );
}
