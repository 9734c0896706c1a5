//! The agent runtime: the lead agent loop, the `task` tool and the subagent executor,
//! the run journal, guards (loop detection, token budget, turn caps) and task observers.
//!
//! It reaches storage only through the `subflow-store` traits and knows nothing of HTTP:
//! live task events leave it as a stream the gateway frames. Spans and metrics leave it
//! through the [`spans::SpanSink`] and [`metrics::RuntimeMetrics`] traits.

pub mod admission;
pub mod batch;
mod guarded;
pub mod guards;
pub mod journal;
mod lead;
pub mod metrics;
pub mod observers;
pub mod output;
pub mod run;
pub mod runtime;
pub mod spans;
pub mod subagent;
pub mod task_control;
mod tool_table;
pub mod tools;
pub mod usage;
