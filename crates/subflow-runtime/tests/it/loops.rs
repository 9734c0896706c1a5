//! The lead's loop detection across runs: its state is kept per thread for the life of
//! the process, and the least recently used thread is forgotten past
//! `loop_detection.max_tracked_threads` (docs/events.md#loop-detection).

use serde_json::json;

use crate::harness::{Harness, scripted_harness};

/// Every lead run makes the same single `ls` call, then answers.
fn same_call_each_run(warn_threshold: usize, max_tracked_threads: usize) -> Harness {
    let turns = json!([
        {"tool_calls": [{"name": "ls", "args": {"path": "."}}]},
        {"text": "done"}
    ]);
    scripted_harness(
        json!([{"agent": "lead_agent", "turns": turns}]),
        move |config| {
            config.loop_detection.warn_threshold = warn_threshold;
            config.loop_detection.hard_limit = 9;
            config.loop_detection.max_tracked_threads = max_tracked_threads;
        },
    )
}

/// The `middleware:loop_detection` actions a run recorded.
async fn loop_actions(h: &Harness, thread: &str, run: &str) -> Vec<String> {
    h.events(thread, run)
        .await
        .into_iter()
        .filter(|e| e.event_type == "middleware:loop_detection")
        .map(|e| e.content["action"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_leads_repeated_calls_count_across_runs_of_one_thread_and_not_across_threads() {
    let h = same_call_each_run(3, 100);
    h.run("t1", "r1", "Look").await;
    h.run("t2", "r2", "Look").await;
    h.run("t1", "r3", "Look").await;
    h.run("t2", "r4", "Look").await;
    assert!(loop_actions(&h, "t1", "r3").await.is_empty());
    let (result, _) = h.run("t1", "r5", "Look").await;
    assert_eq!(loop_actions(&h, "t1", "r5").await, ["warn"]);
    let audit = h
        .events("t1", "r5")
        .await
        .into_iter()
        .find(|e| e.event_type == "middleware:loop_detection")
        .unwrap();
    assert_eq!(audit.content["changes"]["count"], 3);
    assert_eq!(audit.content["changes"]["is_subagent"], false);
    assert_eq!(result.status, subflow_contracts::RunStatus::Success);
    assert!(
        loop_actions(&h, "t2", "r4").await.is_empty(),
        "t2 made the call twice only"
    );
}

#[tokio::test(start_paused = true)]
async fn past_max_tracked_threads_the_least_recently_used_thread_starts_over() {
    // Room for both threads: t1's second call warns.
    let roomy = same_call_each_run(2, 2);
    roomy.run("t1", "r1", "Look").await;
    roomy.run("t2", "r2", "Look").await;
    roomy.run("t1", "r3", "Look").await;
    assert_eq!(loop_actions(&roomy, "t1", "r3").await, ["warn"]);

    // Room for one: t2 evicts t1, whose second call is a first again.
    let tight = same_call_each_run(2, 1);
    tight.run("t1", "r1", "Look").await;
    tight.run("t2", "r2", "Look").await;
    tight.run("t1", "r3", "Look").await;
    assert!(loop_actions(&tight, "t1", "r3").await.is_empty());
    tight.run("t1", "r4", "Look").await;
    assert_eq!(loop_actions(&tight, "t1", "r4").await, ["warn"]);
}
