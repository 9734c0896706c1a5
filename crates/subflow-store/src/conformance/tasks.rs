//! Conformance cases of [`EventStore::task_summaries`](crate::EventStore::task_summaries)
//! (docs/api.md#task-summaries): every backend counts what a card lists, exactly as the memory store and
//! the card rules (`task_card::display_steps` over the `/events` backfill) do.

use std::sync::Arc;

use serde_json::{Value, json};
use subflow_contracts::task_card::{self, CardStatus};
use subflow_contracts::task_events::map_task_event;
use subflow_contracts::{NewEvent, TaskEndStatus};

use super::{all_events, assert_conforms};
use crate::tasks::{self, StepBrief};
use crate::{EventQuery, Store};

/// Expands to one `#[tokio::test]` per task-summary case; invoked by `conformance_tests!`.
#[doc(hidden)]
#[macro_export]
macro_rules! task_conformance_tests {
    ($factory:expr) => {
        $crate::task_conformance_tests!(@cases $factory;
            task_summaries_count_what_a_card_lists,
            task_summaries_are_scoped_to_thread_and_run,
            a_long_task_is_summarised_in_one_query,
        );
    };
    (@cases $factory:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $factory.await;
                $crate::conformance::tasks::$case(fixture.store.clone()).await;
            }
        )+
    };
}

/// One task event of `thread`/`run` as the runtime persists it, with `extra` content.
fn task(thread: &str, run: &str, chunk: Value, extra: Option<(&str, Value)>) -> NewEvent {
    let mut mapped = map_task_event(&chunk).expect("a valid task event");
    if let Some((key, value)) = extra {
        mapped = mapped.with_content_field(key, value);
    }
    mapped.into_event(thread, run).with_user(Some("u1".into()))
}

fn usage(total: u64) -> Value {
    json!({"input_tokens": total - 10, "output_tokens": 10, "total_tokens": total})
}

fn start(thread: &str, run: &str, id: &str) -> NewEvent {
    task(
        thread,
        run,
        json!({"type": "task_started", "task_id": id, "description": format!("Task {id}"), "model_name": "scripted-1"}),
        Some(("subagent_type", json!("general-purpose"))),
    )
}

fn ai(thread: &str, run: &str, id: &str, index: u64, text: &str, calls: usize) -> NewEvent {
    let calls: Vec<Value> = (0..calls)
        .map(|n| json!({"id": format!("c{index}-{n}"), "name": "ls", "args": {"path": "."}}))
        .collect();
    task(
        thread,
        run,
        json!({"type": "task_running", "task_id": id, "message_index": index, "total_messages": index,
               "message": {"type": "ai", "content": text, "tool_calls": calls}, "usage": usage(100 * index), "model_name": "scripted-1"}),
        None,
    )
}

fn tool(thread: &str, run: &str, id: &str, index: u64, text: &str) -> NewEvent {
    task(
        thread,
        run,
        json!({"type": "task_running", "task_id": id, "message_index": index, "total_messages": index,
               "message": {"type": "tool", "name": "ls", "content": text}, "usage": usage(100 * index), "model_name": "scripted-1"}),
        None,
    )
}

fn end(thread: &str, run: &str, id: &str, kind: &str, total: u64) -> NewEvent {
    let key = if kind == "task_completed" {
        "result"
    } else {
        "error"
    };
    let mut chunk =
        json!({"type": kind, "task_id": id, "usage": usage(total), "model_name": "scripted-1"});
    chunk[key] = json!(format!("{kind} text"));
    task(
        thread,
        run,
        chunk,
        Some(("stop_reason", json!("turn_capped"))).filter(|_| kind == "task_completed"),
    )
}

/// Every summary equals the reference reading and what the card lists after a backfill.
async fn assert_cards_agree(store: &dyn Store, thread: &str, run: &str) -> Vec<tasks::TaskSummary> {
    let summaries = store
        .task_summaries(thread, run)
        .await
        .expect("task_summaries");
    let records = all_events(store, thread, run).await;
    assert_conforms(&records);
    assert_eq!(
        summaries,
        tasks::summarize_all(tasks::task_rows(&records, run)),
        "the backend reads what the memory store reads"
    );
    for summary in &summaries {
        let mut query = EventQuery::run(thread, run);
        query.event_types = Some(vec!["subagent.step".into()]);
        query.task_id = Some(summary.task_id.clone());
        query.limit = crate::MAX_PAGE_LIMIT;
        let page = store.list_events(&query).await.expect("backfill page");
        let page = serde_json::to_value(&page).expect("records serialise");
        let steps = task_card::backfill_steps(&page, &summary.task_id);
        let status = match summary.end_status {
            Some(TaskEndStatus::Completed) => CardStatus::Completed,
            Some(_) => CardStatus::Failed,
            None => CardStatus::InProgress,
        };
        let listed = task_card::display_steps(&steps, status);
        assert_eq!(
            summary.step_count,
            listed.len() as u64,
            "{}: the count is what the card lists",
            summary.task_id
        );
        let last = listed.last().map(|step| StepBrief {
            kind: step.kind,
            text: step.text.chars().take(tasks::STEP_TEXT_CAP).collect(),
            tool_name: step.tool_name.clone(),
        });
        assert_eq!(
            summary.latest_step, last,
            "{}: the latest step",
            summary.task_id
        );
    }
    summaries
}

/// Three tasks of one run, written in interleaved batches: completed (its answer not
/// counted), stopped (cancelled) and still running; blank AI steps are not counted, a
/// rewritten `message_index` counts once, other runs and threads are not read.
pub async fn task_summaries_count_what_a_card_lists(store: Arc<dyn Store>) {
    let (t, r) = ("t1", "r1");
    store
        .append(&[
            start(t, r, "a"),
            start(t, r, "b"),
            ai(t, r, "a", 1, "", 1),
            tool(t, r, "a", 2, "listing"),
            ai(t, r, "b", 1, "Looking", 1),
            start(t, "r2", "a"),
            ai(t, "r2", "a", 1, "another run", 0),
        ])
        .await
        .unwrap();
    store
        .append(&[
            // JavaScript's trim removes these, so the card lists no such step.
            ai(t, r, "a", 3, "\u{a0}\u{3000}\u{feff} \n", 0),
            tool(t, r, "a", 4, ""),
            start(t, r, "c"),
            tool(t, r, "c", 1, "first"),
            // U+0085 is not JavaScript white space: the card lists this step.
            ai(t, r, "c", 2, "\u{85}", 0),
            // Nor is NUL, which PostgreSQL cannot turn into text.
            ai(t, r, "c", 3, "\u{0}", 0),
        ])
        .await
        .unwrap();
    store.append(&[start("t2", r, "a")]).await.unwrap();
    store
        .append(&[
            tool(t, r, "b", 2, "old text"),
            tool(t, r, "b", 2, "rewritten text"),
            ai(t, r, "b", 3, "Still thinking", 0),
            end(t, r, "b", "task_cancelled", 333),
            ai(t, r, "a", 5, "The answer", 0),
            end(t, r, "a", "task_completed", 555),
        ])
        .await
        .unwrap();

    let summaries = assert_cards_agree(&*store, t, r).await;
    let ids: Vec<&str> = summaries.iter().map(|s| s.task_id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"], "in start order");
    let [a, b, c] = &summaries[..] else {
        unreachable!()
    };
    assert_eq!(a.end_status, Some(TaskEndStatus::Completed));
    assert_eq!(
        a.step_count, 2,
        "the tool steps; blank and result steps are not listed"
    );
    assert_eq!(
        a.latest_step.as_ref().unwrap().tool_name.as_deref(),
        Some("ls")
    );
    assert_eq!(a.result_step.as_ref().unwrap().text, "The answer");
    assert_eq!(a.usage.unwrap().total_tokens, 555);
    assert_eq!(a.subagent_type.as_deref(), Some("general-purpose"));
    assert_eq!(a.description.as_deref(), Some("Task a"));
    assert_eq!(a.model_name.as_deref(), Some("scripted-1"));
    assert_eq!(a.stop_reason.as_deref(), Some("turn_capped"));
    assert_eq!(a.result.as_deref(), Some("task_completed text"));
    assert!(a.started_at.is_some() && a.ended_at.is_some());

    assert_eq!(b.end_status, Some(TaskEndStatus::Cancelled));
    assert_eq!(b.step_count, 3, "a stopped task lists its last AI step");
    assert_eq!(b.latest_step.as_ref().unwrap().text, "Still thinking");
    assert_eq!(b.result_step, None);
    assert_eq!(b.usage.unwrap().total_tokens, 333, "the end record's usage");
    assert_eq!(b.error.as_deref(), Some("task_cancelled text"));

    assert_eq!(c.end_status, None);
    assert_eq!(c.step_count, 3);
    assert_eq!(
        c.usage.unwrap().total_tokens,
        300,
        "the latest step's usage"
    );
    assert_eq!(c.ended_at, None);
}

/// An unknown run, a run of another thread and an unknown thread have no tasks.
pub async fn task_summaries_are_scoped_to_thread_and_run(store: Arc<dyn Store>) {
    store
        .append(&[start("t1", "r1", "a"), tool("t1", "r1", "a", 1, "x")])
        .await
        .unwrap();
    assert_eq!(store.task_summaries("t1", "r1").await.unwrap().len(), 1);
    for (thread, run) in [("t1", "nope"), ("t2", "r1"), ("nope", "nope")] {
        assert_eq!(
            store.task_summaries(thread, run).await.unwrap(),
            [],
            "{thread}/{run}"
        );
    }
}

/// 500 steps written 25 at a time, as the buffer flushes them, with a long last text.
pub async fn a_long_task_is_summarised_in_one_query(store: Arc<dyn Store>) {
    let (t, r) = ("t1", "r1");
    store.append(&[start(t, r, "long")]).await.unwrap();
    let long = "é".repeat(tasks::STEP_TEXT_CAP + 100);
    let steps: Vec<NewEvent> = (1..=500)
        .map(|i| match i % 5 {
            0 => ai(t, r, "long", i, if i == 500 { &long } else { "" }, 0),
            1 => ai(t, r, "long", i, "", 2),
            _ => tool(t, r, "long", i, "ok"),
        })
        .collect();
    for batch in steps.chunks(25) {
        store.append(batch).await.unwrap();
    }
    let summaries = assert_cards_agree(&*store, t, r).await;
    assert_eq!(
        summaries[0].step_count, 301,
        "300 tool steps and the last AI text"
    );
    let latest = summaries[0].latest_step.as_ref().unwrap();
    assert_eq!(latest.text.chars().count(), tasks::STEP_TEXT_CAP);
    store
        .append(&[end(t, r, "long", "task_completed", 99_999)])
        .await
        .unwrap();
    let summaries = assert_cards_agree(&*store, t, r).await;
    assert_eq!(
        summaries[0].step_count, 300,
        "completed: its answer is the result"
    );
}
