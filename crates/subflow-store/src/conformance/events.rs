//! Conformance cases of [`EventStore`](crate::EventStore): appends, `seq`, queries,
//! the message projection and the contracts (docs/events.md#run-events, docs/api.md#run-events).

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Map, Value, json};
use subflow_contracts::task_events::map_task_event;
use subflow_contracts::{EventCategory, EventType, MiddlewareTag, NewEvent};
use uuid::Uuid;

use super::{all_events, assert_conforms, assert_strictly_increasing, event, step, trace};
use crate::{Error, EventQuery, EventStore, Store};

/// Expands to one `#[tokio::test]` per event case; invoked by `conformance_tests!`.
#[doc(hidden)]
#[macro_export]
macro_rules! event_conformance_tests {
    ($factory:expr) => {
        $crate::event_conformance_tests!(@cases $factory;
            seq_is_thread_global_and_strictly_increasing,
            batch_order_is_seq_order_and_records_round_trip,
            a_retried_batch_never_duplicates,
            nothing_follows_a_runs_end,
            invalid_input_is_a_typed_error_and_writes_nothing,
            task_filter_applies_before_the_limit,
            a_batch_larger_than_one_statement_keeps_its_order,
            type_filter_and_cursor,
            paging_with_limit_one_equals_the_full_list,
            queries_are_scoped_to_thread_and_run,
            query_bounds_are_enforced,
            message_projection_holds_only_message_records,
            concurrent_writers_to_one_thread_never_collide,
            a_full_run_history_conforms_to_both_contracts,
            created_at_is_when_the_event_happened,
            identical_histories_give_identical_results,
            json_pages_are_the_serialised_events_without_auth_tokens,
        );
    };
    (@cases $factory:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $factory.await;
                $crate::conformance::events::$case(fixture.store.clone()).await;
            }
        )+
    };
}

/// `seq` is assigned per thread, across runs, strictly increasing from 1.
pub async fn seq_is_thread_global_and_strictly_increasing(store: Arc<dyn Store>) {
    store
        .append(&[trace("t1", "r1", 1), trace("t1", "r1", 2)])
        .await
        .unwrap();
    store.append(&[trace("t1", "r2", 3)]).await.unwrap();
    store.append(&[trace("t2", "r3", 4)]).await.unwrap();
    store.append(&[trace("t1", "r1", 5)]).await.unwrap();
    let r1 = all_events(&*store, "t1", "r1").await;
    let r2 = all_events(&*store, "t1", "r2").await;
    let r3 = all_events(&*store, "t2", "r3").await;
    assert_eq!(r1.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 4]);
    assert_eq!(r2.iter().map(|e| e.seq).collect::<Vec<_>>(), [3]);
    assert_eq!(
        r3.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1],
        "another thread has its own sequence"
    );
    assert_conforms(&[r1, r2, r3].concat());
}

/// Batch order is `seq` order, and every field comes back as written.
pub async fn batch_order_is_seq_order_and_records_round_trip(store: Arc<dyn Store>) {
    let batch: Vec<NewEvent> = (1..=30).map(|i| step("t1", "r1", "call_a", i)).collect();
    let outcome = store.append(&batch).await.unwrap();
    assert_eq!((outcome.written, outcome.skipped), (30, 0));
    let back = all_events(&*store, "t1", "r1").await;
    assert_eq!(back.len(), 30);
    for (written, read) in batch.iter().zip(&back) {
        assert_eq!(read.event_id, written.event_id);
        assert_eq!(read.event_type, written.event_type);
        assert_eq!(read.category, written.category);
        assert_eq!(read.content, written.content_value());
        assert_eq!(read.metadata, written.metadata_map());
        assert_eq!(
            serde_json::to_string(&read.content).unwrap(),
            written.content.get(),
            "text kept"
        );
        assert_eq!(read.user_id.as_deref(), Some("u1"));
        assert_eq!(read.thread_id, "t1");
        assert_eq!(read.run_id, "r1");
    }
    assert_strictly_increasing(&back);
    let keys: Vec<&str> = back[0]
        .content
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "task_id",
            "message_index",
            "kind",
            "text",
            "truncated",
            "tool_calls"
        ],
        "key order is kept"
    );
    assert_conforms(&back);
}

/// A batch appended again after an ambiguous failure writes nothing new.
pub async fn a_retried_batch_never_duplicates(store: Arc<dyn Store>) {
    let batch: Vec<NewEvent> = (0..5).map(|i| trace("t1", "r1", i)).collect();
    store.append(&batch).await.unwrap();
    let again = store.append(&batch).await.unwrap();
    assert_eq!((again.written, again.skipped), (0, 5));
    let mut overlapping = batch[3..].to_vec();
    overlapping.push(trace("t1", "r1", 99));
    let partial = store.append(&overlapping).await.unwrap();
    assert_eq!((partial.written, partial.skipped), (1, 2));
    let back = all_events(&*store, "t1", "r1").await;
    assert_eq!(back.len(), 6);
    let ids: HashSet<Uuid> = back.iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), 6);
    assert_eq!(back.last().unwrap().content, json!("event 99"));
    let seqs: Vec<i64> = back.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        [1, 2, 3, 4, 5, 6],
        "skipped records take no seq, as on every backend"
    );
    // A record repeated within one batch is written once, and its repeat takes no seq.
    let fresh = trace("t1", "r1", 100);
    let repeated = [fresh.clone(), trace("t1", "r1", 101), fresh];
    let outcome = store.append(&repeated).await.unwrap();
    assert_eq!((outcome.written, outcome.skipped), (2, 1));
    let back = all_events(&*store, "t1", "r1").await;
    let tail: Vec<(i64, Value)> = back[6..]
        .iter()
        .map(|e| (e.seq, e.content.clone()))
        .collect();
    assert_eq!(
        tail,
        [(7, json!("event 100")), (8, json!("event 101"))],
        "the repeat took no seq"
    );
}

/// Once a run's `run.end` is stored, records of that run are skipped (a process that
/// lost the run's lease may still write for it), and take no seq; other runs go on.
pub async fn nothing_follows_a_runs_end(store: Arc<dyn Store>) {
    let end = NewEvent::run_end(
        "t1",
        "r1",
        subflow_contracts::RunStatus::Error,
        json!({}),
        true,
    );
    store.append(&[trace("t1", "r1", 0), end]).await.unwrap();
    let late = [trace("t1", "r1", 1), trace("t1", "r2", 2)];
    let outcome = store.append(&late).await.unwrap();
    assert_eq!((outcome.written, outcome.skipped), (1, 1));
    let ended = all_events(&*store, "t1", "r1").await;
    let types: Vec<&str> = ended.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types.last(), Some(&EventType::RunEnd.as_str()), "{types:?}");
    assert_eq!(ended.len(), 2);
    let other = all_events(&*store, "t1", "r2").await;
    assert_eq!(other.len(), 1);
    assert_eq!(other[0].seq, 3, "the skipped record took no seq");
}

/// Over-long types and categories, mixed threads and bad thread ids are typed errors,
/// and a batch holding one bad record writes none of its records.
pub async fn invalid_input_is_a_typed_error_and_writes_nothing(store: Arc<dyn Store>) {
    let good = trace("t1", "r1", 0);
    let long_type = event("t1", "r1", &"x".repeat(33), "trace", json!(null), json!({}));
    let long_category = event(
        "t1",
        "r1",
        "run.start",
        &"c".repeat(17),
        json!(null),
        json!({}),
    );
    let bad_middleware = event(
        "t1",
        "r1",
        "middleware:",
        "middleware",
        json!(null),
        json!({}),
    );
    let other_thread = trace("t2", "r1", 1);
    let bad_thread = trace("bad thread!", "r1", 2);
    type IsExpected = fn(&Error) -> bool;
    let cases: [(Vec<NewEvent>, IsExpected); 5] = [
        (vec![good.clone(), long_type], |e| {
            matches!(e, Error::InvalidEventType(_))
        }),
        (vec![good.clone(), long_category], |e| {
            matches!(e, Error::InvalidCategory(_))
        }),
        (vec![good.clone(), bad_middleware], |e| {
            matches!(e, Error::InvalidEventType(_))
        }),
        (vec![good.clone(), other_thread], |e| {
            matches!(e, Error::MixedThreads { .. })
        }),
        (vec![bad_thread], |e| matches!(e, Error::InvalidThreadId(_))),
    ];
    for (batch, expected) in cases {
        let error = store
            .append(&batch)
            .await
            .expect_err("invalid batch must fail");
        assert!(expected(&error), "unexpected error {error:?}");
        assert!(error.is_invalid_input());
    }
    assert!(
        all_events(&*store, "t1", "r1").await.is_empty(),
        "nothing was written"
    );
    assert!(all_events(&*store, "t2", "r1").await.is_empty());
    let exact = event(
        "t1",
        "r1",
        &"x".repeat(32),
        &"c".repeat(16),
        json!(null),
        json!({}),
    );
    store
        .append(&[exact])
        .await
        .expect("32 and 16 characters are allowed");
}

/// `task_id` filters in the store before the limit, so a page is full of that task.
pub async fn task_filter_applies_before_the_limit(store: Arc<dyn Store>) {
    let mut batch = Vec::new();
    for i in 1..=10 {
        batch.push(step("t1", "r1", "call_a", i));
        batch.push(step("t1", "r1", "call_b", i));
    }
    store.append(&batch).await.unwrap();
    let mut query = EventQuery::run("t1", "r1");
    query.task_id = Some("call_b".into());
    query.limit = 4;
    let page = store.list_events(&query).await.unwrap();
    assert_eq!(page.len(), 4);
    assert!(page.iter().all(|e| e.metadata["task_id"] == "call_b"));
    let indexes: Vec<u64> = page
        .iter()
        .map(|e| e.metadata["message_index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, [1, 2, 3, 4]);
    query.after_seq = Some(page[3].seq);
    query.limit = 100;
    let rest = store.list_events(&query).await.unwrap();
    assert_eq!(rest.len(), 6);
    query.task_id = Some("call_missing".into());
    assert!(store.list_events(&query).await.unwrap().is_empty());
    let numeric = Map::from_iter([("task_id".to_owned(), json!(7))]);
    store
        .append(&[NewEvent::new(
            "t1",
            "r1",
            "llm.error",
            "trace",
            json!(null),
            numeric,
        )])
        .await
        .unwrap();
    query.task_id = Some("7".into());
    query.after_seq = None;
    assert!(
        store.list_events(&query).await.unwrap().is_empty(),
        "a non-string task_id is not indexed"
    );
    assert_conforms(&[page, rest].concat());
}

/// A batch of 2,500 records (more than one insert statement on every backend) is one
/// atomic write numbered in order.
pub async fn a_batch_larger_than_one_statement_keeps_its_order(store: Arc<dyn Store>) {
    let batch: Vec<NewEvent> = (0..2500)
        .map(|n| event("t1", "r1", "llm.error", "trace", json!(n), json!({})))
        .collect();
    let outcome = store.append(&batch).await.unwrap();
    assert_eq!((outcome.written, outcome.skipped), (2500, 0));
    let all = all_events(&*store, "t1", "r1").await;
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=2500).collect::<Vec<i64>>()
    );
    assert!(all.iter().enumerate().all(|(n, e)| e.content == json!(n)));
}

/// Type filters select listed types; an empty list means no filter; the cursor excludes ≤ after_seq.
pub async fn type_filter_and_cursor(store: Arc<dyn Store>) {
    let batch = vec![
        event(
            "t1",
            "r1",
            "run.start",
            "trace",
            json!({"chain": "lead_agent"}),
            json!({"caller": "lead_agent"}),
        ),
        step("t1", "r1", "call_a", 1),
        event("t1", "r1", "llm.error", "trace", json!("boom"), json!({})),
        step("t1", "r1", "call_a", 2),
    ];
    store.append(&batch).await.unwrap();
    let mut query = EventQuery::run("t1", "r1");
    query.event_types = Some(vec!["subagent.step".into(), "run.start".into()]);
    let filtered = store.list_events(&query).await.unwrap();
    assert_eq!(
        filtered
            .iter()
            .map(|e| e.event_type.as_str())
            .collect::<Vec<_>>(),
        ["run.start", "subagent.step", "subagent.step"]
    );
    query.event_types = Some(vec![]);
    assert_eq!(store.list_events(&query).await.unwrap().len(), 4);
    query.event_types = Some(vec!["subagent.step, run.start".into()]);
    assert!(
        store.list_events(&query).await.unwrap().is_empty(),
        "types are matched exactly, untrimmed"
    );
    query.event_types = None;
    query.after_seq = Some(filtered[1].seq);
    let after = store.list_events(&query).await.unwrap();
    assert!(after.iter().all(|e| e.seq > filtered[1].seq));
    assert_eq!(after.len(), 2);
    assert_conforms(&filtered);
}

/// Paging with `limit = 1` from each last `seq` yields exactly the full list.
pub async fn paging_with_limit_one_equals_the_full_list(store: Arc<dyn Store>) {
    for chunk in 0..4 {
        let batch: Vec<NewEvent> = (0..7)
            .map(|i| {
                if i % 2 == 0 {
                    step("t1", "r1", "call_a", chunk * 7 + i + 1)
                } else {
                    trace("t1", "r1", i as usize)
                }
            })
            .collect();
        store.append(&batch).await.unwrap();
        store.append(&[trace("t1", "other", 0)]).await.unwrap();
    }
    let full = all_events(&*store, "t1", "r1").await;
    assert_eq!(full.len(), 28);
    let mut query = EventQuery::run("t1", "r1");
    query.limit = 1;
    let mut paged = Vec::new();
    loop {
        let page = store.list_events(&query).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert_eq!(page.len(), 1);
        query.after_seq = Some(page[0].seq);
        paged.extend(page);
    }
    assert_eq!(paged, full);
}

/// An unknown run, or a run of another thread, gives an empty list.
pub async fn queries_are_scoped_to_thread_and_run(store: Arc<dyn Store>) {
    store.append(&[trace("t1", "r1", 1)]).await.unwrap();
    store.append(&[trace("t2", "r2", 1)]).await.unwrap();
    assert!(
        all_events(&*store, "t1", "r2").await.is_empty(),
        "run of another thread"
    );
    assert!(
        all_events(&*store, "t1", "nope").await.is_empty(),
        "unknown run"
    );
    assert!(
        all_events(&*store, "t9", "r1").await.is_empty(),
        "unknown thread"
    );
    assert_eq!(all_events(&*store, "t2", "r2").await.len(), 1);
}

/// `limit` must be 1–2000 and `after_seq` at least 1.
pub async fn query_bounds_are_enforced(store: Arc<dyn Store>) {
    let mut query = EventQuery::run("t1", "r1");
    for limit in [0, 2001] {
        query.limit = limit;
        assert!(
            matches!(store.list_events(&query).await, Err(Error::InvalidQuery(_))),
            "limit {limit}"
        );
    }
    query.limit = 2000;
    assert!(store.list_events(&query).await.is_ok());
    query.after_seq = Some(0);
    assert!(matches!(
        store.list_events(&query).await,
        Err(Error::InvalidQuery(_))
    ));
    query.after_seq = Some(1);
    assert!(store.list_events(&query).await.is_ok());
}

/// Message projections hold `message` records only, never subagent or middleware ones.
pub async fn message_projection_holds_only_message_records(store: Arc<dyn Store>) {
    let history = full_run_history("t1", "r1");
    store.append(&history).await.unwrap();
    let messages = store.list_messages("t1", None, 2000).await.unwrap();
    let types: Vec<&str> = messages.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        [
            "llm.human.input",
            "llm.ai.response",
            "llm.tool.result",
            "llm.ai.response"
        ]
    );
    assert!(
        messages
            .iter()
            .all(|e| e.category == EventCategory::Message.as_str())
    );
    assert_strictly_increasing(&messages);
    assert!(
        store
            .list_messages("t-none", None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Pages run backwards: the newest two, then the two before the first of them.
    let newest = store.list_messages("t1", None, 2).await.unwrap();
    assert_eq!(newest, messages[2..]);
    let older = store
        .list_messages("t1", Some(newest[0].seq), 2)
        .await
        .unwrap();
    assert_eq!(older, messages[..2]);
    let first = store
        .list_messages("t1", Some(messages[0].seq), 2)
        .await
        .unwrap();
    assert!(first.is_empty());
}

/// Several writers appending to one thread at once: every record once, seqs unique and
/// increasing, each writer's records in its own order.
pub async fn concurrent_writers_to_one_thread_never_collide(store: Arc<dyn Store>) {
    let writers = 6;
    let batches = 15;
    let mut handles = Vec::new();
    for writer in 0..writers {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            for b in 0..batches {
                let batch: Vec<NewEvent> = (0..5)
                    .map(|i| {
                        event(
                            "t1",
                            &format!("r{writer}"),
                            "llm.error",
                            "trace",
                            json!(b * 5 + i),
                            json!({}),
                        )
                    })
                    .collect();
                store.append(&batch).await.expect("concurrent append");
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    let mut all = Vec::new();
    for writer in 0..writers {
        let run = all_events(&*store, "t1", &format!("r{writer}")).await;
        let values: Vec<i64> = run.iter().map(|e| e.content.as_i64().unwrap()).collect();
        assert_eq!(
            values,
            (0..batches * 5).collect::<Vec<_>>(),
            "writer {writer} kept its order"
        );
        all.extend(run);
    }
    let seqs: HashSet<i64> = all.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs.len(),
        (writers * batches * 5) as usize,
        "no seq shared"
    );
}

/// A realistic run history, as the runtime writes it.
pub fn full_run_history(thread: &str, run: &str) -> Vec<NewEvent> {
    let task = |chunk: Value| {
        let mapped = map_task_event(&chunk).expect("valid task event");
        mapped.into_event(thread, run).with_user(Some("u1".into()))
    };
    let usage = json!({"input_tokens": 120, "output_tokens": 30, "total_tokens": 150});
    vec![
        event(
            thread,
            run,
            EventType::RunStart.as_str(),
            "trace",
            json!({"chain": "lead_agent"}),
            json!({"caller": "lead_agent"}),
        ),
        event(
            thread,
            run,
            EventType::LlmHumanInput.as_str(),
            "message",
            json!({"type": "human", "content": "Compare three databases"}),
            json!({"caller": "lead_agent"}),
        ),
        event(
            thread,
            run,
            EventType::LlmAiResponse.as_str(),
            "message",
            json!({"type": "ai", "content": "", "tool_calls": [{"id": "call_1", "name": "task", "args": {"description": "d", "prompt": "p", "subagent_type": "general-purpose"}, "type": "tool_call"}]}),
            json!({"caller": "lead_agent", "usage": usage, "latency_ms": 12, "llm_call_index": 1}),
        ),
        task(
            json!({"type": "task_started", "task_id": "call_1", "description": "Explore", "model_name": "scripted-1"}),
        ),
        task(
            json!({"type": "task_running", "task_id": "call_1", "message_index": 1, "total_messages": 1,
                    "message": {"type": "ai", "content": "", "tool_calls": [{"id": "c2", "name": "write_file", "args": {"path": "note.md", "content": "x"}}]},
                    "usage": usage, "model_name": "scripted-1"}),
        ),
        task(
            json!({"type": "task_running", "task_id": "call_1", "message_index": 2, "total_messages": 2,
                    "message": {"type": "tool", "name": "write_file", "content": "Wrote note.md", "tool_call_id": "c2"},
                    "usage": usage, "model_name": "scripted-1"}),
        ),
        event(
            thread,
            run,
            &MiddlewareTag::LoopDetection.event_type(),
            "middleware",
            json!({"name": "LoopDetectionMiddleware", "hook": "after_model", "action": "warn",
                     "changes": {"is_subagent": true, "agent_id": "general-purpose", "detection_layer": "identical_call_set",
                                 "tool_names": ["write_file"], "count": 3, "threshold": 3}}),
            json!({}),
        ),
        task(
            json!({"type": "task_completed", "task_id": "call_1", "result": "Done", "usage": usage, "model_name": "scripted-1"}),
        ),
        event(
            thread,
            run,
            EventType::LlmToolResult.as_str(),
            "message",
            json!({"type": "tool", "content": "Task Succeeded. Result: Done", "tool_call_id": "call_1"}),
            json!({}),
        ),
        event(
            thread,
            run,
            EventType::LlmAiResponse.as_str(),
            "message",
            json!({"type": "ai", "content": "Summary", "tool_calls": []}),
            json!({"caller": "lead_agent", "usage": usage, "latency_ms": null, "llm_call_index": 2}),
        ),
        event(
            thread,
            run,
            EventType::RunEnd.as_str(),
            "outputs",
            json!({"messages": 5}),
            json!({"status": "success"}),
        ),
    ]
}

/// Every record of a full run history validates against both contracts.
pub async fn a_full_run_history_conforms_to_both_contracts(store: Arc<dyn Store>) {
    let history = full_run_history("t1", "r1");
    store.append(&history[..5]).await.unwrap();
    store.append(&history[5..]).await.unwrap();
    let back = all_events(&*store, "t1", "r1").await;
    assert_eq!(back.len(), history.len());
    assert_conforms(&back);
    for record in &back {
        let created = time::OffsetDateTime::parse(
            &record.created_at,
            &time::format_description::well_known::Rfc3339,
        );
        assert!(
            created.is_ok(),
            "created_at {} is RFC 3339",
            record.created_at
        );
    }
}

/// A record keeps the `created_at` its producer gave it (docs/events.md#envelope): a batch written
/// later, or flushed with records of other moments, says when each event happened.
pub async fn created_at_is_when_the_event_happened(store: Arc<dyn Store>) {
    let moments = [
        "2026-03-01T09:00:00.000001Z",
        "2026-03-01T09:00:00.250000Z",
        "2026-03-01T09:00:07.999999Z",
    ];
    let batch: Vec<NewEvent> = moments
        .iter()
        .enumerate()
        .map(|(n, at)| {
            let mut record = step("t1", "r1", "call_a", n as u64 + 1);
            record.created_at = (*at).to_owned();
            record
        })
        .collect();
    store.append(&batch).await.unwrap();
    let emitted = trace("t1", "r1", 9);
    store.append(std::slice::from_ref(&emitted)).await.unwrap();
    let back = all_events(&*store, "t1", "r1").await;
    let stamps: Vec<&str> = back.iter().map(|r| r.created_at.as_str()).collect();
    assert_eq!(
        stamps,
        [moments[0], moments[1], moments[2], &emitted.created_at]
    );
    assert_conforms(&back);
}

/// The same history gives the same pages, `created_at` included, on this backend as on
/// the in-memory reference.
pub async fn identical_histories_give_identical_results(store: Arc<dyn Store>) {
    let reference = crate::MemoryStore::new();
    let mut history = full_run_history("t1", "r1");
    for (n, record) in history.iter_mut().enumerate() {
        record.event_id = Uuid::from_u128(n as u128 + 1);
    }
    for part in [&history[..3], &history[3..4], &history[4..]] {
        store.append(part).await.unwrap();
        reference.append(part).await.unwrap();
    }
    let mut queries = vec![EventQuery::run("t1", "r1")];
    let mut by_task = EventQuery::run("t1", "r1");
    by_task.task_id = Some("call_1".into());
    by_task.limit = 2;
    queries.push(by_task.clone());
    by_task.after_seq = Some(5);
    queries.push(by_task);
    let mut by_type = EventQuery::run("t1", "r1");
    by_type.event_types = Some(vec![
        "subagent.end".into(),
        "middleware:loop_detection".into(),
    ]);
    queries.push(by_type);
    for query in queries {
        let ours = store.list_events(&query).await.unwrap();
        let theirs = reference.list_events(&query).await.unwrap();
        assert_eq!(
            serde_json::to_string(&ours).unwrap(),
            serde_json::to_string(&theirs).unwrap(),
            "{query:?}"
        );
    }
    for (before, limit) in [(None, 2000), (None, 2), (Some(5), 1)] {
        let ours = store.list_messages("t1", before, limit).await.unwrap();
        let theirs = reference.list_messages("t1", before, limit).await.unwrap();
        assert_eq!(ours, theirs, "before {before:?}, limit {limit}");
    }
}

/// [`EventStore::list_events_json`] is byte for byte the page [`EventStore::list_events`]
/// returns, serialised, with `auth_token` taken out of metadata (wherever else the words
/// appear), under every filter; an empty page is `[]`.
pub async fn json_pages_are_the_serialised_events_without_auth_tokens(store: Arc<dyn Store>) {
    let batch = vec![
        event(
            "t1",
            "r1",
            "run.start",
            "trace",
            json!({"chain": "lead_agent", "quote": "a \"quoted\" line\nand é, 😀, \u{1}"}),
            json!({"caller": "lead_agent", "auth_token": "secret", "nested": {"auth_token": "kept"}}),
        ),
        step("t1", "r1", "call_a", 1),
        event(
            "t1",
            "r1",
            "llm.error",
            "trace",
            json!([1.5, -2, 1e300, null, true]),
            json!({"note": "mentions auth_token in a value"}),
        ),
        step("t1", "r1", "call_b", 2),
    ];
    store.append(&batch).await.unwrap();
    let expected = |events: Vec<subflow_contracts::RunEvent>| {
        let events: Vec<_> = events
            .into_iter()
            .map(|mut event| {
                event.metadata.remove("auth_token");
                event
            })
            .collect();
        serde_json::to_string(&events).unwrap()
    };
    let mut queries = vec![EventQuery::run("t1", "r1"), EventQuery::run("t1", "none")];
    let mut by_task = EventQuery::run("t1", "r1");
    by_task.task_id = Some("call_b".into());
    queries.push(by_task);
    let mut by_type = EventQuery::run("t1", "r1");
    by_type.event_types = Some(vec!["run.start".into(), "llm.error".into()]);
    by_type.after_seq = Some(1);
    by_type.limit = 1;
    queries.push(by_type);
    for query in queries {
        let json = store.list_events_json(&query).await.unwrap();
        let events = store.list_events(&query).await.unwrap();
        assert_eq!(
            String::from_utf8(json).unwrap(),
            expected(events),
            "{query:?}"
        );
    }
    let page: Vec<Value> = serde_json::from_slice(
        &store
            .list_events_json(&EventQuery::run("t1", "r1"))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(page.len(), 4);
    assert!(page[0]["metadata"].get("auth_token").is_none());
    assert_eq!(page[0]["metadata"]["nested"]["auth_token"], "kept");
}
