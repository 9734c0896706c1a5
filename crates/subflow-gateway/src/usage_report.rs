//! `GET /api/usage` arithmetic (docs/usage-and-cost.md#usage-across-threads): runs and batches of a
//! window, grouped by day, model, caller, thread or user, each group priced by the one
//! price function through [`crate::usage`]. Pure functions over records.

use std::collections::HashMap;

use subflow_contracts::RunStatus;
use subflow_contracts::api::usage::{
    BatchSpend, RunsUsage, UsageGroup, UsageGrouping, UsageReport,
};
use subflow_store::RunRecord;
use subflow_store::batches::{BatchActivity, BatchRecord};

use crate::usage::{ModelFacts, RunCost, cost_of, priced, run_costs, stopped};

/// The most groups one answer lists.
pub const MAX_GROUPS: usize = 1_000;

/// The window and grouping of one report.
#[derive(Debug, Clone)]
pub struct Window {
    /// Inclusive start, in the stored RFC 3339 form.
    pub from: String,
    /// Exclusive end, in the stored RFC 3339 form.
    pub to: String,
    /// How groups are keyed.
    pub group_by: UsageGrouping,
    /// The one user reported, if one.
    pub user_id: Option<String>,
}

impl Window {
    /// Whether a moment (stored RFC 3339, one fixed precision) falls in the window.
    pub fn holds(&self, at: &str) -> bool {
        self.from.as_str() <= at && at < self.to.as_str()
    }
}

/// A section being summed: tokens, and the priced amounts whose sum is its cost.
#[derive(Debug, Default)]
struct Sum {
    runs: u64,
    tokens: i64,
    input: i64,
    output: i64,
    costs: Vec<RunCost>,
    /// Set in caller groups, whose input, output and cost are unknown.
    callers_only: bool,
}

impl Sum {
    fn add(&mut self, tokens: i64, input: i64, output: i64, costs: Vec<RunCost>) {
        self.runs += 1;
        self.tokens += tokens;
        self.input += input;
        self.output += output;
        self.costs.extend(costs);
    }

    fn runs_usage(self) -> RunsUsage {
        let known = !self.callers_only;
        RunsUsage {
            runs: self.runs,
            total_tokens: self.tokens,
            total_input_tokens: known.then_some(self.input),
            total_output_tokens: known.then_some(self.output),
            cost: if known { cost_of(self.costs) } else { None },
        }
    }

    fn batch_spend(self) -> BatchSpend {
        BatchSpend {
            items: self.runs,
            total_tokens: self.tokens,
            cost: cost_of(self.costs),
        }
    }
}

/// One group being summed.
#[derive(Debug, Default)]
struct Group {
    counted: Sum,
    stopped: Sum,
    batches: Sum,
}

impl Group {
    fn finish(self, key: String) -> UsageGroup {
        UsageGroup {
            key,
            counted: self.counted.runs_usage(),
            stopped_runs: self.stopped.runs_usage(),
            batches: self.batches.batch_spend(),
        }
    }

    /// The group's cost in its first currency, for ordering.
    fn spend(&self) -> f64 {
        [&self.counted, &self.stopped, &self.batches]
            .iter()
            .flat_map(|sum| sum.costs.iter().map(|(_, _, amount)| amount))
            .sum()
    }
}

/// The UTC day of a stored RFC 3339 moment.
fn day(at: &str) -> String {
    at.get(..10).unwrap_or(at).to_owned()
}

/// A run's share of one group: its key, tokens, input, output and priced amounts.
type Share = (String, i64, i64, i64, Vec<RunCost>);

/// How a run splits over the groups of `group_by`.
fn run_shares(run: &RunRecord, group_by: UsageGrouping, models: &[ModelFacts]) -> Vec<Share> {
    let usage = &run.usage;
    let whole = |key: String| {
        vec![(
            key,
            usage.total_tokens,
            usage.total_input_tokens,
            usage.total_output_tokens,
            run_costs(usage, run.model_name.as_deref(), models),
        )]
    };
    match group_by {
        UsageGrouping::Day => whole(day(&run.created_at)),
        UsageGrouping::Thread => whole(run.thread_id.clone()),
        UsageGrouping::User => whole(run.owner.clone()),
        UsageGrouping::Model if usage.token_usage_by_model.is_empty() => whole(
            run.model_name
                .clone()
                .unwrap_or_else(|| "unknown".to_owned()),
        ),
        UsageGrouping::Model => usage
            .token_usage_by_model
            .iter()
            .map(|(model, bucket)| {
                (
                    model.clone(),
                    bucket.total_tokens,
                    bucket.input_tokens,
                    bucket.output_tokens,
                    priced(models, model, &bucket.tokens())
                        .into_iter()
                        .collect(),
                )
            })
            .collect(),
        UsageGrouping::Caller => [
            ("lead_agent", usage.lead_agent_tokens),
            ("subagent", usage.subagent_tokens),
            ("middleware", usage.middleware_tokens),
        ]
        .into_iter()
        .filter(|(_, tokens)| *tokens > 0)
        .map(|(caller, tokens)| (caller.to_owned(), tokens, 0, 0, Vec::new()))
        .collect(),
    }
}

/// The report of `runs` and `batches` (with their activity) created in `window`.
pub fn report(
    window: &Window,
    runs: &[RunRecord],
    batches: &[(BatchRecord, BatchActivity)],
    models: &[ModelFacts],
) -> UsageReport {
    let mut groups: HashMap<String, Group> = HashMap::new();
    let (mut counted, mut stopped_all, mut batch_all) =
        (Sum::default(), Sum::default(), Sum::default());
    let callers = window.group_by == UsageGrouping::Caller;
    for run in runs.iter().filter(|run| window.holds(&run.created_at)) {
        let is_counted = matches!(run.status, RunStatus::Success | RunStatus::Error);
        if !is_counted && !stopped(run) {
            continue;
        }
        let usage = &run.usage;
        let total = if is_counted {
            &mut counted
        } else {
            &mut stopped_all
        };
        total.add(
            usage.total_tokens,
            usage.total_input_tokens,
            usage.total_output_tokens,
            run_costs(usage, run.model_name.as_deref(), models),
        );
        for (key, tokens, input, output, costs) in run_shares(run, window.group_by, models) {
            let group = groups.entry(key).or_default();
            let sum = if is_counted {
                &mut group.counted
            } else {
                &mut group.stopped
            };
            sum.callers_only = callers;
            sum.add(tokens, input, output, costs);
        }
    }
    for (batch, activity) in batches
        .iter()
        .filter(|(batch, _)| window.holds(&batch.created_at))
    {
        for model in &activity.by_model {
            let name = model.model_name.as_deref().unwrap_or("unknown");
            let costs: Vec<RunCost> = priced(models, name, &model.usage.tokens())
                .into_iter()
                .collect();
            let key = match window.group_by {
                UsageGrouping::Day => day(&batch.created_at),
                UsageGrouping::Thread => batch.thread_id.clone(),
                UsageGrouping::User => batch.user_id.clone(),
                UsageGrouping::Model => name.to_owned(),
                UsageGrouping::Caller => "batch".to_owned(),
            };
            for sum in [&mut batch_all, &mut groups.entry(key).or_default().batches] {
                sum.runs += model.items;
                sum.tokens += model.usage.total_tokens;
                sum.costs.extend(costs.iter().cloned());
            }
        }
    }
    let mut ordered: Vec<(String, Group)> = groups.into_iter().collect();
    if window.group_by == UsageGrouping::Day {
        ordered.sort_by(|a, b| a.0.cmp(&b.0));
    } else {
        ordered.sort_by(|a, b| {
            b.1.spend()
                .total_cmp(&a.1.spend())
                .then_with(|| total_tokens(&b.1).cmp(&total_tokens(&a.1)))
                .then_with(|| a.0.cmp(&b.0))
        });
    }
    let truncated = ordered.len() > MAX_GROUPS;
    ordered.truncate(MAX_GROUPS);
    UsageReport {
        from: window.from.clone(),
        to: window.to.clone(),
        group_by: window.group_by,
        user_id: window.user_id.clone(),
        groups: ordered
            .into_iter()
            .map(|(key, group)| group.finish(key))
            .collect(),
        truncated,
        counted: counted.runs_usage(),
        stopped_runs: stopped_all.runs_usage(),
        batches: batch_all.batch_spend(),
        budgets: Vec::new(),
    }
}

fn total_tokens(group: &Group) -> i64 {
    group.counted.tokens + group.stopped.tokens + group.batches.tokens
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value, json};
    use subflow_store::{ModelUsage, RunUsage};

    use crate::usage::Price;

    fn models() -> Vec<ModelFacts> {
        vec![ModelFacts {
            name: "scripted".into(),
            model: "scripted-1".into(),
            context_window: None,
            pricing: Some(Price {
                currency: "USD".into(),
                input_per_million: 2.0,
                output_per_million: 8.0,
                input_cache_hit_per_million: Some(0.5),
                input_cache_write_per_million: None,
            }),
        }]
    }

    fn run(id: &str, owner: &str, thread: &str, day: &str, status: RunStatus) -> RunRecord {
        let bucket = ModelUsage {
            input_tokens: 1_000,
            output_tokens: 100,
            total_tokens: 1_100,
            cache_read_tokens: Some(400),
            cache_write_tokens: None,
        };
        RunRecord {
            run_id: id.into(),
            thread_id: thread.into(),
            owner: owner.into(),
            assistant_id: "lead_agent".into(),
            status,
            model_name: Some("scripted".into()),
            trace_id: None,
            stop_reason: None,
            error: None,
            metadata: Map::new(),
            multitask_strategy: "reject".into(),
            kwargs: Value::Null,
            usage: RunUsage {
                total_input_tokens: 1_000,
                total_output_tokens: 100,
                total_tokens: 1_100,
                lead_agent_tokens: 600,
                subagent_tokens: 500,
                token_usage_by_model: [("scripted-1".to_owned(), bucket)].into(),
                ..RunUsage::default()
            },
            created_at: format!("{day}T10:00:00.000000Z"),
            updated_at: String::new(),
        }
    }

    fn window(group_by: UsageGrouping) -> Window {
        Window {
            from: "2026-12-01T00:00:00.000000Z".into(),
            to: "2026-12-03T00:00:00.000000Z".into(),
            group_by,
            user_id: None,
        }
    }

    #[test]
    fn days_are_in_order_and_stopped_runs_and_the_window_are_kept_apart() {
        let runs = [
            run("a", "u1", "t1", "2026-12-02", RunStatus::Success),
            run("b", "u1", "t1", "2026-12-01", RunStatus::Error),
            run("c", "u2", "t2", "2026-12-01", RunStatus::Interrupted),
            run("d", "u2", "t2", "2026-12-03", RunStatus::Success),
            run("e", "u2", "t2", "2026-12-02", RunStatus::Running),
        ];
        let report = report(&window(UsageGrouping::Day), &runs, &[], &models());
        let keys: Vec<&str> = report.groups.iter().map(|g| g.key.as_str()).collect();
        assert_eq!(keys, ["2026-12-01", "2026-12-02"]);
        // 600 uncached at 2, 400 read at 0.5, 100 out at 8: 0.0022 a run.
        assert_eq!(report.counted.runs, 2);
        assert_eq!(
            serde_json::to_value(&report.counted.cost).unwrap(),
            json!({"currency": "USD", "total": 0.0044, "by_model": {"scripted-1": 0.0044}})
        );
        assert_eq!(report.stopped_runs.runs, 1);
        assert_eq!(report.groups[0].counted.runs, 1);
        assert_eq!(report.groups[0].stopped_runs.runs, 1);
        assert!(!report.truncated);
    }

    #[test]
    fn callers_split_tokens_but_carry_no_price_and_threads_sort_by_spend() {
        let runs = [
            run("a", "u1", "t1", "2026-12-02", RunStatus::Success),
            run("b", "u1", "t2", "2026-12-02", RunStatus::Success),
            run("c", "u1", "t2", "2026-12-02", RunStatus::Success),
        ];
        let by_caller = report(&window(UsageGrouping::Caller), &runs, &[], &models());
        let callers: Vec<(&str, i64)> = by_caller
            .groups
            .iter()
            .map(|g| (g.key.as_str(), g.counted.total_tokens))
            .collect();
        assert_eq!(callers, [("lead_agent", 1_800), ("subagent", 1_500)]);
        assert_eq!(by_caller.groups[0].counted.cost, None);
        assert_eq!(by_caller.groups[0].counted.total_input_tokens, None);
        let by_thread = report(&window(UsageGrouping::Thread), &runs, &[], &models());
        assert_eq!(by_thread.groups[0].key, "t2");
        assert_eq!(by_thread.groups[0].counted.runs, 2);
    }
}
