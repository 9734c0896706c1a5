//! Progress and spend of a durable batch: the additive fields of the public batch
//! (`usage`, `cost`, `items_per_minute`, `eta_seconds`, `projected_cost`) and the
//! `batches` section of `/token-usage`. One pure function over the batch record and the
//! store's [`BatchActivity`]; the workspace and `subflow batches` only display what it
//! computes.
//!
//! * `usage` sums the items' `token_usage` (each item keeps its last finished attempt's).
//! * `cost` prices each item at its own model (docs/usage-and-cost.md#cost: lookup by name or provider
//!   model, no cache discount since item usage has no cache split); null when nothing is
//!   priced or currencies mix.
//! * `items_per_minute` counts the items that ended `succeeded` or `failed` in the last
//!   [`RATE_WINDOW`]. The window opens at the earliest start among them when that is
//!   later, so a batch that began or resumed a minute ago is not diluted over five.
//! * `eta_seconds` is the unfinished items at that rate; null while the batch is not
//!   `queued` or `running` (paused or ended) or nothing finished in the window.
//! * `projected_cost` is what the whole batch will cost: the cost so far plus the cost
//!   per item that reported usage times the unfinished items; null without a cost.

use std::time::Duration;

use serde::Serialize;
use subflow_contracts::BatchStatus;
use subflow_contracts::api::usage::{BatchSpend, Cost};
use subflow_store::ItemUsage;
use subflow_store::batches::{BatchActivity, BatchRecord};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::usage::{ModelFacts, RunCost, cost_of, priced, round6};

/// How far back completions count towards `items_per_minute`.
pub const RATE_WINDOW: Duration = Duration::from_secs(5 * 60);

/// The shortest window a rate is divided by, so that one item that started and ended
/// within a second does not read as thousands per minute.
const MIN_SPAN_SECONDS: f64 = 1.0;

/// The progress fields of one batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Progress {
    /// The items' usage, summed.
    pub usage: ItemUsage,
    /// `{currency, total, by_model}` of the items priced at their models, or `None`.
    pub cost: Option<Cost>,
    /// Items finished per minute over the last five minutes, 2 decimals.
    pub items_per_minute: f64,
    /// Seconds until the unfinished items are done at that rate, or null.
    pub eta_seconds: Option<u64>,
    /// The whole batch's expected cost in `cost.currency`, or null.
    pub projected_cost: Option<f64>,
}

/// The first moment of the rate window ending at `now`, in the stored RFC 3339 form:
/// the store's `completed_since`.
pub fn window_start(now: OffsetDateTime) -> String {
    subflow_store::rfc3339(now - RATE_WINDOW)
}

/// The priced amounts of a batch's items, one per model that has a price.
fn item_costs(activity: &BatchActivity, models: &[ModelFacts]) -> Vec<RunCost> {
    activity
        .by_model
        .iter()
        .filter_map(|group| priced(models, group.model_name.as_deref()?, &group.usage.tokens()))
        .collect()
}

/// The summed usage and the cost object of some activities.
fn spend(activities: &[&BatchActivity], models: &[ModelFacts]) -> (ItemUsage, u64, Option<Cost>) {
    let mut usage = ItemUsage::default();
    let mut items = 0;
    for group in activities.iter().flat_map(|a| a.by_model.iter()) {
        usage.input_tokens += group.usage.input_tokens;
        usage.output_tokens += group.usage.output_tokens;
        usage.total_tokens += group.usage.total_tokens;
        items += group.items;
    }
    let cost = cost_of(activities.iter().flat_map(|a| item_costs(a, models)));
    (usage, items, cost)
}

/// Items per minute from `recent` completions, the window opening at the later of
/// `now − RATE_WINDOW` and `first_start`.
fn rate(recent: u64, first_start: Option<&str>, now: OffsetDateTime) -> f64 {
    if recent == 0 {
        return 0.0;
    }
    let earliest = now - RATE_WINDOW;
    let start = first_start
        .and_then(|at| OffsetDateTime::parse(at, &Rfc3339).ok())
        .map_or(earliest, |at| at.max(earliest));
    let span = (now - start).as_seconds_f64().max(MIN_SPAN_SECONDS);
    recent as f64 / span * 60.0
}

/// The progress fields of `batch` from its `activity` at `now`.
pub fn progress(
    batch: &BatchRecord,
    activity: &BatchActivity,
    now: OffsetDateTime,
    models: &[ModelFacts],
) -> Progress {
    let (usage, items_with_usage, cost) = spend(&[activity], models);
    let per_minute = rate(
        activity.recent_completions,
        activity.recent_first_start.as_deref(),
        now,
    );
    let left = batch.counts.unfinished();
    let moving = matches!(batch.status, BatchStatus::Queued | BatchStatus::Running);
    let eta_seconds =
        (moving && per_minute > 0.0).then(|| (left as f64 / per_minute * 60.0).ceil() as u64);
    let projected_cost = cost
        .as_ref()
        .map(|cost| cost.total)
        .filter(|_| items_with_usage > 0)
        .map(|so_far| round6(so_far + so_far / items_with_usage as f64 * left as f64));
    Progress {
        usage,
        cost,
        items_per_minute: (per_minute * 100.0).round() / 100.0,
        eta_seconds,
        projected_cost,
    }
}

/// The `batches` section of `/token-usage`: `{items, total_tokens, cost}` over the
/// thread's batch items that reported usage, kept apart from the run totals (docs/batches.md#observability).
pub fn thread_section(activities: &[BatchActivity], models: &[ModelFacts]) -> BatchSpend {
    let all: Vec<&BatchActivity> = activities.iter().collect();
    let (usage, items, cost) = spend(&all, models);
    BatchSpend {
        items,
        total_tokens: usage.total_tokens,
        cost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::Price;
    use proptest::prelude::*;
    use serde_json::{Value, json};
    use subflow_store::batches::{BatchCounts, ModelItemUsage};

    const NOW: &str = "2026-03-01T12:00:00.000000Z";

    fn now() -> OffsetDateTime {
        OffsetDateTime::parse(NOW, &Rfc3339).unwrap()
    }

    fn ago(seconds: i64) -> String {
        subflow_store::rfc3339(now() - time::Duration::seconds(seconds))
    }

    fn priced(name: &str, input: f64, output: f64, currency: &str) -> ModelFacts {
        ModelFacts {
            name: name.into(),
            model: format!("{name}-provider"),
            context_window: None,
            pricing: Some(Price {
                currency: currency.into(),
                input_per_million: input,
                output_per_million: output,
                input_cache_hit_per_million: Some(0.01),
                input_cache_write_per_million: None,
            }),
        }
    }

    fn models() -> Vec<ModelFacts> {
        vec![
            priced("gpt", 2.0, 8.0, "usd"),
            priced("claude", 3.0, 15.0, "USD"),
            ModelFacts {
                pricing: None,
                ..priced("local", 0.0, 0.0, "USD")
            },
        ]
    }

    fn batch(status: BatchStatus, counts: BatchCounts) -> BatchRecord {
        BatchRecord {
            id: "subagent-batch-1".into(),
            thread_id: "t".into(),
            title: "t".into(),
            subagent_type: "general-purpose".into(),
            status,
            total_items: counts.total(),
            max_live_items: 10,
            max_running_items: 3,
            max_attempts: 3,
            created_at: ago(3600),
            updated_at: ago(1),
            completed_at: None,
            counts,
            pause_reason: None,
            budget_level: 0,
            user_id: "u".into(),
            run_id: None,
            tool_call_id: None,
            submission_key: "k".into(),
            execution_spec: Value::Null,
        }
    }

    fn counts(pending: u64, running: u64, succeeded: u64, failed: u64) -> BatchCounts {
        BatchCounts {
            pending,
            running,
            succeeded,
            failed,
            ..BatchCounts::default()
        }
    }

    fn group(model: Option<&str>, items: u64, input: i64, output: i64) -> ModelItemUsage {
        ModelItemUsage {
            model_name: model.map(str::to_owned),
            items,
            usage: ItemUsage {
                input_tokens: input,
                output_tokens: output,
                total_tokens: input + output,
                cache_read_tokens: 0,
                cache_write_tokens: 0,
            },
        }
    }

    fn activity(groups: Vec<ModelItemUsage>, recent: u64, first: Option<String>) -> BatchActivity {
        BatchActivity {
            batch_id: "subagent-batch-1".into(),
            by_model: groups,
            recent_completions: recent,
            recent_first_start: first,
        }
    }

    #[test]
    fn a_batch_with_no_completions_yet_has_no_rate_eta_or_cost() {
        let fresh = batch(BatchStatus::Queued, counts(10, 0, 0, 0));
        let found = progress(&fresh, &BatchActivity::empty("b"), now(), &models());
        assert_eq!(found.usage, ItemUsage::default());
        assert_eq!(found.cost, None);
        assert_eq!(found.items_per_minute, 0.0);
        assert_eq!(found.eta_seconds, None);
        assert_eq!(found.projected_cost, None);
    }

    #[test]
    fn rate_is_recent_completions_per_minute_of_the_window_and_eta_the_rest_at_it() {
        // 30 items in the last five minutes, the first started long before: 6 per minute.
        let running = batch(BatchStatus::Running, counts(57, 3, 28, 2));
        let found = progress(
            &running,
            &activity(
                vec![group(Some("gpt"), 30, 3_000, 1_500)],
                30,
                Some(ago(900)),
            ),
            now(),
            &models(),
        );
        assert_eq!(found.items_per_minute, 6.0);
        assert_eq!(found.eta_seconds, Some(600), "60 left at 6/min");
        // Started a minute ago: the window is that minute, not five.
        let resumed = progress(
            &running,
            &activity(vec![], 6, Some(ago(60))),
            now(),
            &models(),
        );
        assert_eq!(resumed.items_per_minute, 6.0);
        assert_eq!(resumed.eta_seconds, Some(600));
    }

    #[test]
    fn a_paused_batch_has_a_rate_but_no_eta_and_an_ended_one_neither_eta() {
        let recent = activity(vec![group(Some("gpt"), 5, 100, 100)], 5, Some(ago(30)));
        for status in [
            BatchStatus::Paused,
            BatchStatus::Completed,
            BatchStatus::Cancelled,
        ] {
            let found = progress(
                &batch(status, counts(5, 0, 5, 0)),
                &recent,
                now(),
                &models(),
            );
            assert_eq!(found.eta_seconds, None, "{status:?}");
            assert_eq!(found.items_per_minute, 10.0);
        }
    }

    #[test]
    fn each_item_is_priced_at_its_model_and_the_projection_scales_the_cost_per_item() {
        let mixed = activity(
            vec![
                group(Some("claude"), 1, 1_000_000, 0),
                group(Some("gpt-provider"), 3, 0, 1_000_000),
            ],
            4,
            Some(ago(120)),
        );
        let found = progress(
            &batch(BatchStatus::Running, counts(4, 0, 4, 0)),
            &mixed,
            now(),
            &models(),
        );
        assert_eq!(
            serde_json::to_value(&found.cost).unwrap(),
            json!({"currency": "USD", "total": 11.0, "by_model": {"claude": 3.0, "gpt-provider": 8.0}})
        );
        assert_eq!(
            found.usage,
            ItemUsage {
                input_tokens: 1_000_000,
                output_tokens: 1_000_000,
                total_tokens: 2_000_000,
                cache_read_tokens: 0,
                cache_write_tokens: 0,
            }
        );
        // 11.0 over 4 items, 4 left: 22.0 in all.
        assert_eq!(found.projected_cost, Some(22.0));
        let mut done = batch(BatchStatus::Completed, counts(0, 0, 8, 0));
        done.completed_at = Some(ago(1));
        assert_eq!(
            progress(&done, &mixed, now(), &models()).projected_cost,
            Some(11.0),
            "nothing left: the projection is the cost"
        );
    }

    #[test]
    fn unpriced_models_cost_nothing_and_only_unpriced_items_give_a_null_cost() {
        let running = batch(BatchStatus::Running, counts(2, 0, 2, 0));
        let unpriced = activity(
            vec![group(Some("local"), 1, 500, 500), group(None, 1, 10, 10)],
            2,
            None,
        );
        let found = progress(&running, &unpriced, now(), &models());
        assert_eq!(found.cost, None);
        assert_eq!(found.projected_cost, None);
        assert_eq!(found.usage.total_tokens, 1_020);
        let partly = activity(
            vec![
                group(Some("local"), 1, 500, 500),
                group(Some("gpt"), 1, 1_000_000, 0),
            ],
            2,
            None,
        );
        let found = progress(&running, &partly, now(), &models());
        assert_eq!(found.cost.map(|cost| cost.total), Some(2.0));
        // The cost per item spreads over every item that reported usage.
        assert_eq!(found.projected_cost, Some(4.0));
        let mut euro = models();
        euro[1] = priced("claude", 3.0, 15.0, "EUR");
        let both = activity(
            vec![
                group(Some("gpt"), 1, 10, 10),
                group(Some("claude"), 1, 10, 10),
            ],
            2,
            None,
        );
        assert_eq!(progress(&running, &both, now(), &euro).cost, None);
    }

    #[test]
    fn retried_items_count_once_with_their_last_attempt() {
        // A retried item is pending again with its usage cleared: it is one more item
        // left, and only its next attempt will be paid for.
        let before = batch(BatchStatus::Completed, counts(0, 0, 1, 1));
        let after = batch(BatchStatus::Queued, counts(1, 0, 1, 0));
        let spent = activity(vec![group(Some("gpt"), 2, 1_000_000, 0)], 2, Some(ago(60)));
        let retried = activity(vec![group(Some("gpt"), 1, 500_000, 0)], 1, Some(ago(60)));
        assert_eq!(
            progress(&before, &spent, now(), &models()).projected_cost,
            Some(2.0)
        );
        let found = progress(&after, &retried, now(), &models());
        assert_eq!(found.cost.as_ref().map(|cost| cost.total), Some(1.0));
        assert_eq!(
            found.projected_cost,
            Some(2.0),
            "1.0 so far, 1.0 per item, 1 left"
        );
        assert_eq!(found.eta_seconds, Some(60));
    }

    #[test]
    fn the_thread_section_sums_every_batch() {
        let a = activity(vec![group(Some("gpt"), 2, 1_000_000, 0)], 0, None);
        let b = activity(vec![group(None, 1, 5, 5)], 0, None);
        assert_eq!(
            serde_json::to_value(thread_section(&[a, b], &models())).unwrap(),
            json!({"items": 3, "total_tokens": 1_000_010, "cost": {"currency": "USD", "total": 2.0, "by_model": {"gpt": 2.0}}})
        );
        assert_eq!(
            serde_json::to_value(thread_section(&[], &models())).unwrap(),
            json!({"items": 0, "total_tokens": 0, "cost": null})
        );
    }

    proptest! {
        #[test]
        fn the_projection_never_falls_below_the_cost_and_the_eta_shrinks_as_the_rate_grows(
            left in 0u64..10_000,
            finished in 1u64..10_000,
            recent in 1u64..500,
            slower in 1u64..500,
            started in 0i64..1_200,
            input in 0i64..10_000_000,
            output in 1i64..10_000_000,
            paused in proptest::bool::ANY,
        ) {
            let status = if paused { BatchStatus::Paused } else { BatchStatus::Running };
            let record = batch(status, counts(left, 0, finished, 0));
            let fast = activity(vec![group(Some("gpt"), finished, input, output)], recent.max(slower), Some(ago(started)));
            let slow = activity(vec![group(Some("gpt"), finished, input, output)], recent.min(slower), Some(ago(started)));
            let (a, b) = (progress(&record, &fast, now(), &models()), progress(&record, &slow, now(), &models()));
            let cost = a.cost.as_ref().unwrap().total;
            prop_assert!(a.projected_cost.unwrap() + 1e-6 >= cost);
            prop_assert!(a.items_per_minute >= b.items_per_minute);
            prop_assert!(a.items_per_minute <= recent.max(slower) as f64 * 60.0 / MIN_SPAN_SECONDS);
            match (a.eta_seconds, b.eta_seconds) {
                (Some(fast), Some(slow)) => prop_assert!(fast <= slow),
                (None, None) => prop_assert!(paused),
                other => prop_assert!(false, "one ETA without the other: {other:?}"),
            }
            if left == 0 && !paused {
                prop_assert_eq!(a.eta_seconds, Some(0));
            }
        }

        #[test]
        fn without_completions_in_the_window_there_is_never_an_eta(left in 0u64..10_000, tokens in 0i64..1_000_000) {
            let record = batch(BatchStatus::Running, counts(left, 1, 3, 0));
            let found = progress(&record, &activity(vec![group(Some("gpt"), 3, tokens, tokens)], 0, None), now(), &models());
            prop_assert_eq!(found.eta_seconds, None);
            prop_assert_eq!(found.items_per_minute, 0.0);
        }
    }
}
