//! The agent runtime: the lead agent loop, the `task` tool and the subagent executor,
//! the run journal, guards (loop detection, token budget, turn caps) and task observers.
//!
//! It reaches storage only through the `subflow-store` traits and knows nothing of HTTP:
//! live task events leave it as a stream the gateway frames. Spans and metrics leave it
//! through the [`spans::SpanSink`] and [`metrics::RuntimeMetrics`] traits.
//!
//! # Map
//!
//! The agent runtime. `runtime` (configuration, `Models`, the shared `Runtime`, a run's
//! `RunContext`), `run` (one run end to end: status, journal, the lead loop under the run
//! timeout and a panic guard, usage snapshots, final flushes before the terminal status),
//! `lead` (the lead loop: task limits, parallel delegation, usage attribution,
//! checkpoints), `tool_table` (the one table mapping each tool name an agent is offered
//! to its spec and implementation: the lead's workspace tools plus `task`, a subagent's
//! allowed workspace tools and never `task`; the batch tools join the lead's table),
//! `batch` (the lead's `batch_task`, `batch_status` and `cancel_batch`: validation in the
//! order of docs/batches.md#tools with its texts, 0 limits resolved to the configured
//! defaults, `submission_key = "{run_id or thread_id}:{tool_call_id}"`, the
//! `ExecutionSpec` written at submit; none of them is a delegation, so
//! `max_total_per_run` never sees them), `subagent` (definitions; `executor`, one
//! subagent's model and tool loop under its timeout and cancellation, run from what it is
//! handed — definition, model, prompt, workspace, guards, trace and, for `task` calls
//! only, the task's event sink; `task`, the supervisor: admission, one tokio task per
//! execution whose terminal status is written once, the safety net, parent cancellation,
//! usage reported once, events and the ToolMessage; `detached`,
//! `Runtime::execute_detached`, an execution outside any run as a batch item attempt runs
//! it: no task events, loop audits or observers, tokens counted under the `batch` caller,
//! its own trace; `spec`, the batch's `ExecutionSpec` snapshot a worker rebuilds the
//! subagent from), `output` (the live `RunOutput` stream — text chunks and each AI
//! message's closing chunk with its tool calls, whole tool messages, `values`, one
//! `updates` delta per lead step, task events — and the per-task `TaskEmitter`, which
//! builds typed `TaskEvent`s), `journal` (journal events and the usage ledger;
//! `JournalProxy` for subagents), `usage`, `admission` (shared by tasks and batch items),
//! `tools` (the workspace tools), `guards` + `guarded` (loop detection, token budget and
//! how a loop applies them; the lead's detector is one per `Runtime`, its state kept per
//! thread across runs within the `max_tracked_threads` LRU, a subagent's is fresh per
//! execution), `observers` (task observers, webhooks), `spans` (the `SpanSink` trait and
//! `AgentTrace`: one trace per lead run, per subagent execution and per batch item
//! attempt with the Langfuse and GenAI attributes, docs/operations.md#langfuse-and-otlp)
//! and `metrics` (the `RuntimeMetrics` trait the loop counts tokens, runs, tasks and loop
//! detections into). `RuntimeOptions` (named fields with defaults) is the only way to a
//! `Runtime`: its `build` spawns the retry queue and wires store, models, admission and
//! observers. `task_control` holds a run's `TaskControls`: each `task` call registers the
//! child token of the run's cancellation under its tool call id before it announces the
//! task, so one task can be cancelled alone (the gateway's per-task cancel route, or a
//! request relayed from another gateway); its supervisor then ends it `cancelled` with
//! the contract's text and the lead goes on. `batch::submit_batch` is the one submission
//! path, used by `batch_task` and by the gateway's `POST …/subagent-batches`.

pub mod admission;
pub mod batch;
pub mod budget;
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
mod store_retry;
pub mod subagent;
pub mod task_control;
mod tool_table;
pub mod tools;
pub mod usage;
