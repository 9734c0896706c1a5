//! `/token-usage` arithmetic (docs/usage-and-cost.md#thread-token-usage, docs/usage-and-cost.md#cost): counted runs, model and caller sums,
//! context usage and cache-aware cost. Pure functions over run records.

use std::collections::BTreeMap;

use subflow_contracts::RunStatus;
use subflow_contracts::api::TokenUsage;
use subflow_contracts::api::usage::{
    BatchSpend, CallerTotals, ContextUsage, Cost, ModelTotals, StoppedRuns, TaskCost,
};
use subflow_contracts::messages::Message;
use subflow_contracts::task_result::TokenUsage as TaskUsage;
use subflow_store::{RunRecord, RunUsage};

pub use subflow_contracts::cost::{ModelFacts, Price, RunCost, price_of, priced, round6};
use subflow_contracts::cost::{Tokens, cost as price_tokens};

/// Whether a run counts: `success` and `error`, plus `running` when asked.
pub fn counted(run: &RunRecord, include_active: bool) -> bool {
    matches!(run.status, RunStatus::Success | RunStatus::Error)
        || (include_active && run.status == RunStatus::Running)
}

/// The unrounded cost of one run by model (docs/usage-and-cost.md#cost): its priced buckets, skipping empty
/// ones; a run with no priced bucket is priced on its totals at `model_name`, with no
/// cache discount. Shared by `/token-usage` and `subflow_cost_total`.
pub fn run_costs(
    usage: &RunUsage,
    model_name: Option<&str>,
    models: &[ModelFacts],
) -> Vec<RunCost> {
    let mut costs: Vec<RunCost> = usage
        .token_usage_by_model
        .iter()
        .filter_map(|(model, bucket)| priced(models, model, &bucket.tokens()))
        .collect();
    if costs.is_empty()
        && let Some(model) = model_name
    {
        let totals = Tokens::of_signed(usage.total_input_tokens, usage.total_output_tokens, 0, 0);
        costs.extend(priced(models, model, &totals));
    }
    costs
}

/// The price of one task's cumulative usage at its model (docs/api.md#task-summaries, docs/usage-and-cost.md#cost), as
/// `{currency, total}`, or `None` when the model has no price: its cache reads and
/// writes at their own prices, as a card prices them.
pub fn task_cost(usage: &TaskUsage, model: &str, models: &[ModelFacts]) -> Option<TaskCost> {
    let price = price_of(models, model)?;
    Some(TaskCost {
        currency: price.currency.to_uppercase(),
        total: round6(price_tokens(&usage.tokens(), price)),
    })
}

/// The `cost` object over counted runs, or null when nothing is priced or currencies mix.
pub fn cost(runs: &[&RunRecord], models: &[ModelFacts]) -> Option<Cost> {
    cost_of(
        runs.iter()
            .flat_map(|run| run_costs(&run.usage, run.model_name.as_deref(), models)),
    )
}

/// The `cost` object of priced amounts (docs/usage-and-cost.md#cost aggregation): `by_model` and `total`
/// rounded to 6 decimals, or `None` when nothing is priced or currencies mix. Shared by
/// runs and batch items.
pub fn cost_of(costs: impl IntoIterator<Item = RunCost>) -> Option<Cost> {
    let mut by_model: BTreeMap<String, f64> = BTreeMap::new();
    let mut currencies: Vec<String> = Vec::new();
    for (model, currency, amount) in costs {
        currencies.push(currency);
        *by_model.entry(model).or_default() += amount;
    }
    currencies.sort_unstable();
    currencies.dedup();
    match currencies.as_slice() {
        [currency] => Some(Cost {
            currency: currency.clone(),
            total: round6(by_model.values().sum()),
            by_model: by_model
                .iter()
                .map(|(m, c)| (m.clone(), round6(*c)))
                .collect(),
        }),
        _ => None,
    }
}

/// `context_usage` of the latest checkpoint's messages against a model's window.
pub fn context_usage(messages: &[Message], context_window: Option<u64>) -> ContextUsage {
    let count: u64 = messages
        .iter()
        .map(|m| (m.text().chars().count() as u64).div_ceil(4) + 3)
        .sum();
    let percentage = context_window
        .filter(|w| *w > 0)
        .map(|w| ((count as f64 / w as f64 * 100.0) * 10.0).round() / 10.0);
    ContextUsage {
        token_count: count,
        max_context_tokens: context_window,
        percentage,
    }
}

/// Whether a run ended stopped: `interrupted` or `timeout`. Such runs are never counted
/// (as in the reference), but their tokens were spent, so they are summed beside.
pub fn stopped(run: &RunRecord) -> bool {
    matches!(run.status, RunStatus::Interrupted | RunStatus::Timeout)
}

/// Plain sums of some runs: the run totals and the caller buckets.
#[derive(Debug, Default)]
struct Sums {
    total: i64,
    input: i64,
    output: i64,
    lead: i64,
    subagent: i64,
    middleware: i64,
}

impl Sums {
    fn of(runs: &[&RunRecord]) -> Sums {
        let mut sums = Sums::default();
        for run in runs {
            let usage = &run.usage;
            sums.total += usage.total_tokens;
            sums.input += usage.total_input_tokens;
            sums.output += usage.total_output_tokens;
            sums.lead += usage.lead_agent_tokens;
            sums.subagent += usage.subagent_tokens;
            sums.middleware += usage.middleware_tokens;
        }
        sums
    }

    fn by_caller(&self) -> CallerTotals {
        CallerTotals {
            lead_agent: self.lead,
            subagent: self.subagent,
            middleware: self.middleware,
        }
    }
}

/// The `/token-usage` body without `context_usage`.
pub fn summarise(
    thread_id: &str,
    runs: &[RunRecord],
    include_active: bool,
    models: &[ModelFacts],
) -> TokenUsage {
    let counted: Vec<&RunRecord> = runs.iter().filter(|r| counted(r, include_active)).collect();
    let mut by_model: BTreeMap<String, (i64, u64)> = BTreeMap::new();
    for run in &counted {
        let usage = &run.usage;
        if usage.token_usage_by_model.is_empty() {
            let model = run
                .model_name
                .clone()
                .unwrap_or_else(|| "unknown".to_owned());
            let entry = by_model.entry(model).or_default();
            entry.0 += usage.total_tokens;
            entry.1 += 1;
        } else {
            for (model, bucket) in &usage.token_usage_by_model {
                let entry = by_model.entry(model.clone()).or_default();
                entry.0 += bucket.total_tokens;
                entry.1 += 1;
            }
        }
    }
    let sums = Sums::of(&counted);
    let stopped_runs: Vec<&RunRecord> = runs.iter().filter(|r| stopped(r)).collect();
    let stopped_sums = Sums::of(&stopped_runs);
    TokenUsage {
        thread_id: thread_id.to_owned(),
        total_tokens: sums.total,
        total_input_tokens: sums.input,
        total_output_tokens: sums.output,
        total_runs: counted.len() as u64,
        by_model: by_model
            .into_iter()
            .map(|(m, (tokens, runs))| (m, ModelTotals { tokens, runs }))
            .collect(),
        by_caller: sums.by_caller(),
        cost: cost(&counted, models),
        stopped_runs: StoppedRuns {
            runs: stopped_runs.len() as u64,
            total_tokens: stopped_sums.total,
            total_input_tokens: stopped_sums.input,
            total_output_tokens: stopped_sums.output,
            by_caller: stopped_sums.by_caller(),
            cost: cost(&stopped_runs, models),
        },
        context_usage: None,
        batches: BatchSpend::default(),
        budgets: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};
    use subflow_store::ModelUsage;

    /// The JSON body `summarise` answers with.
    fn summary(
        thread_id: &str,
        runs: &[RunRecord],
        include_active: bool,
        models: &[ModelFacts],
    ) -> Value {
        serde_json::to_value(summarise(thread_id, runs, include_active, models)).unwrap()
    }

    /// The JSON of `context_usage`.
    fn context(messages: &[Message], context_window: Option<u64>) -> Value {
        serde_json::to_value(context_usage(messages, context_window)).unwrap()
    }
    use subflow_store::RunUsage;

    fn facts(name: &str, price: Option<(f64, f64, Option<f64>, &str)>) -> ModelFacts {
        ModelFacts {
            name: name.into(),
            model: format!("{name}-model"),
            context_window: Some(1000),
            pricing: price.map(|(i, o, h, c)| Price {
                currency: c.into(),
                input_per_million: i,
                output_per_million: o,
                input_cache_hit_per_million: h,
                input_cache_write_per_million: None,
            }),
        }
    }

    fn run(status: RunStatus, model: &str, buckets: &[(&str, i64, i64, Option<i64>)]) -> RunRecord {
        let mut usage = RunUsage::default();
        for (name, input, output, cached) in buckets {
            usage.total_input_tokens += input;
            usage.total_output_tokens += output;
            usage.total_tokens += input + output;
            usage.lead_agent_tokens += input + output;
            usage.token_usage_by_model.insert(
                name.to_string(),
                ModelUsage {
                    input_tokens: *input,
                    output_tokens: *output,
                    total_tokens: input + output,
                    cache_read_tokens: *cached,
                    cache_write_tokens: None,
                },
            );
        }
        RunRecord {
            run_id: "r".into(),
            thread_id: "t".into(),
            owner: "u".into(),
            assistant_id: "lead_agent".into(),
            status,
            model_name: Some(model.into()),
            trace_id: None,
            stop_reason: None,
            error: None,
            metadata: Map::new(),
            multitask_strategy: "reject".into(),
            kwargs: Value::Null,
            usage,
            created_at: String::new(),
            updated_at: String::new(),
        }
    }

    #[test]
    fn only_success_and_error_count_and_by_model_sums_to_the_total() {
        let runs = vec![
            run(
                RunStatus::Success,
                "gpt",
                &[("gpt", 800, 200, Some(100)), ("claude", 150, 50, None)],
            ),
            run(RunStatus::Error, "gpt", &[("gpt", 10, 10, None)]),
            run(RunStatus::Interrupted, "gpt", &[("gpt", 999, 999, None)]),
            run(RunStatus::Timeout, "gpt", &[("gpt", 999, 999, None)]),
            run(RunStatus::Running, "gpt", &[("gpt", 5, 5, None)]),
        ];
        let models = [
            facts("gpt", Some((2.0, 8.0, Some(0.5), "usd"))),
            facts("claude", Some((3.0, 15.0, None, "USD"))),
        ];
        let body = summary("t", &runs, false, &models);
        assert_eq!(body["total_runs"], 2);
        assert_eq!(body["total_tokens"], 1220);
        let sum: i64 = body["by_model"]
            .as_object()
            .unwrap()
            .values()
            .map(|m| m["tokens"].as_i64().unwrap())
            .sum();
        assert_eq!(sum, 1220);
        assert_eq!(body["by_model"]["gpt"], json!({"tokens": 1020, "runs": 2}));
        assert_eq!(summary("t", &runs, true, &models)["total_runs"], 3);
        // Interrupted and timed-out runs stay out of the totals, summed beside them.
        let stopped = &body["stopped_runs"];
        assert_eq!(stopped["runs"], 2);
        assert_eq!(stopped["total_tokens"], 4 * 999);
        assert_eq!(stopped["total_input_tokens"], 2 * 999);
        assert_eq!(
            stopped["by_caller"],
            json!({"lead_agent": 4 * 999, "subagent": 0, "middleware": 0})
        );
        let spent = round6(2.0 * (999.0 * 2.0 + 999.0 * 8.0) / 1e6);
        assert_eq!(stopped["cost"]["total"], json!(spent));
        assert_eq!(
            body["cost"]["currency"], "USD",
            "currencies are compared upper-cased"
        );
        let gpt = (700.0 * 2.0 + 100.0 * 0.5 + 200.0 * 8.0 + 10.0 * 2.0 + 10.0 * 8.0) / 1e6;
        assert_eq!(body["cost"]["by_model"]["gpt"], json!(round6(gpt)));
    }

    #[test]
    fn cost_is_null_when_unpriced_or_mixed_and_legacy_runs_fall_back() {
        let unpriced = [facts("gpt", None)];
        let runs = vec![run(RunStatus::Success, "gpt", &[("gpt", 10, 10, None)])];
        assert_eq!(summary("t", &runs, false, &unpriced)["cost"], Value::Null);
        let mixed = [
            facts("gpt", Some((1.0, 1.0, None, "USD"))),
            facts("claude", Some((1.0, 1.0, None, "EUR"))),
        ];
        let both = vec![run(
            RunStatus::Success,
            "gpt",
            &[("gpt", 10, 10, None), ("claude", 10, 10, None)],
        )];
        assert_eq!(summary("t", &both, false, &mixed)["cost"], Value::Null);
        let mut legacy = run(RunStatus::Success, "GPT-model", &[]);
        legacy.usage.total_input_tokens = 1_000_000;
        legacy.usage.total_tokens = 1_000_000;
        let priced = [facts("gpt", Some((2.0, 8.0, Some(0.5), "USD")))];
        let body = summary("t", &[legacy], false, &priced);
        assert_eq!(
            body["by_model"]["GPT-model"],
            json!({"tokens": 1_000_000, "runs": 1})
        );
        assert_eq!(body["cost"]["by_model"]["GPT-model"], json!(2.0));
    }

    #[test]
    fn context_usage_counts_characters_over_four_plus_three_per_message() {
        let messages = vec![Message::human("abcdefgh"), Message::human("abc")];
        assert_eq!(
            context(&messages, Some(1000)),
            json!({"token_count": 2 + 3 + 1 + 3, "max_context_tokens": 1000, "percentage": 0.9})
        );
        assert_eq!(context(&messages, None)["percentage"], Value::Null);
    }

    proptest! {
        #[test]
        fn the_cost_total_is_the_sum_of_its_models(a in 0i64..5_000_000, b in 0i64..5_000_000, c in 0i64..5_000_000) {
            let runs = vec![run(RunStatus::Success, "gpt", &[("gpt", a, b, None), ("claude", c, a, Some(c / 2))])];
            let models = [facts("gpt", Some((2.0, 8.0, None, "USD"))), facts("claude", Some((3.0, 15.0, Some(0.3), "USD")))];
            let cost = summary("t", &runs, false, &models)["cost"].clone();
            if cost.is_null() { return Ok(()); }
            let sum: f64 = cost["by_model"].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum();
            prop_assert!((sum - cost["total"].as_f64().unwrap()).abs() < 1e-5);
        }
    }
}
