//! Thread state checkpoints (docs/api.md#objects ThreadState): the conversation after each lead
//! step, newest last, so a reloaded page or a new run resumes from the latest one.
//!
//! Callers always see whole values; the SQL backends store each checkpoint as a delta
//! of the thread's previous one (`delta`), so a thread's checkpoints take about three
//! times its latest state, not the sum of every state it went through.

use async_trait::async_trait;
use serde_json::{Map, Value};

use subflow_contracts::ThreadId;

use crate::{Result, now_rfc3339};

/// A checkpoint to store.
#[derive(Debug, Clone, PartialEq)]
pub struct NewCheckpoint {
    /// Thread id.
    pub thread_id: String,
    /// Unique id (a UUID v7 string, so ids sort by creation).
    pub checkpoint_id: String,
    /// The checkpoint this one follows.
    pub parent_checkpoint_id: Option<String>,
    /// The run that wrote it.
    pub run_id: Option<String>,
    /// State values: `{messages, title?}`.
    pub values: Value,
    /// Checkpoint metadata, e.g. `deerflow_trace_id`, `step`.
    pub metadata: Map<String, Value>,
    /// The lease owner of `run_id` the checkpoint is written under: refused with
    /// [`crate::Error::LeaseLost`] unless it holds the run's lease; `None` for an
    /// unfenced write (a state edit through the API).
    pub lease_owner: Option<String>,
}

impl NewCheckpoint {
    /// The run and lease owner the write is fenced by, if any; a lease owner without a
    /// run is refused.
    pub fn fence(&self) -> Result<Option<(String, String)>> {
        match (&self.run_id, &self.lease_owner) {
            (_, None) => Ok(None),
            (Some(run), Some(owner)) => Ok(Some((run.clone(), owner.clone()))),
            (None, Some(_)) => Err(crate::Error::InvalidQuery(
                "a checkpoint fenced by a run lease needs its run_id".to_owned(),
            )),
        }
    }

    /// The checkpoint as a store writes it, stamped now; the thread id must be valid.
    pub fn into_stored(self) -> Result<Checkpoint> {
        ThreadId::parse(&self.thread_id)?;
        Ok(Checkpoint {
            thread_id: self.thread_id,
            checkpoint_id: self.checkpoint_id,
            parent_checkpoint_id: self.parent_checkpoint_id,
            run_id: self.run_id,
            values: self.values,
            metadata: self.metadata,
            created_at: now_rfc3339(),
        })
    }
}

/// A stored checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Thread id.
    pub thread_id: String,
    /// Unique id.
    pub checkpoint_id: String,
    /// The checkpoint this one follows.
    pub parent_checkpoint_id: Option<String>,
    /// The run that wrote it.
    pub run_id: Option<String>,
    /// State values.
    pub values: Value,
    /// Metadata.
    pub metadata: Map<String, Value>,
    /// RFC 3339, written by the store.
    pub created_at: String,
}

/// Storage of checkpoints.
#[async_trait]
pub trait CheckpointStore: Send + Sync + std::fmt::Debug {
    /// Stores a checkpoint; the thread id must be valid.
    async fn put_checkpoint(&self, checkpoint: NewCheckpoint) -> Result<Checkpoint>;

    /// The thread's newest checkpoint.
    async fn latest_checkpoint(&self, thread_id: &str) -> Result<Option<Checkpoint>>;

    /// One checkpoint of the thread, by id.
    async fn get_checkpoint(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
    ) -> Result<Option<Checkpoint>>;

    /// The thread's checkpoints, newest first, older than `before` (a checkpoint id) when given.
    async fn list_checkpoints(
        &self,
        thread_id: &str,
        limit: u32,
        before: Option<&str>,
    ) -> Result<Vec<Checkpoint>>;

    /// Deletes the checkpoints a run wrote (`rollback`); returns how many.
    async fn delete_run_checkpoints(&self, thread_id: &str, run_id: &str) -> Result<u64>;
}
