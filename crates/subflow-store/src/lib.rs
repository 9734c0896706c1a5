//! Storage traits of subflow and everything that sits on them without knowing SQL:
//! the in-memory store, batch validation, the per-run event buffer with its
//! process-wide retry queue and spill file, and (feature `conformance`) the one
//! conformance suite every backend runs.
//!
//! This crate knows no SQL and picks no backend: the `subflow-store-*` crates
//! implement [`Store`], and only the binary chooses one.

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
