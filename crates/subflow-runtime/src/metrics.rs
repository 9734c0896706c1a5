//! What the runtime counts for `GET /metrics` (docs/operations.md#metrics), as a trait: the runtime calls
//! it where things happen and knows nothing of Prometheus; the registry behind it lives
//! in `subflow-telemetry`.
//!
//! Store buffer and observer counts are not here: they already live in
//! [`subflow_store::buffer::StoreCounters`] and [`crate::observers::ObserverCounters`],
//! which an exporter reads when scraped.

use std::fmt;
use std::time::Duration;

use subflow_contracts::{RunStatus, SubagentStatus};

use crate::usage::UsageRecord;

/// Receives the runtime's countable moments. Every method must return at once.
pub trait RuntimeMetrics: Send + Sync + fmt::Debug {
    /// One model call's usage, counted once (as the run's journal counts it).
    fn tokens(&self, _usage: &TokenCount<'_>) {}
    /// A subagent execution ended with `status` after `duration`.
    fn subagent_task(&self, _agent: &str, _status: SubagentStatus, _duration: Duration) {}
    /// A lead run ended with `status` after `duration`.
    fn run_finished(&self, _status: RunStatus, _duration: Duration) {}
    /// Loop detection warned or stopped (`action` is `warn` or `hard_stop`).
    fn loop_detection(&self, _layer: &str, _action: &str, _is_subagent: bool) {}
    /// A money budget's spend over its limit after a priced call (`scope` is `run`,
    /// `thread`, `user_daily` or `batch`).
    fn budget_spent(&self, _scope: &str, _ratio: f64) {}
}

/// The metrics of a runtime nobody scrapes.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMetrics;

impl RuntimeMetrics for NoMetrics {}

/// One usage record with its metric labels (`subflow_tokens_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCount<'a> {
    /// `lead_agent`, `subagent`, `middleware` or `batch`.
    pub caller: &'a str,
    /// `lead_agent`, the subagent's definition name, or the middleware's name.
    pub agent: &'a str,
    /// The provider-reported model, else `unknown` (the run's model bucket key).
    pub model: &'a str,
    /// Input tokens, cached ones included.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Cached input tokens.
    pub cache_read: u64,
}

impl<'a> TokenCount<'a> {
    /// The labels and counts of `record`: its caller split into kind and agent.
    pub fn of(record: &'a UsageRecord) -> Self {
        let (caller, agent) = match record.caller.split_once(':') {
            Some(("subagent", name)) => ("subagent", name),
            Some(("middleware", name)) => ("middleware", name),
            Some(("batch", name)) => ("batch", name),
            _ => ("lead_agent", record.caller.as_str()),
        };
        TokenCount {
            caller,
            agent,
            model: record.model_name.as_deref().unwrap_or("unknown"),
            input: record.input_tokens,
            output: record.output_tokens,
            cache_read: record.cache_read_tokens.unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(caller: &str, model: Option<&str>) -> UsageRecord {
        UsageRecord {
            source_run_id: "c".into(),
            caller: caller.into(),
            model_name: model.map(str::to_owned),
            input_tokens: 10,
            output_tokens: 4,
            total_tokens: 14,
            cache_read_tokens: Some(6),
            cache_write_tokens: None,
        }
    }

    #[test]
    fn callers_split_into_the_caller_label_and_the_agent() {
        let sub = record("subagent:general-purpose", Some("m"));
        let count = TokenCount::of(&sub);
        assert_eq!(
            (count.caller, count.agent, count.model),
            ("subagent", "general-purpose", "m")
        );
        let lead = record("lead_agent", None);
        let count = TokenCount::of(&lead);
        assert_eq!(
            (count.caller, count.agent, count.model),
            ("lead_agent", "lead_agent", "unknown")
        );
        let title = record("middleware:title", Some("m"));
        assert_eq!(
            (TokenCount::of(&title).caller, TokenCount::of(&title).agent),
            ("middleware", "title")
        );
        assert_eq!(
            (TokenCount::of(&sub).input, TokenCount::of(&sub).cache_read),
            (10, 6)
        );
    }
}
