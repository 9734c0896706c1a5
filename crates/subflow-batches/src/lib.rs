//! Durable batches (docs/batches.md): the worker that leases batch items and runs each attempt
//! through the runtime's subagent executor, guards and admission controller.
//!
//! It reaches storage only through the `subflow-store` [`BatchStore`](subflow_store::BatchStore)
//! trait and knows no SQL and no HTTP. Items emit no run events, no SSE and no observer
//! notifications (docs/batches.md#observability); each attempt still gets its own trace.
//!
//! # Map
//!
//! The durable batch worker (docs/batches.md), over the `BatchStore` trait only.
//! `worker`: `Options` → `build()` → `Worker::run(shutdown)`, a cheap `Handle`
//! (`is_running`, `max_running`, `worker_id`, `executions`) and `claim_and_run_once`, one
//! step of the loop that tests drive without sleeping. The loop heartbeats every third of
//! a lease and runs a claim pass every poll interval while it has free slots
//! (`subagent_runtime.max_running` minus its local executions), and as soon as half its
//! slots are free, so a busy worker never idles a slot. Before a pass it takes whatever
//! admission slots are free (`Admission::reserve_free`; none from a controller that
//! rejects when full, which a held slot could make refuse a task) and asks the pass to
//! start that many claims `running` at once, sparing each its own `leased` → `running`
//! write; a claim beyond them stays `leased` and waits for admission. A slot counts as
//! free when its execution ends, before its outcome is written, so the next pass can
//! share the outcome's commit. `worker/attempt.rs` is one claimed attempt: admission
//! through the runtime's shared controller (unless the pass started it), `leased` →
//! `running`, the subagent rebuilt from `execution_spec` and run through
//! `execute_detached` after the at-least-once preamble, its lease renewed every max(1,
//! lease/3) s, the outcome handed to `worker/finisher.rs` the moment the execution ends.
//! The finisher writes outcomes one `finish_attempts` call at a time (retried once):
//! those that arrive while a call is in flight go together in the next one, so an idle
//! worker writes each at once and a busy one pays one transaction for many. `item` holds
//! the preamble and the result, preview and error caps; `metrics` the `WorkerMetrics`
//! hooks (lease expirations, how each attempt ended).

pub mod item;
pub mod metrics;
pub mod worker;

pub use metrics::{AttemptEnd, NoMetrics, WorkerMetrics};
pub use worker::{Error, Handle, Options, SHUTDOWN_LIMIT, Step, Worker};
