//! What a batch worker counts, as a trait the binary implements over its metrics
//! registry (docs/operations.md#metrics); the worker knows nothing of Prometheus.

use std::fmt;
use std::time::Duration;

use subflow_contracts::BatchItemStatus;
use subflow_contracts::task_result::TokenUsage;

/// How the worker left one claimed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Its outcome was written; the item is now in this status (`succeeded`, `queued`
    /// for a retry, `failed` or `cancelled`).
    Finished(BatchItemStatus),
    /// The claim was handed back with its attempt restored: admission refused, the
    /// worker stopping before admission, a stale local execution drained, or its start
    /// or outcome not stored.
    Released,
    /// The local execution was stopped and nothing written: its lease was lost, its
    /// batch was cancelled, or the worker is shutting down.
    Stopped,
    /// The outcome write was refused by the fence: another claim holds the item now.
    Fenced,
    /// The outcome write failed, and so did its one retry; lease expiry hands the item on.
    WriteFailed,
}

/// Receives the worker's countable moments. Every method must return at once.
pub trait WorkerMetrics: Send + Sync + fmt::Debug {
    /// A claim pass recovered `count` expired leases
    /// (`subflow_batch_lease_expirations_total`).
    fn lease_expirations(&self, _count: u64) {}
    /// A claimed attempt of subagent `agent` ended as `end`, `duration` after its claim.
    fn attempt_finished(&self, _agent: &str, _end: AttemptEnd, _duration: Duration) {}
    /// An item's execution ran on `model` and used `usage`, whatever then became of its
    /// outcome: what it spent (`subflow_cost_total`).
    fn execution_usage(&self, _model: &str, _usage: &TokenUsage) {}
}

/// The metrics of a worker nobody scrapes.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMetrics;

impl WorkerMetrics for NoMetrics {}
