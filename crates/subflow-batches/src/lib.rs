//! Durable batches (docs/batches.md): the worker that leases batch items and runs each attempt
//! through the runtime's subagent executor, guards and admission controller.
//!
//! It reaches storage only through the `subflow-store` [`BatchStore`](subflow_store::BatchStore)
//! trait and knows no SQL and no HTTP. Items emit no run events, no SSE and no observer
//! notifications (docs/batches.md#observability); each attempt still gets its own trace.

pub mod item;
pub mod metrics;
pub mod worker;

pub use metrics::{AttemptEnd, NoMetrics, WorkerMetrics};
pub use worker::{Error, Handle, Options, SHUTDOWN_LIMIT, Step, Worker};
