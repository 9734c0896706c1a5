//! Storage traits of subflow and everything that sits on them without knowing SQL:
//! the in-memory store, batch validation, the per-run event buffer with its
//! process-wide retry queue and spill file, and (feature `conformance`) the one
//! conformance suite every backend runs.
//!
//! This crate knows no SQL and picks no backend: the `subflow-store-*` crates
//! implement [`Store`], and only the binary chooses one.
//!
//! # Map
//!
//! The store traits (`EventStore`, `RecordStore`, `CheckpointStore`, `AuthStore`,
//! `StreamStore`, `BatchStore`; `Store` is all six, what a backend provides),
//! `validate_batch`, `codec` (column decoding shared by the SQL backends), `delta`
//! (checkpoint values as keyframes and deltas of the thread's previous checkpoint:
//! encoding by per-message hashes a per-process `DeltaCodec` remembers, decoding chains,
//! shared by both SQL backends), `MemoryStore` (the reference semantics), `tasks`
//! (docs/api.md#task-summaries task summaries: `task_rows`, the reference reading of a
//! run's `subagent.*` records with the card's own `step_from_record`, and `summarize`,
//! which turns what any backend read into a summary, so the completed-card rule lives in
//! one place), `buffer` (per-run `EventBuffer`, process-wide `RetryQueue`,
//! `StoreCounters` behind the `subflow_event_store_*` metrics), `spill` (the JSON-lines
//! spill file and its re-apply) and, behind feature `conformance`, the one conformance
//! suite (`conformance_tests!`) with the contract validator. `auth`: the `AuthStore`
//! trait (users; tokens stored and found by digest only) and `TokenOwner::refusal`, the
//! one place that decides whether a found token may authenticate (revoked, expired, user
//! disabled). `streams`: the `StreamStore` trait — a run's durable SSE log
//! (`append_frames` of consecutive ids, `read_frames` after a cursor, `stream_log`
//! bounds, `prune_streams`), run leases (acquire, renew, release, `find_orphaned_runs`,
//! `recover_orphan` in one transaction) and remote cancel requests — and `StreamNotice`s,
//! the announcements of appends and cancel requests (`LocalNotices` for the
//! single-process backends). `batches`: the `BatchStore` trait of durable batches
//! (docs/batches.md) — submit with an idempotent `submission_key`, owner-scoped reads
//! (`BatchScope`), pause/resume/cancel/retry, the worker's `claim_pass` (whose first
//! `admitted` claims start `running` in the pass, on admission slots the worker already
//! holds) and its fenced writes (`ItemLease`: mark running, renew, finish, release;
//! `finish_attempts` finalises many outcomes in one call), heartbeats and the gauges'
//! totals — with `batches/machine.rs`, **the docs/batches.md state machine as functions
//! on loaded records** that every backend applies inside its transaction, so no backend
//! has its own transition rules; `batches/rows.rs`, the SQL backends' writes written once
//! over a backend's `BatchRows` (row access inside its transaction); and
//! `batches/activity.rs`, `batch_activity`'s types: one grouped read of the items' usage
//! per batch and model and of their recent completions,
//! which every backend (each in its own `batches/activity.rs`) folds with the one
//! `fold_activity`; a `Clock` (`ManualClock` in tests) is the lease clock of the
//! single-process backends; its property test is `conformance/batch_history.rs`. **One
//! file per store trait everywhere**: the trait and its types in `src/<trait>.rs`, the
//! memory implementation in `memory/<trait>.rs`, the conformance cases in
//! `conformance/<trait>.rs` (each with its own `<trait>_conformance_tests!` list,
//! expanded by `conformance_tests!`), and `src/<trait>.rs` in each SQL backend beside its
//! migration; `memory/mod.rs`, `conformance/mod.rs` and the backends' `lib.rs` hold only
//! what the traits share (locks, connections, fixtures, contract validation). A new table
//! gets those five files and one migration per backend.

pub mod auth;
pub mod batches;
mod checkpoints;
pub mod codec;
pub mod delta;
mod error;
mod events;
mod memory;
mod records;
pub mod tasks;
mod validate;

pub mod buffer;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod spill;
pub mod streams;

pub use auth::{AuthStore, NewToken, TokenOwner, TokenRecord, User};
pub use batches::{
    ActivityQuery, AttemptOutcome, BatchActivity, BatchCounts, BatchItem, BatchQuery, BatchRecord,
    BatchScope, BatchStore, BatchTotals, ClaimPass, ClaimRequest, ClaimedItem, ItemFailure,
    ItemLease, ItemQuery, ItemSuccess, ItemUsage, ModelItemUsage, NewBatch, NewItem, ReleaseReason,
    Renewal, RetryOutcome, Submitted, WorkerHeartbeat,
};
pub use checkpoints::{Checkpoint, CheckpointStore, NewCheckpoint};
pub use error::{Error, Result};
pub use events::{AppendOutcome, EventQuery, EventStore, MAX_PAGE_LIMIT};
pub use memory::MemoryStore;
pub use records::{
    ModelUsage, NewRun, NewThread, RecordStore, RunRecord, RunScope, RunStatusUpdate, RunUsage,
    ThreadRecord, ThreadSearch,
};
pub use streams::{
    FrameBatch, NewFrame, OrphanScope, OrphanedRun, RecoveredRun, StreamFrame, StreamLog,
    StreamNotice, StreamNotices, StreamStore,
};
pub use tasks::{StepBrief, TaskRows, TaskSummary};
pub use validate::{now_rfc3339, rfc3339, validate_batch};

/// Everything a backend provides: run events, thread and run records, checkpoints,
/// users and tokens, run stream logs and leases, durable batches.
pub trait Store:
    EventStore + RecordStore + CheckpointStore + AuthStore + StreamStore + BatchStore
{
}

impl<T> Store for T where
    T: EventStore + RecordStore + CheckpointStore + AuthStore + StreamStore + BatchStore
{
}
