//! Token usage records, the per-subagent collector (docs/usage-and-cost.md#token-records) and the journal's
//! caller and per-model buckets (docs/usage-and-cost.md#run-buckets).

use std::collections::HashSet;
use std::sync::Mutex;

use subflow_contracts::messages::UsageMetadata;
use subflow_contracts::task_result::TokenUsage;
use subflow_store::RunUsage;

/// One model call's usage, attributed to a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRecord {
    /// Unique per model call; the journal counts each id once.
    pub source_run_id: String,
    /// `lead_agent`, `subagent:<name>` or `middleware:<name>`.
    pub caller: String,
    /// As the provider reported it.
    pub model_name: Option<String>,
    /// Input tokens, cached ones included.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Reported total if positive, else input + output.
    pub total_tokens: u64,
    /// Cached input tokens, only when > 0.
    pub cache_read_tokens: Option<u64>,
    /// Input tokens written to the cache, only when > 0.
    pub cache_write_tokens: Option<u64>,
}

impl UsageRecord {
    /// The record of one call, or `None` when it reported no positive usage.
    pub fn from_call(
        source_run_id: impl Into<String>,
        caller: impl Into<String>,
        model_name: Option<String>,
        usage: &UsageMetadata,
    ) -> Option<Self> {
        let total = if usage.total_tokens > 0 {
            usage.total_tokens
        } else {
            usage.input_tokens + usage.output_tokens
        };
        (total > 0).then(|| UsageRecord {
            source_run_id: source_run_id.into(),
            caller: caller.into(),
            model_name,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: total,
            cache_read_tokens: Some(usage.input_token_details.cache_read).filter(|c| *c > 0),
            cache_write_tokens: Some(usage.input_token_details.cache_creation).filter(|c| *c > 0),
        })
    }
}

/// The usage records of one subagent execution, deduplicated by call; readable while
/// the subagent runs.
#[derive(Debug)]
pub struct Collector {
    caller: String,
    records: Mutex<Vec<UsageRecord>>,
}

impl Collector {
    /// A collector for `subagent:<name>`.
    pub fn for_subagent(name: &str) -> Self {
        Collector {
            caller: format!("subagent:{name}"),
            records: Mutex::new(Vec::new()),
        }
    }

    /// The caller its records carry.
    pub fn caller(&self) -> &str {
        &self.caller
    }

    /// Adds one call's usage; calls without positive usage and repeated ids are ignored.
    pub fn record(&self, source_run_id: &str, model_name: Option<String>, usage: &UsageMetadata) {
        let Some(record) = UsageRecord::from_call(source_run_id, &self.caller, model_name, usage)
        else {
            return;
        };
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if records
            .iter()
            .all(|r| r.source_run_id != record.source_run_id)
        {
            records.push(record);
        }
    }

    /// A copy of the records so far.
    pub fn snapshot(&self) -> Vec<UsageRecord> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The cumulative usage, or `None` while there are no records.
    pub fn totals(&self) -> Option<TokenUsage> {
        let records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        (!records.is_empty()).then(|| {
            records
                .iter()
                .fold(TokenUsage::default(), |sum, r| TokenUsage {
                    input_tokens: sum.input_tokens + r.input_tokens,
                    output_tokens: sum.output_tokens + r.output_tokens,
                    total_tokens: sum.total_tokens + r.total_tokens,
                    cache_read_tokens: sum.cache_read_tokens + r.cache_read_tokens.unwrap_or(0),
                    cache_write_tokens: sum.cache_write_tokens + r.cache_write_tokens.unwrap_or(0),
                })
        })
    }
}

/// A run's usage buckets. Every record adds to the run totals, to exactly one caller
/// bucket and to one model bucket, so `total_tokens` always equals the bucket sums.
#[derive(Debug, Default)]
pub struct UsageLedger {
    counted: HashSet<String>,
    usage: RunUsage,
}

impl UsageLedger {
    /// Counts one of the run's own model calls (lead or middleware); false when its id
    /// was already counted.
    pub fn add_own(&mut self, record: &UsageRecord) -> bool {
        self.usage.llm_call_count += 1;
        self.add(record)
    }

    /// Counts records reported by a subagent; ids already counted are skipped, and
    /// `llm_call_count` is not incremented.
    pub fn add_external(&mut self, records: &[UsageRecord]) {
        for record in records {
            self.add(record);
        }
    }

    /// Counts one record reported by a subagent; false when its id was already counted.
    pub fn add_external_one(&mut self, record: &UsageRecord) -> bool {
        self.add(record)
    }

    fn add(&mut self, record: &UsageRecord) -> bool {
        if !self.counted.insert(record.source_run_id.clone()) {
            return false;
        }
        let (input, output, total) = (
            record.input_tokens as i64,
            record.output_tokens as i64,
            record.total_tokens as i64,
        );
        let usage = &mut self.usage;
        usage.total_input_tokens += input;
        usage.total_output_tokens += output;
        usage.total_tokens += total;
        if record.caller.starts_with("subagent:") {
            usage.subagent_tokens += total;
        } else if record.caller.starts_with("middleware:") {
            usage.middleware_tokens += total;
        } else {
            usage.lead_agent_tokens += total;
        }
        let model = record
            .model_name
            .clone()
            .unwrap_or_else(|| "unknown".to_owned());
        let bucket = usage.token_usage_by_model.entry(model).or_default();
        bucket.input_tokens += input;
        bucket.output_tokens += output;
        bucket.total_tokens += total;
        if let Some(cached) = record.cache_read_tokens {
            *bucket.cache_read_tokens.get_or_insert(0) += cached as i64;
        }
        if let Some(written) = record.cache_write_tokens {
            *bucket.cache_write_tokens.get_or_insert(0) += written as i64;
        }
        true
    }

    /// The rollups as the run record stores them.
    pub fn snapshot(&self, message_count: i64) -> RunUsage {
        RunUsage {
            message_count,
            ..self.usage.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use subflow_contracts::messages::InputTokenDetails;

    fn usage(input: u64, output: u64, total: u64, cache_read: u64) -> UsageMetadata {
        UsageMetadata {
            input_tokens: input,
            output_tokens: output,
            total_tokens: total,
            input_token_details: InputTokenDetails {
                cache_read,
                cache_creation: 0,
            },
        }
    }

    #[test]
    fn records_fall_back_to_input_plus_output_and_keep_cache_reads_only_when_positive() {
        let record = UsageRecord::from_call("c1", "lead_agent", None, &usage(10, 5, 0, 0)).unwrap();
        assert_eq!((record.total_tokens, record.cache_read_tokens), (15, None));
        let cached =
            UsageRecord::from_call("c2", "lead_agent", None, &usage(10, 5, 16, 4)).unwrap();
        assert_eq!(
            (cached.total_tokens, cached.cache_read_tokens),
            (16, Some(4))
        );
        assert!(UsageRecord::from_call("c3", "lead_agent", None, &usage(0, 0, 0, 0)).is_none());
    }

    #[test]
    fn a_collector_deduplicates_by_call_and_is_null_without_records() {
        let collector = Collector::for_subagent("general-purpose");
        assert_eq!(collector.totals(), None);
        collector.record("call-1", Some("m".into()), &usage(10, 2, 12, 0));
        collector.record("call-1", Some("m".into()), &usage(10, 2, 12, 0));
        collector.record("call-2", Some("m".into()), &usage(0, 0, 0, 0));
        collector.record("call-3", Some("m".into()), &usage(20, 3, 23, 8));
        assert_eq!(collector.snapshot().len(), 2);
        assert_eq!(collector.snapshot()[0].caller, "subagent:general-purpose");
        assert_eq!(
            collector.totals(),
            Some(TokenUsage {
                input_tokens: 30,
                output_tokens: 5,
                total_tokens: 35,
                cache_read_tokens: 8,
                cache_write_tokens: 0,
            })
        );
    }

    #[test]
    fn the_ledger_fills_caller_and_model_buckets_whose_sum_is_the_total() {
        let mut ledger = UsageLedger::default();
        let lead = UsageRecord::from_call(
            "l1",
            "lead_agent",
            Some("gpt".into()),
            &usage(100, 10, 110, 40),
        )
        .unwrap();
        let title = UsageRecord::from_call(
            "m1",
            "middleware:title",
            Some("gpt".into()),
            &usage(20, 5, 25, 0),
        )
        .unwrap();
        let sub = UsageRecord::from_call(
            "s1",
            "subagent:general-purpose",
            Some("claude".into()),
            &usage(50, 5, 55, 0),
        )
        .unwrap();
        let anonymous =
            UsageRecord::from_call("s2", "subagent:bash", None, &usage(1, 1, 2, 0)).unwrap();
        ledger.add_own(&lead);
        ledger.add_own(&title);
        ledger.add_external(&[sub.clone(), anonymous]);
        ledger.add_external(&[sub]);
        let usage = ledger.snapshot(4);
        assert_eq!(usage.llm_call_count, 2);
        assert_eq!(
            (
                usage.lead_agent_tokens,
                usage.middleware_tokens,
                usage.subagent_tokens
            ),
            (110, 25, 57)
        );
        assert_eq!(
            usage.total_tokens,
            usage.lead_agent_tokens + usage.middleware_tokens + usage.subagent_tokens
        );
        assert_eq!(
            usage.total_tokens,
            usage
                .token_usage_by_model
                .values()
                .map(|b| b.total_tokens)
                .sum::<i64>()
        );
        assert_eq!(
            usage.token_usage_by_model["gpt"].cache_read_tokens,
            Some(40)
        );
        assert_eq!(usage.token_usage_by_model["claude"].cache_read_tokens, None);
        assert_eq!(usage.token_usage_by_model["unknown"].total_tokens, 2);
        assert_eq!(usage.message_count, 4);
    }
}
